"""What a window plan costs at inference, beside the full plan.

Exact figures are pure functions of the plan, the context N and the model's shape:

- KV-cache entries: sum over layers and key/value heads of min(N, w + s), where a kv head's
  window w is the largest among the query heads that share it (grouped-query attention) and
  s the model's sink tokens (kept besides the window);
  bytes = entries * 2 (k and v) * head_dim * bytes per element, for one sequence.
- attention score pairs: sum over query heads of w*N - w*(w-1)/2 with w = min(w_h, N), plus
  the sink pairs (aah_core.windows.pair_count); the full plan has N*(N+1)/2 per head.

Measured figures (prefill time, decode-step time at context N, peak memory on CUDA) are
taken for the plan and the full plan in the same run, interleaved, and given as ratios.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass
from typing import Any

import torch

from aah_core.errors import AAHError
from aah_core.inference.generate import forward_cached, new_cache
from aah_core.inference.kvcache import kv_head_windows
from aah_core.model_api import WindowedLM
from aah_core.windows import full_plan, pair_count


@dataclass(frozen=True)
class ModelShape:
    """What the exact figures need of a model."""

    n_layer: int
    n_head: int
    n_kv_head: int
    head_dim: int
    seq_len: int
    dtype_bytes: int = 4
    sinks: int = 0

    @classmethod
    def of(cls, model: WindowedLM) -> ModelShape:
        param = next(iter(model.parameters()), None) if hasattr(model, "parameters") else None
        size = param.element_size() if param is not None else 4
        return cls(model.n_layer, model.n_head, model.n_kv_head, model.head_dim, model.seq_len, size, model.sinks)


@dataclass(frozen=True)
class PlanCost:
    context: int
    kv_entries: int  # (position, kv head) pairs cached over all layers, one sequence
    kv_entries_full: int
    kv_bytes: int
    kv_bytes_full: int
    attention_pairs: int  # (query, key) score pairs of a forward over N positions, all layers and heads
    attention_pairs_full: int
    n_kv_head: int
    kv_windows: list[list[int]]  # per layer and kv head: the window its cache keeps (min(w, N))

    @property
    def kv_ratio(self) -> float:
        return self.kv_bytes / self.kv_bytes_full

    @property
    def pairs_ratio(self) -> float:
        return self.attention_pairs / self.attention_pairs_full

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"kv_ratio": self.kv_ratio, "pairs_ratio": self.pairs_ratio}


def check_context(context: Any, seq_len: int) -> int:
    """A context length from user input: an integer in [1, seq_len]."""
    if isinstance(context, bool) or not isinstance(context, int) or not 1 <= context <= seq_len:
        raise AAHError(f"context must be an integer in [1, {seq_len}] (the model's seq_len); got {context!r}")
    return context


def kv_windows(plan: torch.Tensor, n_kv_head: int, context: int) -> list[list[int]]:
    """Each layer's kv-head windows under `plan` [n_layer, n_head], clamped to the context."""
    return [[min(w, context) for w in kv_head_windows(row, n_kv_head)] for row in plan.tolist()]


def plan_cost(plan: torch.Tensor, context: int, shape: ModelShape) -> PlanCost:
    """The exact KV-cache size and attention pairs of `plan` at context N (one sequence)."""
    if tuple(plan.shape) != (shape.n_layer, shape.n_head):
        raise AAHError(f"plan shape {tuple(plan.shape)} != ({shape.n_layer}, {shape.n_head})")
    context = check_context(context, shape.seq_len)
    windows = kv_windows(plan, shape.n_kv_head, context)
    entries = sum(min(w + shape.sinks, context) for row in windows for w in row)  # each window and its sinks
    entries_full = shape.n_layer * shape.n_kv_head * context
    per_entry = 2 * shape.head_dim * shape.dtype_bytes  # a key and a value
    pairs = sum(pair_count(w, context, shape.sinks) for w in plan.flatten().tolist())
    pairs_full = shape.n_layer * shape.n_head * pair_count(context, context)
    return PlanCost(context, entries, entries_full, entries * per_entry, entries_full * per_entry, pairs,
                    pairs_full, shape.n_kv_head, windows)


