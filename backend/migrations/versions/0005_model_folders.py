"""Registered model folders: a checkpoint row may hold an absolute path under AAH_MODEL_DIRS
(up to 4096 characters) and the evaluation context chosen when the folder was registered.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("checkpoints") as batch:
        batch.alter_column("path", existing_type=sa.String(500), type_=sa.String(4096), existing_nullable=False)
        batch.add_column(sa.Column("seq_len", sa.Integer))


def downgrade() -> None:
    with op.batch_alter_table("checkpoints") as batch:
        batch.drop_column("seq_len")
        batch.alter_column("path", existing_type=sa.String(4096), type_=sa.String(500), existing_nullable=False)
