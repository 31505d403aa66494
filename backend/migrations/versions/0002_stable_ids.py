"""Never reuse run or view ids; index runs by status.

Run and view ids appear in shared links and saved views, so a deleted run's id must not come
back for a different run: SQLite only guarantees that with AUTOINCREMENT, which needs the table
rebuilt (batch mode copies every row, ids included). The status index serves the startup check
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


def upgrade() -> None:
    for table in ("runs", "views"):
        with op.batch_alter_table(table, recreate="always", table_kwargs={"sqlite_autoincrement": True}):
            pass
    op.create_index("ix_runs_status", "runs", ["status"])


def downgrade() -> None:
    op.drop_index("ix_runs_status", table_name="runs")
    for table in ("runs", "views"):
        with op.batch_alter_table(table, recreate="always", table_kwargs={"sqlite_autoincrement": False}):
            pass
