"""Issue 26's ratios in CPU time of one thread: `python -m bench.cpu_time [--only attention|decode|prefill]`.

On a shared machine wall-clock ratios move by tens of percent with the other processes' load; CPU time of
the measuring thread (time.thread_time, one torch thread) does not. Each figure is a plan / full ratio
taken in the same run, the two interleaved:

- attention: T=2048, H=8, D=64, plan mix-cov0.28 (windows T/64, T/32, T/32, T/16 x3, T/2, T; causal
  coverage 0.283), banded against causal SDPA, forward and forward+backward, median of `--runs`;
- decode: the demo's shape (4 layers x 4 heads x 128) at seq_len 4096 with bench.engine's mixed plan
  (coverage 0.33), one decode step at context 4096 (median of the last `--steps` steps), batch 1 and 8,
  with the step's CPU time inside the caches' attend() (cache writes and attention) and the rest;
- prefill: the same model, a prompt of 4096 tokens through forward_cached, batch 1 and 8, median of `--runs`.

Only `aah_core` and `bench.engine` are imported, so the script also times an older tree (run it with that
tree first on PYTHONPATH) for A/B comparisons. `--out FILE` writes the JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from aah_core.attention import windowed_attention
from aah_core.config import apply_overrides
from aah_core.inference.generate import forward_cached, new_cache
from aah_core.inference.kvcache import LayerKVCache
from aah_core.model import WindowedGPT
from aah_core.presets import get_preset
from aah_core.windows import full_plan
from bench.engine import mixed_plan


def cpu_ms(fn: Callable[..., object], *args: object) -> float:
    t0 = time.thread_time()
    fn(*args)
    return (time.thread_time() - t0) * 1e3


def _attention_call(qkv: list[torch.Tensor], windows: list[int], banded: bool, grad: torch.Tensor | None) -> None:
    with torch.set_grad_enabled(grad is not None):
        if banded:
            out = windowed_attention(*qkv, windows, backend="banded")
        else:
            out = F.scaled_dot_product_attention(*qkv, is_causal=True)
        if grad is not None:
            torch.autograd.grad(out, qkv, grad)


def attention(runs: int, T: int = 2048) -> dict[str, dict[str, float]]:
    windows = [T // 64, T // 32, T // 32, T // 16, T // 16, T // 16, T // 2, T]
    g = torch.Generator().manual_seed(T)
    q, k, v, grad = (torch.randn(1, 8, T, 64, generator=g) for _ in range(4))
    out = {}
    for mode in ("fwd", "fwd+bwd"):
        qkv = [t.clone().requires_grad_(mode == "fwd+bwd") for t in (q, k, v)]
        times: dict[str, list[float]] = {"sdpa": [], "banded": []}
        for rep in range(runs + 2):
            for name in times:
                ms = cpu_ms(_attention_call, qkv, windows, name == "banded", grad if mode == "fwd+bwd" else None)
                if rep >= 2:
                    times[name].append(ms)
        sdpa, band = statistics.median(times["sdpa"]), statistics.median(times["banded"])
        out[mode] = {"sdpa_ms": round(sdpa, 3), "banded_ms": round(band, 3), "ratio": round(band / sdpa, 4)}
    return out


def _model(T: int) -> tuple[WindowedGPT, torch.Tensor, torch.Tensor]:
    config = apply_overrides(get_preset("demo"), {"model.seq_len": T})
    torch.manual_seed(0)
    model = WindowedGPT(config.model).eval()
    return model, mixed_plan(model.n_layer, model.n_head, T), full_plan(model.n_layer, model.n_head, T)


class _AttendClock:
    """CPU time spent inside the caches' attend() (writes and attention), summed while `on`: the rest of a
    step (embedding, norms, projections, MLP, rotary, LM head, Python) is the step minus it."""

    def __init__(self) -> None:
        self.spent = 0.0
        self._attend = LayerKVCache.attend

    def __enter__(self) -> _AttendClock:
        clock, attend = self, self._attend

        def timed(cache: LayerKVCache, *args: torch.Tensor, **kwargs: object) -> torch.Tensor:
            t0 = time.thread_time()
            out = attend(cache, *args, **kwargs)  # type: ignore[arg-type]
            clock.spent += time.thread_time() - t0
            return out

        LayerKVCache.attend = timed  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        LayerKVCache.attend = self._attend  # type: ignore[method-assign]


@torch.no_grad()
def decode(batch: int, steps: int, T: int = 4096) -> dict[str, float]:
    model, plan, full = _model(T)
    prompt = torch.randint(0, model.vocab_size, (batch, T), generator=torch.Generator().manual_seed(batch))
    caches = {}
    for name, p in (("plan", plan), ("full", full)):
        caches[name] = new_cache(model, p)
        forward_cached(model, prompt[:, : T - steps - 2], caches[name], p)
    times: dict[str, list[float]] = {"plan": [], "full": []}
    attend: dict[str, list[float]] = {"plan": [], "full": []}
    with _AttendClock() as clock:
        for t in range(T - steps - 2, T):  # two warm-up steps, then `steps` timed ones, the plans interleaved
            for name, p in (("plan", plan), ("full", full)):
                clock.spent = 0.0
                ms = cpu_ms(forward_cached, model, prompt[:, t : t + 1], caches[name], p)
                if t >= T - steps:
                    times[name].append(ms)
                    attend[name].append(clock.spent * 1e3)
    pm, fm = statistics.median(times["plan"]), statistics.median(times["full"])
    pa, fa = statistics.median(attend["plan"]), statistics.median(attend["full"])
    return {"plan_ms": round(pm, 3), "full_ms": round(fm, 3), "ratio": round(pm / fm, 4),
            "plan_attend_ms": round(pa, 3), "full_attend_ms": round(fa, 3), "attend_ratio": round(pa / fa, 4),
            "plan_rest_ms": round(pm - pa, 3), "full_rest_ms": round(fm - fa, 3)}


@torch.no_grad()
def prefill(batch: int, runs: int, T: int = 4096) -> dict[str, float]:
    model, plan, full = _model(T)
    prompt = torch.randint(0, model.vocab_size, (batch, T), generator=torch.Generator().manual_seed(batch))
    times: dict[str, list[float]] = {"plan": [], "full": []}
    for rep in range(runs + 1):
        for name, p in (("plan", plan), ("full", full)):
            ms = cpu_ms(forward_cached, model, prompt, new_cache(model, p), p)
            if rep >= 1:
                times[name].append(ms)
    pm, fm = statistics.median(times["plan"]), statistics.median(times["full"])
    return {"plan_ms": round(pm, 2), "full_ms": round(fm, 2), "ratio": round(pm / fm, 4)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="+", default=["attention", "decode", "prefill"])
    parser.add_argument("--runs", type=int, default=5, help="attention and prefill repeats (default 5)")
    parser.add_argument("--steps", type=int, default=24, help="decode steps timed (default 24)")
    parser.add_argument("--out", help="write the result here (JSON)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    result: dict[str, object] = {"clock": "thread_time", "threads": 1, "torch": torch.__version__,
                                 "loadavg_before": os.getloadavg()}
    if "attention" in args.only:
        result["attention"] = attention(args.runs)
    if "decode" in args.only:
        result["decode"] = {f"batch {b}": decode(b, args.steps) for b in (1, 8)}
    if "prefill" in args.only:
        result["prefill"] = {f"batch {b}": prefill(b, max(1, args.runs // 2)) for b in (1, 8)}
    result["loadavg_after"] = os.getloadavg()
    print(json.dumps(result, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
