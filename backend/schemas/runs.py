"""Request and response models of runs (docs/api.md, "Runs (the store)"): the run itself, its
metrics and windows, launching and editing it, comparing runs, and diffing two plans.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, RootModel, StrictInt, field_validator

from backend.schemas.base import DbId, DbStep, Plan, Request, Response

RunStatus = Literal["SCHEDULED", "PENDING", "RUNNING", "FINISHED", "FAILED", "KILLED"]
RunSource = Literal["job", "tracked", "imported", "suite", "paper"]
NonFiniteKind = Literal["nan", "inf", "-inf"]
# A metric value in a response: a finite float, or the kind of a non-finite one (JSON has no NaN).
MetricValue = float | NonFiniteKind
DEFAULT_POINTS = 2000  # points per series when a read does not say
MIN_POINTS = 3  # one bucket's minimum and maximum, and the last point
MAX_POINTS = 100_000  # the most a request may ask for (a downsampled response stays a few MB)


class Progress(Response):
    step: int
    total_steps: int


class RunPublic(Response):
    id: int
    name: str
    experiment: str
    status: RunStatus
    preset: str | None
    params: dict[str, str]
    summary: dict[str, MetricValue | None] = Field(description="latest value per key (at most SUMMARY_KEYS "
                                                   "keys, by name; `n_keys` counts them all)")
    n_keys: int = Field(0, description="metric keys the run holds")
    created_at: str
    started_at: str | None
    ended_at: str | None
    progress: Progress | None
    error: str | None
    read_only: bool
    checkpoint: str | None
    data_hash: str | None
    git_rev: str | None
    source: RunSource = "job"
    group: str | None = None
    seed: int | None = None
    description: str | None = None
    notes: str | None = None
    tags: list[str] = Field(default_factory=list)
    target: str = Field("local", description="where the job runs: local, ray or slurm (docs/clusters.md)")
    engine_job_id: str | None = Field(None, description="the cluster engine's id of the job")
    engine_state: str | None = Field(None, description="what the engine last said of the job: PENDING, "
                                     "RUNNING, FINISHED, FAILED, KILLED, or GONE (it no longer knows it)")
    pending_reason: str | None = Field(None, description="while PENDING: why the engine has not started it")



RunList = RootModel[list[RunPublic]]  # GET /runs, serialised in a read thread (routers/runs.py)

class NonFinite(Response):
    """The non-finite points of a series in the range read, by step: every one of them, also those a
    downsampled read left out (a NaN or inf in a bucket of finite values), up to the read's
    ``max_points`` (the first ones by step; ``total`` counts them all)."""

    step: list[int] = Field(default_factory=list)
    kind: list[NonFiniteKind] = Field(default_factory=list)
    total: int = 0


class MetricSeries(Response):
    step: list[int]
    value: list[MetricValue | None]
    timestamp: list[float]
    nonfinite: NonFinite = Field(default_factory=NonFinite)


class MetricsResponse(Response):
    run_id: int
    series: dict[str, MetricSeries]
    downsampled: list[str] = Field(default_factory=list, description="keys reduced to max_points (bucket "
                                   "minima and maxima and the last point); the others are complete")
    next_cursor: str | None = Field(None, description="with `cursor`: the cursor of the next page; null on "
                                    "the last page")


class RunWindowsResponse(Response):
    run_id: int
    steps: list[int]
    step: int
    seq_len: int
    windows: list[list[int | None]]


_OverrideInt = Annotated[StrictInt, Field(ge=-(2**62), le=2**62)]
OverrideValue = _OverrideInt | float | bool | Annotated[str, Field(max_length=1000)] | None | list[_OverrideInt | None]


class Resources(Request):
    """What a job asks of its target; each target refuses (422 naming the field) what it cannot give."""

    gpus: int = Field(0, ge=0, le=1024, description="GPUs per node (several: the job runs under torchrun)")
    cpus: int | None = Field(None, ge=1, le=100_000, description="CPU cores per node")
    memory_gb: float | None = Field(None, gt=0, le=1_000_000, description="memory per node, GB")
    nodes: int = Field(1, ge=1, le=10_000, description="nodes (more than one: slurm only)")
    time_limit_min: int | None = Field(None, ge=1, le=525_600, description="wall-clock limit, minutes (slurm)")


class RunCreate(Request):
    preset: str = Field(min_length=1, max_length=100)
    overrides: dict[Annotated[str, Field(max_length=100)], OverrideValue] = Field(default_factory=dict,
                                                                                 max_length=100)
    name: str | None = Field(None, max_length=200)
    experiment: str | None = Field(None, max_length=200)
    target: str = Field("local", min_length=1, max_length=32, description="where the job runs (GET /targets)")
    resources: Resources = Field(default_factory=Resources)


class TargetPublic(Response):
    name: str
    kind: str
    available: bool
    detail: str = Field(description="free CPUs/GPUs where the engine says, or why the target is unavailable")
    free_cpus: float | None = None
    free_gpus: float | None = None


class LogsResponse(Response):
    run_id: int
    target: str
    engine_job_id: str | None
    lines: list[str]


def check_tag(tag: str) -> str:
    tag = tag.strip()
    if not tag or len(tag) > 64 or "," in tag or not tag.isprintable():
        raise ValueError(f"tag {tag[:70]!r}: 1-64 printable characters, no comma")
    return tag


Tag = Annotated[str, Field(max_length=200)]


class RunUpdate(Request):
    """PATCH /runs/{id}: the editable identity of a run; omitted fields stay as they are."""

    name: str | None = Field(None, min_length=1, max_length=200)
    description: str | None = Field(None, max_length=10_000)
    notes: str | None = Field(None, max_length=100_000)
    tags: list[Tag] | None = Field(None, max_length=50, description="replaces the run's tags")

    @field_validator("tags")
    @classmethod
    def _tags(cls, value: list[str] | None) -> list[str] | None:
        return None if value is None else list(dict.fromkeys(check_tag(t) for t in value))


class CompareRequest(Request):
    run_ids: list[DbId] = Field(min_length=1, max_length=100)
    keys: list[Annotated[str, Field(max_length=250)]] | None = Field(None, max_length=200)
    agg: Literal["last", "min", "max", "at_step"] = "last"
    step: DbStep | None = None
    max_points: int = Field(DEFAULT_POINTS, ge=MIN_POINTS, le=MAX_POINTS, description="points per series at "
                            "most: longer ones are downsampled like GET /runs/{id}/metrics")


class CompareRow(Response):
    run_id: int
    values: dict[str, MetricValue | None]
    steps: dict[str, int | None] | None = Field(
        None, description="with agg=at_step: the stored step each value was read at (the last one <= step)")


class SeriesXY(Response):
    step: list[int]
    value: list[MetricValue | None]
    nonfinite: NonFinite = Field(default_factory=NonFinite)


class CompareResponse(Response):
    keys: list[str]
    runs: list[RunPublic]
    table: list[CompareRow]
    series: dict[str, dict[str, SeriesXY]]
    downsampled: dict[str, list[str]] = Field(default_factory=dict, description="per run id, the keys "
                                              "reduced to max_points")


class RunPlanRef(Request):
    run_id: DbId
    step: DbStep | None = None


class ModelPlanRef(Request):
    model_id: str = Field(max_length=64)


class InlinePlanRef(Request):
    windows: Plan


PlanRef = RunPlanRef | ModelPlanRef | InlinePlanRef


class DiffRequest(Request):
    a: PlanRef
    b: PlanRef


class DiffResponse(Response):
    a: list[list[int | None]]
    b: list[list[int | None]]
    changed: list[list[bool]]
    n_changed: int

