"""Seeds as groups over HTTP: GET /runs/groups (mean ± std per metric) and /runs/groups/series
(curves as mean and spread by step). Declared before /runs/{run_id}, which would take "groups" as an id."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Query

from backend.deps import SessionDep
from backend.downsample import MAX_POINTS
from backend.groups import GroupSeriesResponse, GroupSummary, group_series, group_summaries
from backend.routers.runs import parse_keys
from backend.schemas import RunSource

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


@router.get("/series")
def read_group_series(
    session: SessionDep,
    experiment: Name,
    group: Name,
    keys: Annotated[str | None, Query(max_length=10_000, description="comma-separated metric keys")] = None,
    max_points: Annotated[int | None, Query(ge=2, le=MAX_POINTS, description="keep every k-th aligned step "
                                            "(and the last) so that at most this many remain")] = None,
) -> GroupSeriesResponse:
    """One group's curves: at each step every run of the group logged, the mean, std, min and max."""
    return group_series(session, experiment, group, parse_keys(keys), max_points)
