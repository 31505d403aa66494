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

from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

_OPTION = " WITHOUT ROWID"


def _rebuild(with_rowid: bool) -> None:
    conn = op.get_bind()
    if conn.dialect.name != "sqlite":
        return
    # the table as it stands (its CREATE statement, as SQLite keeps it), with or without the option
    create = conn.exec_driver_sql("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'metric_rollups'"
                                  ).scalar_one().rstrip()
    create = create.removesuffix(_OPTION) + ("" if with_rowid else _OPTION)
    op.rename_table("metric_rollups", "metric_rollups_old")
    op.execute(create)
    op.execute("INSERT INTO metric_rollups SELECT * FROM metric_rollups_old ORDER BY run_id, key, level, bucket")
    op.drop_table("metric_rollups_old")


def upgrade() -> None:
    _rebuild(with_rowid=False)


def downgrade() -> None:
    _rebuild(with_rowid=True)
