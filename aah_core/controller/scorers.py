"""Controller inputs and the scorer MLPs (aah_method §2.6, §2.7).

In the paper these MLPs are never trained: their logits only go through argmax (§2.10).
They are therefore built from a seed (with PyTorch's default init, inside fork_rng so the
backbone's RNG stream is untouched) and rebuilt from that seed on resume.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from aah_core.controller.hierarchy import Level


def enriched_inputs(levels: list[Level]) -> list[torch.Tensor]:
    """Per level, [G_l, 3F + 2] rows (29 for F = 9):
    [F_l[g], l/(L-1), F_l[g] - F_{l+1}[parent(g)] (0 at the top), F_l[g] - mean_g' F_l[g'], |g| / sum |g'|]."""
    L = len(levels)
    out = []
    for l, level in enumerate(levels):
        f = level.feats.double()
        G = f.shape[0]
        depth = torch.full((G, 1), l / (L - 1) if L > 1 else 0.0, dtype=torch.float64)
        if level.parent is None:
            parent_diff = torch.zeros_like(f)
        else:
            parent_diff = f - levels[l + 1].feats.double()[torch.tensor(level.parent)]
        sizes = torch.tensor(level.sizes, dtype=torch.float64).view(G, 1)
        out.append(torch.cat([f, depth, parent_diff, f - f.mean(dim=0), sizes / sizes.sum()], dim=1))
    return out


def base_inputs(levels: list[Level]) -> list[torch.Tensor]:
    """Per level, the raw group feature rows [G_l, F]."""
    return [level.feats.double() for level in levels]


def input_dim(n_features: int, mode: str) -> int:
    return 3 * n_features + 2 if mode == "enriched" else n_features


def sibling_pairs(parent: list[int] | None, n_groups: int) -> list[tuple[int, int]]:
    """Joint-scorer pairs (§2.7): children of one parent in ascending order, paired (m0, m1), (m2, m3), ...

    At the top level (parent None) all groups form one family. An odd leftover is unpaired.
    """
    families: dict[int, list[int]] = {}
    for g in range(n_groups):
        families.setdefault(-1 if parent is None else parent[g], []).append(g)
    pairs = []
    for key in sorted(families):
        members = sorted(families[key])
        pairs += [(members[i], members[i + 1]) for i in range(0, len(members) - 1, 2)]
    return pairs


class Scorer(nn.Module):
    """Group inputs [G, in_dim] -> bucket logits [G, K]: in -> hidden -> GELU (-> hidden -> GELU) -> K."""

    def __init__(self, in_dim: int, hidden: int, n_buckets: int, deep: bool = False) -> None:
        super().__init__()
        layers: list[nn.Module] = [nn.Linear(in_dim, hidden), nn.GELU()]
        if deep:
            layers += [nn.Linear(hidden, hidden), nn.GELU()]
        layers.append(nn.Linear(hidden, n_buckets))
        self.net = nn.Sequential(*layers)

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        return self.net(u)


class JointScorer(nn.Module):
    """A sibling pair -> both members' logits: [u_a, u_b, u_a - u_b, u_b - u_a] (4 in_dim) -> hidden -> 2K."""

    def __init__(self, in_dim: int, hidden: int, n_buckets: int) -> None:
        super().__init__()
        self.n_buckets = n_buckets
        self.fc = nn.Linear(4 * in_dim, hidden)
        self.out = nn.Linear(hidden, 2 * n_buckets)

    def forward(self, ua: torch.Tensor, ub: torch.Tensor) -> torch.Tensor:
        """ua, ub: [P, in_dim] -> [P, 2, K] (row 0 for a, row 1 for b)."""
        joint = torch.cat([ua, ub, ua - ub, ub - ua], dim=-1)  # (P, 4 in_dim)
        return self.out(F.gelu(self.fc(joint))).view(-1, 2, self.n_buckets)


class LayerScorers(nn.Module):
    """One layer's frozen scorers: the per-group MLP and (optionally) the joint sibling scorer."""

    def __init__(self, in_dim: int, n_buckets: int, control_dim: int, joint_hidden: int | None, deep: bool,
                 seed: int) -> None:
        super().__init__()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.scorer = Scorer(in_dim, control_dim, n_buckets, deep)
            self.joint = JointScorer(in_dim, joint_hidden, n_buckets) if joint_hidden else None
        self.requires_grad_(False)

    @torch.no_grad()
    def logits(self, u: torch.Tensor, parent: list[int] | None, logit_scale: float = 1.0,
               joint_scale: float = 1.0) -> tuple[torch.Tensor, int]:
        """Logits [G, K] for one level, the joint rows replacing the independent ones; and the pair count."""
        u = u.float()
        z = logit_scale * self.scorer(u)
        if self.joint is None:
            return z, 0
        pairs = sibling_pairs(parent, u.shape[0])
        if pairs:
            a = torch.tensor([p[0] for p in pairs])
            b = torch.tensor([p[1] for p in pairs])
            joint = joint_scale * self.joint(u[a], u[b])  # (P, 2, K)
            z = z.clone()
            z[a], z[b] = joint[:, 0], joint[:, 1]
        return z, len(pairs)
