"""Registered models keep the size of their evaluation sets: `eval_tokens` (tokens per eval set,
null for the default of 4 sequences).

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-02
"""

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("checkpoints") as batch:
        batch.add_column(sa.Column("eval_tokens", sa.Integer))


def downgrade() -> None:
    with op.batch_alter_table("checkpoints") as batch:
        batch.drop_column("eval_tokens")
