"""Rounding a per-head window plan to the grains serving engines support.

Grains (coarsest last):

- `head`: the plan itself (per-head windows: research code and this studio's engine).
- `kv_group`: the query heads that share a key/value head share one window.
- `layer`: every head of a layer shares one window.
- `transformers`: every layer is full or slides with ONE window w shared by the whole model
  (transformers' `layer_types` + `sliding_window`).

Modes:

- `up`: no head sees less context than in the plan; among such plans of the grain, the fewest KV bytes.
  For `kv_group` that is each group's largest window, whose KV bytes equal the plan's exactly (the cache
  already keeps a group's largest window).
- `budget`: the KV bytes stay at or below the plan's; among the few candidates the grain allows, the one
  with the lowest loss (the caller's `loss_of`, evaluated on every candidate).

KV bytes are aah_core.inference.cost's exact figure at the model's seq_len. Windows follow aah_core.windows.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from aah_core.errors import AAHError
from aah_core.inference.cost import ModelShape, plan_cost
from aah_core.inference.kvcache import kv_head_windows

GRAINS = ("head", "kv_group", "layer", "transformers")
MODES = ("up", "budget")
ENGINES = {
    "head": "per-head windows: research code only (DuoAttention, MoA, LServe) and this studio's engine",
    "kv_group": "one window per KV group: what a per-head KV cache saves under grouped-query attention "
                "(DuoAttention-style caches); no stock engine",
    "layer": "one window per layer: vLLM's hybrid KV-cache manager, TensorRT-LLM's VSWA, llama.cpp's SWA cache",
    "transformers": "each layer full or sliding with one window for the model: transformers' layer_types + "
                    "sliding_window (Qwen2/3, Gemma 3), SGLang's SWA pool, vLLM for Gemma 2/3",
}
LossOf = Callable[[torch.Tensor], float]


@dataclass(frozen=True)
class Candidate:
    """One plan a grain allows, with how it was made and its exact KV bytes."""

    plan: torch.Tensor  # [n_layer, n_head], full written as seq_len
    rule: str
    kv_bytes: int
    attention_pairs: int
    window: int | None = None  # transformers grain: the shared sliding window (None: every layer full)


@dataclass(frozen=True)
class Rounding:
    chosen: Candidate
    granularity: str
    mode: str
    kv_bytes_plan: int  # the per-head plan's
    candidates: list[Candidate]
    note: str

    @property
    def plan(self) -> torch.Tensor:
        return self.chosen.plan


def _candidate(plan: torch.Tensor, rule: str, shape: ModelShape, window: int | None = None) -> Candidate:
    cost = plan_cost(plan, shape.seq_len, shape)
    return Candidate(plan, rule, cost.kv_bytes, cost.attention_pairs, window)


def _units(shape: ModelShape, granularity: str) -> list[tuple[int, list[int], int]]:
    """(layer, query heads, kv heads they use) of each unit that shares one window."""
    if granularity == "layer":
        return [(layer, list(range(shape.n_head)), shape.n_kv_head) for layer in range(shape.n_layer)]
    if shape.n_head % shape.n_kv_head:
        raise AAHError(f"{shape.n_head} query heads cannot share {shape.n_kv_head} key/value heads evenly")
    g = shape.n_head // shape.n_kv_head
    return [(layer, list(range(k * g, (k + 1) * g)), 1) for layer in range(shape.n_layer)
            for k in range(shape.n_kv_head)]


def _kv_share(windows: list[int], n_kv: int) -> float:
    """The window per kv head that costs what these query heads cost in the plan (their kv heads keep
    their groups' largest windows)."""
    return sum(kv_head_windows(windows, n_kv)) / n_kv


def _shared(plan: torch.Tensor, shape: ModelShape, granularity: str,
            pick: Callable[[list[int], float], int]) -> torch.Tensor:
    """Each unit's heads get pick(their windows, the unit's KV share)."""
    out = plan.clone()
    rows = plan.tolist()
    for layer, heads, n_kv in _units(shape, granularity):
        windows = [rows[layer][h] for h in heads]
        out[layer, heads] = pick(windows, _kv_share(windows, n_kv))
    return out


def _unit_candidates(plan: torch.Tensor, shape: ModelShape, granularity: str, mode: str,
                     buckets: Sequence[int]) -> list[Candidate]:
    unit = "KV group" if granularity == "kv_group" else "layer"
    below = sorted(b for b in buckets if b <= shape.seq_len)
    rules: list[tuple[str, Callable[[list[int], float], int]]] = [(f"each {unit}'s largest window",
                                                                    lambda ws, share: max(ws))]
    if mode == "budget":  # each unit within its own KV share, so the whole plan within the plan's KV bytes
        rules += [
            (f"each {unit}: the window its KV share buys", lambda ws, share: max(1, math.floor(share))),
            (f"each {unit}: the largest bucket within its KV share",
             lambda ws, share: max([b for b in below if b <= share] or [1])),
            (f"each {unit}'s smallest window", lambda ws, share: min(ws)),
        ]
    return [_candidate(_shared(plan, shape, granularity, pick), rule, shape) for rule, pick in rules]


def _transformers_windows(plan: torch.Tensor, shape: ModelShape, buckets: Sequence[int]) -> list[int]:
    """Candidate shared windows: the model's buckets and the plan's own windows, below full."""
    return sorted(w for w in {int(b) for b in buckets} | set(plan.flatten().tolist()) if 1 <= w < shape.seq_len)


def _sliding(full: torch.Tensor, layers: list[int], w: int) -> torch.Tensor:
    """The full plan with `layers` sliding at w."""
    out = full.clone()
    out[layers] = w
    return out


def _layers_rule(w: int, sliding: list[int], n_layer: int) -> str:
    if len(sliding) == n_layer:
        return f"w={w}: every layer slides"
    return f"w={w}: layers {', '.join(map(str, sliding))} slide, the rest full" if sliding else f"w={w}: no layer slides"


def _transformers_candidates(plan: torch.Tensor, shape: ModelShape, mode: str, budget: int,
                             buckets: Sequence[int]) -> list[Candidate]:
    T = shape.seq_len
    full = torch.full_like(plan, T)
    out = [_candidate(full, "every layer full", shape)]
    need = plan.max(dim=1).values.tolist()  # each layer's largest window
    layer_kv = [_kv_share(row, shape.n_kv_head) for row in plan.tolist()]
    for w in _transformers_windows(plan, shape, buckets):
        if mode == "up":
            sliding = [layer for layer in range(shape.n_layer) if need[layer] <= w]
        else:  # every layer shrunk to w; then layers that lost context, most KV first, get full back
            sliding = list(range(shape.n_layer))
            if plan_cost(_sliding(full, sliding, w), T, shape).kv_bytes > budget:
                continue
            for layer in sorted((x for x in sliding if need[x] > w), key=lambda x: (-layer_kv[x], x)):
                trial = [x for x in sliding if x != layer]
                if plan_cost(_sliding(full, trial, w), T, shape).kv_bytes <= budget:
                    sliding = trial
        out.append(_candidate(_sliding(full, sliding, w), _layers_rule(w, sliding, shape.n_layer), shape,
                              w if sliding else None))
    return out


def candidates(plan: torch.Tensor, shape: ModelShape, granularity: str, mode: str,
               buckets: Sequence[int]) -> list[Candidate]:
    """Every plan the grain allows under the mode's rule, before choosing (deduplicated, in order).
    In `budget` mode each one's KV bytes are at most the plan's."""
    if granularity not in GRAINS:
        raise AAHError(f"granularity {granularity!r} is unknown; use one of {', '.join(GRAINS)}")
    if mode not in MODES:
        raise AAHError(f"mode {mode!r} is unknown; use one of {', '.join(MODES)}")
    plan = plan.clamp(max=shape.seq_len)
    budget = plan_cost(plan, shape.seq_len, shape).kv_bytes
    if granularity == "head":
        found = [_candidate(plan, "the plan itself", shape)]
    elif granularity == "transformers":
        found = _transformers_candidates(plan, shape, mode, budget, buckets)
    else:
        found = _unit_candidates(plan, shape, granularity, mode, buckets)
    if mode == "budget":
        found = [c for c in found if c.kv_bytes <= budget]
    unique: dict[tuple[int, ...], Candidate] = {}
    for c in found:
        unique.setdefault(tuple(c.plan.flatten().tolist()), c)
    return list(unique.values())


def round_plan(plan: torch.Tensor, shape: ModelShape, granularity: str, mode: str = "up",
               buckets: Sequence[int] = (), loss_of: LossOf | None = None) -> Rounding:
    """Round `plan` [n_layer, n_head] to a serving grain. `budget` mode needs `loss_of(plan) -> loss`."""
    found = candidates(plan, shape, granularity, mode, buckets)
    budget = plan_cost(plan.clamp(max=shape.seq_len), shape.seq_len, shape).kv_bytes
    if mode == "up":
        best = min(range(len(found)), key=lambda i: (found[i].kv_bytes, found[i].attention_pairs, i))
        how = (f"the fewest KV bytes among {len(found)} candidates that shrink no head" if len(found) > 1
               else "no head shrinks")
    else:
        if loss_of is None:
            raise AAHError("budget mode evaluates its candidates: pass loss_of")
        losses = [float(loss_of(c.plan)) for c in found]
        best = min(range(len(found)), key=lambda i: (losses[i], found[i].kv_bytes, i))
        how = f"the lowest loss among {len(found)} candidates within the plan's KV bytes"
    chosen = found[best]
    note = f"{granularity}: {ENGINES[granularity]}. {mode}: {chosen.rule} ({how})."
    return Rounding(chosen, granularity, mode, budget, found, note)

