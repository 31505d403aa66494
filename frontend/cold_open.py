"""The editor's cold open: one sentence saying what this is and what to try first, derived from the
model's own numbers (the head that needs far context most), never written in by hand. Pure."""

from __future__ import annotations

from typing import Sequence

from frontend.plans import Window, window_label

WHAT = "Here every attention head gets its own window (how many recent tokens it may look at) and the loss shows the cost"
SWEEP_LIMIT = 64  # heads; a larger model's opening uses the retained-mass curves (one forward pass) instead


def _smallest(buckets: Sequence[Window]) -> int | None:
    """Index of the smallest integer window among the buckets (None when all are full)."""
    ints = [(w, k) for k, w in enumerate(buckets) if w is not None]
    return min(ints)[1] if ints else None


def held_out_clause(sweep: dict) -> str:
    """The sweep's pick checked on a set it was not picked on (GET /sensitivity's `pick`), or ""."""
    pick = sweep.get("pick") or {}
    if pick.get("held_out_delta") is None:
        return ""
    return (f" That head was picked on {sweep['eval_set']}; on held-out {sweep['held_out']} the same edit "
            f"changes the loss by {pick['held_out_delta']:+.3f} nats.")


def pick_line(sweep: dict) -> str:
    """The sweep's pick with both of its numbers, in-sample and held-out (under the sweep's heatmap), or ""."""
    pick = sweep.get("pick") or {}
    if not pick:
        return ""
    head = f"L{pick['layer']}H{pick['head']} at window {window_label(pick['window'])}"
    line = f"The head this sweep singles out: {head}, {pick['delta']:+.3f} nats on {sweep['eval_set']} (where it was picked)"
    if pick.get("held_out_delta") is None:
        return line + "; no held-out set for this model."
    return line + f", {pick['held_out_delta']:+.3f} nats on held-out {sweep['held_out']} (not used to pick it)."


def from_sensitivity(delta: Sequence[Sequence[Sequence[float | None]]], buckets: Sequence[Window]) -> str | None:
    """The sentence from the sensitivity sweep: the head whose loss rises most when it alone is shrunk
    to the smallest window, against the head that minds it least. None when there is nothing to say."""
    k = _smallest(buckets)
    if k is None:
        return None
    cells = [(d[k], layer, head) for layer, row in enumerate(delta) for head, d in enumerate(row) if d[k] is not None]
    if not cells:
        return None
    worst, least = max(cells), min(cells)
    if worst[0] <= 0:
        return None
    w = window_label(buckets[k])
    return (f"{WHAT}: in this model, layer {worst[1]} head {worst[2]} needs far context most (shrunk alone to "
            f"{w} tokens, the loss rises by {worst[0]:.3f} nats; layer {least[1]} head {least[2]}: {least[0]:+.3f}), "
            f"so try that first: pick L{worst[1]}H{worst[2]} below and set it to {w}.")


def from_retained_mass(mass: Sequence[Sequence[Sequence[float]]], buckets: Sequence[Window]) -> str | None:
    """The sentence from retained-mass curves: the head that keeps the least attention within the
    smallest window (it looks furthest back). None when there is nothing to say."""
    k = _smallest(buckets)
    if k is None:
        return None
    cells = [(m[k], layer, head) for layer, row in enumerate(mass) for head, m in enumerate(row)]
    if not cells:
        return None
    low, high = min(cells), max(cells)
    w = window_label(buckets[k])
    return (f"{WHAT}: in this model, layer {low[1]} head {low[2]} looks furthest back (only {low[0]:.0%} of its "
            f"attention falls within the last {w} tokens; layer {high[1]} head {high[2]}: {high[0]:.0%}), so try "
            f"that first: pick L{low[1]}H{low[2]} below, set it to {w} and watch the loss.")
