"""Baselines matched to a target causal coverage: the window, or the global heads and window, whose
plan's causal_coverage (aah_core.windows, sink keys counted) is closest to the target.

The suite (aah_core/suite.py) sets `fixed_window`, `sink_window` and `local_global` this way to
`full_adaptive`'s measured coverage, so every row is compared with the simple baselines at the same
attention work. Windows are any integer in 1..T (not only the model's buckets): a static plan takes
any window, and the buckets' coarse steps would miss the target by more than the ±0.02 asked for.
"""

from __future__ import annotations

import torch

from aah_core.errors import InvalidConfig
from aah_core.windows import causal_coverage


def _check_target(target: float) -> None:
    if not 0.0 < target <= 1.0:
        raise InvalidConfig(f"a target coverage must be in (0, 1]; got {target!r}")


def plan_coverage(n_head: int, global_heads: int, window: int, seq_len: int, sinks: int = 0) -> float:
    """causal_coverage of one layer with `global_heads` full heads and the rest at `window` (every layer alike)."""
    row = [seq_len] * global_heads + [window] * (n_head - global_heads)
    return causal_coverage(torch.tensor([row]), seq_len, sinks)


def matched_window(seq_len: int, target: float, sinks: int = 0, n_head: int = 1, global_heads: int = 0) -> int:
    """The window w in 1..T whose plan (`global_heads` full heads per layer, the rest at w) is closest to `target`.

    Coverage grows with w, so this is a bisection for the first w at or above the target, then the
    nearer of it and its predecessor."""
    _check_target(target)
    lo, hi = 1, seq_len
    while lo < hi:
        mid = (lo + hi) // 2
        if plan_coverage(n_head, global_heads, mid, seq_len, sinks) < target:
            lo = mid + 1
        else:
            hi = mid
    candidates = [w for w in (lo - 1, lo) if w >= 1]
    return min(candidates, key=lambda w: abs(plan_coverage(n_head, global_heads, w, seq_len, sinks) - target))


def matched_local_global(seq_len: int, n_head: int, target: float, global_heads: int = 1,
                         sinks: int = 0) -> tuple[int, int]:
    """(global heads per layer, window of the others) closest to `target`.

    Keeps `global_heads` full heads per layer (1 by default: one global head per layer) unless those
    alone already cover more than the target (every other head at window 1): then fewer."""
    _check_target(target)
    if not 1 <= global_heads < n_head:
        raise InvalidConfig(f"local + global needs 1 <= global_heads < n_head={n_head}; got {global_heads}")
    g = global_heads
    while g > 0 and plan_coverage(n_head, g, 1, seq_len, sinks) > target:
        g -= 1
    return g, matched_window(seq_len, target, sinks, n_head, g)
