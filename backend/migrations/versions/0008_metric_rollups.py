"""Per-bucket minima and maxima of every metric series (``metric_rollups``, kept by backend/rollups.py).

A downsampled read of a million-step series used to scan every row of the range for its bucket
extremes (16 s for 6 keys of 1 M steps on SQLite, and minutes on PostgreSQL in bench/store.py). With
the extremes of 16-, 64-, 256-... step buckets kept as rows are written, a read of a long range
touches about as many rollup rows as points it returns. The rollups of series stored before this
revision are built here from their rows (the same code that keeps them afterwards).

The index covering the value (0004) served the old reads; reads of short ranges now find their
rows through the unique ``(run_id, key, step)`` index (0006), and dropping it makes a SQLite batch
insert about a third cheaper (122-164 k against 92-100 k points/s measured on a 1 M-row store).

Metric rows (and rollups) lose their foreign key to runs: PostgreSQL checked it once per row, a
third of a 9,000-point insert (EXPLAIN ANALYZE: 112 of 339 ms), although a batch is always for one
run; metric_store.log_metrics now checks and locks that run once per batch and store.delete_runs deletes
a run's metric rows and rollups with it. SQLite can only drop a constraint by rebuilding the table
(a copy of the rows, once).

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

from backend.store import rollups

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

_SQLITE_FK_NAMES = {"fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s"}
_SQLITE_FK = "fk_metrics_run_id_runs"


def upgrade() -> None:
    op.create_table(
        "metric_rollups",
        sa.Column("run_id", sa.Integer, primary_key=True),
        sa.Column("key", sa.String(250), primary_key=True),
        sa.Column("level", sa.SmallInteger, primary_key=True),
        sa.Column("bucket", sa.BigInteger, primary_key=True),
        sa.Column("first_step", sa.BigInteger, nullable=False),
        sa.Column("first_ts", sa.Float(53), nullable=False),
        sa.Column("lo_step", sa.BigInteger),
        sa.Column("lo_value", sa.Float(53)),
        sa.Column("lo_ts", sa.Float(53)),
        sa.Column("hi_step", sa.BigInteger),
        sa.Column("hi_value", sa.Float(53)),
        sa.Column("hi_ts", sa.Float(53)),
    )
    metrics = sa.table("metrics", sa.column("run_id", sa.Integer), sa.column("key", sa.String),
                       sa.column("step", sa.BigInteger))
    conn = op.get_bind()
    series = conn.execute(sa.select(metrics.c.run_id, metrics.c.key, sa.func.min(metrics.c.step),
                                    sa.func.max(metrics.c.step)).group_by(metrics.c.run_id, metrics.c.key)).all()
    for run_id, key, first, last in series:
        rollups.rebuild(conn, run_id, key, first, last, rollups.BASE_COLUMNS)
    op.drop_index("ix_metrics_run_key_step_value", table_name="metrics")
    if conn.dialect.name == "postgresql":
        op.drop_constraint("metrics_run_id_fkey", "metrics", type_="foreignkey")  # PostgreSQL's default name
    else:  # unnamed in SQLite: named here by convention so that the rebuild can leave it out
        with op.batch_alter_table("metrics", recreate="always", naming_convention=_SQLITE_FK_NAMES) as batch:
            batch.drop_constraint(_SQLITE_FK, type_="foreignkey")


def downgrade() -> None:
    op.execute("DELETE FROM metrics WHERE run_id NOT IN (SELECT id FROM runs)")  # what the key forbids
    if op.get_bind().dialect.name == "postgresql":
        op.create_foreign_key("metrics_run_id_fkey", "metrics", "runs", ["run_id"], ["id"], ondelete="CASCADE")
    else:
        with op.batch_alter_table("metrics", recreate="always", naming_convention=_SQLITE_FK_NAMES) as batch:
            batch.create_foreign_key(_SQLITE_FK, "runs", ["run_id"], ["id"], ondelete="CASCADE")
    op.create_index("ix_metrics_run_key_step_value", "metrics", ["run_id", "key", "step", "value"])
    op.drop_table("metric_rollups")
