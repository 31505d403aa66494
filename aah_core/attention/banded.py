"""The `banded` backend: exact per-head windows that only compute the band, with autograd.

Heads are bucketed by window. A bucket whose window covers T is plain causal SDPA. A
windowed bucket (w < T) splits its query rows in two:

- rows ``i < w`` see every earlier key, so they are causal SDPA over the first w positions;
- rows ``i >= w`` are cut into blocks of c queries. The block starting at row s sees keys
  ``s-w+1 .. s+c-1``: a window of ``L = c+w-1`` keys that never starts before position 1,
  so no left padding (and no padded key to mask) is needed. One ``unfold`` view of K and V
  gives every block its L keys without a copy, and one SDPA call runs all blocks with the
  same small ``[c, L]`` band mask (query r of a block sees window columns ``r .. r+w-1``).

Work is ``w^2/2 + (T-w)(c+w-1)`` pairs against ``T^2/2`` for causal, so the band is
never worse than causal plus ``c`` keys per row; it is exact for every w, so there is no
inexact "just use causal" fallback. Rows always keep their own key: no NaN, even at w=1.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
import torch.nn.functional as F

NAME = "banded"
SUPPORTS_GRAD = True


def available(device: torch.device) -> tuple[bool, str]:
    return True, ""


def supports_grad(device: torch.device) -> bool:
    return True


def check_inputs(device: torch.device, dtype: torch.dtype, dropout_p: float) -> str:
    """Reason this backend can't run such inputs, or "" (banded runs anything SDPA runs)."""
    return ""


@functools.lru_cache(maxsize=256)
def buckets(windows: tuple[int, ...], T: int) -> tuple[tuple[tuple[int, tuple[int, ...]], ...], tuple[int, ...] | None]:
    """Heads grouped by window, every window >= T merged into the full bucket T.

    Returns ((window, heads), ...) in order of first head, and the permutation that puts
    the concatenated bucket outputs back in head order (None when they already are).
    """
    groups: dict[int, list[int]] = {}
    for h, w in enumerate(windows):
        groups.setdefault(min(w, T), []).append(h)
    order = [h for heads in groups.values() for h in heads]
    inverse = None
    if order != sorted(order):
        inverse = tuple(sorted(range(len(order)), key=order.__getitem__))
    return tuple((w, tuple(heads)) for w, heads in groups.items()), inverse


def block_size(w: int, needs_grad: bool) -> int:
    """Queries per block for window w (measured on a 2-core AVX2 CPU, bench/attention.py).

    Forward: small blocks waste the fewest keys ((c+w-1)/w) and the unfold view costs
    nothing, so c=32 wins. Backward materialises a gradient for every unfolded key
    (L/c times K), so blocks grow with w there.
    """
    if not needs_grad:
        return 32 if w <= 1024 else 64
    c = 32
    while c < 256 and 4 * c < w:
        c *= 2
    return c


@functools.lru_cache(maxsize=64)
def band_mask(c: int, w: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """[c, c+w-1] additive mask: query r of a block sees window columns r .. r+w-1."""
    r = torch.arange(c, device=device).view(c, 1)
    j = torch.arange(c + w - 1, device=device).view(1, c + w - 1)
    allowed = (j >= r) & (j <= r + w - 1)
    return torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill(~allowed, float("-inf"))


def windowed_bucket(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, w: int, dropout_p: float, scale: float | None
) -> torch.Tensor:
    """Exact window-w causal attention for one bucket. q, k, v: [B, Hb, T, D] -> [B, Hb, T, D]."""
    B, Hb, T, D = q.shape
    if w >= T:
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True, scale=scale)
    head = F.scaled_dot_product_attention(
        q[:, :, :w], k[:, :, :w], v[:, :, :w], dropout_p=dropout_p, is_causal=True, scale=scale
    )  # (B, Hb, w, D): rows that still see the whole prefix
    c = block_size(w, torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad))
    n = -(-(T - w) // c)  # query blocks over rows w .. T-1
    L = c + w - 1  # keys per block
    qb = F.pad(q[:, :, w:], (0, 0, 0, n * c - (T - w)))  # (B, Hb, n*c, D)
    qb = qb.reshape(B * Hb, n, c, D)  # (B*Hb, n, c, D)
    # block b's keys start at position 1 + b*c; right-pad so the last block has L keys
    # (padded keys are only ever seen by padded query rows, which are dropped)
    kpad = n * c + w - T
    kk = F.pad(k[:, :, 1:], (0, 0, 0, kpad))  # (B, Hb, n*c + w - 1, D)
    vv = F.pad(v[:, :, 1:], (0, 0, 0, kpad))
    kb = kk.unfold(2, L, c).transpose(-1, -2).flatten(0, 1)  # (B*Hb, n, L, D) overlapping view
    vb = vv.unfold(2, L, c).transpose(-1, -2).flatten(0, 1)  # (B*Hb, n, L, D)
    mask = band_mask(c, w, q.dtype, q.device)  # (c, L), broadcast over (B*Hb, n)
    body = F.scaled_dot_product_attention(qb, kb, vb, attn_mask=mask, dropout_p=dropout_p, scale=scale)
    body = body.reshape(B, Hb, n * c, D)[:, :, : T - w]  # (B, Hb, T-w, D)
    return torch.cat([head, body], dim=2)  # (B, Hb, T, D)


def run_buckets(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    windows: tuple[int, ...],
    bucket_fn: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, int], torch.Tensor],
) -> torch.Tensor:
    """Run bucket_fn(q_b, k_b, v_b, w) once per window bucket and reassemble [B, H, T, D].

    A bucket whose heads are contiguous is a slice (no copy); scattered heads are gathered
    once, and the output is put back in head order with one index_select.
    """
    groups, inverse = buckets(tuple(windows), q.shape[-2])
    if len(groups) == 1:
        return bucket_fn(q, k, v, groups[0][0])
    parts = []
    for w, heads in groups:
        if heads[-1] - heads[0] + 1 == len(heads):
            sl = slice(heads[0], heads[-1] + 1)
            parts.append(bucket_fn(q[:, sl], k[:, sl], v[:, sl], w))  # views (B, Hb, T, D)
        else:
            idx = torch.tensor(heads, device=q.device)
            parts.append(bucket_fn(*(t.index_select(1, idx) for t in (q, k, v)), w))  # (B, Hb, T, D)
    out = torch.cat(parts, dim=1)  # (B, H, T, D), heads in bucket order
    if inverse is not None:
        out = out.index_select(1, torch.tensor(inverse, device=q.device))  # back to head order
    return out


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    windows: tuple[int, ...],
    dropout_p: float,
    scale: float | None,
) -> torch.Tensor:
    """q, k, v: [B, H, T, D]; windows: H ints >= 1. Returns [B, H, T, D]."""
    return run_buckets(q, k, v, windows, lambda qb, kb, vb, w: windowed_bucket(qb, kb, vb, w, dropout_p, scale))
