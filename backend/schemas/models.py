"""The model endpoints' schemas: health, models, presets, live evaluation, attention, cost,
generation (docs/api.md). Runs are in runs.py, saved views in views.py, tracking in tracking.py.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, StrictInt, model_validator

from backend.schemas.base import OWN_WINDOW, AttentionWindow, EvalSet, Plan, Request, Response

# ---- health, models, presets -------------------------------------------------------------

class HealthResponse(Response):
    status: str
    version: str
    models: int
    runs: int


class PrecisionInfo(Response):
    """How a Hugging Face model is evaluated on this machine (aah_core/hf/precision.py), known once it is loaded."""

    dtype: str = Field(description="float32 or bfloat16")
    choice: str = Field(description='"measured" (the faster dtype here) or "requested"')
    bf16_speedup: float = Field(description="float32 time / bfloat16 time of a matrix product of the model's width, here")
    loss_float32: float | None = Field(description="own-plan loss in float32 on `tokens` evaluation tokens (bfloat16 models)")
    loss_bfloat16: float | None = Field(description="the same in bfloat16")
    loss_delta: float | None = Field(description="loss_bfloat16 - loss_float32")
    tokens: int


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
    eval_tokens: int = Field(description="tokens in each evaluation set (eval_seqs x seq_len)")
    eval_seqs: int = Field(description="sequences in each evaluation set")
    precision: PrecisionInfo | None = Field(
        None, description="a Hugging Face model's measured dtype choice and its loss difference (null until loaded)")
    sinks: int = Field(0, description="sink tokens every head sees besides its window (the model's own; 0: none)")


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
    eval_tokens: int | None = Field(
        None, ge=2, le=1 << 22, description="tokens per evaluation set: whole sequences of seq_len, rounded down "
        "(default 4 sequences); at least one sequence")


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
    n_kv_head: int = Field(description="key/value heads per layer: the query heads of one share its cache, so a "
                           "window shrinks the cache only when every head of the group has it")


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
    sinks: StrictInt | None = Field(None, ge=0, description="sink tokens to evaluate with, at most seq_len; "
                                                            "null: the model's own (its baseline keeps its own)")


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
    sinks: int = Field(0, description="the sink tokens the plan was evaluated with (coverage and cost count them)")


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


class RetainedMassRequest(Request):
    """POST /retained-mass: the curves on a posted text, on the seq_len tokens shown from `offset` (as
    POST /attention shows them), so the curve and τ's suggestion are about the text on screen."""

    text: str = Field(min_length=1, max_length=MAX_ATTENTION_TEXT_CHARS)
    offset: int = Field(0, ge=0, le=MAX_ATTENTION_TEXT_CHARS * 8)


class RetainedMassResponse(Response):
    buckets: list[int | None]
    mass: list[list[list[float]]]


class SweepPick(Response):
    """The head the sweep singles out: its loss rises most when it alone gets the smallest window."""

    layer: int
    head: int
    window: int
    delta: float = Field(description="on eval_set, where it was picked (in-sample)")
    held_out_delta: float | None = Field(description="the same edit on the held-out set (not used to pick)")
    held_out_loss: float | None = Field(None, description="the edited plan's loss on the held-out set")
    held_out_baseline_loss: float | None = Field(None, description="the model's own plan's loss on the held-out set")


class SensitivityResponse(Response):
    buckets: list[int | None]
    baseline_loss: float
    delta: list[list[list[float | None]]]
    eval_set: str
    held_out: str | None = Field(description="the set the pick is checked on (None: this model has none)")
    pick: SweepPick | None = Field(description="None when no head's loss rises at the smallest window")


# The eval set a choice made on one set is checked on: it shares no sequence with the choosing set
# (mixed = text + copy; english is the bundled English text, never trained on).
HELD_OUT: dict[str, EvalSet] = {"mixed": "english", "text": "english", "copy": "english", "english": "text"}


class AllocateRequest(Request):
    budget: float = Field(gt=0.0, le=1.0, allow_inf_nan=False)
    metric: Literal["causal_coverage", "acr"] = "causal_coverage"
    eval_set: EvalSet = Field("mixed", description="the set the allocator chooses its plan on")
    held_out: EvalSet | None = Field(
        None, description="the set the chosen plan is scored on as well; default: one sharing no sequence with "
        "eval_set (mixed, text, copy -> english; english -> text). Must differ from eval_set")

    @model_validator(mode="after")
    def _held_out(self) -> AllocateRequest:
        if self.held_out is None:
            self.held_out = HELD_OUT[self.eval_set]
        if self.held_out == self.eval_set:
            raise ValueError("held_out must differ from eval_set (a score on the choosing set is in-sample)")
        return self


class CurvePoint(Response):
    acr: float
    causal_coverage: float
    kv_bytes: int | None = Field(None, description="KV-cache bytes of the step's plan at context seq_len")
    loss: float


class AllocateResponse(CoverageFields):
    windows: list[list[int | None]]
    eval_set: str = Field(description="the set the plan was chosen on (loss, baseline_loss, curve: in-sample)")
    loss: float
    baseline_loss: float
    held_out: str | None = Field(description="the set the plan was scored on besides (None: it has none here)")
    held_out_loss: float | None
    held_out_baseline_loss: float | None = Field(description="the model's own plan on the held-out set")
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
    kv_windows: list[list[int]] = Field(description="per layer and kv head: positions its cache keeps at N")
    measured: MeasuredCostPublic | None = None


class RetrievalRequest(Request):
    windows: Plan | None = Field(None, description="null: the model's own plan")
    per_cell: int = Field(16, ge=2, le=64, description="passkey sequences per (distance, start) cell")


class RetrievalResponse(Response):
    """Passkey retrieval under a plan (aah_core/analysis/retrieval.py): accuracy per key character at each
    distance with the repeat ending the sequence (`end`, as training logs it), and with the planted key at
    fixed starts (`by_start[i][j]`: starts[i], distances[j]; null where the distance does not fit)."""

    windows: list[list[int | None]]
    distances: list[int]
    starts: list[int]
    end: list[float]
    by_start: list[list[float | None]]
    chance: float
    key_chars_per_cell: int
    elapsed_ms: float
    cached: bool = False


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

