"""The per-layer observer that records head statistics when the controller arms it.

Arming is per step: the controller arms only the step before one that needs features, so
cached steps pay nothing. The first forward after arming (the training forward) is
recorded; evaluation forwards later in the same step are ignored.
"""

from __future__ import annotations

import time

import torch

from aah_core.controller.features import HeadStats, head_stats
from aah_core.model import WindowedGPT


class FeatureObserver:
    def __init__(self, model: WindowedGPT, n_rows: int, n_seqs: int) -> None:
        self.model = model
        self.n_rows, self.n_seqs = n_rows, n_seqs
        n_layer = model.config.n_layer
        self.latest: list[HeadStats | None] = [None] * n_layer
        self.previous: list[HeadStats | None] = [None] * n_layer
        self.fresh: set[int] = set()  # layers recorded since the controller last read them
        self._armed: set[int] = set()
        self.seconds = 0.0  # time spent recording since the last reset

    def attach(self) -> None:
        for layer in range(self.model.n_layer):
            self.model.block(layer).attn.observer = self

    def detach(self) -> None:
        for layer in range(self.model.n_layer):
            attn = self.model.block(layer).attn
            if attn.observer is self:
                attn.observer = None

    def arm(self) -> None:
        self._armed = set(range(len(self.latest)))

    @property
    def ready(self) -> bool:
        return all(s is not None for s in self.latest)

    def recorded(self, layer: int) -> HeadStats:
        """The latest statistics of `layer`, which was recorded (it is fresh, or the observer is ready)."""
        stats = self.latest[layer]
        assert stats is not None, f"layer {layer} has not been recorded yet"
        return stats

    def clear(self) -> None:
        n = len(self.latest)
        self.latest, self.previous, self.fresh = [None] * n, [None] * n, set()

    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, y: torch.Tensor) -> None:
        if layer not in self._armed:
            return
        t0 = time.perf_counter()
        self._armed.discard(layer)
        windows = self.model.plan[layer]
        self.previous[layer] = self.latest[layer]
        self.latest[layer] = head_stats(q, k, v, y, windows, self.n_rows, self.n_seqs)
        self.fresh.add(layer)
        self.seconds += time.perf_counter() - t0

    def to_json(self) -> list[list[dict | None]]:
        return [[s.to_json() if s is not None else None for s in pair] for pair in zip(self.latest, self.previous)]

    def load_json(self, doc: list[list[dict | None]]) -> None:
        self.latest = [HeadStats.from_json(a) if a else None for a, _ in doc]
        self.previous = [HeadStats.from_json(b) if b else None for _, b in doc]
