"""Per-head diagnostics: attention maps full vs windowed, cut-off mass, pooling, retained-mass
curves and the one-head sensitivity sweep. Pure functions of a model and token ids; no web.

Maps come from the reference path (explicit masks, exact zeros outside the window), which is
the only path that returns probabilities.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from aah_core.attention.reference import attention_probs
from aah_core.model_api import WindowedLM

MAX_SIDE = 256  # no heatmap axis longer than this after pooling


@dataclass
class HeadMaps:
    full: torch.Tensor  # [T, T] the head with its full causal window
    windowed: torch.Tensor  # [T, T] the same queries and keys with the window applied
    cut_mass: torch.Tensor  # [T] mass of each `full` row on keys outside the window
    window: int  # the window used, clamped to T


@torch.no_grad()
def layer_queries_keys(model: WindowedLM, idx: torch.Tensor, plan: torch.Tensor,
                       layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    """q, k of `layer` ([B, H, T, D] each, float32) for ids [B, T], layers before it run under `plan`."""
    q, k = model.queries_keys(model.run_layers(model.embed(idx), plan, end=layer), layer)
    return q.float(), k.float()


def cut_mass(full: torch.Tensor, window: int) -> torch.Tensor:
    """Per query row i of a causal map [T, T]: the mass on keys j <= i - window (outside the window)."""
    return full.tril(-window).sum(dim=-1)


@torch.no_grad()
def head_attention(model: WindowedLM, idx: torch.Tensor, plan: torch.Tensor, layer: int, head: int,
                   window: int) -> HeadMaps:
    """One head's map on one sequence idx [1, T], full and under `window` (earlier layers under `plan`)."""
    q, k = layer_queries_keys(model, idx, plan, layer)
    T = idx.shape[1]
    w = min(int(window), T)
    qh, kh = q[:1, head : head + 1], k[:1, head : head + 1]  # (1, 1, T, D)
    full = attention_probs(qh, kh, (T,))[0, 0]  # (T, T)
    windowed = attention_probs(qh, kh, (w,))[0, 0]  # (T, T)
    return HeadMaps(full=full, windowed=windowed, cut_mass=cut_mass(full, w), window=w)


def pool_factor(T: int, max_side: int = MAX_SIDE) -> int:
    """The smallest block size that brings T down to at most max_side blocks."""
    return max(1, math.ceil(T / max_side))


def pool_map(m: torch.Tensor, pool: int) -> torch.Tensor:
    """[T, T] -> [ceil(T/pool)]^2: queries averaged within a block, keys summed, so rows keep their mass."""
    if pool == 1:
        return m
    T = m.shape[0]
    n = math.ceil(T / pool)
    padded = torch.zeros(n * pool, n * pool, dtype=m.dtype)
    padded[:T, :T] = m
    blocks = padded.view(n, pool, n, pool).sum(dim=(1, 3))  # (n, n) mass per block pair
    counts = torch.full((n,), pool, dtype=m.dtype)
    counts[-1] = T - (n - 1) * pool  # queries in the last (maybe partial) block
    return blocks / counts.view(n, 1)


def pool_rows(v: torch.Tensor, pool: int) -> torch.Tensor:
    """[T] -> [ceil(T/pool)]: the mean within each block of queries."""
    if pool == 1:
        return v
    T = v.shape[0]
    n = math.ceil(T / pool)
    padded = torch.zeros(n * pool, dtype=v.dtype)
    padded[:T] = v
    counts = torch.full((n,), pool, dtype=v.dtype)
    counts[-1] = T - (n - 1) * pool
    return padded.view(n, pool).sum(dim=1) / counts


def retained_mass(probs: torch.Tensor, windows: Sequence[int]) -> torch.Tensor:
    """probs [B, H, T, T] (causal rows) -> [H, K]: mean over sequences and queries of the mass on
    the last windows[k] keys (itself included)."""
    T = probs.shape[-1]
    i = torch.arange(T).view(T, 1)
    j = torch.arange(T).view(1, T)
    out = []
    for w in windows:
        inside = (j <= i) & (j > i - min(int(w), T))  # (T, T)
        out.append((probs * inside).sum(dim=-1).mean(dim=(0, 2)))  # (H,)
    return torch.stack(out, dim=-1)  # (H, K)


@torch.no_grad()
def retained_mass_curves(model: WindowedLM, idx: torch.Tensor, plan: torch.Tensor,
                         windows: Sequence[int]) -> torch.Tensor:
    """[n_layer, n_head, K]: each head's full-window attention (earlier layers under `plan`), retained
    within each window of `windows`."""
    T = idx.shape[1]
    curves = []
    for layer in range(model.n_layer):
        q, k = layer_queries_keys(model, idx, plan, layer)
        probs = attention_probs(q, k, (T,) * q.shape[1])  # (B, H, T, T)
        curves.append(retained_mass(probs, windows))
    return torch.stack(curves)


def sensitivity_sweep(loss: Callable[[torch.Tensor], float], plan: torch.Tensor,
                      windows: Sequence[int]) -> tuple[float, torch.Tensor]:
    """(baseline loss, delta [n_layer, n_head, K]): loss increase when one head alone gets windows[k].

    Layers are visited last to first, so a prefix-cached `loss` recomputes as few layers as possible.
    A head whose own window already equals windows[k] gets exactly 0 without an evaluation.
    """
    baseline = loss(plan)
    n_layer, n_head = plan.shape
    delta = torch.zeros(n_layer, n_head, len(windows), dtype=torch.float64)
    for layer in reversed(range(n_layer)):
        for head in range(n_head):
            for kk, w in enumerate(windows):
                if int(plan[layer, head]) == int(w):
                    continue
                edited = plan.clone()
                edited[layer, head] = int(w)
                delta[layer, head, kk] = loss(edited) - baseline
    return baseline, delta
