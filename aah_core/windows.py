"""Window plans and coverage metrics: the one definition used everywhere.

For head h with window w_h (an integer >= 1), query i attends to keys j with
``i - w_h < j <= i``: the w_h most recent keys, itself included. ``w_h >= T`` is full
causal attention. A model may also keep ``s`` sink tokens (``ModelConfig.sinks``, default 0):
every head then also sees the first s keys, so query i attends key j iff ``j <= i`` and
(``j > i - w_h`` or ``j < s``), StreamingLLM's rule; every coverage metric below counts them.
A plan is an integer tensor ``[n_layer, n_head]``; in JSON it is a list of lists where ``null``
means full. The sink count is the model's, not the plan's: plan JSON is the same with or without.

This module is the engine's plan type and its one JSON codec: `decode_window` / `validate_plan`
read user or stored JSON (an int >= 1 or null; ints >= T are full) into the tensor form,
`encode_window` / `plan_to_json` write it back with full as null. Every layer above converts
through these four functions and nothing else.

"Full window" has one spelling per medium: ``None`` in Python and ``null`` in JSON, ``FULL`` ("full")
in text (`window_label`), and the sequence length T inside the engine's tensors, where a number is
needed (a window >= T sees every earlier key).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from aah_core.errors import InvalidWindowPlan

JsonWindow = int | None
JsonPlan = list[list[JsonWindow]]
DEFAULT_TILE = 128
FULL = "full"  # a full window in text: labels, metric keys (window_frac/full), reports


def window_label(window: int | None, seq_len: int | None = None) -> str:
    """A window as text: "full" for None (or anything >= seq_len when given), else the integer."""
    if window is None or (seq_len is not None and int(window) >= seq_len):
        return FULL
    return str(int(window))


def _check_window(value: Any, where: str) -> int | None:
    """One window from user input: an int >= 1 or None (full). bools, floats and strings are refused."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidWindowPlan(f"{where}: got {value!r}; expected an integer >= 1 or null (full)")
    if value < 1:
        raise InvalidWindowPlan(f"{where}: window {value} is invalid; use an integer >= 1 or null (full)")
    return value


def decode_window(value: Any, seq_len: int, where: str = "window") -> int:
    """One JSON window -> its engine form: null -> seq_len, ints clamped to seq_len; others refused."""
    w = _check_window(value, where)
    return seq_len if w is None else min(w, seq_len)


def encode_window(window: int | None, seq_len: int) -> JsonWindow:
    """One window -> JSON: full (null, or any value >= seq_len) is written as None."""
    return None if window is None or int(window) >= seq_len else int(window)


def validate_plan(raw: Any, n_layer: int, n_head: int, seq_len: int) -> torch.Tensor:
    """Turn user input into a plan tensor [n_layer, n_head] (int64), full written as seq_len.

    Accepts a nested list of ints / None, or an integer tensor of the right shape.
    """
    if isinstance(raw, torch.Tensor):
        if raw.dtype.is_floating_point or raw.dtype == torch.bool:
            raise InvalidWindowPlan(f"plan tensor has dtype {raw.dtype}; expected an integer dtype")
        raw = raw.tolist()
    if not isinstance(raw, (list, tuple)) or len(raw) != n_layer:
        got = len(raw) if isinstance(raw, (list, tuple)) else type(raw).__name__
        raise InvalidWindowPlan(f"plan must be a list of {n_layer} layers, each a list of {n_head} windows; got {got}")
    rows = []
    for layer, row in enumerate(raw):
        if not isinstance(row, (list, tuple)) or len(row) != n_head:
            got = len(row) if isinstance(row, (list, tuple)) else type(row).__name__
            raise InvalidWindowPlan(f"layer {layer}: expected {n_head} windows; got {got}")
        rows.append([decode_window(w, seq_len, f"layer {layer}, head {h}") for h, w in enumerate(row)])
    return torch.tensor(rows, dtype=torch.long)


def full_plan(n_layer: int, n_head: int, seq_len: int) -> torch.Tensor:
    """The plan in which every head sees its full causal context."""
    return torch.full((n_layer, n_head), seq_len, dtype=torch.long)


def uniform_plan(n_layer: int, n_head: int, seq_len: int, window: int | None) -> torch.Tensor:
    """Every head gets the same window (None = full)."""
    w = decode_window(window, seq_len, "uniform window")
    return torch.full((n_layer, n_head), w, dtype=torch.long)


def plan_to_json(plan: torch.Tensor | Sequence[Sequence[int | None]], seq_len: int) -> JsonPlan:
    """A plan (tensor, or nested lists that may already hold None) as JSON, full written as None."""
    rows = plan.tolist() if isinstance(plan, torch.Tensor) else plan
    return [[encode_window(w, seq_len) for w in row] for row in rows]


