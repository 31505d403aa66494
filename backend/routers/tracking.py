"""Tracking over HTTP: a training process anywhere creates its run, logs batches and its status, and
uploads its checkpoint (the client is aah_tracking; contract in docs/api.md, "Tracking")."""

from __future__ import annotations

import shutil
import uuid
from typing import Annotated

from fastapi import APIRouter, Header, Path, Request, Response
from sqlalchemy.orm import Session, sessionmaker
from starlette.concurrency import run_in_threadpool

from backend.api.deps import SessionDep, SettingsDep
from backend.routers.runs import RunId
from backend.schemas.errors import InvalidInput, ServiceError
from backend.schemas.runs import RunPublic
from backend.schemas.tracking import (
    SECRET_HEADER,
    CheckpointFileResult,
    CheckpointPublic,
    LogBatch,
    LogResult,
    StatusUpdate,
    TrackedRunCreate,
    TrackedRunPublic,
)
from backend.services import tracking
from backend.store.db import transaction

router = APIRouter(prefix="/tracking/runs", tags=["tracking"])
UPLOAD_PATH = r"^/api/v1/tracking/runs/\d+/checkpoint/[^/]+$"  # streamed: exempt from the small-body limit
FileName = Annotated[str, Path(max_length=64)]
# every write to a run after its creation: the write secret its creation answered (403 without it)
RunSecret = Annotated[str | None, Header(alias=SECRET_HEADER, max_length=256,
                                         description="the run's write secret (answered when it was created)")]


class PayloadTooLarge(ServiceError):
    status_code = 413


@router.post("", status_code=200, responses={201: {"model": TrackedRunPublic, "description": "the run was created"}})
def create_tracked_run(session: SessionDep, body: TrackedRunCreate, response: Response) -> TrackedRunPublic:
    """Create a tracked run (201, with its write secret: shown once), or answer the run already made with this
    `run_key` (200, without the secret)."""
    result = tracking.create_tracked_run(session, body)
    response.status_code = 201 if result.created else 200
    return result


@router.post("/{run_id}/log")
def log_batch(session: SessionDep, settings: SettingsDep, run_id: RunId, body: LogBatch,
              secret: RunSecret = None) -> LogResult:
    """Metric points and window plans; points and plan steps already stored are ignored."""
    return tracking.log_batch(session, run_id, body, secret, settings.max_metric_keys)


@router.post("/{run_id}/status")
def update_status(session: SessionDep, run_id: RunId, body: StatusUpdate, secret: RunSecret = None) -> RunPublic:
    """RUNNING, or the run's final status (sent again: no change); optionally a checkpoint reference."""
    return tracking.set_status(session, run_id, body, secret)


@router.put("/{run_id}/checkpoint/{name}")
async def upload_checkpoint_file(request: Request, settings: SettingsDep, run_id: RunId,
                                 name: FileName, secret: RunSecret = None) -> CheckpointFileResult:
    """One checkpoint file as the raw body: config.json, plan.json or model.safetensors (at most
    AAH_MAX_UPLOAD_BYTES). POST .../checkpoint afterwards validates and registers the checkpoint."""
    limit = settings.max_upload_bytes
    declared = request.headers.get("content-length")
    if declared is not None and (not declared.isdigit() or int(declared) > limit):
        raise PayloadTooLarge(f"{name}: larger than the upload limit of {limit} bytes (AAH_MAX_UPLOAD_BYTES)")
    # never on the event loop: a stalled database must not stop the service
    await run_in_threadpool(_check_upload, request.app.state.sessions, run_id, name, secret)
    staging, _ = tracking.checkpoint_dirs(settings.data_dir, run_id)
    staging.mkdir(parents=True, exist_ok=True)
    part = staging / f".{name}.{uuid.uuid4().hex[:8]}.part"  # a retried upload racing the first one has its own
    size = 0
    try:
        with part.open("wb") as f:
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise PayloadTooLarge(f"{name}: larger than the upload limit of {limit} bytes (AAH_MAX_UPLOAD_BYTES)")
                await run_in_threadpool(f.write, chunk)
        part.replace(staging / name)  # atomic: the file is whole or the previous one
    finally:
        part.unlink(missing_ok=True)
    return CheckpointFileResult(name=name, bytes=size)


def _check_upload(sessions: sessionmaker[Session], run_id: int, name: str, secret: str | None) -> None:
    with transaction(sessions) as s:
        tracking.check_upload(s, run_id, name, secret)


@router.post("/{run_id}/checkpoint")
def commit_checkpoint(session: SessionDep, settings: SettingsDep, run_id: RunId,
                      secret: RunSecret = None) -> CheckpointPublic:
    """Validate the uploaded files (safetensors + JSON, shapes against the config) and register the model."""
    try:
        return tracking.commit_checkpoint(session, run_id, settings.data_dir, secret)
    except InvalidInput:
        staging, _ = tracking.checkpoint_dirs(settings.data_dir, run_id)
        shutil.rmtree(staging, ignore_errors=True)  # a refused upload is not kept: send the files again
        raise
