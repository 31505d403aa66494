"""The `reference` backend: an explicit per-head boolean mask over the full T x T scores.

It is the exactness oracle for every other backend, so it shares no band or mask helper
with them. Any floating dtype works, float64 included.
"""

from __future__ import annotations

import math

import torch

NAME = "reference"
SUPPORTS_GRAD = True


def available(device: torch.device) -> tuple[bool, str]:
    return True, ""


def _head_masks(windows: tuple[int, ...], T: int, device: torch.device, sinks: int = 0) -> torch.Tensor:
    """[H, T, T] bool: True where query i may attend key j, i.e. j <= i and (i - w < j or j < sinks)."""
    i = torch.arange(T, device=device).view(1, T, 1)
    j = torch.arange(T, device=device).view(1, 1, T)
    w = torch.tensor(windows, device=device).view(-1, 1, 1)
    return (j <= i) & ((j > i - w) | (j < sinks))


def attention_probs(
    q: torch.Tensor, k: torch.Tensor, windows: tuple[int, ...], scale: float | None = None, sinks: int = 0
) -> torch.Tensor:
    """Per-head attention probabilities [B, H, T, T]; masked entries are exactly 0."""
    T, D = q.shape[-2], q.shape[-1]
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    scores = (q @ k.transpose(-2, -1)) * scale  # (B, H, T, T)
    scores = scores.masked_fill(~_head_masks(windows, T, q.device, sinks), float("-inf"))
    # every row keeps its diagonal, so no row is all -inf and softmax never yields NaN
    return torch.softmax(scores, dim=-1)


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    windows: tuple[int, ...],
    dropout_p: float,
    scale: float | None,
    sinks: int = 0,
) -> torch.Tensor:
    probs = attention_probs(q, k, windows, scale, sinks)
    if dropout_p > 0.0:
        probs = torch.nn.functional.dropout(probs, p=dropout_p, training=True)
    return probs @ v  # (B, H, T, D)
