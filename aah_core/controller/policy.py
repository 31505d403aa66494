"""Window choice: top-down selection with the parent clamp (aah_method §2.7) and the per-step
post-processing of the per-head bucket index (§2.8). Pure functions over small tensors.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from aah_core.controller.hierarchy import Level
from aah_core.controller.scorers import LayerScorers


@dataclass
class Selection:
    head_idx: list[int]  # bucket index per head
    level_idx: list[list[int]]  # bucket index per group, per level (level 0 first)
    raw_idx: list[list[int]]  # argmax before the clamp
    joint_pairs: list[int]  # joint-scored pairs per level


def clamp_top_down(raw: list[list[int]], levels: list[Level], parent_constraint: bool = True) -> list[list[int]]:
    """From the top level down: a child's index is min(its own argmax, its parent's final index)."""
    final = [list(r) for r in raw]
    if parent_constraint:
        for l in range(len(levels) - 2, -1, -1):
            parent = levels[l].parent
            assert parent is not None, f"level {l} is below the top, so it has parents"
            final[l] = [min(final[l][g], final[l + 1][parent[g]]) for g in range(len(final[l]))]
    return final


def select(levels: list[Level], inputs: list[torch.Tensor], scorers: LayerScorers, n_head: int,
           parent_constraint: bool = True, logit_scale: float = 1.0, joint_scale: float = 1.0) -> Selection:
    """Score every level, argmax, clamp child <= parent, and scatter level-0 choices to heads."""
    raw, pairs = [], []
    for level, u in zip(levels, inputs):
        z, n_pairs = scorers.logits(u, level.parent, logit_scale, joint_scale)
        raw.append(z.argmax(dim=-1).tolist())
        pairs.append(n_pairs)
    final = clamp_top_down(raw, levels, parent_constraint)
    head_idx = [0] * n_head
    for g, members in enumerate(levels[0].groups):
        for h in members:
            head_idx[h] = final[0][g]
    return Selection(head_idx, final, raw, pairs)


def warmup_index(buckets: list[int], seq_len: int, fixed: bool) -> int | None:
    """The bucket index executed during warmup: the bucket equal to T (full attention).

    When T is not a bucket the paper falls back to index 0, the smallest window (§8.8); the
    fix returns None, which windows_of() executes as full attention.
    """
    if seq_len in buckets:
        return buckets.index(seq_len)
    return None if fixed else 0


def resolution_ema(state: list[float] | None, idx: list[int], beta: float, n_buckets: int) -> tuple[list[float], list[int]]:
    """e <- beta * e + (1 - beta) * idx, executed idx = clamp(round(e)); the state starts at the first idx."""
    if state is None:
        state = [float(i) for i in idx]
    else:
        state = [beta * e + (1 - beta) * i for e, i in zip(state, idx)]
    return state, [min(max(round(e), 0), n_buckets - 1) for e in state]


def ramp(idx: list[int], step: int, warmup: int, ramp_steps: int, full_idx: int) -> list[int]:
    """Post-warmup ramp: p = clip((step - warmup + 1) / R, 0, 1), idx = round(p * idx + (1 - p) * full)."""
    if ramp_steps <= 0:
        return list(idx)
    p = min(max((step - warmup + 1) / ramp_steps, 0.0), 1.0)
    return [round(p * i + (1 - p) * full_idx) for i in idx]


def windows_of(idx: Sequence[int | None], buckets: list[int], seq_len: int, w_min: int = 1) -> list[int]:
    """Bucket indices -> windows min(max(bucket, w_min), T); None is full attention (T)."""
    return [seq_len if i is None else min(max(buckets[i], w_min), seq_len) for i in idx]
