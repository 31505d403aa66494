"""Request and response models of the tracking API (docs/api.md, "Tracking"): a training process
elsewhere creates its run, sends metric and plan batches and its status, and uploads its checkpoint.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import Field, StrictInt, field_validator, model_validator

from backend.schemas.base import DbStep, Plan, Request, Response
from backend.schemas.runs import RunPublic, RunStatus, Tag, check_tag

RunKey = str  # checked by pattern on the fields that carry it
RUN_KEY_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:-]{7,127}$"
SECRET_PATTERN = r"^[A-Za-z0-9_-]{32,128}$"
SECRET_HEADER = "X-AAH-Run-Secret"  # every write to a tracked run carries its write secret here
# where a checkpoint that stays on the training machine may be: a path, or a URL of one of these schemes
CHECKPOINT_SCHEMES = ("file", "http", "https", "s3", "gs", "az", "hf")
MAX_METRICS_PER_BATCH = 20_000
MAX_PLANS_PER_BATCH = 200
MetricValue = float | Literal["nan", "inf", "-inf"] | None


class TrackedRunCreate(Request):
    """POST /tracking/runs: idempotent on `run_key` (the same key answers the run made the first time)."""

    run_key: str = Field(pattern=RUN_KEY_PATTERN, description="client-chosen id, 8-128 characters [A-Za-z0-9._:-]")
    name: str = Field(min_length=1, max_length=200)
    experiment: str = Field("tracked", min_length=1, max_length=200)
    source: Literal["tracked", "imported", "suite"] = "tracked"
    preset: str | None = Field(None, max_length=100)
    config: dict[str, Any] = Field(description="the full resolved RunConfig (to_dict()); stored as params")
    data_hash: str | None = Field(None, max_length=128)
    git_rev: str | None = Field(None, max_length=64)
    total_steps: int | None = Field(None, ge=0, le=2**62)
    start_step: DbStep = 0
    group: str | None = Field(None, max_length=200)
    seed: StrictInt | None = Field(None, ge=-(2**31), le=2**31 - 1)
    description: str | None = Field(None, max_length=10_000)
    tags: list[Tag] = Field(default_factory=list, max_length=50)
    write_secret: str | None = Field(
        None, pattern=SECRET_PATTERN, description="the run's write secret, chosen by the client (32-128 of "
        "[A-Za-z0-9_-]); omitted: the server makes one and answers it once. Sending the create again with the "
        "same key and secret is safe (a retry, a replayed spool)")

    @field_validator("tags")
    @classmethod
    def _tags(cls, value: list[str]) -> list[str]:
        return list(dict.fromkeys(check_tag(t) for t in value))


class TrackedRunPublic(Response):
    created: bool = Field(description="false when the run key was known: the run made the first time")
    run: RunPublic
    write_secret: str | None = Field(
        None, description=f"only when the run was created (201): the secret every later write to it carries in "
        f"the {SECRET_HEADER} header. The server keeps only its hash: it is never shown again")


MetricKey = Annotated[str, Field(min_length=1, max_length=250)]
LogTime = Annotated[float, Field(ge=0, le=1e11, description="epoch seconds when the value was logged")]


class MetricPoint(Request):
    key: MetricKey
    step: DbStep
    value: MetricValue = Field(description='a number, or "nan" / "inf" / "-inf" (null is read as "nan")')
    time: LogTime


class MetricColumns(Request):
    """One key's points as three columns of equal length: point i is (step[i], value[i], time[i])."""

    step: list[DbStep] = Field(max_length=MAX_METRICS_PER_BATCH)
    value: list[MetricValue] = Field(max_length=MAX_METRICS_PER_BATCH,
                                     description='numbers, or "nan" / "inf" / "-inf" (null is read as "nan")')
    time: list[LogTime] = Field(max_length=MAX_METRICS_PER_BATCH)

    @model_validator(mode="after")
    def _same_length(self) -> MetricColumns:
        if not len(self.step) == len(self.value) == len(self.time):
            raise ValueError(f"step, value and time must have the same length (got {len(self.step)}, "
                             f"{len(self.value)}, {len(self.time)})")
        return self


class PlanPoint(Request):
    step: DbStep
    windows: Plan


class LogBatch(Request):
    """POST /tracking/runs/{id}/log: metric points and plans; a (key, step) or plan step already stored
    is ignored, so a batch may be sent again safely.

    Points come as rows (``metrics``), as columns per key (``series``: the compact form, about half the
    bytes and a tenth of the parsing), or both; at most MAX_METRICS_PER_BATCH in all."""

    metrics: list[MetricPoint] = Field(default_factory=list, max_length=MAX_METRICS_PER_BATCH)
    series: dict[MetricKey, MetricColumns] = Field(
        default_factory=dict, max_length=MAX_METRICS_PER_BATCH,
        description="per key, its points as columns {step: [int], value: [...], time: [...]}")
    plans: list[PlanPoint] = Field(default_factory=list, max_length=MAX_PLANS_PER_BATCH)
    step: DbStep | None = Field(None, description="progress: the last step the process finished")

    @model_validator(mode="after")
    def _points_limit(self) -> LogBatch:
        if len(self.metrics) + sum(len(c.step) for c in self.series.values()) > MAX_METRICS_PER_BATCH:
            raise ValueError(f"metrics and series hold more than {MAX_METRICS_PER_BATCH} points in all")
        return self


class LogResult(Response):
    run_id: int
    metrics_written: int = Field(description="new metric rows (points already stored are not counted)")
    plans_written: int = Field(description="new plans (a plan already stored at its step is not counted)")


class StatusUpdate(Request):
    """POST /tracking/runs/{id}/status: RUNNING, or the final status (sent again: no change)."""

    status: Literal["RUNNING", "FINISHED", "FAILED", "KILLED"]
    error: str | None = Field(None, max_length=10_000)
    step: DbStep | None = None
    checkpoint_ref: str | None = Field(
        None, min_length=1, max_length=4096,
        description="where the checkpoint stays when it is not uploaded: a path on the training machine, or a "
        f"URL of scheme {', '.join(CHECKPOINT_SCHEMES)}")

    @field_validator("checkpoint_ref")
    @classmethod
    def _checkpoint_ref(cls, value: str | None) -> str | None:
        return None if value is None else check_checkpoint_ref(value)


_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):")
_DRIVE = re.compile(r"^[A-Za-z]:[\\/]")  # C:\ckpt or C:/ckpt: a Windows path, not a scheme


def check_checkpoint_ref(value: str) -> str:
    """A path, or a URL of an allowed scheme: never ``javascript:``, ``data:`` or the like, which a page that
    shows the reference as a link would run."""
    if any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise ValueError("control characters are not allowed in a path or URL")
    bare = value.lstrip(" ")  # a browser drops leading spaces from a link before it reads the scheme
    scheme = _SCHEME.match(bare)
    if scheme is None or _DRIVE.match(bare):
        return value
    name = scheme.group(1).lower()
    if name not in CHECKPOINT_SCHEMES or not bare[scheme.end():].startswith("//"):
        raise ValueError(f"{name!r} URLs are not allowed; give a path or a URL of scheme "
                         f"{', '.join(s + '://' for s in CHECKPOINT_SCHEMES)}")
    return value


class CheckpointFileResult(Response):
    name: str
    bytes: int


class CheckpointPublic(Response):
    run_id: int
    model_id: str
    path: str = Field(description="relative to the data dir")
    n_params: int
    status: RunStatus
