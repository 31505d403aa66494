"""ORM tables (SQLAlchemy 2.0, typed). No pydantic here; rows never leave the store
package (``backend.store``).

Times are epoch milliseconds (BigInteger) except metric timestamps, which are epoch
seconds as floats (what training loops report). Windows are integers with NULL = full.
NaN and +-inf cannot round-trip through SQL reliably, so a non-finite metric is stored
with ``value = NULL`` and ``special`` in {'nan', 'inf', '-inf'}.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Float,
    ForeignKey,
    Index,
    Integer,
    SmallInteger,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

RUN_STATUSES = ("SCHEDULED", "PENDING", "RUNNING", "FINISHED", "FAILED", "KILLED")
# PENDING: queued by a cluster engine (a job of a ray or slurm target), waiting for resources
ACTIVE_STATUSES = ("SCHEDULED", "PENDING", "RUNNING")
SPECIAL_VALUES = ("nan", "inf", "-inf")
# where a run came from: a job of this service, a tracked process elsewhere, an imported run folder,
# the reproduction suite, the paper's reported numbers
RUN_SOURCES = ("job", "tracked", "imported", "suite", "paper")


class Base(DeclarativeBase):
    pass


class Experiment(Base):
    __tablename__ = "experiments"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    read_only: Mapped[bool] = mapped_column(Boolean, default=False)
    created_at: Mapped[int] = mapped_column(BigInteger)


class Run(Base):
    __tablename__ = "runs"
    __table_args__ = (
        CheckConstraint(f"status IN {RUN_STATUSES!r}", name="ck_runs_status"),
        CheckConstraint(f"source IN {RUN_SOURCES!r}", name="ck_runs_source"),
        Index("ix_runs_experiment_status", "experiment_id", "status"),
        Index("ix_runs_status", "status"),
        Index("ix_runs_source", "source"),
        Index("ix_runs_group_name", "group_name"),
        Index("ux_runs_client_key", "client_key", unique=True),
        Index("ix_runs_target_status", "target", "status"),
        {"sqlite_autoincrement": True},  # ids are in links and saved views: never reuse one
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    experiment_id: Mapped[int] = mapped_column(ForeignKey("experiments.id", ondelete="CASCADE"))
    status: Mapped[str] = mapped_column(String(16))
    preset: Mapped[str | None] = mapped_column(String(100))
    config_json: Mapped[str | None] = mapped_column(Text)
    checkpoint: Mapped[str | None] = mapped_column(String(500))  # relative to the data dir
    data_hash: Mapped[str | None] = mapped_column(String(128))
    git_rev: Mapped[str | None] = mapped_column(String(64))
    seq_len: Mapped[int | None] = mapped_column(Integer)
    created_at: Mapped[int] = mapped_column(BigInteger)
    started_at: Mapped[int | None] = mapped_column(BigInteger)
    ended_at: Mapped[int | None] = mapped_column(BigInteger)
    progress_step: Mapped[int | None] = mapped_column(BigInteger)
    total_steps: Mapped[int | None] = mapped_column(BigInteger)
    error: Mapped[str | None] = mapped_column(Text)
    read_only: Mapped[bool] = mapped_column(Boolean, default=False)
    pid: Mapped[int | None] = mapped_column(Integer)
    source: Mapped[str] = mapped_column(String(16), default="job", server_default="job")
    group_name: Mapped[str | None] = mapped_column(String(200))  # e.g. a suite row; seeds of one setting
    seed: Mapped[int | None] = mapped_column(Integer)
    description: Mapped[str | None] = mapped_column(Text)
    notes: Mapped[str | None] = mapped_column(Text)
    client_key: Mapped[str | None] = mapped_column(String(128))  # makes tracked/imported creation idempotent
    # jobs on targets (services/target_jobs.py): where the job runs, the engine's id of it, what the
    # engine last said of it and why it waits
    target: Mapped[str] = mapped_column(String(32), default="local", server_default="local")
    engine_job_id: Mapped[str | None] = mapped_column(String(128))
    engine_state: Mapped[str | None] = mapped_column(String(16))
    pending_reason: Mapped[str | None] = mapped_column(String(1000))
    # SHA-256 (hex) of a tracked run's write secret; NULL: no client may write to the run over tracking
    write_secret_hash: Mapped[str | None] = mapped_column(String(64))


class RunTag(Base):
    __tablename__ = "run_tags"
    __table_args__ = (Index("ix_run_tags_tag", "tag"),)

    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    tag: Mapped[str] = mapped_column(String(64), primary_key=True)


class Param(Base):
    __tablename__ = "params"

    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    key: Mapped[str] = mapped_column(String(250), primary_key=True)
    value: Mapped[str] = mapped_column(String(8000))


class _MetricValue:
    """The columns a metric row and a latest-metric row share."""

    step: Mapped[int] = mapped_column(BigInteger)
    value: Mapped[float | None] = mapped_column(Float(53))
    special: Mapped[str | None] = mapped_column(String(8))
    timestamp: Mapped[float] = mapped_column(Float(53))


class Metric(_MetricValue, Base):
    """One point of a series. No foreign key on ``run_id``: PostgreSQL checks one per row (a third of a
    batch insert's time), while every batch is for one run, which metric_store.log_metrics checks and locks
    once; store.delete_runs removes a run's points and rollups with it."""

    __tablename__ = "metrics"
    __table_args__ = (
        CheckConstraint("special IS NULL OR (value IS NULL AND special IN ('nan', 'inf', '-inf'))",
                        name="ck_metrics_special"),
        Index("ux_metrics_run_key_step", "run_id", "key", "step", unique=True),  # a step sent twice is stored once
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = mapped_column(Integer)
    key: Mapped[str] = mapped_column(String(250))


class LatestMetric(_MetricValue, Base):
    """The newest value per (run, key), kept in the same transaction as the metric rows."""

    __tablename__ = "latest_metrics"

    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    key: Mapped[str] = mapped_column(String(250), primary_key=True)
    n_rows: Mapped[int] = mapped_column(BigInteger, server_default="0")  # metric rows of this series


class MetricRollup(Base):
    """One step bucket of a metric series at one level: its first row, the rows of its finite minimum
    and maximum and its count of non-finite rows (backend/store/rollups.py keeps them; downsampled reads of
    long ranges read these rows).
    Written with the metric rows, so, like them, without a foreign key (see Metric)."""

    __tablename__ = "metric_rollups"
    # SQLite: rows in key order, so a zoom's rollup rows of one series and level sit on adjacent pages
    __table_args__ = {"sqlite_with_rowid": False}

    run_id: Mapped[int] = mapped_column(Integer, primary_key=True)
    key: Mapped[str] = mapped_column(String(250), primary_key=True)
    level: Mapped[int] = mapped_column(SmallInteger, primary_key=True)
    bucket: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    first_step: Mapped[int] = mapped_column(BigInteger)
    first_ts: Mapped[float] = mapped_column(Float(53))
    lo_step: Mapped[int | None] = mapped_column(BigInteger)
    lo_value: Mapped[float | None] = mapped_column(Float(53))
    lo_ts: Mapped[float | None] = mapped_column(Float(53))
    hi_step: Mapped[int | None] = mapped_column(BigInteger)
    hi_value: Mapped[float | None] = mapped_column(Float(53))
    hi_ts: Mapped[float | None] = mapped_column(Float(53))
    n_nonfinite: Mapped[int] = mapped_column(BigInteger, server_default="0")  # rows that are NaN or +-inf


class WindowAssignment(Base):
    """One head's window in a run's plan at one step (NULL = full)."""

    __tablename__ = "window_plans"

    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    step: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    layer: Mapped[int] = mapped_column(Integer, primary_key=True)
    head: Mapped[int] = mapped_column(Integer, primary_key=True)
    window: Mapped[int | None] = mapped_column(Integer)


class Checkpoint(Base):
    """A model the service can load: a checkpoint inside the data dir, or a registered model folder."""

    __tablename__ = "checkpoints"
    __table_args__ = (UniqueConstraint("path", name="uq_checkpoints_path"),)

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    path: Mapped[str] = mapped_column(String(4096))  # relative to the data dir, or absolute under AAH_MODEL_DIRS
    run_id: Mapped[int | None] = mapped_column(ForeignKey("runs.id", ondelete="SET NULL"))
    preset: Mapped[str | None] = mapped_column(String(100))
    fingerprint: Mapped[str | None] = mapped_column(String(64))
    seq_len: Mapped[int | None] = mapped_column(Integer)  # evaluation context of a registered HF model (None: default)
    eval_tokens: Mapped[int | None] = mapped_column(Integer)  # tokens per evaluation set (None: the default batch)
    created_at: Mapped[int] = mapped_column(BigInteger)


class View(Base):
    """A saved dashboard state (name + page + JSON) for presenting."""

    __tablename__ = "views"
    __table_args__ = {"sqlite_autoincrement": True}

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(120))
    page: Mapped[str] = mapped_column(String(64))
    state_json: Mapped[str] = mapped_column(Text)
    created_at: Mapped[int] = mapped_column(BigInteger)
    position: Mapped[int | None] = mapped_column(Integer)  # set by PUT /views/order; null: after those, by id
