"""Request and response models (pydantic v2): the HTTP contract of docs/api.md in code.

Requests forbid unknown fields so a typo ("window" for "windows") is a 422, not a silent
default. Non-finite floats serialise as null (``ser_json_inf_nan``), never as a 500.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, field_validator

Window = Annotated[StrictInt, Field(ge=1, description="keys seen by the head (>= 1); null = full")]
Plan = Annotated[
    list[Annotated[list[Window | None], Field(max_length=1024)]],
    Field(description="per layer, per head: int >= 1 or null (full)", max_length=1024),
]
OWN_WINDOW = "own"
# /attention's window: "own" (the head's window in the model's own plan; the default), an int >= 1, or
# null (full), the same null as in a plan.
AttentionWindow = Window | Literal["own"] | None
EvalSet = Literal["mixed", "text", "english", "copy"]
# Ids and steps are SQLite integers (64-bit signed): anything larger is a 422, not an overflow.
DbId = Annotated[int, Field(ge=1, le=2**62)]
DbStep = Annotated[int, Field(ge=0, le=2**62)]
RunStatus = Literal["SCHEDULED", "RUNNING", "FINISHED", "FAILED", "KILLED"]
RunSource = Literal["job", "tracked", "imported", "suite", "paper"]
MAX_VIEW_STATE_BYTES = 64 * 1024
MAX_VIEW_STATE_DEPTH = 64  # nesting of a saved view's state (the dashboard's is 3 deep)


class Response(BaseModel):
    model_config = ConfigDict(ser_json_inf_nan="null")


class Request(BaseModel):
    model_config = ConfigDict(extra="forbid")


# ---- health, models, presets -------------------------------------------------------------

class HealthResponse(Response):
    status: str
    version: str
    models: int
    runs: int


class ModelInfo(Response):
    id: str
    name: str
    n_layer: int
    n_head: int
    seq_len: int
    preset: str | None
    buckets: list[int | None]
    n_params: int
    run_id: int | None
    family: str = Field(description='"aah" (AAH Studio checkpoint) or the Hugging Face model_type, e.g. "llama"')
    dtype: str = Field(description="the dtype the model is evaluated in (float32 or bfloat16)")


class ModelUnavailable(Response):
    """A registered model that cannot be served here, and why (unreadable, inconsistent, too large)."""

    id: str
    name: str
    reason: str


class ModelCreate(Request):
    """Register a local model folder (a Hugging Face causal LM, or an AAH Studio checkpoint) under AAH_MODEL_DIRS."""

    path: str = Field(min_length=1, max_length=4096, description="the folder, absolute or relative to the first model root")
    name: str | None = Field(None, min_length=1, max_length=200, description="display name (default: the folder's name)")
    seq_len: int | None = Field(None, ge=2, le=1 << 20, description="evaluation context (default min(model maximum, 1024))")


class CoverageFields(Response):
    acr: float
    causal_coverage: float
    tile_coverage: float


class CostFields(Response):
    """Exact inference cost of a plan at context N (aah_core/cost.py), one sequence, beside the full plan."""

    context: int
    kv_bytes: int
    kv_bytes_full: int
    attention_pairs: int
    attention_pairs_full: int


class ModelWindowsResponse(CoverageFields, CostFields):
    """Cost fields are at context = seq_len."""

    model_id: str
    seq_len: int
    windows: list[list[int | None]]


class TextInfo(Response):
    id: str
    name: str
    kind: Literal["text", "english", "copy"]
    n_tokens: int
    preview: str


class PresetInfo(Response):
    name: str
    description: str
    group: str


# ---- live evaluation ---------------------------------------------------------------------

class EvaluateRequest(Request):
    windows: Plan
    eval_set: EvalSet = "mixed"
    per_token: bool = False


class PerTokenLosses(Response):
    tokens: list[str]
    loss: list[float | None]
    baseline: list[float | None]
    delta: list[float | None]


class EvaluateResponse(CoverageFields, CostFields):
    """Cost fields are at context = the model's seq_len."""

    loss: float
    baseline_loss: float
    delta: float
    delta_pct: float
    perplexity: float
    windows: list[list[int | None]]
    eval_set: str
    elapsed_ms: float
    cached: bool
    per_token: PerTokenLosses | None = None


