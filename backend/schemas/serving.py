"""Request and response models of rounding a plan to a serving grain and exporting it."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from backend.schemas.base import EvalSet, Plan, Request
from backend.schemas.models import CostFields, CoverageFields

Granularity = Literal["head", "kv_group", "layer", "transformers"]
RoundMode = Literal["up", "budget"]


class RoundRequest(Request):
    windows: Plan
    granularity: Granularity = "transformers"
    mode: RoundMode = Field("up", description="up: no head shrinks, fewest KV bytes; budget: KV bytes <= the "
                                              "plan's, lowest loss among the grain's candidates")
    eval_set: EvalSet = "mixed"


class RoundResponse(CoverageFields, CostFields):
    """The rounded plan, its loss (what POST /evaluate gives for it), its coverage and exact cost at seq_len."""

    windows: list[list[int | None]]
    granularity: Granularity
    mode: RoundMode
    loss: float
    plan_loss: float = Field(description="the per-head plan's loss on the same batch")
    delta: float = Field(description="loss - plan_loss: what the rounding costs in loss")
    kv_bytes_plan: int = Field(description="the per-head plan's KV bytes at seq_len")
    window: int | None = Field(None, description="transformers grain: the one sliding window (null: all full)")
    candidates: int = Field(description="plans the grain allowed under the mode's rule")
    note: str = Field(description="which engines serve the grain, and how the plan was chosen")


class ExportRequest(RoundRequest):
    name: str | None = Field(None, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$",
                             description="folder name under <data dir>/exports (default: from the request)")
