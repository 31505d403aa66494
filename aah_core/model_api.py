"""The one model interface: what evaluation, diagnostics, allocation and the service need of a
language model with per-head windows.

The demo's `WindowedGPT` (aah_core/model.py) and the Hugging Face adapter (aah_core/hf/) both
satisfy it, so nothing downstream branches on the model's family. A model is run as

    x = model.embed(idx)                                  # [B, T, C], the residual entering layer 0
    x = model.run_layers(x, plan, start=l, residuals=rs)  # layers l.. under plan [n_layer, n_head]
    logits = model.logits(x)                              # [B, T, V]

and the residual entering layer l depends only on plan rows < l (prefix caching, evaluate.py).
Windows follow aah_core/windows.py: head h with window w lets query i see keys i - w < j <= i.
Under grouped-query attention windows are per query head; key/value heads are shared.

Generation (aah_core/generate.py) runs the same three calls with a per-layer KV cache:
`embed(idx, start)` embeds positions start.., and `run_layers(x, plan, cache=layers)` hands
each layer's attention to its LayerCache instead of computing it over x alone.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Protocol, Self, runtime_checkable

import torch

from aah_core.data.tokenizers import Tokenizer


class LayerCache(Protocol):
    """One layer's KV cache (aah_core/kvcache.py). A layer with a cache rotates its q and k at
    positions start.. and gets its attention output from attend(q [B, n_head, T, D],
    k, v [B, n_kv_head, T, D], scale) -> [B, n_head, T, D]; the cache stores k and v itself
    (scale None: 1/sqrt(D))."""

    start: int

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None = None) -> torch.Tensor:
        ...


@runtime_checkable
class WindowedLM(Protocol):
    """A causal LM whose attention takes a per-head window plan [n_layer, n_head]."""

    training: bool

    @property
    def n_layer(self) -> int: ...

    @property
    def n_head(self) -> int:
        """Query heads per layer (the plan's second axis)."""
        ...

    @property
    def n_kv_head(self) -> int:
        """Key/value heads per layer (n_head without grouped-query attention); each is cached."""
        ...

    @property
    def head_dim(self) -> int:
        """Channels per key (and per value) head."""
        ...

    @property
    def seq_len(self) -> int:
        """The context used for evaluation; a window >= seq_len is full attention."""
        ...

    @property
    def vocab_size(self) -> int: ...

    @property
    def sinks(self) -> int:
        """Sink tokens every head sees besides its window (aah_core/windows.py); 0 for none."""
        ...

    @property
    def plan(self) -> torch.Tensor:
        """The model's own plan [n_layer, n_head] (full written as seq_len)."""
        ...

    @property
    def buckets(self) -> list[int]:
        """The window choices offered for this model, ascending, full written as seq_len."""
        ...

    @property
    def tokenizer(self) -> Tokenizer: ...

    def embed(self, idx: torch.Tensor, start: int = 0) -> torch.Tensor:
        """Token ids [B, T] at positions start.. -> the residual stream entering layer 0, [B, T, C]."""
        ...

    def run_layers(
        self, x: torch.Tensor, plan: torch.Tensor, start: int = 0, end: int | None = None, backend: str = "auto",
        residuals: list[torch.Tensor] | None = None, cache: Sequence[LayerCache] | None = None,
        sinks: int | None = None,
    ) -> torch.Tensor:
        """Run layers start..end-1 on the residual x under `plan`; appends each layer's input to `residuals`.
        With `cache` (one LayerCache per layer) attention goes through the caches (generation).
        `sinks`: the sink tokens of this call (None: the model's own, `self.sinks`)."""
        ...

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """The residual after the last layer [B, T, C] -> logits [B, T, V]."""
        ...

    def token_losses(self, x: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The residual after the last layer [B, T, C] and targets [B, T] -> per-token cross-entropy [B, T]
        (0 where the target is -1), float32 (float64 for a float64 model), without holding B x T x V logits."""
        ...

    def queries_keys(self, x: torch.Tensor, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The residual entering `layer` -> its attention's q and k, each [B, n_head, T, D], positions
        applied, key heads repeated to the query heads they serve, q scaled so that
        softmax(q k^T / sqrt(D)) is the layer's attention (for attention maps)."""
        ...

    def parameters(self, recurse: bool = True) -> Iterator[torch.nn.Parameter]:
        """The weights (an nn.Module's): their device is where a batch goes."""
        ...

    def eval(self) -> Self: ...

    def train(self, mode: bool = True) -> Self: ...


def power_of_two_buckets(seq_len: int) -> list[int]:
    """Window choices for a context: the powers of two below seq_len, then seq_len (full)."""
    out, w = [], 1
    while w < seq_len:
        out.append(w)
        w *= 2
    return out + [seq_len]
