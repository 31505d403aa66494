"""The run store over HTTP: list, read, metrics, window plans, compare, start and cancel jobs.

No route queries the store on the event loop: plain ``def`` routes run in FastAPI's thread pool,
and the ``async`` ones (the run list, a run, metrics, compare) hand their reads to a thread or the bounded
read executor (services/executor.py: 429 with Retry-After when full)."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from typing import Annotated

from fastapi import APIRouter, Path, Query, Request, Response
from pydantic import BaseModel
from sqlalchemy.orm import Session, sessionmaker

from backend.api.deps import MetricsCacheDep, ReadsDep, SessionDep, TargetJobsDep
from backend.schemas.base import MAX_DB_ID
from backend.schemas.errors import InvalidInput
from backend.schemas.runs import (
    DEFAULT_POINTS,
    MAX_POINTS,
    MIN_POINTS,
    CompareRequest,
    CompareResponse,
    CompareRow,
    LogsResponse,
    MetricsResponse,
    RunCreate,
    RunList,
    RunPublic,
    RunSource,
    RunStatus,
    RunUpdate,
    RunWindowsResponse,
    SeriesXY,
)
from backend.services.cache import LruCache
from backend.services.executor import BUSY
from backend.store import metric_store, run_store
from backend.store.db import transaction
from backend.store.downsample import read_downsampled
from backend.store.identity import update_identity

router = APIRouter(prefix="/runs", tags=["runs"])
RunId = Annotated[int, Path(ge=1, le=MAX_DB_ID)]
Step = Annotated[int | None, Query(ge=0, le=2**62)]
MAX_KEYS = 200


def _in_transaction(sessions: sessionmaker[Session], read: Callable[[Session], BaseModel]) -> Callable[[], BaseModel]:
    def run() -> BaseModel:
        with transaction(sessions) as session:
            return read(session)

    return run


# The run list and a run's page are what every open dashboard reads, and each is tens of queries and a model
# per run: on the thread pool of plain routes (40 threads) 50 clients made GET /runs cost 97-115 ms of CPU a
# request against 30 ms for one client, the threads handing the interpreter lock round; on the read executor's
# few threads they queue instead (docs/performance.md, "Synchronous routes under concurrency"). Not shared
# between identical requests (key None): a read that began before a client's write must not answer it.
@router.get("", response_model=list[RunPublic], responses=BUSY)
async def read_runs(
    request: Request,
    reads: ReadsDep,
    experiment: Annotated[str | None, Query(max_length=200)] = None,
    preset: Annotated[str | None, Query(max_length=100)] = None,
    status: RunStatus | None = None,
    source: RunSource | None = None,
    group: Annotated[str | None, Query(max_length=200)] = None,
    tag: Annotated[str | None, Query(max_length=64)] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    offset: Annotated[int, Query(ge=0, le=2**62)] = 0,
) -> Response:
    """Runs, newest first, filtered by experiment name, preset, status, source, group and tag."""
    def read(session: Session) -> RunList:
        return RunList(run_store.list_runs(session, experiment=experiment, preset=preset, status=status,
                                           source=source, group=group, tag=tag, limit=limit, offset=offset))

    return await reads.json_response(None, _in_transaction(request.app.state.sessions, read))


@router.get("/{run_id}", response_model=RunPublic, responses=BUSY)
async def read_run(request: Request, reads: ReadsDep, run_id: RunId) -> Response:
    """One run: params, status, progress, latest value per metric."""
    return await reads.json_response(
        None, _in_transaction(request.app.state.sessions, lambda session: run_store.get_run(session, run_id)))


@router.patch("/{run_id}")
def update_run(session: SessionDep, run_id: RunId, body: RunUpdate) -> RunPublic:
    """Edit a run's name, description, notes or tags (tags are replaced as a whole)."""
    return update_identity(session, run_id, body)


def parse_keys(keys: str | None) -> list[str] | None:
    if keys is None:
        return None
    parsed = [k.strip() for k in keys.split(",") if k.strip()]
    if len(parsed) > MAX_KEYS:
        raise InvalidInput(f"keys: {len(parsed)} keys requested; at most {MAX_KEYS} per request")
    return parsed


