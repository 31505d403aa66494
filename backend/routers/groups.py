"""Seeds as groups over HTTP: GET /runs/groups (mean ± std per metric) and /runs/groups/series
(curves as mean and spread by step). Declared before /runs/{run_id}, which would take "groups" as an id."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Query, Request, Response

from backend.api.deps import ReadsDep, SessionDep
from backend.routers.runs import parse_keys
from backend.schemas.runs import DEFAULT_POINTS, MAX_POINTS, MIN_POINTS, RunSource
from backend.services.executor import BUSY
from backend.store.db import transaction
from backend.store.groups import (
    GroupSeriesResponse,
    GroupSummary,
    PairedDifference,
    group_series,
    group_summaries,
    paired_differences,
)

router = APIRouter(prefix="/runs/groups", tags=["runs"])
Name = Annotated[str, Query(min_length=1, max_length=200)]


@router.get("")
def read_groups(
    session: SessionDep,
    keys: Annotated[str | None, Query(max_length=10_000, description="comma-separated metric keys")] = None,
    agg: Literal["last", "min", "max"] = "last",
    experiment: Annotated[str | None, Query(max_length=200)] = None,
    group: Annotated[str | None, Query(max_length=200)] = None,
    source: RunSource | None = None,
    tag: Annotated[str | None, Query(max_length=64)] = None,
) -> list[GroupSummary]:
    """Runs that carry a group, grouped by (experiment, group): per key, the mean, sample std, min and
    max over the runs of one value each (`agg`: the run's last, min or max value)."""
    return group_summaries(session, keys=parse_keys(keys), agg=agg, experiment=experiment, group=group,
                           source=source, tag=tag)


@router.get("/paired")
def read_paired(
    session: SessionDep,
    experiment: Name,
    base: Name,
    keys: Annotated[str, Query(min_length=1, max_length=10_000, description="comma-separated metric keys")],
    agg: Literal["last", "min", "max"] = "last",
) -> list[PairedDifference]:
    """Every other group of the experiment against `base`, per key: the runs' values (`agg`) minus the base's
    of the same seed, with the mean and its 95% t half-interval over seeds and whether it excludes 0."""
    parsed = parse_keys(keys)
    return paired_differences(session, experiment, base, parsed or [], agg)


@router.get("/series", response_model=GroupSeriesResponse, responses=BUSY)
async def read_group_series(
    request: Request,
    reads: ReadsDep,
    experiment: Name,
    group: Name,
    keys: Annotated[str | None, Query(max_length=10_000, description="comma-separated metric keys")] = None,
    max_points: Annotated[int, Query(ge=MIN_POINTS, le=MAX_POINTS, description="points per curve at most: each "
                                     "run's series is downsampled by the store before alignment, and the "
                                     "aligned curve by the same rule")] = DEFAULT_POINTS,
) -> Response:
    """One group's curves: at each step every run of the group logged, the mean, std, min and max
    (read by the bounded read executor, like metric misses and compare)."""
    parsed = parse_keys(keys)
    sessions = request.app.state.sessions

    def read() -> GroupSeriesResponse:
        with transaction(sessions) as session:
            return group_series(session, experiment, group, parsed, max_points)

    key = ("group-series", experiment, group, None if parsed is None else tuple(parsed), max_points)
    return await reads.json_response(key, read)
