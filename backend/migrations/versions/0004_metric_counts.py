"""Rows per metric series (``latest_metrics.n_rows``), and a metrics index that covers the value.

The metrics endpoint needs a cheap "has this run's data changed?" (its response cache) and
"is this series longer than the points asked for?" (downsampling). Counting a run's metric rows
reads every index entry of the run (seconds at millions of points); the count kept beside each
key's latest value, moved forward by the same statement that writes a batch, answers both in
one row per key. Existing rows are counted once here.

Downsampled reads scan a step range of one series for bucket minima and maxima; with the value in
the ``(run_id, key, step)`` index they never touch the table (on SQLite that halved a 100 k-point
read). The index replaces the old one, which it extends.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("latest_metrics") as batch:
        batch.add_column(sa.Column("n_rows", sa.BigInteger, nullable=False, server_default="0"))
    latest = sa.table("latest_metrics", sa.column("run_id", sa.Integer), sa.column("key", sa.String),
                      sa.column("n_rows", sa.BigInteger))
    metrics = sa.table("metrics", sa.column("run_id", sa.Integer), sa.column("key", sa.String))
    count = (sa.select(sa.func.count()).select_from(metrics)
             .where(metrics.c.run_id == latest.c.run_id, metrics.c.key == latest.c.key).scalar_subquery())
    op.execute(latest.update().values(n_rows=count))
    op.create_index("ix_metrics_run_key_step_value", "metrics", ["run_id", "key", "step", "value"])
    op.drop_index("ix_metrics_run_key_step", table_name="metrics")


def downgrade() -> None:
    op.create_index("ix_metrics_run_key_step", "metrics", ["run_id", "key", "step"])
    op.drop_index("ix_metrics_run_key_step_value", table_name="metrics")
    with op.batch_alter_table("latest_metrics") as batch:
        batch.drop_column("n_rows")
