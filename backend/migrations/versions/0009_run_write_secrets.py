"""Tracked runs get a write secret: `runs.write_secret_hash`, the SHA-256 of the secret their client was
given (or chose) when it created the run. Every later tracking write to the run must carry the secret.

Runs stored before this revision have none, so no client can write to them over tracking any more (a
spool written by an older client is refused with a 403 that says so).

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-02
"""

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("write_secret_hash", sa.String(64)))


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("write_secret_hash")
