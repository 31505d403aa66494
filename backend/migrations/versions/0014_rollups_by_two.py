"""Rollup levels two times apart instead of four (``width(l) = 16 * 2**l``; backend/rollups.py): a zoom's
buckets hold 1-2 cells of the level it reads instead of 1-4, and reading and merging those cells was
most of a zoom's work on the server (README.md, "Zooms"). Level 0 (16 steps) is the same in both
layouts, so every level above it is recomputed from it; the downgrade does the same at four.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-04
"""

from alembic import op

from backend.store import rollups

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    rollups.rebuild_levels(op.get_bind(), factor=2, levels=23)


def downgrade() -> None:
    rollups.rebuild_levels(op.get_bind(), factor=4, levels=12)
