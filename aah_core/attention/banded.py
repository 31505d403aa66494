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

With s sink tokens the head rows are ``i < w + s`` (their window reaches the sinks, so they
see every earlier key) and every body block's keys are the s sink keys followed by its band:
the sink columns are one dense ``[c, s]`` block of the mask (every body row sees every sink),
so the work per body row is ``c + w - 1 + s`` keys against the ``w + s`` it attends.
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


@functools.lru_cache(maxsize=256)
def buckets(windows: tuple[int, ...], T: int) -> tuple[tuple[tuple[int, int], ...], tuple[int, ...] | None]:
    """Heads grouped by window, every window >= T merged into the full bucket T.

    Returns ((window, n_heads), ...) in order of each bucket's first head, and the head
    permutation that makes every bucket contiguous (None when they already are).
    """
    groups: dict[int, list[int]] = {}
    for h, w in enumerate(windows):
        groups.setdefault(min(w, T), []).append(h)
    order = tuple(h for heads in groups.values() for h in heads)
    perm = None if order == tuple(range(len(windows))) else order
    return tuple((w, len(heads)) for w, heads in groups.items()), perm


def block_size(w: int, needs_grad: bool, device_type: str = "cpu") -> int:
    """Queries per block for window w (measured on a 2-core AVX2 CPU, see bench/attention.py).

    Forward: small blocks waste the fewest keys ((c+w-1)/w per row) and the unfold view
    costs nothing, so c=32 wins at every w. Backward materialises a gradient for every
    unfolded key ((c+w-1)/c times K and V), so there blocks grow to about w/4.
    On CUDA the kernels' own tiles are 64-128 queries, so blocks start at 128 (untuned).
    """
    if device_type == "cuda":
        return max(128, block_size(w, needs_grad))
    if not needs_grad:
        return 32
    c = 32
    while c < 512 and 4 * c < w:
        c *= 2
    return c


@functools.lru_cache(maxsize=64)
def band_mask(c: int, w: int, dtype: torch.dtype, device: torch.device, sinks: int = 0) -> torch.Tensor:
    """[c, sinks + c+w-1] additive mask: query r of a block sees every sink column, then window columns r .. r+w-1."""
    r = torch.arange(c, device=device).view(c, 1)
    j = torch.arange(c + w - 1, device=device).view(1, c + w - 1)
    allowed = (j >= r) & (j <= r + w - 1)
    band = torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill(~allowed, float("-inf"))
    return F.pad(band, (sinks, 0))  # the sink block: zeros (allowed) for every row


def _block_keys(t: torch.Tensor, start: int, n: int, c: int, L: int) -> torch.Tensor:
    """[B, Hb, T, D] -> [B*Hb, n, L, D]: block b gets positions start + b*c .. start + b*c + L-1.

    One unfold view, no copy; right-padded so the last block has L keys (padded keys are only
    ever seen by padded query rows, which are dropped)."""
    padded = F.pad(t, (0, 0, -start, start + n * c + L - c - t.shape[2]))  # (B, Hb, n*c + L - c, D)
    return padded.unfold(2, L, c).transpose(-1, -2).flatten(0, 1)


def windowed_bucket(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, w: int, dropout_p: float, scale: float | None,
    sinks: int = 0,
) -> torch.Tensor:
    """Exact window-w causal attention (with `sinks` sink keys) for one bucket. q, k, v: [B, Hb, T, D] -> [B, Hb, T, D]."""
    B, Hb, T, D = q.shape
    h = w + sinks  # rows i < w + s still see the whole prefix (their window reaches the sinks)
    if h >= T:
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True, scale=scale)
    q_head, q_body = q.split([h, T - h], dim=2)  # (B, Hb, h, D), (B, Hb, T-h, D)
    head = F.scaled_dot_product_attention(
        q_head, k[:, :, :h], v[:, :, :h], dropout_p=dropout_p, is_causal=True, scale=scale
    )  # (B, Hb, h, D)
    wants_grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    c = block_size(w, wants_grad, q.device.type)
    n = -(-(T - h) // c)  # query blocks over rows h .. T-1
    L = c + w - 1  # window keys per block
    qb = F.pad(q_body, (0, 0, 0, n * c - (T - h)))  # (B, Hb, n*c, D)
    qb = qb.reshape(B * Hb, n, c, D)  # (B*Hb, n, c, D)
    # block b's first query is h + b*c, so its window keys start at h + b*c - w + 1 = s + 1 + b*c
    kb = _block_keys(k, sinks + 1, n, c, L)  # (B*Hb, n, L, D) overlapping view
    vb = _block_keys(v, sinks + 1, n, c, L)
    if sinks:  # the same s sink keys in front of every block's band
        kb, vb = (torch.cat([t[:, :, :sinks].unsqueeze(2).expand(B, Hb, n, sinks, D).flatten(0, 1), tb], dim=2)
                  for t, tb in ((k, kb), (v, vb)))  # (B*Hb, n, s + L, D)
    mask = band_mask(c, w, q.dtype, q.device, sinks)  # (c, s + L), broadcast over (B*Hb, n)
    body = F.scaled_dot_product_attention(qb, kb, vb, attn_mask=mask, dropout_p=dropout_p, scale=scale)
    body = body.reshape(B, Hb, n * c, D)[:, :, : T - h]  # (B, Hb, T-h, D)
    return torch.cat([head, body], dim=2)  # (B, Hb, T, D)


def run_buckets(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    windows: tuple[int, ...],
    bucket_fn: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, int], torch.Tensor],
) -> torch.Tensor:
    """Run bucket_fn(q_b, k_b, v_b, w) once per window bucket and reassemble [B, H, T, D].

    Buckets are split off along heads (views; one cat in backward). When a bucket's heads
    are not contiguous, q, k, v are permuted once first and the output once back.
    """
    groups, perm = buckets(tuple(windows), q.shape[-2])
    if len(groups) == 1:
        return bucket_fn(q, k, v, groups[0][0])
    if perm is not None:
        index = torch.tensor(perm, device=q.device)
        q, k, v = (t.index_select(1, index) for t in (q, k, v))  # (B, H, T, D), buckets contiguous
    sizes = [n for _, n in groups]
    pieces = zip(q.split(sizes, dim=1), k.split(sizes, dim=1), v.split(sizes, dim=1))  # (B, Hb, T, D) views
    out = torch.cat([bucket_fn(qb, kb, vb, w) for (w, _), (qb, kb, vb) in zip(groups, pieces)], dim=1)
    if perm is not None:
        inverse = torch.empty_like(index)
        inverse[index] = torch.arange(len(perm), device=q.device)
        out = out.index_select(1, inverse)  # (B, H, T, D) back in head order
    return out


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    windows: tuple[int, ...],
    dropout_p: float,
    scale: float | None,
    sinks: int = 0,
) -> torch.Tensor:
    """q, k, v: [B, H, T, D]; windows: H ints >= 1; sinks: keys every query also sees. Returns [B, H, T, D]."""
    def bucket(qb: torch.Tensor, kb: torch.Tensor, vb: torch.Tensor, w: int) -> torch.Tensor:
        return windowed_bucket(qb, kb, vb, w, dropout_p, scale, sinks)

    return run_buckets(q, k, v, windows, bucket)
