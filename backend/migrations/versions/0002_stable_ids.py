"""Never reuse run or view ids; index runs by status.

Run and view ids appear in shared links and saved views, so a deleted run's id must not come
back for a different run: SQLite only guarantees that with AUTOINCREMENT, which needs the table
rebuilt (batch mode copies every row, ids included). PostgreSQL's sequences never reuse an id, so
there the tables are left as they are. The status index serves the startup check
for runs left active and the runs page's status filter.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29
"""

from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def _rebuild(autoincrement: bool) -> None:
    if op.get_bind().dialect.name != "sqlite":
        return
    for table in ("runs", "views"):
        with op.batch_alter_table(table, recreate="always", table_kwargs={"sqlite_autoincrement": autoincrement}):
            pass


def upgrade() -> None:
    _rebuild(True)
    op.create_index("ix_runs_status", "runs", ["status"])


def downgrade() -> None:
    op.drop_index("ix_runs_status", table_name="runs")
    _rebuild(False)
