"""Per-head windows inside transformers' own model code: an attention function registered with
transformers' AttentionInterface (and a mask function with AttentionMaskInterface) under the name
ATTN_IMPLEMENTATION. The model code is transformers' own; only the attention call is ours.

The plan reaches the function through a context variable set by the adapter around each layer
call (per thread, so concurrent requests on one model never see each other's plans). Under
grouped-query attention each query head gets its own window; the key/value heads are shared
(repeated to the query heads they serve, as transformers' own eager path does).
"""

from __future__ import annotations

import math
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import torch

from aah_core.attention import windowed_attention
from aah_core.errors import CheckpointError
from aah_core.model_api import LayerCache

ATTN_IMPLEMENTATION = "aah_windowed"


@dataclass
class LayerCall:
    """What the attention function of one layer call needs: its heads' windows, the backend, and
    whether to stop after capturing q and k (attention maps) instead of attending."""

    windows: tuple[int, ...]
    backend: str = "auto"
    capture: bool = False
    cache: LayerCache | None = None  # generation: the layer's KV cache attends instead
    sinks: int = 0  # sink tokens every head sees besides its window


class Captured(Exception):
    """Raised by the attention function in capture mode, carrying the layer's q and k."""

    def __init__(self, q: torch.Tensor, k: torch.Tensor) -> None:
        super().__init__("captured q and k")
        self.q, self.k = q, k


CURRENT: ContextVar[LayerCall | None] = ContextVar("aah_hf_layer_call", default=None)


def repeat_kv_heads(t: torch.Tensor, n_query_heads: int) -> torch.Tensor:
    """[B, KV, T, D] -> [B, H, T, D]: query head h uses key/value head h // (H / KV)."""
    groups = n_query_heads // t.shape[1]
    return t if groups == 1 else t.repeat_interleave(groups, dim=1)


def windowed_attention_forward(
    module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
    attention_mask: torch.Tensor | None, scaling: float | None = None, dropout: float = 0.0,
    softcap: float | None = None, **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature: q [B, H, T, D], k/v [B, KV, T, D] -> ([B, T, H, D], None).

    The causal window mask is ours (the plan's row for this layer); `attention_mask` is ignored
    because the adapter never pads, and the model's own `sliding_window` is already in its plan.
    """
    call = CURRENT.get()
    if call is None:
        raise RuntimeError(f"attn_implementation {ATTN_IMPLEMENTATION!r} runs only inside aah_core.hf.HFWindowedLM")
    if softcap is not None:
        raise CheckpointError("attention logit soft-capping (e.g. Gemma 2) is not supported by windowed_attention")
    H, D = query.shape[1], query.shape[-1]
    scale = D**-0.5 if scaling is None else float(scaling)
    if call.cache is not None:  # the cache keeps the kv heads (not repeated) and applies the windows
        return call.cache.attend(query, key, value, scale).transpose(1, 2).contiguous(), None
    key, value = repeat_kv_heads(key, H), repeat_kv_heads(value, H)
    if call.capture:  # q rescaled so that the default 1/sqrt(D) gives this layer's own scores
        raise Captured(query * (scale * math.sqrt(D)), key)
    out = windowed_attention(query, key, value, call.windows, backend=call.backend, scale=scale,
                             sinks=call.sinks)  # (B, H, T, D)
    return out.transpose(1, 2).contiguous(), None


def _no_mask(*args: Any, **kwargs: Any) -> None:
    """The mask function for ATTN_IMPLEMENTATION: none; windowed_attention applies causality and windows."""
    return None


def register() -> None:
    """Register the attention and mask functions with transformers (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(ATTN_IMPLEMENTATION, windowed_attention_forward)
    AttentionMaskInterface.register(ATTN_IMPLEMENTATION, _no_mask)