# run, keys, step range, points, page cursor
MetricsQuery = tuple[int, tuple[str, ...] | None, int | None, int | None, int, str | None]
FIRST_PAGE = "start"


def encode_cursor(cursor: metric_store.Cursor | None) -> str | None:
    """A page cursor as URL-safe text (base64 of the JSON [key, step] the page starts at)."""
    return None if cursor is None else base64.urlsafe_b64encode(json.dumps(list(cursor)).encode()).decode()


def decode_cursor(text: str) -> metric_store.Cursor | None:
    if text == FIRST_PAGE:
        return None
    try:
        key, step = json.loads(base64.urlsafe_b64decode(text.encode()))
    except (ValueError, TypeError):
        key = step = None
    if not isinstance(key, str) or not isinstance(step, int) or isinstance(step, bool) or not 0 <= step <= 2**62:
        raise InvalidInput(f"cursor: {text[:40]!r} is not a cursor this API gave out (start with {FIRST_PAGE!r})")
    return key, step


def _metrics_version(sessions: sessionmaker[Session], run_id: int) -> tuple[int, int]:
    with transaction(sessions) as s:
        run_store.run_exists(s, run_id)
        return metric_store.metrics_version(s, run_id)


def _metrics_body(sessions: sessionmaker[Session], cache: LruCache, query: MetricsQuery,
                  version: tuple[int, int] | None) -> bytes:
    """The response to ``query``, cached with the metrics' version (``None``: read with the rows)."""
    run_id, keys, min_step, max_step, max_points, cursor = query
    following = None
    with transaction(sessions) as s:
        if version is None:  # read first: rows written meanwhile make the next poll read again, never miss
            version = metric_store.metrics_version(s, run_id)  # (both reads below check that the run exists)
        reduced: list[str] = []
        if cursor is None:
            series, reduced = read_downsampled(s, run_id, max_points, keys, min_step, max_step)
        else:
            series, following = metric_store.read_page(s, run_id, keys, min_step, max_step, decode_cursor(cursor),
                                                       max_points)
    body = MetricsResponse(run_id=run_id, series=series, downsampled=reduced,
                           next_cursor=encode_cursor(following)).model_dump_json().encode()
    cache.put(query, (version, body))
    return body


@router.get("/{run_id}/metrics", response_model=MetricsResponse, responses=BUSY)
async def read_run_metrics(
    request: Request,
    cache: MetricsCacheDep,
    reads: ReadsDep,
    run_id: RunId,
    keys: Annotated[str | None, Query(max_length=10_000, description="comma-separated metric keys")] = None,
    min_step: Step = None,
    max_step: Step = None,
    max_points: Annotated[int, Query(
        ge=MIN_POINTS, le=MAX_POINTS, description="at most this many points per key: each step bucket's "
        "minimum and maximum and the last point are kept exactly; with `cursor`, rows per page")] = DEFAULT_POINTS,
    cursor: Annotated[str | None, Query(max_length=2000, description=f"page through every row instead: "
                                        f"{FIRST_PAGE!r} for the first page, then each response's "
                                        "`next_cursor`")] = None,
) -> Response:
    """Metric series by key (all keys when `keys` is omitted); NaN/inf come back as "nan", "inf",
    "-inf", and each series lists its non-finite points in `nonfinite`.

    A series longer than `max_points` (within `min_step`..`max_step`) is downsampled in the database;
    its key is listed in `downsampled`. A dashboard asks again with a step range when the user zooms.
    With `cursor`, the full series come in pages of `max_points` rows in (key, step) order."""
    if min_step is not None and max_step is not None and min_step > max_step:
        raise InvalidInput(f"min_step: {min_step} is greater than max_step {max_step}")
    if cursor is not None:
        decode_cursor(cursor)  # a bad cursor is a 422 before any work
    parsed = parse_keys(keys)
    sessions = request.app.state.sessions
    # Dashboards poll the same series from many tabs. A poll whose answer is cached costs one
    # indexed read of the run's per-key row counts in a thread (never on the event loop), shared by
    # the polls of the run that arrive while it runs; a miss is read by the bounded read executor,
    # once however many pollers ask for it at once. A query never answered (a zoom, mostly) skips
    # the check: its read job reads the version with the rows, in one thread hop instead of two.
    query = (run_id, None if parsed is None else tuple(parsed), min_step, max_step, max_points, cursor)
    hit = cache.get(query)
    version = None
    if hit is not None:
        version = await request.app.state.checks.run(("version", run_id),
                                                     lambda: _metrics_version(sessions, run_id))
        if hit[0] == version:
            return Response(content=hit[1], media_type="application/json")
    body = await reads.run(("metrics", query, version), lambda: _metrics_body(sessions, cache, query, version))
    return Response(content=body, media_type="application/json")


