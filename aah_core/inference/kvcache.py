"""Per-head KV caches sized by each head's window, for incremental decoding.

A layer's key/value heads are grouped by window (a window bucket). A bucket with window
W < max_len keeps a ring buffer of at most W keys and values: position p lives in slot
p mod W (Mistral's rolling buffer, here per head), so after t positions the bucket holds
min(t, W) of them. A bucket whose window covers the whole context (full heads) grows.
Buffers grow by doubling up to their window, so a buffer never has more than W slots.

Keys are cached after the rotary rotation: a cached key already carries its position,
so the slot order inside a buffer does not matter to attention (softmax over a set).

Grouped-query attention: query head h reads key/value head h // g (g = H / n_kv_head).
A kv head keeps the largest window among its query heads; a query head with a smaller
window masks the cached positions outside its own window, so decoding stays exact.

The cache knows nothing about a model: a layer hands it q [B, H, T, D] and k, v
[B, n_kv_head, T, D] at positions start .. start+T-1 and gets [B, H, T, D] back. The first
call (the prompt) goes through `windowed_attention`; later calls take one position each.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from aah_core.attention import windowed_attention
from aah_core.errors import InvalidWindowPlan


def kv_head_windows(windows: Sequence[int], n_kv_head: int) -> list[int]:
    """Each kv head's window: the largest window among the query heads that share it."""
    H = len(windows)
    if n_kv_head < 1 or H % n_kv_head:
        raise InvalidWindowPlan(f"{H} query heads cannot share {n_kv_head} key/value heads evenly")
    g = H // n_kv_head
    return [max(windows[j * g : (j + 1) * g]) for j in range(n_kv_head)]


@dataclass
class BucketSize:
    """What one window bucket of one layer holds: `length` positions in `capacity` slots per head."""

    window: int
    n_kv_head: int
    length: int
    capacity: int


