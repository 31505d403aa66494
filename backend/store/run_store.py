"""The run store: functions over a ``Session`` that return schemas, never ORM rows.

Commit and rollback belong to the caller's ``db.transaction``; these functions only read
and write. Domain failures raise ``errors.NotFound`` / ``Conflict`` (mapped to HTTP once).
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from itertools import islice
from typing import TypeVar, cast

from sqlalchemy import CursorResult, delete, func, select, text, update
from sqlalchemy.orm import Session

from aah_core.windows import JsonPlan, plan_to_json
from backend.schemas.errors import Conflict, NotFound
from backend.schemas.runs import Progress, RunPublic
from backend.store.db import driver_rows, upsert
from backend.store.tables import (
    ACTIVE_STATUSES,
    Experiment,
    LatestMetric,
    Metric,
    MetricRollup,
    Param,
    Run,
    RunTag,
    WindowAssignment,
)

T = TypeVar("T")
IN_BATCH = 500  # bound parameters per IN list or OR of ranges (SQLite allows 32,766 a statement)
SUMMARY_KEYS = 100  # latest values a run's summary lists (by key name); RunPublic.n_keys counts them all


def batched(items: Sequence[T], size: int = IN_BATCH) -> Iterator[list[T]]:
    """``items`` in lists of at most ``size``: long IN lists go to the database in batches."""
    it = iter(items)
    while chunk := list(islice(it, size)):
        yield chunk


def now_ms() -> int:
    return int(time.time() * 1000)


def iso(ms: int | None) -> str | None:
    return None if ms is None else datetime.fromtimestamp(ms / 1000, UTC).isoformat()


# ---- experiments and runs ----------------------------------------------------------------

def check_experiment_writable(s: Session, name: str) -> None:
    """Conflict when `name` is a read-only (reference) experiment: it takes no new run of ours."""
    if s.scalar(select(Experiment.read_only).where(Experiment.name == name)):
        raise Conflict(f"experiment {name!r} is read-only (a reference experiment); file the run under another "
                       "experiment")


def ensure_experiment(s: Session, name: str, read_only: bool = False) -> int:
    """The experiment's id, created if new (a read-only one only takes read-only runs)."""
    if not read_only:
        check_experiment_writable(s, name)
    exp_id = s.scalar(select(Experiment.id).where(Experiment.name == name))
    if exp_id is None:
        exp = Experiment(name=name, read_only=read_only, created_at=now_ms())
        s.add(exp)
        s.flush()
        exp_id = exp.id
    return exp_id


def create_run(s: Session, *, name: str, experiment: str, status: str = "SCHEDULED", preset: str | None = None,
               params: dict[str, str] | None = None, config: dict | None = None, read_only: bool = False,
               seq_len: int | None = None, total_steps: int | None = None, checkpoint: str | None = None,
               data_hash: str | None = None, git_rev: str | None = None, source: str = "job",
               group: str | None = None, seed: int | None = None, description: str | None = None,
               client_key: str | None = None, tags: Sequence[str] = (), target: str = "local") -> int:
    run = Run(name=name, experiment_id=ensure_experiment(s, experiment, read_only=read_only), status=status,
              preset=preset, config_json=None if config is None else json.dumps(config), read_only=read_only,
              seq_len=seq_len, total_steps=total_steps, checkpoint=checkpoint, data_hash=data_hash,
              git_rev=git_rev, created_at=now_ms(), source=source, group_name=group, seed=seed,
              description=description, client_key=client_key, target=target)
    s.add(run)
    s.flush()
    if params:
        log_params(s, run.id, params)
    s.add_all(RunTag(run_id=run.id, tag=tag) for tag in dict.fromkeys(tags))
    return run.id


def _run_row(s: Session, run_id: int) -> Run:
    run = s.get(Run, run_id)
    if run is None:
        raise NotFound(f"run {run_id} not found")
    return run


_RUN_EXISTS = text("SELECT 1 FROM runs WHERE id = :run")  # (loading the ORM row cost ~5x the read)


def run_exists(s: Session, run_id: int) -> None:
    if not driver_rows(s.connection(), _RUN_EXISTS, {"run": run_id}):
        raise NotFound(f"run {run_id} not found")


