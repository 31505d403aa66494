"""Rollups count their non-finite rows (``metric_rollups.n_nonfinite``): a downsampled read keeps
each bucket's finite extremes, so a NaN or an inf inside a bucket of finite values used to vanish
from every chart. With a count per bucket, a read finds the buckets that hold such rows and returns
them (backend/downsample.py) without scanning the finite ones. Series stored before this revision
get their counts here: the buckets of each series between its first and its last non-finite step
are rebuilt from its rows (the code that keeps them afterwards); every other bucket counts 0.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-02
"""

import sqlalchemy as sa
from alembic import op

from backend.store import rollups

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

_COLUMNS = (*rollups.BASE_COLUMNS, "n_nonfinite")  # the rollup columns as of this revision


def upgrade() -> None:
    with op.batch_alter_table("metric_rollups") as batch:
        batch.add_column(sa.Column("n_nonfinite", sa.BigInteger, nullable=False, server_default="0"))
    metrics = sa.table("metrics", sa.column("run_id", sa.Integer), sa.column("key", sa.String),
                       sa.column("step", sa.BigInteger), sa.column("special", sa.String))
    conn = op.get_bind()
    series = conn.execute(sa.select(metrics.c.run_id, metrics.c.key, sa.func.min(metrics.c.step),
                                    sa.func.max(metrics.c.step)).where(metrics.c.special.is_not(None))
                          .group_by(metrics.c.run_id, metrics.c.key)).all()
    for run_id, key, first, last in series:
        rollups.rebuild(conn, run_id, key, first, last, _COLUMNS)


def downgrade() -> None:
    with op.batch_alter_table("metric_rollups") as batch:
        batch.drop_column("n_nonfinite")
