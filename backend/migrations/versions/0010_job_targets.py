"""Jobs on targets: where a job runs (``target``: local, ray or slurm), the engine's id of it
(``engine_job_id``), what the engine last said of it (``engine_state``: PENDING, RUNNING, FINISHED,
FAILED, KILLED or GONE) and why it waits (``pending_reason``); and a new status PENDING (queued by the
engine, waiting for resources). A cluster job's tracking writes carry its run's write secret (0009).

Existing rows are local jobs (or runs of other sources). SQLite rebuilds the table for the changed
status check (AUTOINCREMENT kept, as in 0003); PostgreSQL alters it in place.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-02
"""

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

_OLD = "('SCHEDULED', 'RUNNING', 'FINISHED', 'FAILED', 'KILLED')"
_NEW = "('SCHEDULED', 'PENDING', 'RUNNING', 'FINISHED', 'FAILED', 'KILLED')"


def upgrade() -> None:
    with op.batch_alter_table("runs", table_kwargs={"sqlite_autoincrement": True}) as batch:
        batch.add_column(sa.Column("target", sa.String(32), nullable=False, server_default="local"))
        batch.add_column(sa.Column("engine_job_id", sa.String(128)))
        batch.add_column(sa.Column("engine_state", sa.String(16)))
        batch.add_column(sa.Column("pending_reason", sa.String(1000)))
        batch.drop_constraint("ck_runs_status", type_="check")
        batch.create_check_constraint("ck_runs_status", f"status IN {_NEW}")
    op.create_index("ix_runs_target_status", "runs", ["target", "status"])


def downgrade() -> None:
    op.drop_index("ix_runs_target_status", table_name="runs")
    op.execute("UPDATE runs SET status = 'SCHEDULED' WHERE status = 'PENDING'")
    with op.batch_alter_table("runs", table_kwargs={"sqlite_autoincrement": True}) as batch:
        batch.drop_constraint("ck_runs_status", type_="check")
        batch.create_check_constraint("ck_runs_status", f"status IN {_OLD}")
        for column in ("pending_reason", "engine_state", "engine_job_id", "target"):
            batch.drop_column(column)