# ---- attention and diagnostics -----------------------------------------------------------

MAX_TEXT_CHARS = 4096

MAX_ATTENTION_TEXT_CHARS = 100_000  # a long paste is read whole; the map shows seq_len tokens from `offset`


class AttentionRequest(Request):
    layer: int = Field(ge=0, le=1024)
    head: int = Field(ge=0, le=1024)
    text: str | None = Field(None, max_length=MAX_ATTENTION_TEXT_CHARS)
    offset: int = Field(0, ge=0, le=MAX_ATTENTION_TEXT_CHARS * 8,
                        description="first token of the span shown: a text longer than the model's seq_len is "
                                    "shown seq_len tokens at a time (clipped so the span ends at the text's end)")
    text_id: str | None = Field(None, max_length=64)
    window: AttentionWindow = Field(OWN_WINDOW, description='"own" (default): the head\'s own window; '
                                    "an int >= 1; null: full causal attention")


class AttentionResponse(Response):
    layer: int
    head: int
    window: int | None
    seq_len: int
    tokens: list[str]
    full: list[list[float | None]]
    windowed: list[list[float | None]]
    cut_mass: list[float]
    pool: int
    n_tokens: int
    offset: int = Field(description="the text's token index of the first token shown")
    text_tokens: int = Field(description="tokens in the whole text; tokens outside offset..offset+n_tokens are not shown")


class RetainedMassResponse(Response):
    buckets: list[int | None]
    mass: list[list[list[float]]]


class SensitivityResponse(Response):
    buckets: list[int | None]
    baseline_loss: float
    delta: list[list[list[float | None]]]


class AllocateRequest(Request):
    budget: float = Field(gt=0.0, le=1.0, allow_inf_nan=False)
    metric: Literal["causal_coverage", "acr"] = "causal_coverage"
    eval_set: EvalSet = "mixed"


class CurvePoint(Response):
    acr: float
    causal_coverage: float
    kv_bytes: int | None = Field(None, description="KV-cache bytes of the step's plan at context seq_len")
    loss: float


class AllocateResponse(CoverageFields):
    windows: list[list[int | None]]
    loss: float
    baseline_loss: float
    curve: list[CurvePoint]


# ---- inference cost and generation -------------------------------------------------------

Context = Annotated[StrictInt, Field(ge=1, le=2**31, description="context length N (<= the model's seq_len)")]


class CostRequest(Request):
    windows: Plan
    context: Context
    measure: bool = False


class MeasuredCostPublic(Response):
    """Medians; *_full is the full plan measured in the same run; ratios are plan / full."""

    prefill_ms: float
    prefill_ms_full: float
    prefill_ratio: float | None
    decode_step_ms: float | None
    decode_step_ms_full: float | None
    decode_step_ratio: float | None
    tokens_per_s: float | None
    tokens_per_s_full: float | None
    peak_memory_bytes: int | None
    peak_memory_bytes_full: int | None
    peak_memory_ratio: float | None
    batch: int
    device: str


class CostResponse(CostFields):
    windows: list[list[int | None]]
    kv_entries: int
    kv_entries_full: int
    kv_ratio: float
    pairs_ratio: float
    n_kv_head: int
    kv_windows: list[list[int]] = Field(description="per layer and kv head: positions its cache keeps at N")
    measured: MeasuredCostPublic | None = None


class GenerateRequest(Request):
    prompt: str = Field(min_length=1, max_length=MAX_TEXT_CHARS)
    windows: Plan | None = Field(None, description="null: the model's own plan")
    max_new_tokens: int = Field(64, ge=1, le=1024)
    temperature: float = Field(0.0, ge=0.0, le=100.0, allow_inf_nan=False, description="0 = greedy")
    top_k: int = Field(0, ge=0, le=1_000_000, description="0 = off")
    top_p: float = Field(1.0, gt=0.0, le=1.0, allow_inf_nan=False, description="1 = off")
    seed: int = Field(0, ge=0, le=2**63 - 1)


class GenerateResponse(Response):
    windows: list[list[int | None]]
    prompt_tokens: int
    text: str
    tokens: list[str]
    stop_reason: Literal["max_new_tokens", "context"]
    cache_bytes: list[int] = Field(description="KV bytes held when each new token was predicted")
    kv_bytes_full: int = Field(description="the full plan's KV bytes at the final context")
    elapsed_ms: float


