"""Greedy "leader" clustering of heads or groups (aah_method §2.4, §2.5). Pure functions.

Items are visited in index order; each joins the most similar existing group if the
similarity reaches the threshold, else opens a new group. Level 0 adds a forced
bipartition when everything lands in one group (which, with raw positive features, is
always: every cosine is about 1), and small groups may be merged afterwards.
"""

from __future__ import annotations

import torch

EPS = 1e-6
TIE_MARGIN = 1e-8
METRICS = ("cosine", "cosine_normdiff", "centered_cosine", "l2")


def unit(x: torch.Tensor) -> torch.Tensor:
    """Rows scaled to unit norm (norm clamped at 1e-6)."""
    return x / x.norm(dim=-1, keepdim=True).clamp(min=EPS)


class _Centroid:
    """A group's running summary: its members' raw rows and unit rows."""

    def __init__(self, raw: torch.Tensor, metric: str) -> None:
        self.metric = metric
        self.raw = [raw]

    def add(self, raw: torch.Tensor) -> None:
        self.raw.append(raw)

    def _direction(self) -> torch.Tensor:
        rows = torch.stack(self.raw)
        if self.metric == "centered_cosine":
            rows = rows - rows.mean(dim=-1, keepdim=True)
        return unit(unit(rows).mean(dim=0))

    def similarity(self, x: torch.Tensor, scale: float) -> float:
        """cosine: <centroid, u>; cosine_normdiff subtracts scale*|norm gap|/max norm (raw member mean);
        centered_cosine: cosine after subtracting each vector's own mean; l2: -||mean - x||."""
        mean = torch.stack(self.raw).mean(dim=0)
        if self.metric == "l2":
            return -float((mean - x).norm())
        xv = x - x.mean() if self.metric == "centered_cosine" else x
        sim = float(self._direction() @ unit(xv))
        if self.metric == "cosine_normdiff":
            a, b = float(mean.norm()), float(x.norm())
            sim -= scale * abs(a - b) / max(a, b, EPS)
        return sim


def leader_cluster(
    feats: torch.Tensor,
    threshold: float,
    metric: str = "cosine",
    scale: float = 16.0,
    forced_bipartition: bool = False,
    prev_groups: list[list[int]] | None = None,
    churn_penalty: float = 0.0,
    min_group_size: int = 1,
) -> list[list[int]]:
    """Cluster the rows of feats [n, F]; returns groups as lists of item indices, in creation order."""
    n = feats.shape[0]
    feats = feats.double()
    groups: list[list[int]] = []
    centroids: list[_Centroid] = []
    for i in range(n):
        if groups:
            sims = [c.similarity(feats[i], scale) for c in centroids]
            best = max(range(len(sims)), key=lambda g: sims[g])  # first maximum on ties
            if sims[best] >= threshold:
                groups[best].append(i)
                centroids[best].add(feats[i])
                continue
        groups.append([i])
        centroids.append(_Centroid(feats[i], metric))
    if forced_bipartition and len(groups) == 1 and n >= 2:
        return forced_split(feats, prev_groups, churn_penalty)
    if min_group_size > 1 and len(groups) > 1:
        groups = merge_small_groups(feats, groups, threshold, min_group_size)
    return groups


def same_group_matrix(groups: list[list[int]] | None, n: int) -> torch.Tensor:
    """[n, n] bool: True where items i != j shared a group."""
    same = torch.zeros(n, n, dtype=torch.bool)
    for members in groups or []:
        idx = torch.tensor([m for m in members if m < n], dtype=torch.long)
        if len(idx):
            same[idx.view(-1, 1), idx.view(1, -1)] = True
    same.fill_diagonal_(False)
    return same


def forced_split(feats: torch.Tensor, prev_groups: list[list[int]] | None = None, churn_penalty: float = 0.0) -> list[list[int]]:
    """The level-0 forced bipartition: anchors are the least similar pair; the rest join the closer anchor.

    The churn penalty raises the similarity of pairs that shared a group last time (capped at 1),
    and only affects the choice of anchors. Ties go to the currently smaller side.
    """
    n = feats.shape[0]
    u = unit(feats.double())
    sim = u @ u.T  # (n, n)
    if churn_penalty and prev_groups:
        sim = torch.where(same_group_matrix(prev_groups, n), (sim + churn_penalty).clamp(max=1.0), sim)
    sim.fill_diagonal_(2.0)
    flat = int(torch.argmin(sim))  # first minimum in row-major order
    i0, i1 = divmod(flat, n)
    side_a, side_b = [i0], [i1]
    for j in range(n):
        if j in (i0, i1):
            continue
        margin = float(u[j] @ u[i0] - u[j] @ u[i1])
        if margin > TIE_MARGIN:
            side_a.append(j)
        elif margin < -TIE_MARGIN:
            side_b.append(j)
        else:
            (side_a if len(side_a) <= len(side_b) else side_b).append(j)
    if not side_a or not side_b:  # cannot happen with distinct anchors; kept as the paper's fallback
        order = list(range(n))
        return [order[: n // 2], order[n // 2 :]]
    return [sorted(side_a), sorted(side_b)]


def merge_small_groups(
    feats: torch.Tensor, groups: list[list[int]], threshold: float, min_group_size: int
) -> list[list[int]]:
    """Merge groups smaller than min_group_size into their most similar other group (§2.4).

    Similarity is the dot product of the groups' mean unit vectors (not renormalised), taken
    once before merging, so an emptied group keeps its stale mean and can still be a target
    (the paper's quirk). A merge needs sim >= threshold and more than 2 non-empty groups.
    """
    u = unit(feats.double())
    means = [u[torch.tensor(g)].mean(dim=0) for g in groups]
    groups = [list(g) for g in groups]
    for g in range(len(groups)):
        if not 0 < len(groups[g]) < min_group_size:
            continue
        others = [o for o in range(len(groups)) if o != g]
        sims = [float(means[g] @ means[o]) for o in others]
        best = others[max(range(len(others)), key=lambda i: sims[i])]
        non_empty = sum(1 for members in groups if members)
        if max(sims) >= threshold and non_empty > 2:
            groups[best] = sorted(groups[best] + groups[g])
            groups[g] = []
    return [members for members in groups if members]


def head_to_group(groups: list[list[int]], n: int) -> list[int]:
    """Item -> group index."""
    out = [-1] * n
    for g, members in enumerate(groups):
        for m in members:
            out[m] = g
    return out


def churn(prev: list[list[int]] | None, cur: list[list[int]], n: int) -> tuple[float, float]:
    """(head_reassign_rate, group_overlap) between two groupings (§5).

    reassign: fraction of items whose group id changed; overlap: Jaccard of the same-group pairs.
    """
    if prev is None:
        return 0.0, 1.0
    a, b = head_to_group(prev, n), head_to_group(cur, n)
    reassign = sum(x != y for x, y in zip(a, b)) / n
    pa, pb = same_group_matrix(prev, n), same_group_matrix(cur, n)
    union = int((pa | pb).sum())
    overlap = 1.0 if union == 0 else int((pa & pb).sum()) / union
    return reassign, overlap
