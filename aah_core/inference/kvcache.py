"""Per-head KV caches sized by each head's window, for incremental decoding.

Each key/value head keeps a ring buffer of at most W keys and values, W its window: position p
lives in slot p mod W (Mistral's rolling buffer, here per head), so after t positions the head
holds min(t, W) of them. A head whose window covers the whole context grows up to it. Buffers
grow by doubling up to their window, so a buffer never has more than W slots.

A layer keeps all its heads' buffers in one flat tensor [B, slots, D] (kv head j's ring is the
segment offsets[j] .. offsets[j] + capacity[j]) and the position each slot holds, so a decode step
is the same few tensor operations whatever the windows: one index_copy_ writes the new key (and
value) of every head, and ONE scaled_dot_product_attention call attends: the H query heads form
one query block over the flat buffer, with a mask that keeps each query head to its own kv
head's slots inside its window. The keys are read once (the plan's bytes, not the full
context's); the scores are H x slots, so with many heads the wasted products grow (measured in
the README: at 4 heads one call costs the same as one call per window bucket, at 12 heads more).
When every kv head has the same window the segments are equal and the buffer is a plain
[B, n, W, D] tensor: one SDPA call with a mask only where a query head sees less than its kv head.

Sink tokens (a model with s > 0): every ring also keeps the first s positions for good. Its first
s slots hold them, and position p >= s lives in slot s + (p - s) mod W, so a head holds
min(t, W + s) positions and a query head sees a slot when it is inside its window or holds a
sink. Without sinks this is the rolling buffer above.

Keys are cached after the rotary rotation: a cached key already carries its position,
so the slot order inside a buffer does not matter to attention (softmax over a set).

Grouped-query attention: query head h reads key/value head h // g (g = H / n_kv_head).
A kv head keeps the largest window among its query heads; a query head with a smaller
window masks the cached positions outside its own window, so decoding stays exact.

The cache knows nothing about a model: a layer hands it q [B, H, T, D] and k, v
[B, n_kv_head, T, D] at positions start .. start+T-1 and gets [B, H, T, D] back. The first
call (the prompt) goes through `windowed_attention` (the banded kernels); later calls take one
position each.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from aah_core.attention import windowed_attention
from aah_core.errors import InvalidWindowPlan
from aah_core.windows import check_sinks

MIN_CAPACITY = 16  # a growing buffer starts with at least this many slots


def kv_head_windows(windows: Sequence[int], n_kv_head: int) -> list[int]:
    """Each kv head's window: the largest window among the query heads that share it."""
    H = len(windows)
    if n_kv_head < 1 or H % n_kv_head:
        raise InvalidWindowPlan(f"{H} query heads cannot share {n_kv_head} key/value heads evenly")
    g = H // n_kv_head
    return [max(windows[j * g : (j + 1) * g]) for j in range(n_kv_head)]


@dataclass
class BucketSize:
    """What the kv heads of one window hold in one layer: `length` positions in `capacity` slots per head."""

    window: int
    n_kv_head: int
    length: int
    capacity: int


EMPTY = -(1 << 40)  # the position an empty slot "holds": outside every window


