"""Tracked runs: training processes elsewhere (``aah train --tracking-uri``, ``aah import``) create
their run, send metric and plan batches and their status, and upload their checkpoint.

Everything is idempotent, because a client retries and replays its spool: a run key names one run,
a (key, step) metric or a plan step already stored is ignored, a final status sent again changes
nothing, and a checkpoint uploaded again replaces itself.

Records have owners: creating a run gives its client a write secret (its own, or one made here and
answered once); only its SHA-256 is stored, and every later write must carry the secret (403
otherwise). Runs without one (jobs of this service, the seeded demo, suite and paper runs) take no
tracking writes. A run that has ended takes no new points (409) but accepts a replay of points it holds
with the same values; a stored plan is never replaced by a different one (409).
"""

from __future__ import annotations

import hashlib
import hmac
import itertools
import json
import math
import secrets
import shutil
import threading
import uuid
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from aah_core.checkpoint import FILES, CheckpointInfo, verify_checkpoint
from aah_core.config import RunConfig
from aah_core.errors import AAHError
from aah_core.windows import plan_to_json, validate_plan
from backend.schemas.errors import Conflict, Forbidden, InvalidInput, NotFound
from backend.schemas.runs import RunPublic
from backend.schemas.tracking import (
    SECRET_HEADER,
    CheckpointPublic,
    LogBatch,
    LogResult,
    MetricValue,
    StatusUpdate,
    TrackedRunCreate,
    TrackedRunPublic,
)
from backend.store import catalog, metric_store, run_store
from backend.store.tables import ACTIVE_STATUSES, Run

TRACKED_SOURCES = ("tracked", "imported", "suite")
TRACKED_DIR = "tracked"  # under the data dir: one folder per run with an uploaded checkpoint
_COMMITS = threading.Lock()
_SPECIAL = {None: math.nan, "nan": math.nan, "inf": math.inf, "-inf": -math.inf}


def secret_hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def create_tracked_run(s: Session, body: TrackedRunCreate) -> TrackedRunPublic:
    """The run named by ``body.run_key``: created RUNNING the first time, the same run afterwards.

    Only the first answer carries the write secret; a repeated create answers the run without it."""
    existing = s.scalar(select(Run.id).where(Run.client_key == body.run_key))
    if existing is not None:
        return TrackedRunPublic(created=False, run=run_store.get_run(s, existing))
    secret = body.write_secret or secrets.token_urlsafe(32)
    try:
        config = RunConfig.from_dict(body.config)
    except (AAHError, KeyError, TypeError, ValueError) as exc:
        raise InvalidInput(f"config: not a valid run configuration: {exc}") from None
    try:
        with s.begin_nested():  # a concurrent create of the same key loses here, and reads the winner
            run_id = run_store.create_run(
                s, name=body.name, experiment=body.experiment, status="RUNNING", preset=body.preset,
                params=run_store.flatten_params(config.to_dict()), config=config.to_dict(), seq_len=config.model.seq_len,
                total_steps=body.total_steps, data_hash=body.data_hash, git_rev=body.git_rev, source=body.source,
                group=body.group, seed=body.seed, description=body.description, client_key=body.run_key,
                tags=body.tags)
            run_store.update_run(s, run_id, started_at=run_store.now_ms(), progress_step=body.start_step,
                                 write_secret_hash=secret_hash(secret))
    except IntegrityError:
        existing = s.scalar(select(Run.id).where(Run.client_key == body.run_key))
        if existing is None:
            raise
        return TrackedRunPublic(created=False, run=run_store.get_run(s, existing))
    return TrackedRunPublic(created=True, run=run_store.get_run(s, run_id), write_secret=secret)


def _tracked_run(s: Session, run_id: int, secret: str | None) -> Run:
    """The run, when ``secret`` is its write secret (compared in constant time); 403 otherwise. A job this
    server submitted to a cluster target writes to its own run like a tracked client (services/target_jobs.py
    made the run and its secret); its first write says it runs."""
    run = s.get(Run, run_id)
    if run is None:
        raise NotFound(f"run {run_id} not found")
    cluster_job = run.source == "job" and run.target != "local"
    if run.read_only or (run.source not in TRACKED_SOURCES and not cluster_job) or run.write_secret_hash is None:
        raise Forbidden(f"run {run_id} is read-only for tracking: only the client that created a run over "
                        "tracking may write to it (jobs, the demo, the shipped suite and the paper's runs take "
                        "no tracking writes; runs created before write secrets existed neither)")
    if secret is None:
        raise Forbidden(f"writes to run {run_id} need its write secret in the {SECRET_HEADER} header (answered "
                        "once, when the run was created)")
    if not hmac.compare_digest(secret_hash(secret), run.write_secret_hash):
        raise Forbidden(f"the {SECRET_HEADER} header does not hold run {run_id}'s write secret")
    if cluster_job and run.status in ("SCHEDULED", "PENDING"):  # it reports: it runs (the engine's poll may lag)
        run.status, run.pending_reason, run.started_at = "RUNNING", None, run.started_at or run_store.now_ms()
    return run