class _Bucket:
    """The keys and values of the kv heads that share one window."""

    def __init__(self, window: int, q_windows: torch.Tensor) -> None:
        self.window = window
        self.q_windows = q_windows  # (n, g): the window of each query head reading these kv heads
        self.masked = bool((q_windows < window).any())  # some query head sees less than the buffer
        self.k: torch.Tensor | None = None  # (B, n, capacity, D)
        self.v: torch.Tensor | None = None
        self.length = 0  # positions held (<= capacity <= window)

    def fill(self, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store the last min(T, W) positions of a prompt k, v [B, n, T, D] in their slots."""
        T = k.shape[2]
        keep = min(T, self.window)
        k, v = k[:, :, T - keep :], v[:, :, T - keep :]  # positions T-keep .. T-1
        if keep == self.window:  # position p goes to slot p mod W
            shift = T % self.window
            k, v = k.roll(shift, dims=2), v.roll(shift, dims=2)
        self.k, self.v, self.length = k.contiguous(), v.contiguous(), keep
        self.q_windows = self.q_windows.to(k.device)

    def append(self, k: torch.Tensor, v: torch.Tensor, pos: int) -> None:
        """Store one position's k, v [B, n, 1, D] in slot pos mod W, growing the buffer while it is short."""
        assert self.k is not None and self.v is not None
        slot = pos % self.window
        if self.length < self.window:
            assert slot == self.length  # while short, positions 0..length-1 sit in slots 0..length-1
            if self.length == self.k.shape[2]:
                capacity = min(self.window, max(2 * self.length, 16))
                grow = (0, 0, 0, capacity - self.length)
                self.k, self.v = F.pad(self.k, grow), F.pad(self.v, grow)  # (B, n, capacity, D)
            self.length += 1
        self.k[:, :, slot : slot + 1] = k
        self.v[:, :, slot : slot + 1] = v

    def attend(self, q: torch.Tensor, pos: int, scale: float | None) -> torch.Tensor:
        """q [B, n, g, D] (the query heads of each kv head, at position pos) -> [B, n, g, D]."""
        assert self.k is not None and self.v is not None
        k, v = self.k[:, :, : self.length], self.v[:, :, : self.length]  # (B, n, L, D)
        mask = None
        if self.masked:
            slots = torch.arange(self.length, device=q.device)
            held = pos - (pos - slots) % self.window  # (L,) the position each slot holds
            mask = held.view(1, 1, -1) > pos - self.q_windows.unsqueeze(-1)  # (n, g, L)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)

    def size(self) -> BucketSize:
        capacity = 0 if self.k is None else self.k.shape[2]
        n = self.q_windows.shape[0]
        return BucketSize(self.window, n, self.length, capacity)


class LayerKVCache:
    """One layer's cache under one row of a plan (query-head windows), for a model with n_kv_head kv heads."""

    def __init__(self, windows: Sequence[int], n_kv_head: int, max_len: int, backend: str = "auto") -> None:
        self.windows = tuple(min(int(w), max_len) for w in windows)
        if any(w < 1 for w in self.windows):
            raise InvalidWindowPlan(f"windows must be integers >= 1; got {list(windows)}")
        self.backend = backend
        self.n_kv_head = n_kv_head
        self.group = len(self.windows) // n_kv_head
        kv_windows = kv_head_windows(self.windows, n_kv_head)
        by_window: dict[int, list[int]] = {}
        for j, w in enumerate(kv_windows):
            by_window.setdefault(w, []).append(j)
        q_windows = torch.tensor(self.windows).view(n_kv_head, self.group)  # (n_kv_head, g)
        self.buckets = [_Bucket(w, q_windows[heads]) for w, heads in by_window.items()]
        self.sizes_per_bucket = [len(heads) for heads in by_window.values()]
        order = [j for heads in by_window.values() for j in heads]
        self.perm = None if order == sorted(order) else torch.tensor(order)
        self.inverse = None if self.perm is None else torch.argsort(self.perm)
        self.start = 0  # positions seen

    def _split(self, t: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """[B, n_kv_head, ...] -> one view per bucket (kv heads permuted so buckets are contiguous)."""
        if self.perm is not None:
            t = t.index_select(1, self.perm.to(t.device))
        return t.split(self.sizes_per_bucket, dim=1)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None = None) -> torch.Tensor:
        """q [B, H, T, D], k, v [B, n_kv_head, T, D] at positions start.. -> attention output [B, H, T, D].

        scale: score scale (default 1/sqrt(D))."""
        T = q.shape[2]
        if self.start == 0:
            out = self._prefill(q, k, v, scale)
        elif T == 1:
            out = self._step(q, k, v, scale)
        else:
            raise ValueError(f"after the prompt the cache takes one position per call; got {T}")
        self.start += T
        return out

    def _prefill(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None) -> torch.Tensor:
        for bucket, kb, vb in zip(self.buckets, self._split(k), self._split(v)):
            bucket.fill(kb, vb)
        if self.group > 1:  # each query head reads its kv head
            k = k.repeat_interleave(self.group, dim=1)  # (B, H, T, D)
            v = v.repeat_interleave(self.group, dim=1)
        return windowed_attention(q, k, v, self.windows, backend=self.backend, scale=scale)

    def _step(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None) -> torch.Tensor:
        B, H, _, D = q.shape
        pos = self.start
        qg = q.view(B, self.n_kv_head, self.group, D)  # (B, n_kv_head, g, D): query heads by kv head
        outs = []
        for bucket, qb, kb, vb in zip(self.buckets, self._split(qg), self._split(k), self._split(v)):
            bucket.append(kb, vb, pos)
            outs.append(bucket.attend(qb, pos, scale))  # (B, n, g, D)
        out = torch.cat(outs, dim=1) if len(outs) > 1 else outs[0]  # (B, n_kv_head, g, D), bucket order
        if self.inverse is not None:
            out = out.index_select(1, self.inverse.to(out.device))  # back in kv-head order
        return out.reshape(B, H, 1, D)  # (B, H, 1, D)

    def sizes(self) -> list[BucketSize]:
        return [b.size() for b in self.buckets]


class KVCache:
    """A model's per-head KV cache under a plan: one LayerKVCache per layer."""

    def __init__(
        self, plan: torch.Tensor, n_kv_head: int, max_len: int, backend: str = "auto"
    ) -> None:
        self.max_len = max_len
        self.layers = [LayerKVCache(row, n_kv_head, max_len, backend) for row in plan.tolist()]

    @property
    def start(self) -> int:
        """Positions cached so far."""
        return self.layers[0].start

    def entries(self) -> int:
        """Cached (position, kv head) pairs over all layers, per sequence of the batch."""
        return sum(s.length * s.n_kv_head for layer in self.layers for s in layer.sizes())

    def nbytes(self) -> int:
        """Bytes of the keys and values held (every sequence of the batch)."""
        total = 0
        for layer in self.layers:
            for b in layer.buckets:
                if b.k is not None:
                    B, n, _, D = b.k.shape
                    total += 2 * B * n * b.length * D * b.k.element_size()
        return total
