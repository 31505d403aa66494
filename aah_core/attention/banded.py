"""The `banded` backend: exact per-head windows that only compute the band, with autograd.

Heads are bucketed by window. A bucket whose window covers T is plain causal SDPA. A
windowed bucket (w < T) splits its query rows in two:

- rows ``i < w`` see every earlier key, so they are causal SDPA over the first w positions;
- rows ``i >= w`` are cut into blocks of c queries. The block starting at row s sees keys
  ``s-w+1 .. s+c-1``: a window of ``L = c+w-1`` keys that never starts before position 1,
  so no left padding (and no padded key to mask) is needed. One ``unfold`` view of K and V
  gives every block its L keys without a copy (q, k, v are not copied either when c divides
  the body's rows), and one SDPA call runs all blocks with the same small ``[c, L]`` band mask
  (query r of a block sees window columns ``r .. r+w-1``). The view's backward (BandView)
  folds the blocks' key gradients back with a few shifted adds.

Work is ``w^2/2 + (T-w)(c+w-1)`` pairs against ``T^2/2`` for causal, so the band is
never worse than causal plus ``c`` keys per row; it is exact for every w, so there is no
inexact "just use causal" fallback. Rows always keep their own key: no NaN, even at w=1.

With s sink tokens the head rows are ``i < w + s`` (their window reaches the sinks, so they
see every earlier key). For the body, K and V are laid out once in chunks of c keys, each
chunk preceded by a copy of the s sink keys (``(s + c) / c`` times K, not a copy per block);
the same unfold then gives every block M = ceil((c+w-1)/c) chunks, and one shared mask keeps
the first chunk's sinks (one dense ``[c, s]`` block: every body row sees every sink) and the
band, masking the other chunks' sink copies. Work per body row is ``M (c + s)`` keys against
the ``w + s`` it attends: about ``c + w + M s``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

import aah_core.attention.native as native

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
    """Queries per block for window w (measured on 2-core AVX2 and AVX-512 CPUs, see bench/attention.py).

    Forward: small blocks waste the fewest keys ((c+w-1)/w per row) and the unfold view
    costs nothing, so c=32 wins at every w. Backward writes a gradient for every key of a
    block ((c+w-1)/c times K and V) before folding it back, so there blocks grow to about
    w/2, at most 256 (issue 26: 64 beat 32 for w=128 and 256 beat 512 for w=1024).
    On CUDA the kernels' own tiles are 64-128 queries, so blocks start at 128 (untuned).
    """
    if device_type == "cuda":
        return max(128, block_size(w, needs_grad))
    c = 32
    while needs_grad and c < 256 and 2 * c < w:
        c *= 2
    return c


@functools.lru_cache(maxsize=64)
@torch.inference_mode(False)  # cached across calls: never an inference tensor, which autograd could not save
def band_mask(c: int, w: int, dtype: torch.dtype, device: torch.device, sinks: int = 0) -> torch.Tensor:
    """Additive mask of a block's keys: query r sees window columns r .. r+w-1 of its c+w-1 band keys.

    Without sinks: [c, c+w-1]. With s sinks the keys are M chunks of (s sink copies, c band keys),
    M = ceil((c+w-1)/c): [c, M (s+c)]; every row sees the first chunk's sinks, no other sink copy."""
    L = c + w - 1
    r = torch.arange(c, device=device).view(c, 1)
    if not sinks:
        j = torch.arange(L, device=device).view(1, L)
        allowed = (j >= r) & (j <= r + w - 1)
    else:
        M, P = -(-L // c), sinks + c
        u = torch.arange(M * P, device=device).view(1, M * P)
        chunk, offset = u // P, u % P
        band = chunk * c + offset - sinks  # the column's band index (meaningless on a sink copy)
        allowed = (u < sinks) | ((offset >= sinks) & (band >= r) & (band <= r + w - 1))
    return torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill(~allowed, float("-inf"))


class BandView(torch.autograd.Function):
    """x [B, H, P, D] -> [B*H, n, L, D]: block b holds positions b*c .. b*c+L-1 (an overlapping view, no copy).

    Its backward folds the blocks' gradient back with ceil(L/c) shifted adds of c-row slices.
    torch's own unfold backward scatters every unfolded element: it was 76 % of a w=32 bucket's
    backward and 38 % of a w=128 one's (issue 26, torch.profiler).
    """

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, n: int, L: int, c: int) -> torch.Tensor:
        ctx.shape, ctx.c = x.shape, c
        return x.unfold(2, L, c)[:, :, :n].transpose(-1, -2).flatten(0, 1)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        B, H, P, D = ctx.shape
        c = ctx.c
        _, n, L, _ = grad.shape
        m = -(-L // c)  # c-row slices per block
        grad = grad.view(B, H, n, L, D)
        out = grad.new_zeros(B, H, max(n + m - 1, -(-P // c)), c, D)  # (B, H, chunks, c, D)
        for j in range(m):  # slice j of block b lands in chunk b + j
            width = min(c, L - j * c)
            out[:, :, j : j + n, :width] += grad[:, :, :, j * c : j * c + width]
        return out.flatten(2, 3)[:, :, :P], None, None, None


def _block_keys(t: torch.Tensor, start: int, n: int, c: int, L: int, sinks: int = 0) -> torch.Tensor:
    """[B, Hb, T, D] -> the keys of each of n query blocks, block b's band at positions start + b*c ..
    start + b*c + L-1: [B*Hb, n, L, D] without sinks, [B*Hb, n, M (s+c), D] with (band_mask's layout).

    Without sinks one overlapping view (BandView), no copy unless the last block runs past T; with
    sinks one copy of K laid out in chunks (each with the s sink keys in front), then the same kind
    of view. Right-padded so the last block has all
    its keys (padded keys are only ever seen by padded query rows, which are dropped)."""
    B, Hb, T, D = t.shape
    if not sinks:
        extra = start + n * c + L - c - T
        x = t[:, :, start:] if extra <= 0 else F.pad(t, (0, 0, -start, extra))  # (B, Hb, >= n*c + L - c, D)
        return BandView.apply(x, n, L, c)
    M, P = -(-L // c), sinks + c
    chunks = n + M - 1  # block b reads chunks b .. b+M-1
    full, rest = divmod(T - start, c)  # whole chunks of keys, then the last keys
    laid = t.new_empty(B, Hb, chunks, P, D)  # written once, slice by slice (each write is differentiable)
    laid[:, :, :, :sinks] = t[:, :, :sinks].unsqueeze(2)
    laid[:, :, :full, sinks:] = t[:, :, start : start + full * c].reshape(B, Hb, full, c, D)
    laid[:, :, full:, sinks:] = 0.0  # padding: finite, so no NaN reaches a gradient
    if rest:
        laid[:, :, full, sinks : sinks + rest] = t[:, :, start + full * c :]
    return BandView.apply(laid.view(B, Hb, chunks * P, D), n, M * P, P)  # (B*Hb, n, M*(s+c), D)


# CPU flash attention that also returns each row's log-sum-exp (what F.scaled_dot_product_attention runs on CPU)
_FLASH_LSE = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
# native.band_attention takes a head when min(window + sinks, T) * head dim is at most this (full heads included). One
# head at T = 1024-4096, D = 32-128 (bench/band_kernel.py, bench/results/band-kernel-s46-*.json): it took
# 0.21-0.73x the time of ATen's blocks for every window up to this, and 0.56-0.87x of ATen's causal attention
# for full heads up to it (T * D = 131072: D = 32 at T = 4096, D = 64 at 2048, D = 128 at 1024); past it, on
# full heads, 1.05-1.57x (D = 64 at T = 4096, D = 128 at 2048 and 4096; D = 32 at T = 8192: 1.07x). Forward and
# backward (bench.band_kernel --grad, band-kernel-grad-s47): 0.41-0.83x ATen's for every window and full head of one
# head; eight full heads at once past this, 1.10-1.35x causal SDPA's (ATen's threads then all busy), so the same
# bound holds under autograd.
NATIVE_MAX_WORK = 4096 * 32
BALANCE_MIN_T = 1024  # shorter causal calls keep one call: the split's extra calls and merge cost more there
_BALANCE_DTYPES = (torch.float32, torch.float64)  # the merge runs in the output dtype


def causal(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float, scale: float | None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal SDPA of q, k, v [B, Hb, T, D] (written into `out` when given), split in halves of equal work
    when one call would leave CPU threads idle.

    ATen's CPU flash kernel hands each thread a contiguous run of (batch, head, query block) items, and a
    causal query block costs as many keys as its position: with B*Hb heads that do not divide evenly over
    the threads, the thread with the last blocks does most of the work (one head on 2 threads: 0.74 of the
    serial time instead of 0.5; the mixed plan's full-context head at batch 1, issue 26). Split rows and
    keys in halves a, b: rows of a see keys a causally and rows of b keys b causally (one call, 2*B*Hb
    equal heads), rows of b also see all of keys a (one call without a mask, equal blocks); the two parts
    of b's rows are merged by their log-sum-exps. The same pairs are computed; inference only (the kernel's
    log-sum-exp has no gradient here)."""
    B, Hb, T, _ = q.shape
    wants_grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    if (_FLASH_LSE is None or q.device.type != "cpu" or dropout_p or wants_grad or q.dtype not in _BALANCE_DTYPES
            or not split_pays(B * Hb, T, torch.get_num_threads())):
        full = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True, scale=scale)
        return full if out is None else out.copy_(full)
    return balanced_causal(q, k, v, scale, out)


def split_pays(heads: int, T: int, threads: int) -> bool:
    """Whether causal() splits: heads (B*Hb) that leave threads unevenly loaded, T long and even."""
    return threads > 1 and heads % threads != 0 and T >= BALANCE_MIN_T and T % 2 == 0


def balanced_causal(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None, out: torch.Tensor | None = None
) -> torch.Tensor:
    """causal()'s split (CPU, no gradient, T even): q, k, v [B, Hb, T, D] -> [B, Hb, T, D]."""
    assert _FLASH_LSE is not None
    B, Hb, T, D = q.shape
    h = T // 2

    def halves(t: torch.Tensor) -> torch.Tensor:  # (B, 2*Hb, h, D): each head's first rows, then its last
        return t.reshape(B, Hb, 2, h, D).flatten(1, 2)

    diag, diag_lse = _FLASH_LSE(halves(q), halves(k), halves(v), 0.0, True, scale=scale)  # (B, 2Hb, h, D), (B, 2Hb, h)
    diag, diag_lse = diag.view(B, Hb, 2, h, D), diag_lse.view(B, Hb, 2, h)
    past, past_lse = _FLASH_LSE(q[:, :, h:], k[:, :, :h], v[:, :, :h], 0.0, False, scale=scale)  # (B, Hb, h, D)
    out = q.new_empty(q.shape) if out is None else out
    if native.merges(out):  # one pass on one thread; the torch ops below are four, each waking the threads
        native.merge_halves(diag[:, :, 0], diag[:, :, 1], diag_lse[:, :, 1], past, past_lse, out)
        return out
    lse = torch.logaddexp(diag_lse[:, :, 1], past_lse)  # (B, Hb, h): rows of b over all their keys
    out[:, :, :h] = diag[:, :, 0]
    torch.mul(diag[:, :, 1], (diag_lse[:, :, 1] - lse).exp_().unsqueeze(-1), out=out[:, :, h:])
    out[:, :, h:].addcmul_(past, (past_lse - lse).exp_().unsqueeze(-1))
    return out


def windowed_bucket(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, w: int, dropout_p: float, scale: float | None,
    sinks: int = 0, out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Exact window-w causal attention (with `sinks` sink keys) for one bucket. q, k, v: [B, Hb, T, D] -> [B, Hb, T, D].

    With `out` ([B, Hb, T, D], a view of the whole call's output) the rows are written there and out is returned."""
    B, Hb, T, D = q.shape
    h = w + sinks  # rows i < w + s still see the whole prefix (their window reaches the sinks)
    if h >= T:
        return causal(q, k, v, dropout_p, scale, out)
    q_head, q_body = q.split([h, T - h], dim=2)  # (B, Hb, h, D), (B, Hb, T-h, D)
    head = F.scaled_dot_product_attention(
        q_head, k[:, :, :h], v[:, :, :h], dropout_p=dropout_p, is_causal=True, scale=scale
    )  # (B, Hb, h, D)
    wants_grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    c = block_size(w, wants_grad, q.device.type)
    n = -(-(T - h) // c)  # query blocks over rows h .. T-1
    L = c + w - 1  # window keys per block
    extra = n * c - (T - h)  # padded query rows (none when c divides T - h: then qb is a view of q)
    qb = F.pad(q_body, (0, 0, 0, extra)) if extra else q_body
    qb = qb.reshape(B * Hb, n, c, D)  # (B*Hb, n, c, D)
    # block b's first query is h + b*c, so its window keys start at h + b*c - w + 1 = s + 1 + b*c
    kb = _block_keys(k, sinks + 1, n, c, L, sinks)  # (B*Hb, n, keys, D) overlapping view
    vb = _block_keys(v, sinks + 1, n, c, L, sinks)
    mask = band_mask(c, w, q.dtype, q.device, sinks)  # (c, keys), broadcast over (B*Hb, n)
    body = F.scaled_dot_product_attention(qb, kb, vb, attn_mask=mask, dropout_p=dropout_p, scale=scale)
    if out is not None and not extra:  # one strided copy: SDPA's output is laid out (B*Hb, c, n, D)
        out[:, :, :h] = head  # rows written in place: no cat per bucket, then another over buckets
        out[:, :, h:].unflatten(2, (n, c)).copy_(body.view(B, Hb, n, c, D))
        return out
    body = body.reshape(B, Hb, n * c, D)  # (B, Hb, n*c, D)
    if out is None:
        return torch.cat([head, body[:, :, : T - h] if extra else body], dim=2)  # (B, Hb, T, D)
    out[:, :, :h] = head
    out[:, :, h:] = body[:, :, : T - h] if extra else body
    return out


def run_buckets(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    windows: tuple[int, ...],
    bucket_fn: Callable[..., torch.Tensor],
    write_into: bool = False,
) -> torch.Tensor:
    """Run bucket_fn(q_b, k_b, v_b, w) once per window bucket and reassemble [B, H, T, D].

    Buckets are split off along heads (views; one cat in backward). When a bucket's heads
    are not contiguous, q, k, v are permuted once first and the output once back. With
    `write_into`, bucket_fn(q_b, k_b, v_b, w, out_b) writes its rows into out_b, its heads' view
    of one output tensor, instead of returning them to a cat (one pass and allocation less;
    the allocations of fresh multi-MB outputs page-fault on every call on CPU).
    """
    groups, perm = buckets(tuple(windows), q.shape[-2])
    if len(groups) == 1:
        return bucket_fn(q, k, v, groups[0][0])
    if perm is not None:
        index = torch.tensor(perm, device=q.device)
        q, k, v = (t.index_select(1, index) for t in (q, k, v))  # (B, H, T, D), buckets contiguous
    sizes = [n for _, n in groups]
    pieces = zip(q.split(sizes, dim=1), k.split(sizes, dim=1), v.split(sizes, dim=1))  # (B, Hb, T, D) views
    if write_into:
        B, H, T, D = q.shape
        # laid out (B, T, H, D) like SDPA's own output: the caller's transpose to (B, T, C) is then a view
        out, first = q.new_empty(B, T, H, D).transpose(1, 2), 0
        for (w, n), (qb, kb, vb) in zip(groups, pieces):
            bucket_fn(qb, kb, vb, w, out.narrow(1, first, n))  # narrow, not split: split's views refuse in-place writes
            first += n
    else:
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
    def bucket(qb: torch.Tensor, kb: torch.Tensor, vb: torch.Tensor, w: int, out: torch.Tensor | None = None) -> torch.Tensor:
        return windowed_bucket(qb, kb, vb, w, dropout_p, scale, sinks, out)

    # rows written into one output when no gradient is wanted (2 % faster forward at T=2048, coverage 0.28);
    # under autograd the in-place writes made the backward 6 % slower than a cat
    wants_grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    T, D = q.shape[2:]
    takes = tuple(_native_takes(w + sinks, T, D) for w in windows)  # the heads the C kernel is faster for
    if any(takes) and not dropout_p and native.usable(q, k, v):
        if not wants_grad:
            return _attend_native(q, k, v, windows, scale, sinks)
        if all(takes):
            return native.BandAttention.apply(q, k, v, tuple(windows), scale, sinks)
        return _attend_native_grad(q, k, v, windows, takes, scale, sinks, bucket)
    return run_buckets(q, k, v, windows, bucket, write_into=not wants_grad)


def _native_takes(keys: int, T: int, D: int) -> bool:
    """keys: a query's window plus the sinks."""
    return min(keys, T) * D <= NATIVE_MAX_WORK


def _attend_native_grad(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, windows: tuple[int, ...], takes: tuple[bool, ...],
    scale: float | None, sinks: int, bucket: Callable[..., torch.Tensor],
) -> torch.Tensor:
    """attend() under autograd when the kernel takes some heads (`takes`) but not all: those heads through
    native.BandAttention, the others through run_buckets(bucket), in one group each (views when each group's heads
    are contiguous, else q, k, v permuted once and the output once back), joined by one cat."""
    H = q.shape[1]
    groups = (True, False) if takes[0] else (False, True)  # in the order of each group's first head
    order = [h for group in groups for h in range(H) if takes[h] == group]
    n = takes.count(groups[0])
    index = None if order == list(range(H)) else torch.tensor(order, device=q.device)
    if index is not None:
        q, k, v = (t.index_select(1, index) for t in (q, k, v))
    parts = []
    for group, heads in zip(groups, (slice(0, n), slice(n, H))):
        group_windows = tuple(windows[h] for h in order[heads])
        qg, kg, vg = q[:, heads], k[:, heads], v[:, heads]
        parts.append(native.BandAttention.apply(qg, kg, vg, group_windows, scale, sinks) if group else
                     run_buckets(qg, kg, vg, group_windows, bucket))
    out = torch.cat(parts, dim=1)
    if index is None:
        return out
    inverse = torch.empty_like(index)
    inverse[index] = torch.arange(H, device=q.device)
    return out.index_select(1, inverse)


def _attend_native(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, windows: tuple[int, ...], scale: float | None, sinks: int
) -> torch.Tensor:
    """attend() without gradient or dropout, float32 on CPU: the heads with min(window + sinks, T) * D up to
    NATIVE_MAX_WORK in one call of native.band_attention, the others on ATen (a run of heads with the same
    window at a time), all written into one output laid out (B, T, H, D)."""
    B, H, T, D = q.shape
    out = q.new_empty(B, T, H, D).transpose(1, 2)
    kernel_windows = tuple(w if _native_takes(w + sinks, T, D) else 0 for w in windows)  # 0: not the kernel's
    native.band_attention(q, k, v, kernel_windows, scale, out, sinks=sinks)
    first = 0
    while first < H:
        end = first + 1
        if kernel_windows[first] == 0:
            while end < H and kernel_windows[end] == 0 and min(windows[end], T) == min(windows[first], T):
                end += 1
            heads = slice(first, end)
            windowed_bucket(q[:, heads], k[:, heads], v[:, heads], windows[first], 0.0, scale, sinks,
                            out.narrow(1, first, end - first))
        first = end
    return out