def _value(value: MetricValue) -> float:
    return _SPECIAL[value] if value is None or isinstance(value, str) else float(value)


def _metric_rows(body: LogBatch) -> list[metric_store.MetricRow]:
    """The batch's points as (key, step, value, time) rows: its ``metrics``, then its ``series`` columns."""
    rows = [(p.key, p.step, _value(p.value), p.time) for p in body.metrics]
    for key, columns in body.series.items():
        rows.extend(zip(itertools.repeat(key), columns.step, map(_value, columns.value), columns.time))
    return rows


def log_batch(s: Session, run_id: int, body: LogBatch, secret: str | None, max_keys: int | None = None) -> LogResult:
    """Store a batch of metric points and plans, ignoring what is stored already; move progress forward
    (``max_keys``: the most metric keys the run may hold, AAH_MAX_METRIC_KEYS).

    An ended run takes only what it holds already (a replayed spool): nothing new, nothing different."""
    run = _tracked_run(s, run_id, secret)
    rows = _metric_rows(body)
    plans = _checked_plans(run, body)
    ended = run.status not in ACTIVE_STATUSES
    if ended:
        _check_replay(s, run, rows)
    written = 0 if ended else metric_store.log_metrics(s, run_id, rows, max_keys)
    stored = _stored_plans(s, run_id, [step for step, _ in plans])
    new_plans: list[tuple[int, list[list[int | None]]]] = []
    for step, windows in plans:
        if step in stored:
            if stored[step] != windows:
                raise Conflict(f"run {run_id} has a different plan stored at step {step}; a stored plan is never "
                               "replaced")
        elif ended:
            raise Conflict(f"run {run_id} already ended ({run.status}); it takes no new plan (step {step})")
        else:
            new_plans.append((step, windows))
            stored[step] = windows
    run_store.log_plans(s, run_id, new_plans)
    if not ended and body.step is not None and body.step > (run.progress_step or 0):
        run.progress_step = body.step
    return LogResult(run_id=run_id, metrics_written=written, plans_written=len(new_plans))


def _checked_plans(run: Run, body: LogBatch) -> list[tuple[int, list[list[int | None]]]]:
    """The batch's plans validated against the run's model, as (step, plan JSON with full as null)."""
    model = json.loads(run.config_json or "{}").get("model", {})
    n_layer, n_head, seq_len = model.get("n_layer"), model.get("n_head"), model.get("seq_len")
    plans = []
    for i, plan in enumerate(body.plans):
        try:
            checked = validate_plan(plan.windows, n_layer, n_head, seq_len)
        except AAHError as exc:
            raise InvalidInput(f"plans.{i} (step {plan.step}): {exc}") from None
        plans.append((plan.step, plan_to_json(checked, seq_len)))
    return plans


def _stored_plans(s: Session, run_id: int, steps: list[int]) -> dict[int, list[list[int | None]]]:
    """The run's stored plans at those of ``steps`` that have one."""
    if not steps:
        return {}
    held = set(steps).intersection(run_store.plan_steps(s, run_id))
    return {step: run_store.read_plan(s, run_id, step).windows for step in held}


def _check_replay(s: Session, run: Run, rows: list[metric_store.MetricRow]) -> None:
    """409 unless every point is stored already with the same value (a replay to an ended run)."""
    wanted: dict[str, dict[int, tuple[float | None, str | None]]] = {}
    for key, step, value, _ in rows:  # a step twice in one batch: the first counts, as log_metrics stores it
        wanted.setdefault(key, {}).setdefault(int(step), metric_store.split_value(value))
    for key, points in wanted.items():
        held = metric_store.stored_values(s, run.id, key, sorted(points))
        for step, point in sorted(points.items()):
            if step not in held:
                raise Conflict(f"run {run.id} already ended ({run.status}); it takes no new points ({key!r} at "
                               f"step {step})")
            if held[step] != point:
                raise Conflict(f"run {run.id} already ended ({run.status}); {key!r} at step {step} is stored with "
                               "another value, which stays")


