"""Group hierarchies over one layer's heads (aah_method §2.5). Pure functions.

Level 0 groups heads; level l+1 groups the groups of level l. Each level has a feature
row per group and, below the top, a parent map into the next level.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from aah_core.controller.clustering import leader_cluster


@dataclass
class Level:
    groups: list[list[int]]  # members: heads at level 0, groups of the level below above it
    feats: torch.Tensor  # [G, F]
    parent: list[int] | None = None  # group -> index of its group at the next level; None at the top

    @property
    def sizes(self) -> list[int]:
        return [len(g) for g in self.groups]


def aggregate(groups: list[list[int]], rows: torch.Tensor, mode: str = "mean") -> torch.Tensor:
    """Group feature rows [G, F] from item rows [n, F].

    mean: the members' mean (the paper's); mean_global_offset: 2 * mean - mean over all items.
    """
    means = torch.stack([rows[torch.tensor(g)].mean(dim=0) for g in groups])
    if mode == "mean_global_offset":
        return 2 * means - rows.mean(dim=0)
    return means


def link(levels: list[Level]) -> list[Level]:
    """Fill every level's parent map from the groups of the level above it."""
    for lower, upper in zip(levels, levels[1:]):
        parent = [-1] * len(lower.groups)
        for p, members in enumerate(upper.groups):
            for child in members:
                parent[child] = p
        lower.parent = parent
    if levels:
        levels[-1].parent = None
    return levels


def build_upper_levels(
    level0: Level, max_depth: int, threshold: float, metric: str, scale: float, mode: str = "mean",
    min_group_size: int = 1, stop_on_identity: bool = False,
) -> list[Level]:
    """Cluster upward from level 0 (§2.5): stop when a level would hold a single group.

    A level that merges nothing is still appended (the paper's identity copies); with
    stop_on_identity (the 'identity_levels' fix) it ends the hierarchy instead.
    """
    levels = [level0]
    for _ in range(1, max_depth):
        prev = levels[-1]
        groups = leader_cluster(prev.feats, threshold, metric, scale, min_group_size=min_group_size)
        if len(groups) == 1:
            break
        if stop_on_identity and len(groups) == len(prev.groups):
            break
        levels.append(Level(groups, aggregate(groups, prev.feats, mode)))
    return link(levels)


def passthrough(level0: Level, max_depth: int) -> list[Level]:
    """Identity upper levels up to max_depth: every group is its own parent (§2.9 fixed / frozen paths)."""
    n = len(level0.groups)
    levels = [level0] + [Level([[g] for g in range(n)], level0.feats.clone()) for _ in range(1, max_depth)]
    return link(levels)


def relevel(topology: list[list[list[int]]], level0_feats: torch.Tensor, mode: str = "mean") -> list[Level]:
    """Rebuild a stored topology with new level-0 group features; upper rows are aggregated again."""
    levels = [Level(topology[0], level0_feats)]
    for groups in topology[1:]:
        levels.append(Level(groups, aggregate(groups, levels[-1].feats, mode)))
    return link(levels)


def topology_of(levels: list[Level]) -> list[list[list[int]]]:
    """The groups of every level (JSON-able)."""
    return [[list(g) for g in level.groups] for level in levels]


def balanced_split(n_head: int, seed: int | None) -> list[list[int]]:
    """Two balanced groups: h mod 2 (seed None, 'fixed_deterministic') or seeded random halves ('fixed_random')."""
    if seed is None:
        return [[h for h in range(n_head) if h % 2 == 0], [h for h in range(n_head) if h % 2 == 1]]
    perm = torch.randperm(n_head, generator=torch.Generator().manual_seed(seed)).tolist()
    half = n_head // 2
    return [g for g in (sorted(perm[:half]), sorted(perm[half:])) if g]