def writable_run(s: Session, run_id: int) -> Run:
    """The run, or 404 if there is none and 409 if it is read-only (a reference experiment)."""
    run = _run_row(s, run_id)
    if run.read_only:
        raise Conflict(f"run {run_id} is read-only (a reference experiment)")
    return run


def run_config(s: Session, run_id: int) -> dict | None:
    raw = _run_row(s, run_id).config_json
    return None if raw is None else json.loads(raw)


def runs_public(s: Session, run_ids: Sequence[int]) -> list[RunPublic]:
    """RunPublic for the given ids, in that order, with params and summaries loaded in bulk."""
    if not run_ids:
        return []
    rows = s.execute(select(Run, Experiment.name).join(Experiment).where(Run.id.in_(run_ids))).all()
    by_id = {run.id: (run, exp) for run, exp in rows}
    params: dict[int, dict[str, str]] = defaultdict(dict)
    for run_id, key, value in s.execute(select(Param.run_id, Param.key, Param.value)
                                        .where(Param.run_id.in_(run_ids))):
        params[run_id][key] = value
    summary = latest_values(s, run_ids, SUMMARY_KEYS)
    n_keys = key_counts(s, run_ids)
    tags: dict[int, list[str]] = defaultdict(list)
    for run_id, tag in s.execute(select(RunTag.run_id, RunTag.tag).where(RunTag.run_id.in_(run_ids))
                                 .order_by(RunTag.tag)):
        tags[run_id].append(tag)
    out = []
    for run_id in run_ids:
        if run_id not in by_id:
            raise NotFound(f"run {run_id} not found")
        run, exp = by_id[run_id]
        progress = None
        if run.total_steps:
            progress = Progress(step=run.progress_step or 0, total_steps=run.total_steps)
        out.append(RunPublic(
            id=run.id, name=run.name, experiment=exp, status=run.status, preset=run.preset,
            params=params[run_id], summary=summary.get(run_id, {}), n_keys=n_keys.get(run_id, 0),
            created_at=iso(run.created_at),
            started_at=iso(run.started_at), ended_at=iso(run.ended_at), progress=progress, error=run.error,
            read_only=run.read_only, checkpoint=run.checkpoint, data_hash=run.data_hash, git_rev=run.git_rev,
            source=run.source, group=run.group_name, seed=run.seed, description=run.description, notes=run.notes,
            tags=tags[run_id], target=run.target, engine_job_id=run.engine_job_id, engine_state=run.engine_state,
            pending_reason=run.pending_reason,
        ))
    return out


def get_run(s: Session, run_id: int) -> RunPublic:
    return runs_public(s, [run_id])[0]


def list_runs(s: Session, *, experiment: str | None = None, preset: str | None = None,
              status: str | None = None, source: str | None = None, group: str | None = None,
              tag: str | None = None, limit: int = 100, offset: int = 0) -> list[RunPublic]:
    query = select(Run.id).join(Experiment)
    if experiment is not None:
        query = query.where(Experiment.name == experiment)
    for column, value in ((Run.preset, preset), (Run.status, status), (Run.source, source), (Run.group_name, group)):
        if value is not None:
            query = query.where(column == value)
    if tag is not None:
        query = query.where(Run.id.in_(select(RunTag.run_id).where(RunTag.tag == tag)))
    ids = list(s.scalars(query.order_by(Run.id.desc()).limit(limit).offset(offset)))
    return runs_public(s, ids)


def count_runs(s: Session) -> int:
    return s.scalar(select(func.count(Run.id))) or 0


_MUTABLE = {"status", "checkpoint", "data_hash", "git_rev", "seq_len", "started_at", "ended_at",
            "progress_step", "total_steps", "error", "pid", "config_json", "engine_job_id", "engine_state",
            "pending_reason", "write_secret_hash"}


def update_run(s: Session, run_id: int, **fields: object) -> None:
    unknown = set(fields) - _MUTABLE
    if unknown:
        raise ValueError(f"cannot update run fields {sorted(unknown)}")
    run = writable_run(s, run_id)
    for key, value in fields.items():
        setattr(run, key, value)


def is_active(s: Session, run_id: int) -> bool:
    return _run_row(s, run_id).status in ACTIVE_STATUSES