class _Layout:
    """Where each kv head's ring lies in the flat buffer: per slot its kv head and its index in that
    ring; per (query head, slot) the query head's window, or 0 for another kv head's slot."""

    def __init__(self, kv_windows: torch.Tensor, q_windows: torch.Tensor, capacity: int, spans: torch.Tensor) -> None:
        self.kv_windows = kv_windows  # (n,)
        self.q_windows = q_windows  # (n, g)
        self.capacities = spans.clamp(max=capacity)  # (n,) spans: the most positions each head keeps
        self.offsets = torch.cumsum(self.capacities, 0) - self.capacities  # (n,)
        self.slots = int(self.capacities.sum())
        self.head = torch.repeat_interleave(torch.arange(len(kv_windows)), self.capacities)  # (S,)
        self.ring = torch.arange(self.slots) - self.offsets[self.head]  # (S,) index inside the head's ring
        n, g = q_windows.shape
        # query head h (kv head h // g) sees slot s holding position p at step pos iff pos - p < reach[h, s]
        owner = (torch.arange(n * g) // g).unsqueeze(1) == self.head.unsqueeze(0)  # (H, S)
        self.reach = torch.where(owner, q_windows.reshape(-1, 1), 0)  # (H, S)
        self.owner = owner  # (H, S) for the sink slots, which every query head of the kv head sees

    def to(self, device: torch.device) -> _Layout:
        for name in ("kv_windows", "q_windows", "capacities", "offsets", "head", "ring", "reach", "owner"):
            setattr(self, name, getattr(self, name).to(device))
        return self


class LayerKVCache:
    """One layer's cache under one row of a plan (query-head windows), for a model with n_kv_head kv heads."""

    def __init__(
        self, windows: Sequence[int], n_kv_head: int, max_len: int, backend: str = "auto", sinks: int = 0
    ) -> None:
        self.windows = tuple(min(int(w), max_len) for w in windows)
        if any(w < 1 for w in self.windows):
            raise InvalidWindowPlan(f"windows must be integers >= 1; got {list(windows)}")
        self.backend = backend
        self.max_len = max_len
        self.sinks = check_sinks(sinks)
        self.n_kv_head = n_kv_head
        self.group = len(self.windows) // n_kv_head
        self.kv_windows = kv_head_windows(self.windows, n_kv_head)
        self._kv_windows = torch.tensor(self.kv_windows)  # (n,)
        self._q_windows = torch.tensor(self.windows).view(n_kv_head, self.group)  # (n, g)
        self.uniform = len(set(self.kv_windows)) == 1  # equal segments: the buffer is [B, n, W, D]
        self.masked = bool((self._q_windows < self._kv_windows.unsqueeze(1)).any())  # a query head sees less
        self._spans = (self._kv_windows + self.sinks).clamp(max=max_len)  # (n,) positions a head keeps at most
        self.max_window = int(self._spans.max())
        self.capacity = 0  # slots of a head whose window is larger (the others have their window's)
        self.layout: _Layout | None = None
        self.k: torch.Tensor | None = None  # (B, slots, D)
        self.v: torch.Tensor | None = None
        self.held: torch.Tensor | None = None  # (slots,) the position each slot holds (EMPTY: none)
        self.start = 0  # positions seen

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

    def _relayout(self, capacity: int, device: torch.device) -> _Layout:
        self.capacity = capacity
        self.layout = _Layout(self._kv_windows, self._q_windows, capacity, self._spans).to(device)
        return self.layout

    def _prefill(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None) -> torch.Tensor:
        T = k.shape[2]
        lay = self._relayout(T, k.device)  # capacity min(W, T): exactly the positions kept
        # slot r < s of a ring holds sink r; slot r >= s position T-1 - ((T-1 - r) mod W): the last positions
        held = (T - 1) - ((T - 1) - lay.ring) % lay.kv_windows[lay.head]  # (S,)
        held = torch.where(lay.ring < self.sinks, lay.ring, held)
        self.k = k[:, lay.head, held]  # (B, S, D)
        self.v = v[:, lay.head, held]
        self.held = held
        if self.group > 1:  # each query head reads its kv head
            k = k.repeat_interleave(self.group, dim=1)  # (B, H, T, D)
            v = v.repeat_interleave(self.group, dim=1)
        return windowed_attention(q, k, v, self.windows, backend=self.backend, scale=scale, sinks=self.sinks)

    def _grow(self) -> None:
        """Double the rings that are full and shorter than their window (all at once: they hold the same t)."""
        assert self.k is not None and self.v is not None and self.layout is not None
        old = self.layout
        lay = self._relayout(min(self.max_window, max(2 * self.capacity, MIN_CAPACITY)), self.k.device)
        keep = lay.ring < old.capacities[lay.head]  # (S_new,): slots that existed before
        source = old.offsets[lay.head] + lay.ring  # their old index
        B, _, D = self.k.shape
        for name in ("k", "v"):
            grown = self.k.new_zeros(B, lay.slots, D)
            grown[:, keep] = getattr(self, name)[:, source[keep]]
            setattr(self, name, grown)
        assert self.held is not None
        self.held = torch.where(keep, self.held[source.clamp(max=len(self.held) - 1)], EMPTY)

    def _step(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None) -> torch.Tensor:
        assert self.k is not None and self.v is not None and self.held is not None
        B, H, _, D = q.shape
        pos = self.start
        if pos == self.capacity and pos < self.max_window:
            self._grow()
        lay = self.layout
        assert lay is not None
        if self.uniform:
            return self._uniform_step(q, k, v, scale)
        slots = lay.offsets + self._slot(pos, lay.kv_windows)  # (n,): this position's slot in each head's ring
        self.k.index_copy_(1, slots, k[:, :, 0])
        self.v.index_copy_(1, slots, v[:, :, 0])
        self.held.index_fill_(0, slots, pos)
        visible = self._visible(pos, self.held, lay.reach, lay.owner)  # (H, S): own kv head's slots
        out = F.scaled_dot_product_attention(q.view(B, 1, H, D), self.k.unsqueeze(1), self.v.unsqueeze(1),
                                             attn_mask=visible, scale=scale)  # the heads as one query block
        return out.view(B, H, 1, D)

    def _uniform_step(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None) -> torch.Tensor:
        """Equal windows: the buffer is [B, n, L, D] and the step one slice write and one SDPA per head group."""
        assert self.k is not None and self.v is not None and self.held is not None and self.layout is not None
        B, H, _, D = q.shape
        pos, n = self.start, self.n_kv_head
        L = self.layout.slots // n
        slot = int(self._slot(pos, self.kv_windows[0]))
        keys, values = self.k.view(B, n, L, D), self.v.view(B, n, L, D)
        keys[:, :, slot], values[:, :, slot] = k[:, :, 0], v[:, :, 0]
        held = self.held.view(n, L)
        held[:, slot] = pos
        length = min(pos + 1, L)  # slots held: the ring's first `length`
        mask = None
        if self.masked or self.sinks:  # (n, g, length): inside each query head's own window, or a sink
            mask = self._visible(pos, held[:, :length].unsqueeze(1), self.layout.q_windows.unsqueeze(-1), True)
        out = F.scaled_dot_product_attention(q.view(B, n, self.group, D), keys[:, :, :length], values[:, :, :length],
                                             attn_mask=mask, scale=scale)
        return out.view(B, H, 1, D)

    def _slot(self, pos: int, windows: torch.Tensor | int) -> torch.Tensor | int:
        """Position pos's slot in rings of these windows: itself while a sink, else s + (pos - s) mod W."""
        return pos if pos < self.sinks else self.sinks + (pos - self.sinks) % windows

    def _visible(self, pos: int, held: torch.Tensor, reach: torch.Tensor, owner: torch.Tensor | bool) -> torch.Tensor:
        """Whether a slot holding position `held` is seen at step pos: inside the window, or an owned sink."""
        inside = (pos - held) < reach
        if not self.sinks:
            return inside
        return inside | ((held >= 0) & (held < self.sinks) & owner)  # EMPTY (< 0) holds no sink

    def sizes(self) -> list[BucketSize]:
        """Per distinct kv-head window: heads, positions held, slots per head."""
        out = []
        for w in dict.fromkeys(self.kv_windows):
            n = self.kv_windows.count(w)
            span = min(w + self.sinks, self.max_len)  # its sinks and its window
            capacity = 0 if self.layout is None else min(span, self.capacity)
            out.append(BucketSize(w, n, min(self.start, span), capacity))
        return out

    def nbytes(self) -> int:
        """Bytes of the keys and values held (every sequence of the batch)."""
        if self.k is None:
            return 0
        B, _, D = self.k.shape
        return 2 * B * D * self.k.element_size() * sum(s.length * s.n_kv_head for s in self.sizes())


class KVCache:
    """A model's per-head KV cache under a plan: one LayerKVCache per layer."""

    def __init__(
        self, plan: torch.Tensor, n_kv_head: int, max_len: int, backend: str = "auto", sinks: int = 0
    ) -> None:
        self.max_len = max_len
        self.layers = [LayerKVCache(row, n_kv_head, max_len, backend, sinks) for row in plan.tolist()]

    @property
    def start(self) -> int:
        """Positions cached so far."""
        return self.layers[0].start

    def entries(self) -> int:
        """Cached (position, kv head) pairs over all layers, per sequence of the batch."""
        return sum(s.length * s.n_kv_head for layer in self.layers for s in layer.sizes())

    def nbytes(self) -> int:
        """Bytes of the keys and values held (every sequence of the batch)."""
        return sum(layer.nbytes() for layer in self.layers)
