"""Per-head KV caches sized by each head's window, for incremental decoding.

Each key/value head keeps a ring buffer of at most W keys and values, W its window: position p
lives in slot p mod W (Mistral's rolling buffer, here per head), so after t positions the head
holds min(t, W) of them. A head whose window covers the whole context grows up to it. Buffers
grow by doubling up to their window, so a buffer never has more than W slots.

A layer keeps all its heads' buffers in one flat tensor [B, slots, D] (kv head j's ring is the
segment offsets[j] .. offsets[j] + capacity[j], laid out window by window) and the position each
slot holds. A decode step writes the new key (and value) of every head with one index_copy_, then
attends in one of two ways, chosen per layer shape when the prompt arrives (choose_decode):

- 'flat': ONE attention call: the H query heads against the whole flat buffer in two batched
  products (baddbmm, softmax, bmm), with an additive bias that keeps each query head to its own kv
  head's slots inside its window. The bias is kept from step to step where it can be (no sinks, no
  query head seeing less than its kv head): a step then only opens its new slots. The same few
  operations whatever the windows, but the scores are H x slots, n_kv_head times the products
  needed: it wins only when the buffer is small.
- 'buckets': one call per distinct kv window over that window's [B, n_b, capacity, D] view of the
  buffer (no copy); the per-step Python loop runs over windows, never over heads.

On CPU in float32 (head sizes that are multiples of 16, up to 128), when no query head needs a mask (no sinks,
none seeing less than its kv head), a step is neither: ONE call of native.decode_step (decode_kernel.c) writes
the step's keys and values and reads each kv head's ring where it lies, its (sequence, kv head) items dealt to
the threads by their slots. model.py's blocks hand such a cache their whole step (step_block: one C call for the
block, inference/block_step.py).

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

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

import aah_core.attention.native as native
from aah_core.attention import windowed_attention
from aah_core.errors import InvalidWindowPlan
from aah_core.inference.block_step import BlockStep
from aah_core.inference.threads import all_threads
from aah_core.windows import check_sinks

MIN_CAPACITY = 16  # a growing buffer starts with at least this many slots
FLAT_WASTE_PER_CALL = 150_000  # choose_decode: wasted score products that cost about one attention call
# A decode step runs on one intra-op thread (generate.forward_cached); a bucket's attention call over more than
# one (sequence, kv head) with at least this many products (queries x keys x dim) gets the threads back: about
# 60 us of work at one thread, which a split saves more of than a thread wake costs (inference/threads.py)
PARALLEL_CALL_WORK = 1 << 18


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
    ring; per (query head, slot) the query head's window, or 0 for another kv head's slot. Rings are
    laid out bucket by bucket (`order`), so the kv heads of one window are one [B, n_b, capacity, D] view."""

    def __init__(
        self, kv_windows: torch.Tensor, q_windows: torch.Tensor, capacity: int, spans: torch.Tensor, order: torch.Tensor
    ) -> None:
        self.kv_windows = kv_windows  # (n,)
        self.q_windows = q_windows  # (n, g)
        self.capacities = spans.clamp(max=capacity)  # (n,) spans: the most positions each head keeps
        ordered = self.capacities[order]
        self.offsets = torch.empty_like(ordered)
        self.offsets[order] = torch.cumsum(ordered, 0) - ordered  # (n,) first slot of each kv head's ring
        self.slots = int(self.capacities.sum())
        self.head = torch.repeat_interleave(order, ordered)  # (S,)
        self.ring = torch.arange(self.slots) - self.offsets[self.head]  # (S,) index inside the head's ring
        self._held: dict[tuple[int, int], torch.Tensor] = {}  # held_after's answers
        n, g = q_windows.shape
        # query head h (kv head h // g) sees slot s holding position p at step pos iff pos - p < reach[h, s]
        owner = (torch.arange(n * g) // g).unsqueeze(1) == self.head.unsqueeze(0)  # (H, S)
        self.reach = torch.where(owner, q_windows.reshape(-1, 1), 0)  # (H, S)
        self.owner = owner  # (H, S) for the sink slots, which every query head of the kv head sees

    def to(self, device: torch.device) -> _Layout:
        for name in ("kv_windows", "q_windows", "capacities", "offsets", "head", "ring", "reach", "owner"):
            setattr(self, name, getattr(self, name).to(device))
        return self

    def held_after(self, T: int, sinks: int) -> torch.Tensor:
        """(S,) the position each slot holds after a prompt of T positions (capacity T: exactly those kept):
        slot r < s of a ring holds sink r; slot r >= s position T-1 - ((T-1 - r) mod W), the last positions."""
        held = self._held.get((T, sinks))
        if held is None:
            with torch.inference_mode(False):  # kept with the layout: never an inference tensor
                held = (T - 1) - ((T - 1) - self.ring) % self.kv_windows[self.head]
                held = self._held[(T, sinks)] = torch.where(self.ring < sinks, self.ring, held)
        return held


@functools.lru_cache(maxsize=256)
def _layout(kv_windows: tuple[int, ...], q_windows: tuple[tuple[int, ...], ...], capacity: int, spans: tuple[int, ...],
            order: tuple[int, ...], device: torch.device) -> _Layout:
    """The layout of rings of these windows at this capacity, made once per process (a prefill's layout is the
    same every time: making it was 0.7-1.2 ms of small operations a layer, on one thread, issue 26). Its
    tensors are only ever read."""
    with torch.inference_mode(False):  # shared across calls: never an inference tensor
        return _Layout(torch.tensor(kv_windows), torch.tensor(q_windows), capacity, torch.tensor(spans),
                       torch.tensor(order)).to(device)


@dataclass
class _Bucket:
    """The kv heads of one window: slots first .. first + n * capacity of the flat buffer (after relayout)."""

    window: int
    n: int
    q_windows: torch.Tensor  # (n, g)
    masked: bool  # a query head sees less than its kv head
    first: int = 0
    capacity: int = 0
    keys: torch.Tensor | None = None  # (B, n, capacity, D) views of the flat buffers (set with them)
    values: torch.Tensor | None = None


def choose_decode(kv_windows: Sequence[int], group: int, batch: int, head_dim: int) -> str:
    """'flat' (one attention call over the whole buffer) or 'buckets' (one call per kv window), per layer shape.

    The flat call scores every query head against every kv head's slots: (n_kv_head - 1) * group * slots
    products per sequence and dim more than the buckets need; the buckets make one more call per window.
    Measured per layer step (issue 26; 1 thread, CPU time; bench/decode_step.py): one call costs
    about as much as FLAT_WASTE_PER_CALL of those wasted products. With the flat call as baddbmm + softmax
    + bmm (AMD EPYC, modes interleaved): flat won for 4 small windows (16-128, D=64: 39 vs 60 us at batch 1,
    98 vs 122 at batch 8); the buckets won at the demo's 4 heads with windows up to 4096 (113 vs 117 us at
    batch 1, 1171 vs 1817 at batch 8) and at 12 heads of 8 windows (1178 vs 2446 us at batch 1).
    """
    windows = len(set(kv_windows))
    wasted = (len(kv_windows) - 1) * group * sum(kv_windows) * head_dim * batch
    return "flat" if windows > 1 and wasted < (windows - 1) * FLAT_WASTE_PER_CALL else "buckets"


class LayerKVCache:
    """One layer's cache under one row of a plan (query-head windows), for a model with n_kv_head kv heads."""

    def __init__(
        self, windows: Sequence[int], n_kv_head: int, max_len: int, backend: str = "auto", sinks: int = 0,
        decode: str = "auto",
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
        self._spans = (self._kv_windows + self.sinks).clamp(max=max_len)  # (n,) positions a head keeps at most
        if decode not in ("auto", "flat", "buckets"):
            raise ValueError(f"decode must be 'auto', 'flat' or 'buckets'; got {decode!r}")
        self.decode = decode  # 'auto' is settled by the prompt's batch and head size (choose_decode)
        by_window: dict[int, list[int]] = {}
        for j, w in enumerate(self.kv_windows):
            by_window.setdefault(w, []).append(j)
        order = [j for heads in by_window.values() for j in heads]  # kv heads bucket by bucket
        self._order = torch.tensor(order)
        self._perm = None if order == sorted(order) else self._order  # query heads to bucket order, if needed
        self._inverse = None if self._perm is None else torch.argsort(self._order)
        self.buckets = [
            _Bucket(w, len(heads), self._q_windows[heads], bool((self._q_windows[heads] < w).any()))
            for w, heads in by_window.items()
        ]
        self.max_window = int(self._spans.max())
        self.capacity = 0  # slots of a head whose window is larger (the others have their window's)
        self.layout: _Layout | None = None
        self._bias: torch.Tensor | None = None  # flat, no sinks or masked query heads: the (H, slots) bias kept
        self._opened = torch.empty(0)  # (H, n): the bias column a new slot of kv head j gets (made per layout)
        self._settled = False  # every ring full at its final size: the kept bias changes no more
        self._always_masked = bool(self.sinks) or any(b.masked for b in self.buckets)
        self.k: torch.Tensor | None = None  # (B, slots, D)
        self.v: torch.Tensor | None = None
        self.held: torch.Tensor | None = None  # (slots,) the position each slot holds (EMPTY: none)
        self._tracks_held = True  # settled with `decode`: only masks read `held` (flat, masked buckets, sinks)
        self._bucket_heads = [b.n for b in self.buckets]
        self._native: bool | None = None  # steps through native.decode_step (settled by the first step)
        self._rings: native.Rings | None = None  # its kv heads' rings, per layout
        self._threads = 1  # and the threads it may use
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
        self._bias, self._settled, self._rings = None, False, None
        self.layout = _layout(tuple(self.kv_windows), tuple(map(tuple, self._q_windows.tolist())), capacity,
                              tuple(self._spans.tolist()), tuple(self._order.tolist()), device)
        first = 0
        for b in self.buckets:
            b.first, b.capacity = first, min(b.window + self.sinks, self.max_len, capacity)
            first += b.n * b.capacity
        return self.layout

    def _prefill(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None) -> torch.Tensor:
        B, _, T, D = k.shape
        if self.decode == "auto":
            self.decode = choose_decode(self._spans.tolist(), self.group, B, D)
        lay = self._relayout(T, k.device)  # capacity min(W, T): exactly the positions kept
        held = lay.held_after(T, self.sinks)  # (S,)
        self.k = k[:, lay.head, held]  # (B, S, D)
        self.v = v[:, lay.head, held]
        self._tracks_held = self.decode == "flat" or bool(self.sinks) or any(b.masked for b in self.buckets)
        self.held = held.clone() if self._tracks_held else None  # (steps write into it)
        self._views(k.device)
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
        if self.held is not None:
            self.held = torch.where(keep, self.held[source.clamp(max=len(self.held) - 1)], EMPTY)
        self._views(self.k.device)

    def _views(self, device: torch.device) -> None:
        """Each bucket's [B, n_b, capacity, D] views of the flat buffers, and the step's index tensors on
        `device`, made once per layout (a step then slices nothing while its rings are full)."""
        assert self.k is not None and self.v is not None
        B, _, D = self.k.shape
        for b in self.buckets:
            region = slice(b.first, b.first + b.n * b.capacity)
            b.keys = self.k[:, region].view(B, b.n, b.capacity, D)
            b.values = self.v[:, region].view(B, b.n, b.capacity, D)
            b.q_windows = b.q_windows.to(device)
        for name in ("_perm", "_inverse"):
            if getattr(self, name) is not None:
                setattr(self, name, getattr(self, name).to(device))
        heads = torch.arange(len(self.windows), device=device) // self.group  # (H,) each query head's kv head
        own = heads.unsqueeze(1) == torch.arange(self.n_kv_head, device=device)  # (H, n)
        self._opened = torch.where(own, 0.0, -math.inf).to(self.k.dtype)

    def _step(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None) -> torch.Tensor:
        assert self.k is not None and self.v is not None
        B, H, _, D = q.shape
        pos = self.start
        if pos == self.capacity and pos < self.max_window:
            self._grow()
        lay = self.layout
        assert lay is not None
        if self._steps_in_c():
            return self._native_step(q, k, v, scale)
        slots = lay.offsets + self._slot(pos, lay.kv_windows)  # (n,): this position's slot in each head's ring
        self.k.index_copy_(1, slots, k[:, :, 0])
        self.v.index_copy_(1, slots, v[:, :, 0])
        final = self._settled and self.capacity >= self.max_window and not self._always_masked
        if self.held is not None and not final:  # once final, no mask reads `held` again
            self.held.index_fill_(0, slots, pos)
        if self.decode == "buckets":
            return self._bucket_step(q, scale)
        scores = torch.baddbmm(self._flat_bias(pos, slots), q.reshape(B, H, D), self.k.transpose(1, 2),
                               alpha=D**-0.5 if scale is None else scale)  # (B, H, S)
        return torch.bmm(scores.softmax(dim=-1), self.v).view(B, H, 1, D)

    def _flat_bias(self, pos: int, slots: torch.Tensor) -> torch.Tensor:
        """(H, S): 0 where query head h sees slot s at step pos, -inf elsewhere. Without sinks or query heads
        that see less than their kv head, a written slot stays visible to its kv head's query heads until it
        is overwritten (a ring holds the last positions of its window): the bias is then kept, a step opens
        its new slots (one index_copy_), and once every ring is full at its final size it changes no more."""
        lay = self.layout
        assert lay is not None and self.held is not None
        self._settled = self.capacity >= self.max_window and pos + 1 >= self.max_window
        if self._always_masked:
            visible = self._visible(pos, self.held, lay.reach, lay.owner)  # (H, S)
            return torch.zeros_like(visible, dtype=self._opened.dtype).masked_fill_(~visible, -math.inf)
        if self._bias is None:  # after the prompt or a growth: from the positions held
            self._bias = torch.where(lay.owner & (self.held > EMPTY), 0.0, -math.inf).to(self._opened.dtype)
        elif pos < self.max_window:  # a ring still fills (after that a write replaces a visible slot)
            self._bias.index_copy_(1, slots, self._opened)
        return self._bias

    def _steps_in_c(self) -> bool:
        """Whether steps go through native.decode_step: settled at the first step (float32 on CPU, every query head
        seeing its kv head's whole ring, no mask to apply)."""
        if self._native is None:
            assert self.k is not None
            self._native = not self._always_masked and native.decodes(self.k)
            if self._native:
                self.held = None  # (no mask reads it)
        return self._native

    def _c_rings(self) -> native.Rings:
        """The rings as native.decode_step takes them, and the threads it may use, made once per layout."""
        if self._rings is None:
            lay = self.layout
            assert lay is not None
            self._rings = native.Rings(lay.offsets.tolist(), lay.capacities.tolist(), lay.kv_windows.tolist())
            with all_threads():
                self._threads = torch.get_num_threads()
        return self._rings

    def _native_step(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None) -> torch.Tensor:
        """One call of native.decode_step writes the step's keys and values and attends for every kv head (the
        buckets' SDPA calls, one per window, cost 15-30 us each beyond their work at batch 1)."""
        assert self.k is not None and self.v is not None
        return native.decode_step(q, k, v, self.k, self.v, self._c_rings(), self.start, scale, self._threads,
                                  PARALLEL_CALL_WORK)

    def step_block(self, step: BlockStep, rows: torch.Tensor) -> torch.Tensor | None:
        """A decoding step of a whole block in one C call (inference/block_step.py) for rows [B, C] at position
        start, the cache taking the step's keys and values; None, and nothing done, where this cache's steps do not
        run in C (the prompt, a mask to apply, a cache native.decodes refuses)."""
        if self.start == 0 or self.k is None or self.v is None or self.n_kv_head != step.n_head:
            return None
        if self.start == self.capacity and self.start < self.max_window:
            self._grow()
        if not self._steps_in_c():
            return None
        out = step(rows, self.k, self.v, self._c_rings(), self.start, self._threads, PARALLEL_CALL_WORK)
        self.start += 1
        return out

    def _bucket_step(self, q: torch.Tensor, scale: float | None) -> torch.Tensor:
        """One SDPA call per kv window over that bucket's [B, n_b, capacity, D] view of the buffer."""
        B, H, _, D = q.shape
        pos = self.start
        qg = q.view(B, self.n_kv_head, self.group, D)  # (B, n, g, D): query heads by kv head
        if self._perm is not None:
            qg = qg.index_select(1, self._perm)  # kv heads in bucket order
        outs = []
        for b, qb in zip(self.buckets, qg.split(self._bucket_heads, dim=1) if len(self.buckets) > 1 else (qg,)):
            keys, values = b.keys, b.values
            assert keys is not None and values is not None
            length = min(pos + 1, b.capacity)  # slots held: the ring's first `length`
            if length < b.capacity:
                keys, values = keys[:, :, :length], values[:, :, :length]
            mask = None
            if b.masked or self.sinks:  # (n_b, g, length): inside each query head's own window, or a sink
                assert self.held is not None
                held = self.held[b.first : b.first + b.n * b.capacity].view(b.n, b.capacity)[:, :length].unsqueeze(1)
                mask = self._visible(pos, held, b.q_windows.unsqueeze(-1), True)
            if B * b.n > 1 and B * b.n * self.group * length * D >= PARALLEL_CALL_WORK:  # worth a thread wake
                with all_threads():
                    outs.append(F.scaled_dot_product_attention(qb, keys, values, attn_mask=mask, scale=scale))
            else:
                outs.append(F.scaled_dot_product_attention(qb, keys, values, attn_mask=mask, scale=scale))  # (B, n_b, g, D)
        out = torch.cat(outs, dim=1) if len(outs) > 1 else outs[0]  # (B, n, g, D) in bucket order
        if self._inverse is not None:
            out = out.index_select(1, self._inverse)
        return out.reshape(B, H, 1, D)

    def _slot(self, pos: int, windows: torch.Tensor | int) -> torch.Tensor | int:
        """Position pos's slot in rings of these windows: itself while a sink, else s + (pos - s) mod W."""
        if not self.sinks:
            return pos % windows
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
        self, plan: torch.Tensor, n_kv_head: int, max_len: int, backend: str = "auto", sinks: int = 0,
        decode: str = "auto",
    ) -> None:
        self.max_len = max_len
        self.layers = [LayerKVCache(row, n_kv_head, max_len, backend, sinks, decode) for row in plan.tolist()]

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
