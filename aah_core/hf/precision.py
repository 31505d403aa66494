"""The evaluation dtype of a Hugging Face model on this machine, chosen by measurement.

bfloat16 halves the weights' bytes, and on CPUs that run it natively (AVX512-BF16, AMX) its
matrix products are several times faster than float32's; elsewhere it is emulated and slower.
So the choice is measured, not guessed: a matrix product of the model's width, best of a few
runs in each dtype (once per width and process). bfloat16 is taken when it is at least
MIN_SPEEDUP times faster. Its cost in accuracy is measured too: the model is loaded in float32,
its loss (own plan) taken on a sample of the evaluation text, then it is cast to bfloat16 and
the loss taken again; the difference is what the model's page shows.
"""

from __future__ import annotations

import functools
import time
from dataclasses import asdict, dataclass
from typing import Any

import torch

from aah_core.analysis.evaluate import evaluate_loss
from aah_core.data import EvalBatch

MIN_SPEEDUP = 1.3  # bfloat16 must beat float32 by this much to be worth its rounding
_ROWS = 512  # rows of the timed product (tokens), columns 4 x width (an MLP's first product)
_RUNS = 3
MIN_TIMED_WIDTH = 512  # a tiny model's product is too short to time: the machine's answer is the same


@dataclass(frozen=True)
class Precision:
    """How a model is evaluated, and why."""

    dtype: str  # "float32" or "bfloat16"
    choice: str  # "measured" (the faster one here) or "requested"
    bf16_speedup: float  # float32 time / bfloat16 time of a product of the model's width, here
    loss_float32: float | None  # the model's own-plan loss on `tokens` evaluation tokens, in float32
    loss_bfloat16: float | None  # the same in bfloat16 (None when the model stays in float32)
    tokens: int  # tokens the two losses were taken on

    @property
    def loss_delta(self) -> float | None:
        """bfloat16's loss minus float32's (None when the model stays in float32)."""
        if self.loss_bfloat16 is None or self.loss_float32 is None:
            return None
        return self.loss_bfloat16 - self.loss_float32

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "loss_delta": self.loss_delta}


def _best_time(a: torch.Tensor, b: torch.Tensor) -> float:
    a @ b  # warm-up: the first call pays for kernel selection
    best = float("inf")
    for _ in range(_RUNS):
        t = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t)
    return best


@functools.lru_cache(maxsize=8)
def bf16_speedup(width: int) -> float:
    """float32 time / bfloat16 time of a [512, width] x [width, 4 width] product on this machine."""
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(_ROWS, width, generator=gen)
    b = torch.randn(width, 4 * width, generator=gen)
    f32 = _best_time(a, b)
    return f32 / _best_time(a.bfloat16(), b.bfloat16())


def settle_precision(model: Any, sample: EvalBatch, requested: str | None = None) -> Precision:
    """Put a float32-loaded HFWindowedLM in its evaluation dtype: `requested` ("float32" or "bfloat16"),
    else bfloat16 when it measures MIN_SPEEDUP times faster here. When the model ends in bfloat16 the
    float32 and bfloat16 losses on `sample` are measured (the model's own plan)."""
    if model.dtype != torch.float32:
        raise ValueError(f"settle_precision needs the model loaded in float32; it is in {model.dtype}")
    speedup = bf16_speedup(max(int(model.hf.config.hidden_size), MIN_TIMED_WIDTH))
    dtype = requested or ("bfloat16" if speedup >= MIN_SPEEDUP else "float32")
    choice = "requested" if requested else "measured"
    tokens = int((sample.targets >= 0).sum())
    if dtype == "float32":
        return Precision("float32", choice, speedup, None, None, tokens)
    loss_f32 = evaluate_loss(model, sample)
    model.cast(torch.bfloat16)
    return Precision("bfloat16", choice, speedup, loss_f32, evaluate_loss(model, sample), tokens)