def set_status(s: Session, run_id: int, body: StatusUpdate, secret: str | None) -> RunPublic:
    """RUNNING (a run that is running already), or end the run; the same final status again is a no-op
    (an ended run changes no more: neither its progress nor its checkpoint reference)."""
    run = _tracked_run(s, run_id, secret)
    if run.status not in ACTIVE_STATUSES:
        if body.status != run.status:
            raise Conflict(f"run {run_id} already ended as {run.status}; it cannot become {body.status}")
        return run_store.get_run(s, run_id)
    if body.step is not None and body.step > (run.progress_step or 0):
        run.progress_step = body.step
    if body.checkpoint_ref is not None and not catalog.find_checkpoint_by_path(s, run.checkpoint or ""):
        run.checkpoint = body.checkpoint_ref  # a reference only: the model stays on the training machine
    if body.status != "RUNNING" and not run_store.end_run(s, run_id, body.status, body.error):
        s.refresh(run)  # another request ended it meanwhile: the same status is that request's twin
        if run.status != body.status:
            raise Conflict(f"run {run_id} already ended as {run.status}; it cannot become {body.status}")
    s.flush()
    s.expire(run)
    return run_store.get_run(s, run_id)


# ---- checkpoint upload -------------------------------------------------------------------

def checkpoint_dirs(data_dir: Path, run_id: int) -> tuple[Path, Path]:
    """(staging folder for uploaded files, the run's checkpoint folder), both under the data dir."""
    root = data_dir / TRACKED_DIR / f"run-{run_id}"
    return root / ".upload", root / "checkpoint"


def check_upload(s: Session, run_id: int, name: str, secret: str | None) -> None:
    """Only the checkpoint's own files (safetensors + JSON), and only by the client that created the run."""
    _tracked_run(s, run_id, secret)
    if name not in FILES:
        raise InvalidInput(f"file: {name!r} is not a checkpoint file; upload {', '.join(FILES)} (no pickles)")


def commit_checkpoint(s: Session, run_id: int, data_dir: Path, secret: str | None) -> CheckpointPublic:
    """Validate the uploaded files with the engine, move them into place and register the model.

    A commit sent again after its answer was lost finds the checkpoint in place and registers it again."""
    run = _tracked_run(s, run_id, secret)
    staging, final = checkpoint_dirs(data_dir, run_id)
    with _COMMITS:  # two commits of one upload (a client's retry) must not interleave their moves
        if not staging.exists() and (final / "model.safetensors").is_file():
            info = verify_checkpoint(final)
        else:
            info = _move_into_place(run, staging, final)
    relative = str(final.relative_to(data_dir))
    catalog.register_checkpoint(s, catalog.CheckpointEntry(
        id=f"run-{run_id}", name=run.name, path=relative, run_id=run_id, preset=run.preset, fingerprint=None))
    run.checkpoint = relative
    return CheckpointPublic(run_id=run_id, model_id=f"run-{run_id}", path=relative, n_params=info.n_params,
                            status=run.status)


def _move_into_place(run: Run, staging: Path, final: Path) -> CheckpointInfo:
    missing = [name for name in FILES if not (staging / name).is_file()]
    if missing:
        raise InvalidInput(f"checkpoint: {', '.join(missing)} not uploaded yet; PUT each file first")
    try:
        info = verify_checkpoint(staging)
    except AAHError as exc:
        raise InvalidInput(f"checkpoint: {exc}".replace(str(staging), "upload")) from None
    own = json.loads(run.config_json or "{}").get("model")
    if own is not None and info.config.to_dict()["model"] != own:  # both as to_dict writes them (the stored config is)
        raise InvalidInput(f"checkpoint: its model config differs from run {run.id}'s; upload the run's own checkpoint")
    for part in staging.glob(".*.part"):  # an upload that lost a race with its retry
        part.unlink(missing_ok=True)
    if final.exists():  # an upload again replaces the checkpoint whole
        old = final.with_name(f".old-{uuid.uuid4().hex[:8]}")
        final.rename(old)
        shutil.rmtree(old)
    staging.rename(final)
    return info
