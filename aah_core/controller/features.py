"""The 9 head features of aah_method §2.2, computed cheaply from each layer's observer call.

x_h = [mean|q|, std q, mean|k|, std k, mean|v|, std v, entropy, output norm, usage].

Cost: the q/k/v statistics are fused reductions over a few sequences of the batch; entropy
and usage need attention probabilities, which are computed for a subsample of query rows
only (not the paper's fp32 T x T maps with per-head host syncs, §8.13). All results stay
on the device until the controller reads them at a control step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

N_FEATURES = 9
QKV = ("q", "k", "v")


@dataclass
class HeadStats:
    """One observed forward of one layer; every tensor is [H]."""

    abs_mean: dict[str, torch.Tensor]  # mean |x| over (B, T, D), per head, for x in q, k, v
    mean: dict[str, torch.Tensor]
    sq_mean: dict[str, torch.Tensor]
    count: int  # B * T * D elements per head
    entropy: torch.Tensor  # mean row entropy / log(T)
    norm: torch.Tensor  # mean over (b, t) of ||y_{b,h,t}||
    usage_last: torch.Tensor  # the paper's "usage": mean probability on key T-1 (the §8.4 bug)
    usage_dist: torch.Tensor  # the fix: mean attention distance (i - j) / T

    def to_cpu(self) -> HeadStats:
        def cpu(d: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
            return {k: v.double().cpu() for k, v in d.items()}

        return HeadStats(cpu(self.abs_mean), cpu(self.mean), cpu(self.sq_mean), self.count,
                         *(t.double().cpu() for t in (self.entropy, self.norm, self.usage_last, self.usage_dist)))

    def to_json(self) -> dict:
        s = self.to_cpu()
        return {"abs_mean": {k: v.tolist() for k, v in s.abs_mean.items()},
                "mean": {k: v.tolist() for k, v in s.mean.items()},
                "sq_mean": {k: v.tolist() for k, v in s.sq_mean.items()}, "count": s.count,
                "entropy": s.entropy.tolist(), "norm": s.norm.tolist(),
                "usage_last": s.usage_last.tolist(), "usage_dist": s.usage_dist.tolist()}

    @classmethod
    def from_json(cls, doc: dict) -> HeadStats:
        t = lambda v: torch.tensor(v, dtype=torch.float64)  # noqa: E731
        return cls({k: t(v) for k, v in doc["abs_mean"].items()}, {k: t(v) for k, v in doc["mean"].items()},
                   {k: t(v) for k, v in doc["sq_mean"].items()}, int(doc["count"]), t(doc["entropy"]),
                   t(doc["norm"]), t(doc["usage_last"]), t(doc["usage_dist"]))


def _query_rows(T: int, n_rows: int, device: torch.device) -> torch.Tensor:
    """Evenly spaced query positions, always including the last one (usage reads row T-1)."""
    if n_rows >= T:
        return torch.arange(T, device=device)
    return torch.linspace(0, T - 1, n_rows, device=device).round().long().unique()


@torch.no_grad()
def head_stats(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, y: torch.Tensor, windows: torch.Tensor,
    n_rows: int = 32, n_seqs: int = 4,
) -> HeadStats:
    """Statistics of one layer's forward. q, k, v, y: [B, H, T, D]; windows: [H] executed windows.

    Everything is computed on the first n_seqs sequences of the batch (the paper used all of
    them; the means over n_seqs * T * D elements per head are already precise), so the cost
    does not grow with the batch.
    """
    H, T, D = q.shape[1:]
    abs_mean, mean, sq_mean = {}, {}, {}
    qs, ks, vs, ys = (t.detach()[:n_seqs] for t in (q, k, v, y))  # statistics over the first n_seqs sequences
    n = qs.shape[0] * T * D
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    for name, x in zip(QKV, (qs, ks, vs)):
        # fused reductions: no |x| or x^2 temporaries of the activation's size
        abs_mean[name] = torch.linalg.vector_norm(x, ord=1, dim=(0, 2, 3), dtype=acc) / n  # (H,)
        mean[name] = x.mean(dim=(0, 2, 3), dtype=acc)
        sq_mean[name] = torch.linalg.vector_norm(x, ord=2, dim=(0, 2, 3), dtype=acc).square() / n
    norm = torch.linalg.vector_norm(ys, dim=-1, dtype=acc).mean(dim=(0, 2))  # (H,)
    rows = _query_rows(T, n_rows, q.device)  # (R,)
    scores = (qs[:, :, rows].to(acc) @ ks.to(acc).transpose(-2, -1)) / math.sqrt(D)  # (b, H, R, T)
    dist = rows.view(-1, 1) - torch.arange(T, device=q.device).view(1, -1)  # (R, T): i - j
    w = windows.to(q.device).clamp(max=T).view(H, 1, 1)
    allowed = (dist >= 0) & (dist < w)  # (H, R, T), the executed window (§2.2: P under the mask)
    probs = scores.masked_fill(~allowed, float("-inf")).softmax(dim=-1)  # (b, H, R, T)
    entropy = -(probs * (probs + 1e-9).log()).sum(-1).mean(dim=(0, 2)) / math.log(T)  # (H,)
    # under causality only query T-1 sees key T-1, so the mean over all (b, t) is p[T-1, T-1] / T
    usage_last = probs[:, :, -1, -1].mean(dim=0) / T
    usage_dist = (probs * dist.clamp(min=0)).sum(-1).mean(dim=(0, 2)) / T
    return HeadStats(abs_mean, mean, sq_mean, n, entropy, norm, usage_last, usage_dist)


def _std(mean: torch.Tensor, sq_mean: torch.Tensor, count: int) -> torch.Tensor:
    """Bessel-corrected std from first and second moments."""
    var = (sq_mean - mean.square()).clamp(min=0) * count / max(count - 1, 1)
    return var.sqrt()


def _assemble(abs_mean, mean, sq_mean, count, ens: list[torch.Tensor]) -> torch.Tensor:
    cols = []
    for name in QKV:
        cols += [abs_mean[name], _std(mean[name], sq_mean[name], count)]
    return torch.stack(cols + ens, dim=-1)  # (n, 9)


def head_features(qkv: HeadStats, ens: HeadStats | None, fixed_usage: bool) -> torch.Tensor:
    """Per-head features [H, 9] (float64, CPU). `ens` supplies entropy/norm/usage (None: zeros, §2.2)."""
    qkv = qkv.to_cpu()
    H = qkv.entropy.shape[0]
    if ens is None:
        extra = [torch.zeros(H, dtype=torch.float64)] * 3
    else:
        ens = ens.to_cpu()
        extra = [ens.entropy, ens.norm, ens.usage_dist if fixed_usage else ens.usage_last]
    return _assemble(qkv.abs_mean, qkv.mean, qkv.sq_mean, qkv.count, extra)


def pooled_group_features(
    groups: list[list[int]], qkv: HeadStats, ens: HeadStats | None, fixed_usage: bool
) -> torch.Tensor:
    """Group rows [G, 9] from the current batch, pooling q/k/v over all member heads' elements (§2.2).

    The std is a pooled std (not a mean of per-head stds); entropy, norm and usage are member means.
    """
    qkv = qkv.to_cpu()
    heads = head_features(qkv, ens, fixed_usage)
    rows = []
    for members in groups:
        idx = torch.tensor(members)
        pooled = {k: {n: d[n][idx].mean().view(1) for n in QKV} for k, d in
                  (("abs", qkv.abs_mean), ("mean", qkv.mean), ("sq", qkv.sq_mean))}
        ens_cols = [heads[idx, c].mean().view(1) for c in (6, 7, 8)]
        rows.append(_assemble(pooled["abs"], pooled["mean"], pooled["sq"], qkv.count * len(members), ens_cols)[0])
    return torch.stack(rows)


class Standardizer:
    """z-scores feature columns with statistics taken across heads (the 'standardize' fix, §8.3)."""

    def __init__(self, head_rows: torch.Tensor | None) -> None:
        # (mean, std) per column; None (the fix is off): rows pass unchanged
        self.stats = None if head_rows is None else (
            head_rows.mean(dim=0), head_rows.std(dim=0, unbiased=False).clamp(min=1e-6))

    def __call__(self, rows: torch.Tensor) -> torch.Tensor:
        if self.stats is None:
            return rows
        mean, std = self.stats
        return (rows - mean) / std
