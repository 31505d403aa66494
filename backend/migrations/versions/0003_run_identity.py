"""Run identity: where a run came from (source), its seed group, editable description, notes and tags,
and a client key that makes tracked and imported runs idempotent.

``source`` is one of job (a training job of this service), tracked (a training process elsewhere
reporting over HTTP), imported (a finished run folder registered by ``aah import``), suite (the
shipped reproduction, or ``aah suite --tracking-uri``) and paper (the paper's reported numbers).
Existing rows become ``paper`` when their experiment is read-only and ``job`` otherwise (the demo
run is re-labelled ``imported`` by its seeding). Plain SQL types and indexes only, so the revision
runs on SQLite and PostgreSQL alike.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

_SOURCES = "('job', 'tracked', 'imported', 'suite', 'paper')"


def upgrade() -> None:
    # the check constraint makes SQLite rebuild the table: keep AUTOINCREMENT (0002) through it
    with op.batch_alter_table("runs", table_kwargs={"sqlite_autoincrement": True}) as batch:
        batch.add_column(sa.Column("source", sa.String(16), nullable=False, server_default="job"))
        batch.add_column(sa.Column("group_name", sa.String(200)))
        batch.add_column(sa.Column("seed", sa.Integer))
        batch.add_column(sa.Column("description", sa.Text))
        batch.add_column(sa.Column("notes", sa.Text))
        batch.add_column(sa.Column("client_key", sa.String(128)))
        batch.create_check_constraint("ck_runs_source", f"source IN {_SOURCES}")
    op.create_index("ix_runs_source", "runs", ["source"])
    op.create_index("ix_runs_group_name", "runs", ["group_name"])
    op.create_index("ux_runs_client_key", "runs", ["client_key"], unique=True)
    op.create_table(
        "run_tags",
        sa.Column("run_id", sa.Integer, sa.ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
        sa.Column("tag", sa.String(64), nullable=False),
        sa.PrimaryKeyConstraint("run_id", "tag"),
    )
    op.create_index("ix_run_tags_tag", "run_tags", ["tag"])
    runs = sa.table("runs", sa.column("source", sa.String), sa.column("experiment_id", sa.Integer))
    experiments = sa.table("experiments", sa.column("id", sa.Integer), sa.column("read_only", sa.Boolean))
    read_only = sa.select(experiments.c.id).where(experiments.c.read_only == sa.true())
    op.execute(runs.update().where(runs.c.experiment_id.in_(read_only)).values(source="paper"))


def downgrade() -> None:
    op.drop_index("ix_run_tags_tag", table_name="run_tags")
    op.drop_table("run_tags")
    op.drop_index("ux_runs_client_key", table_name="runs")
    op.drop_index("ix_runs_group_name", table_name="runs")
    op.drop_index("ix_runs_source", table_name="runs")
    # SQLite rebuilds the table for the dropped constraint; PostgreSQL alters it in place (recreating
    # it there would fail: params, metrics and plans reference it)
    with op.batch_alter_table("runs", table_kwargs={"sqlite_autoincrement": True}) as batch:
        batch.drop_constraint("ck_runs_source", type_="check")
        for column in ("client_key", "notes", "description", "seed", "group_name", "source"):
            batch.drop_column(column)