# ---- runs --------------------------------------------------------------------------------

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
    summary: dict[str, float | None]
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


class MetricSeries(Response):
    step: list[int]
    value: list[float | None]
    timestamp: list[float]


class MetricsResponse(Response):
    run_id: int
    series: dict[str, MetricSeries]
    downsampled: list[str] = Field(default_factory=list, description="keys reduced to max_points (bucket "
                                   "minima and maxima and the last point); the others are complete")


class RunWindowsResponse(Response):
    run_id: int
    steps: list[int]
    step: int
    seq_len: int
    windows: list[list[int | None]]


_OverrideInt = Annotated[StrictInt, Field(ge=-(2**62), le=2**62)]
OverrideValue = _OverrideInt | float | bool | Annotated[str, Field(max_length=1000)] | None | list[_OverrideInt | None]


class RunCreate(Request):
    preset: str = Field(min_length=1, max_length=100)
    overrides: dict[Annotated[str, Field(max_length=100)], OverrideValue] = Field(default_factory=dict,
                                                                                 max_length=100)
    name: str | None = Field(None, max_length=200)
    experiment: str | None = Field(None, max_length=200)


def _check_tag(tag: str) -> str:
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
        return None if value is None else list(dict.fromkeys(_check_tag(t) for t in value))


class CompareRequest(Request):
    run_ids: list[DbId] = Field(min_length=1, max_length=100)
    keys: list[Annotated[str, Field(max_length=250)]] | None = Field(None, max_length=200)
    agg: Literal["last", "min", "max", "at_step"] = "last"
    step: DbStep | None = None


class CompareRow(Response):
    run_id: int
    values: dict[str, float | None]
    steps: dict[str, int | None] | None = Field(
        None, description="with agg=at_step: the stored step each value was read at (the last one <= step)")


class SeriesXY(Response):
    step: list[int]
    value: list[float | None]


class CompareResponse(Response):
    keys: list[str]
    runs: list[RunPublic]
    table: list[CompareRow]
    series: dict[str, dict[str, SeriesXY]]


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


# ---- saved views -------------------------------------------------------------------------

class ViewCreate(Request):
    name: str = Field(min_length=1, max_length=120)
    page: str = Field(min_length=1, max_length=64)
    state: dict[str, Any]

    @field_validator("state", mode="before")
    @classmethod
    def _state_shape(cls, value: Any) -> Any:
        _check_json_tree(value, "state")
        return value

    @field_validator("state")
    @classmethod
    def _state_size(cls, value: dict[str, Any]) -> dict[str, Any]:
        size = len(json.dumps(value, allow_nan=False).encode())
        if size > MAX_VIEW_STATE_BYTES:
            raise ValueError(f"state is {size} bytes as JSON; the limit is {MAX_VIEW_STATE_BYTES}")
        return value


class ViewUpdate(Request):
    name: str = Field(min_length=1, max_length=120)


class ViewOrder(Request):
    ids: list[int] = Field(max_length=10_000, description="every saved view's id once, in the new order")


def _check_json_tree(value: Any, name: str) -> None:
    """Walk free-form JSON without recursion: at most MAX_VIEW_STATE_DEPTH levels, text that is valid
    Unicode (no lone surrogates, which no JSON encoder can write back) and integers that fit 64 bits."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > MAX_VIEW_STATE_DEPTH:
            raise ValueError(f"{name} is nested deeper than {MAX_VIEW_STATE_DEPTH} levels")
        if isinstance(item, dict):
            stack.extend((key, depth) for key in item)
            stack.extend((child, depth + 1) for child in item.values())
        elif isinstance(item, list):
            stack.extend((child, depth + 1) for child in item)
        elif isinstance(item, str) and not item.isascii():
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                raise ValueError(f"{name} holds text that is not valid Unicode (a lone surrogate)") from None
        elif isinstance(item, int) and not isinstance(item, bool) and abs(item) >= 2**63:
            raise ValueError(f"{name} holds an integer out of range (|value| must be below 2**63)")


class ViewPublic(Response):
    id: int
    name: str
    page: str
    state: dict[str, Any]
    created_at: str
    position: int | None = Field(None, description="its place once the views were reordered (null: never)")
