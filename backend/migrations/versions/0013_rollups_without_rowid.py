"""SQLite keeps ``metric_rollups`` in its primary key's order (``WITHOUT ROWID``): a zoom reads a few
thousand consecutive rollup rows of one series and level, which in a rowid table are scattered among
every other series' rows in write order, each found through the key's index and then looked up again
by rowid. Clustered, they come from a few adjacent pages. (The 50-client zoom bench:
README.md, "Computed ranges (zooms)".) PostgreSQL is left as it is.

The table is copied once (a few seconds for a store with millions of metric rows).

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-02
"""

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

_COLUMNS = ("run_id", "key", "level", "bucket", "first_step", "first_ts", "lo_step", "lo_value", "lo_ts",
            "hi_step", "hi_value", "hi_ts", "n_nonfinite")


def _rebuild(with_rowid: bool) -> None:
    if op.get_bind().dialect.name != "sqlite":
        return
    op.rename_table("metric_rollups", "metric_rollups_old")
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
        sa.Column("n_nonfinite", sa.BigInteger, nullable=False, server_default="0"),
        sqlite_with_rowid=with_rowid,
    )
    columns = ", ".join(_COLUMNS)
    op.execute(f"INSERT INTO metric_rollups ({columns}) SELECT {columns} FROM metric_rollups_old "
               "ORDER BY run_id, key, level, bucket")
    op.drop_table("metric_rollups_old")


def upgrade() -> None:
    _rebuild(with_rowid=False)


def downgrade() -> None:
    _rebuild(with_rowid=True)