def advance_run(s: Session, run_id: int, **fields: object) -> bool:
    """Update a run that is still active, in one conditional UPDATE: a run another request ended meanwhile
    (a cancel) is left alone, whatever its caller read before."""
    unknown = set(fields) - _MUTABLE
    if unknown:
        raise ValueError(f"cannot update run fields {sorted(unknown)}")
    result = s.execute(update(Run).where(Run.id == run_id, Run.status.in_(ACTIVE_STATUSES)).values(**fields))
    return cast(CursorResult, result).rowcount > 0


def end_run(s: Session, run_id: int, status: str, error: str | None = None) -> bool:
    """Move an active run to a final status; a run that already ended is left alone."""
    result = s.execute(update(Run).where(Run.id == run_id, Run.status.in_(ACTIVE_STATUSES))
                       .values(status=status, error=error, ended_at=now_ms(), pid=None, pending_reason=None))
    return cast(CursorResult, result).rowcount > 0  # an UPDATE's result is a cursor's (Session types it Result)


@dataclass(frozen=True)
class ActiveRun:
    id: int
    status: str
    pid: int | None
    created_at: int


def delete_runs(s: Session, run_ids: Sequence[int]) -> None:
    """Runs and everything of theirs: metric rows and rollups here (they have no foreign key), the
    rest by the foreign keys' cascade."""
    ids = list(run_ids)
    s.execute(delete(Metric).where(Metric.run_id.in_(ids)))
    s.execute(delete(MetricRollup).where(MetricRollup.run_id.in_(ids)))
    s.execute(delete(Run).where(Run.id.in_(ids)))


def active_job_runs(s: Session) -> list[ActiveRun]:
    """SCHEDULED/RUNNING runs of this service's local training jobs (tracked runs and jobs on cluster
    targets have no worker here)."""
    rows = s.execute(select(Run.id, Run.status, Run.pid, Run.created_at)
                     .where(Run.status.in_(ACTIVE_STATUSES), Run.source == "job", Run.target == "local")
                     .order_by(Run.id))
    return [ActiveRun(*row) for row in rows]


@dataclass(frozen=True)
class EngineJob:
    """A job run on a cluster target as the poller follows it."""

    id: int
    status: str
    target: str
    engine_job_id: str | None
    engine_state: str | None
    created_at: int
    error: str | None


def engine_jobs(s: Session) -> list[EngineJob]:
    """Runs on cluster targets that are active, or ended here while their engine had not ended them yet
    (a cancel the engine has not confirmed)."""
    rows = s.execute(select(Run.id, Run.status, Run.target, Run.engine_job_id, Run.engine_state, Run.created_at,
                            Run.error)
                     .where(Run.target != "local", Run.source == "job",
                            Run.status.in_(ACTIVE_STATUSES) | Run.engine_state.in_(("PENDING", "RUNNING")))
                     .order_by(Run.id))
    return [EngineJob(*row) for row in rows]


def count_active_jobs(s: Session, target: str) -> int:
    return s.scalar(select(func.count(Run.id)).where(Run.target == target, Run.source == "job",
                                                     Run.status.in_(ACTIVE_STATUSES))) or 0


def run_secret_hash(s: Session, run_id: int) -> str | None:
    return _run_row(s, run_id).write_secret_hash


# ---- params and metrics ------------------------------------------------------------------

def flatten_params(config: dict, prefix: str = "") -> dict[str, str]:
    """{"model": {"n_layer": 4}} -> {"model.n_layer": "4"}: a nested config as string params."""
    out: dict[str, str] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(flatten_params(value, f"{name}."))
        else:
            out[name] = json.dumps(value) if isinstance(value, (list, dict)) else str(value)
    return out


def log_params(s: Session, run_id: int, params: dict[str, str]) -> None:
    """Params are write-once: the same value again is fine, a different one is a conflict."""
    existing = dict(s.execute(select(Param.key, Param.value).where(Param.run_id == run_id)).tuples().all())
    for key, value in params.items():
        value = str(value)[:8000]
        if key in existing and existing[key] != value:
            raise Conflict(f"param {key!r} of run {run_id} is {existing[key]!r}; params cannot change")
        if key not in existing:
            s.add(Param(run_id=run_id, key=key[:250], value=value))


