"""The `banded` backend: heads bucketed by window; full heads through causal SDPA.

Windowed buckets go through SDPA with a boolean band mask for now.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

NAME = "banded"
SUPPORTS_GRAD = True


def available(device: torch.device) -> tuple[bool, str]:
    return True, ""


def _buckets(windows: tuple[int, ...], T: int) -> dict[int, list[int]]:
    """Window -> head indices, with every window >= T merged into the full bucket T."""
    groups: dict[int, list[int]] = {}
    for h, w in enumerate(windows):
        groups.setdefault(min(w, T), []).append(h)
    return groups


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    windows: tuple[int, ...],
    dropout_p: float,
    scale: float | None,
) -> torch.Tensor:
    T = q.shape[-2]
    groups = _buckets(windows, T)
    if len(groups) == 1:
        (w,) = groups
        return _attend_bucket(q, k, v, w, dropout_p, scale)
    out = torch.empty_like(q)
    for w, heads in groups.items():
        idx = torch.tensor(heads, device=q.device)
        out[:, idx] = _attend_bucket(q[:, idx], k[:, idx], v[:, idx], w, dropout_p, scale)
    return out


def _attend_bucket(q, k, v, w: int, dropout_p: float, scale: float | None) -> torch.Tensor:
    T = q.shape[-2]
    if w >= T:
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True, scale=scale)
    i = torch.arange(T, device=q.device).view(T, 1)
    j = torch.arange(T, device=q.device).view(1, T)
    band = (j <= i) & (j > i - w)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=band, dropout_p=dropout_p, scale=scale)
