"""One metric row per (run, key, step): a step sent twice is stored once.

Tracked runs report over a network that may lose answers: a client that retries a batch, or
replays its spool after the server came back, sends steps the store may already hold. A unique
index lets every write be an insert-or-ignore (``ON CONFLICT DO NOTHING`` on SQLite and
PostgreSQL alike). Rows that repeat a step today (a job resumed from a checkpoint re-logs the steps
after it) keep the row written last, as reads did before, and each series' row count is redone.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    metrics = sa.table("metrics", sa.column("id", sa.Integer), sa.column("run_id", sa.Integer),
                       sa.column("key", sa.String), sa.column("step", sa.BigInteger))
    # a derived table: PostgreSQL and SQLite both accept it in a DELETE on the same table
    keep = sa.select(sa.func.max(metrics.c.id).label("id")).group_by(
        metrics.c.run_id, metrics.c.key, metrics.c.step).subquery()
    op.execute(metrics.delete().where(metrics.c.id.not_in(sa.select(keep.c.id))))
    latest = sa.table("latest_metrics", sa.column("run_id", sa.Integer), sa.column("key", sa.String),
                      sa.column("n_rows", sa.BigInteger))
    count = (sa.select(sa.func.count()).select_from(metrics)
             .where(metrics.c.run_id == latest.c.run_id, metrics.c.key == latest.c.key).scalar_subquery())
    op.execute(latest.update().values(n_rows=count))
    op.create_index("ux_metrics_run_key_step", "metrics", ["run_id", "key", "step"], unique=True)


def downgrade() -> None:
    op.drop_index("ux_metrics_run_key_step", table_name="metrics")