@dataclass(frozen=True)
class MeasuredCost:
    """Medians over repeats; *_full are the full plan's, measured in the same run."""

    prefill_ms: float
    prefill_ms_full: float
    decode_step_ms: float | None  # one new token with context N (None when N = 1)
    decode_step_ms_full: float | None
    peak_memory_bytes: int | None  # CUDA only: peak allocated while decoding
    peak_memory_bytes_full: int | None
    batch: int
    device: str

    def ratios(self) -> dict[str, float | None]:
        def ratio(a: float | None, b: float | None) -> float | None:
            return None if a is None or not b else a / b

        return {
            "prefill_ratio": ratio(self.prefill_ms, self.prefill_ms_full),
            "decode_step_ratio": ratio(self.decode_step_ms, self.decode_step_ms_full),
            "peak_memory_ratio": ratio(self.peak_memory_bytes, self.peak_memory_bytes_full),
        }

    def tokens_per_s(self, full: bool = False) -> float | None:
        ms = self.decode_step_ms_full if full else self.decode_step_ms
        return None if not ms else 1000.0 * self.batch / ms

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | self.ratios() | {
            "tokens_per_s": self.tokens_per_s(), "tokens_per_s_full": self.tokens_per_s(full=True)}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _prefill_ms(model: WindowedLM, plan: torch.Tensor, prompt: torch.Tensor, backend: str) -> float:
    cache = new_cache(model, plan, backend)
    _sync(prompt.device)
    t0 = time.perf_counter()
    forward_cached(model, prompt, cache, plan)
    _sync(prompt.device)
    return 1000.0 * (time.perf_counter() - t0)


def _decode_ms(
    model: WindowedLM, plan: torch.Tensor, prompt: torch.Tensor, steps: int, backend: str
) -> tuple[float, int | None]:
    """Median ms of the last `steps` one-token steps up to context N (the prompt length); peak bytes on CUDA."""
    device = prompt.device
    cache = new_cache(model, plan, backend)
    N = prompt.shape[1]
    forward_cached(model, prompt[:, : N - steps], cache, plan)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    times = []
    for t in range(N - steps, N):
        _sync(device)
        t0 = time.perf_counter()
        forward_cached(model, prompt[:, t : t + 1], cache, plan)
        _sync(device)
        times.append(1000.0 * (time.perf_counter() - t0))
    peak = int(torch.cuda.max_memory_allocated(device)) if device.type == "cuda" else None
    return statistics.median(times), peak


@torch.no_grad()
def measure_cost(
    model: WindowedLM, plan: torch.Tensor, context: int, repeats: int = 3, decode_steps: int = 8,
    batch: int = 1, backend: str = "auto", seed: int = 0,
) -> MeasuredCost:
    """Time a prefill of N tokens and single decode steps at context N, for `plan` and for the full plan.

    The two plans alternate within every repeat (so load on a shared machine hits both); medians.
    """
    context = check_context(context, model.seq_len)
    if repeats < 1 or decode_steps < 1 or batch < 1:
        raise AAHError("repeats, decode_steps and batch must be >= 1")
    device = model.plan.device
    gen = torch.Generator().manual_seed(seed)
    prompt = torch.randint(0, model.vocab_size, (batch, context), generator=gen).to(device)
    steps = min(decode_steps, context - 1)
    full = full_plan(model.n_layer, model.n_head, model.seq_len).to(plan.device)
    was_training = model.training
    model.eval()
    results: dict[str, dict[str, list[float]]] = {"plan": {}, "full": {}}
    peaks: dict[str, int | None] = {}
    try:
        _prefill_ms(model, plan, prompt, backend)  # warm-up (first calls allocate, compile masks)
        for _ in range(repeats):
            for name, p in (("plan", plan), ("full", full)):
                results[name].setdefault("prefill", []).append(_prefill_ms(model, p, prompt, backend))
                if steps:
                    ms, peak = _decode_ms(model, p, prompt, steps, backend)
                    results[name].setdefault("decode", []).append(ms)
                    peaks[name] = peak
    finally:
        model.train(was_training)

    def med(name: str, key: str) -> float | None:
        values = results[name].get(key)
        return statistics.median(values) if values else None

    return MeasuredCost(
        prefill_ms=statistics.median(results["plan"]["prefill"]),
        prefill_ms_full=statistics.median(results["full"]["prefill"]),
        decode_step_ms=med("plan", "decode"), decode_step_ms_full=med("full", "decode"),
        peak_memory_bytes=peaks.get("plan"), peak_memory_bytes_full=peaks.get("full"),
        batch=batch, device=str(device),
    )