@router.get("/{run_id}/windows")
def read_run_windows(session: SessionDep, run_id: RunId, step: Step = None) -> RunWindowsResponse:
    """The run's window plan at `step` (default: the latest stored) and every step with a plan."""
    plan = run_store.read_plan(session, run_id, step)
    return RunWindowsResponse(run_id=run_id, steps=plan.steps, step=plan.step, seq_len=plan.seq_len,
                              windows=plan.windows)


@router.post("", status_code=202)
def create_run(body: RunCreate, jobs: TargetJobsDep) -> RunPublic:
    """Start a training job from a preset (+ overrides) on a target (default local: a worker process of
    this server; ray, slurm: a job of that engine); returns the new run. 503 names a target that cannot be
    reached or is at its cap."""
    return jobs.start(body)


def _compare(sessions: sessionmaker[Session], body: CompareRequest) -> CompareResponse:
    run_ids = list(dict.fromkeys(body.run_ids))
    with transaction(sessions) as session:
        runs = run_store.runs_public(session, run_ids)
        keys = body.keys
        if keys is None:
            keys = sorted({k for run in runs for k in run.summary})
        table = metric_store.aggregate_metrics(session, run_ids, keys, body.agg, body.step)
        steps = (metric_store.steps_at_or_before(session, run_ids, keys, body.step)
                 if body.agg == "at_step" and body.step is not None else {})  # compare_runs refused at_step without one
        series, downsampled = {}, {}
        for run_id in run_ids:
            by_key, reduced = read_downsampled(session, run_id, body.max_points, keys)
            series[str(run_id)] = {k: SeriesXY(step=s.step, value=s.value, nonfinite=s.nonfinite)
                                   for k, s in by_key.items()}
            if reduced:
                downsampled[str(run_id)] = reduced
    rows = [CompareRow(run_id=r, values=table[r], steps=steps.get(r)) for r in run_ids]
    return CompareResponse(keys=keys, runs=runs, table=rows, series=series, downsampled=downsampled)


@router.post("/compare", response_model=CompareResponse, responses=BUSY)
async def compare_runs(request: Request, body: CompareRequest, reads: ReadsDep) -> Response:
    """Several runs side by side: one aggregated value per (run, key) and every series by step, each
    downsampled to `max_points` like GET /runs/{id}/metrics (read by the bounded read executor, like
    metric misses)."""
    if body.agg == "at_step" and body.step is None:
        raise InvalidInput("step: required when agg is 'at_step'")
    sessions = request.app.state.sessions
    return await reads.json_response(("compare", body.model_dump_json()), lambda: _compare(sessions, body))


@router.post("/{run_id}/cancel")
def cancel_run(run_id: RunId, jobs: TargetJobsDep) -> RunPublic:
    """Stop a scheduled, pending or running job; the run ends KILLED (`engine_state` says whether the
    cluster engine has ended the job too). 409 if it already ended."""
    return jobs.cancel(run_id)


@router.get("/{run_id}/logs")
def read_run_logs(run_id: RunId, jobs: TargetJobsDep,
                  tail: Annotated[int, Query(ge=1, le=10_000)] = 100) -> LogsResponse:
    """The last `tail` lines of the job's output (the worker's log, or the cluster engine's)."""
    return jobs.logs(run_id, tail)
