"""Initial run store: experiments, runs, params, metrics, latest metrics, window plans,
checkpoints and saved views.

Revision ID: 0001
Revises:
Create Date: 2025-01-01
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

_STATUSES = "('SCHEDULED', 'RUNNING', 'FINISHED', 'FAILED', 'KILLED')"


def _run_fk() -> sa.Column:
    return sa.Column("run_id", sa.Integer, sa.ForeignKey("runs.id", ondelete="CASCADE"), nullable=False)


def _value_columns() -> list[sa.Column]:
    """Columns shared by metrics and latest_metrics."""
    return [
        sa.Column("step", sa.BigInteger, nullable=False),
        sa.Column("value", sa.Float(53)),
        sa.Column("special", sa.String(8)),
        sa.Column("timestamp", sa.Float(53), nullable=False),
    ]


def upgrade() -> None:
    op.create_table(
        "experiments",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("name", sa.String(200), nullable=False, unique=True),
        sa.Column("read_only", sa.Boolean, nullable=False),
        sa.Column("created_at", sa.BigInteger, nullable=False),
    )
    op.create_table(
        "runs",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("experiment_id", sa.Integer, sa.ForeignKey("experiments.id", ondelete="CASCADE"),
                  nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("preset", sa.String(100)),
        sa.Column("config_json", sa.Text),
        sa.Column("checkpoint", sa.String(500)),
        sa.Column("data_hash", sa.String(128)),
        sa.Column("git_rev", sa.String(64)),
        sa.Column("seq_len", sa.Integer),
        sa.Column("created_at", sa.BigInteger, nullable=False),
        sa.Column("started_at", sa.BigInteger),
        sa.Column("ended_at", sa.BigInteger),
        sa.Column("progress_step", sa.BigInteger),
        sa.Column("total_steps", sa.BigInteger),
        sa.Column("error", sa.Text),
        sa.Column("read_only", sa.Boolean, nullable=False),
        sa.Column("pid", sa.Integer),
        sa.CheckConstraint(f"status IN {_STATUSES}", name="ck_runs_status"),
    )
    op.create_index("ix_runs_experiment_status", "runs", ["experiment_id", "status"])
    op.create_table(
        "params",
        _run_fk(),
        sa.Column("key", sa.String(250), nullable=False),
        sa.Column("value", sa.String(8000), nullable=False),
        sa.PrimaryKeyConstraint("run_id", "key"),
    )
    op.create_table(
        "metrics",
        sa.Column("id", sa.Integer, primary_key=True),
        _run_fk(),
        sa.Column("key", sa.String(250), nullable=False),
        *_value_columns(),
        sa.CheckConstraint("special IS NULL OR (value IS NULL AND special IN ('nan', 'inf', '-inf'))",
                           name="ck_metrics_special"),
    )
    op.create_index("ix_metrics_run_key_step", "metrics", ["run_id", "key", "step"])
    op.create_table(
        "latest_metrics",
        _run_fk(),
        sa.Column("key", sa.String(250), nullable=False),
        *_value_columns(),
        sa.PrimaryKeyConstraint("run_id", "key"),
    )
    op.create_table(
        "window_plans",
        _run_fk(),
        sa.Column("step", sa.BigInteger, nullable=False),
        sa.Column("layer", sa.Integer, nullable=False),
        sa.Column("head", sa.Integer, nullable=False),
        sa.Column("window", sa.Integer),
        sa.PrimaryKeyConstraint("run_id", "step", "layer", "head"),
    )
    op.create_table(
        "checkpoints",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("path", sa.String(500), nullable=False),
        sa.Column("run_id", sa.Integer, sa.ForeignKey("runs.id", ondelete="SET NULL")),
        sa.Column("preset", sa.String(100)),
        sa.Column("fingerprint", sa.String(64)),
        sa.Column("created_at", sa.BigInteger, nullable=False),
        sa.UniqueConstraint("path", name="uq_checkpoints_path"),
    )
    op.create_table(
        "views",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("name", sa.String(120), nullable=False),
        sa.Column("page", sa.String(64), nullable=False),
        sa.Column("state_json", sa.Text, nullable=False),
        sa.Column("created_at", sa.BigInteger, nullable=False),
    )


def downgrade() -> None:
    for table in ("views", "checkpoints", "window_plans", "latest_metrics", "metrics", "params", "runs",
                  "experiments"):
        op.drop_table(table)