def check_head_windows(windows: Sequence[int] | torch.Tensor, n_head: int) -> tuple[int, ...]:
    """Validate one layer's per-head windows for attention; returns plain ints (not clamped)."""
    if isinstance(windows, torch.Tensor):
        if windows.dim() != 1 or windows.dtype.is_floating_point or windows.dtype == torch.bool:
            raise InvalidWindowPlan(
                f"windows must be a 1-D integer tensor; got shape {tuple(windows.shape)}, dtype {windows.dtype}"
            )
        windows = windows.tolist()
    if isinstance(windows, (str, bytes)) or not isinstance(windows, Sequence):
        raise InvalidWindowPlan(f"windows must be a sequence of {n_head} integers; got {type(windows).__name__}")
    if len(windows) != n_head:
        raise InvalidWindowPlan(f"got {len(windows)} windows for {n_head} heads; pass exactly one window per head")
    out = []
    for h, w in enumerate(windows):
        checked = _check_window(w, f"head {h}")
        if checked is None:
            raise InvalidWindowPlan(f"head {h}: got None; attention needs an integer window (use T for full)")
        out.append(checked)
    return tuple(out)


def check_sinks(value: Any, where: str = "sinks") -> int:
    """A sink count from user input: an integer >= 0 (bools, floats and strings are refused)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidWindowPlan(f"{where}: got {value!r}; expected an integer >= 0 (the number of sink tokens)")
    return value


def pair_count(window: int, seq_len: int, sinks: int = 0) -> int:
    """Attended (query, key) pairs of one head: w*T - w*(w-1)/2 with w = min(window, T), plus the sink pairs.

    Row i >= w sees min(s, i - w + 1) sink keys outside its window: over the m = T - w such rows
    that is 1 + 2 + .. + min(m, s), then s for each row after the s-th."""
    w = min(int(window), seq_len)
    m, s = seq_len - w, min(sinks, seq_len - w)
    return w * seq_len - w * (w - 1) // 2 + s * (s + 1) // 2 + s * (m - s)


def acr(plan: torch.Tensor, seq_len: int, sinks: int = 0) -> float:
    """The paper's Attention Coverage Ratio: mean over heads of min(w + s, T) / T (ignores the causal triangle)."""
    return float((plan + sinks).clamp(max=seq_len).double().mean() / seq_len)


def causal_coverage(plan: torch.Tensor, seq_len: int, sinks: int = 0) -> float:
    """Attended (query, key) pairs over full causal pairs, summed over every head of every layer."""
    attended = sum(pair_count(w, seq_len, sinks) for w in plan.flatten().tolist())
    return attended / (plan.numel() * seq_len * (seq_len + 1) // 2)


def _tiles_touched(window: int, n_blocks: int, block: int, sinks: int = 0) -> int:
    """Causal tiles (q_block >= k_block) that hold at least one pair with q - k < window or k < sinks."""
    sink_blocks = math.ceil(sinks / block)  # key blocks that hold a sink key
    touched = 0
    for gap in range(n_blocks):  # gap = q_block - k_block; tiles with this gap: n_blocks - gap
        # the closest pair in a tile with gap >= 1 is q = q_block*b, k = k_block*b + b - 1
        closest = 0 if gap == 0 else (gap - 1) * block + 1
        if closest <= window - 1:
            touched += n_blocks - gap
        else:  # outside the window only the sink key blocks (k_block < sink_blocks) are touched
            touched += min(sink_blocks, n_blocks - gap)
    return touched


def tile_coverage(plan: torch.Tensor, seq_len: int, block: int = DEFAULT_TILE, sinks: int = 0) -> float:
    """Fraction of causal block x block tiles a block-sparse windowed kernel must touch."""
    n_blocks = math.ceil(seq_len / block)
    causal_tiles = n_blocks * (n_blocks + 1) // 2
    touched = sum(_tiles_touched(min(w, seq_len), n_blocks, block, sinks) for w in plan.flatten().tolist())
    return touched / (plan.numel() * causal_tiles)


def coverage_metrics(plan: torch.Tensor, seq_len: int, sinks: int = 0) -> dict[str, float]:
    """The three coverage metrics under their contract names (`sinks`: the model's sink tokens)."""
    return {
        "acr": acr(plan, seq_len, sinks),
        "causal_coverage": causal_coverage(plan, seq_len, sinks),
        "tile_coverage": tile_coverage(plan, seq_len, sinks=sinks),
    }


def window_fractions(plan: torch.Tensor, buckets: Sequence[int], seq_len: int) -> dict[str, float]:
    """Fraction of heads whose window equals each bucket (key 'full' for windows >= seq_len)."""
    flat = plan.clamp(max=seq_len).flatten().tolist()
    counts = dict.fromkeys((window_label(b, seq_len) for b in buckets), 0)
    for w in flat:
        key = window_label(w, seq_len)
        counts[key] = counts.get(key, 0) + 1
    return {k: v / len(flat) for k, v in counts.items()}