def latest_values(s: Session, run_ids: Sequence[int], per_run: int | None = None,
                  ) -> dict[int, dict[str, float | str | None]]:
    """Each run's latest value per key (a non-finite one as its kind: "nan", "inf", "-inf"); with
    ``per_run``, only the first so many keys by name (summaries of runs that log many keys stay small)."""
    out: dict[int, dict[str, float | str | None]] = defaultdict(dict)
    c = LatestMetric.__table__.c
    query = select(c.run_id, c.key, c.value, c.special)
    if per_run is not None:
        rank = func.row_number().over(partition_by=c.run_id, order_by=c.key).label("rank")
        ranked = select(c.run_id, c.key, c.value, c.special, rank).where(c.run_id.in_(run_ids)).subquery()
        query = select(*ranked.c[:4]).where(ranked.c.rank <= per_run)
    else:
        query = query.where(c.run_id.in_(run_ids))
    for run_id, key, value, special in s.execute(query.order_by(query.selected_columns[1])):
        out[run_id][key] = value if special is None else special
    return out


def key_counts(s: Session, run_ids: Sequence[int]) -> dict[int, int]:
    """Metric keys per run."""
    return dict(s.execute(select(LatestMetric.run_id, func.count()).where(LatestMetric.run_id.in_(run_ids))
                          .group_by(LatestMetric.run_id)).tuples().all())


# ---- window plans ------------------------------------------------------------------------

def log_plan(s: Session, run_id: int, step: int, windows: list[list[int | None]]) -> None:
    """Store a run's plan at ``step`` (replacing one already stored at that step)."""
    log_plans(s, run_id, [(step, windows)])


def log_plans(s: Session, run_id: int, plans: Iterable[tuple[int, list[list[int | None]]]]) -> None:
    """Store a run's plans, (step, windows) each, in one statement (replacing those already stored at their
    steps): an adaptive run's history holds a plan every few steps (800 in a 5,000-step suite run), and one
    statement per plan cost ~1.7 ms each where the rows themselves cost a few µs."""
    rows = [{"run_id": run_id, "step": int(step), "layer": layer, "head": head, "window": w}
            for step, windows in plans for layer, row in enumerate(windows) for head, w in enumerate(row)]
    if not rows:
        return
    stmt = upsert(s)(WindowAssignment)
    s.execute(stmt.on_conflict_do_update(index_elements=["run_id", "step", "layer", "head"],
                                         set_={"window": stmt.excluded.window}), rows)


@dataclass(frozen=True)
class RunPlan:
    steps: list[int]  # every step with a stored plan
    step: int  # the chosen one
    seq_len: int
    windows: list[list[int | None]]


def plan_steps(s: Session, run_id: int) -> list[int]:
    """Every step at which the run has a plan stored, in order."""
    return list(s.scalars(select(WindowAssignment.step).where(WindowAssignment.run_id == run_id)
                          .distinct().order_by(WindowAssignment.step)))


def read_plan(s: Session, run_id: int, step: int | None = None) -> RunPlan:
    """A run's plan at ``step`` (None = the latest stored)."""
    run = _run_row(s, run_id)
    steps = plan_steps(s, run_id)
    if not steps:
        raise NotFound(f"run {run_id} has no window plan stored")
    if step is None:
        step = steps[-1]
    elif step not in steps:
        raise NotFound(f"run {run_id} has no window plan at step {step}; stored steps: {_brief(steps)}")
    rows = s.execute(select(WindowAssignment.layer, WindowAssignment.head, WindowAssignment.window)
                     .where(WindowAssignment.run_id == run_id, WindowAssignment.step == step)).all()
    n_layer = max(r[0] for r in rows) + 1
    n_head = max(r[1] for r in rows) + 1
    plan: JsonPlan = [[None] * n_head for _ in range(n_layer)]
    seq_len = int(run.seq_len or json.loads(run.config_json or "{}").get("model", {}).get("seq_len", 0))
    for layer, head, window in rows:
        plan[layer][head] = window
    # full is written as null, whatever was stored (the engine's codec)
    return RunPlan(steps, step, seq_len, plan_to_json(plan, seq_len) if seq_len else plan)


def _brief(values: list[int], limit: int = 10) -> str:
    shown = ", ".join(str(v) for v in values[:limit])
    return shown + (f", ... ({len(values)} in all)" if len(values) > limit else "")
