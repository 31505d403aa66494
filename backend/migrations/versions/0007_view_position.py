"""Saved views keep an order of their own: `position` (null until the views are reordered; views are
listed by position, then by id, so a new view comes last).

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("views") as batch:
        batch.add_column(sa.Column("position", sa.Integer))


def downgrade() -> None:
    with op.batch_alter_table("views") as batch:
        batch.drop_column("position")
