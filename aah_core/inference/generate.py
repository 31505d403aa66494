"""Text generation under a window plan, with per-head KV caches (aah_core/kvcache.py).

The prompt is one forward pass through `windowed_attention` that fills the caches; every
new token is one position through the cache, whose buckets hold min(t, w) positions per
head. Sampling is greedy (temperature 0) or temperature / top-k / top-p, seeded.

Generation stops after `max_new_tokens` or when prompt + continuation reach the model's
context (its seq_len: rotary tables and full heads end there), and says which.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch

from aah_core.errors import AAHError
from aah_core.inference.kvcache import KVCache
from aah_core.inference.threads import one_thread
from aah_core.model_api import WindowedLM

StopReason = Literal["max_new_tokens", "context"]
# a decode step whose rows x width^2 (a twelfth of a layer's GEMM products) is at most this runs on one
# intra-op thread (0: never): the demo's width (128) up to 16 sequences; a GPT-2-small width (768), not measured, never
DECODE_ONE_THREAD_WORK = 1 << 18


@dataclass(frozen=True)
class Sampling:
    """temperature 0 is greedy; top_k 0 and top_p 1 switch those filters off."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        if not 0.0 <= self.temperature <= 100.0:
            raise AAHError(f"temperature must be in [0, 100] (0 = greedy); got {self.temperature}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise AAHError(f"top_k must be an integer >= 0 (0 = off); got {self.top_k!r}")
        if not 0.0 < self.top_p <= 1.0:
            raise AAHError(f"top_p must be in (0, 1] (1 = off); got {self.top_p}")


@dataclass
class Generation:
    tokens: torch.Tensor  # [B, n] the continuation
    stop_reason: StopReason
    prompt_len: int
    # bytes the caches held (whole batch) when each new token was predicted: after the prompt, then per step
    cache_bytes: list[int] = field(default_factory=list)


def sample(logits: torch.Tensor, sampling: Sampling, gen: torch.Generator | None = None) -> torch.Tensor:
    """Next tokens [B] from logits [B, V]. Refuses logits that are not finite (a model whose weights hold
    NaN or inf), which no choice of token could honestly come from."""
    if not bool(torch.isfinite(logits).all()):
        raise AAHError("the model's next-token logits are not finite (NaN or inf): its weights are broken, "
                       "so it cannot generate; retrain or re-export it")
    if sampling.temperature == 0.0:
        return logits.argmax(dim=-1)
    # In float64, where a temperature or top_p as small as 1e-300 is not 0 (in float32 it is, and 0 / 0 is
    # NaN), with the largest logit moved to 0 first: a tiny temperature then sends the others to -inf
    # (greedy among ties), never to inf - inf.
    logits = logits.double()
    logits = (logits - logits.amax(dim=-1, keepdim=True)) / sampling.temperature
    if sampling.top_k and sampling.top_k < logits.shape[-1]:
        kth = logits.topk(sampling.top_k, dim=-1).values[:, -1:]  # (B, 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if sampling.top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        probs = sorted_logits.softmax(dim=-1)
        before = probs.cumsum(dim=-1) - probs  # mass of the tokens ranked above each one
        drop = before >= sampling.top_p  # the top token always stays (before = 0)
        logits = logits.scatter(-1, order, sorted_logits.masked_fill(drop, float("-inf")))
    probs = logits.softmax(dim=-1)
    return torch.multinomial(probs, 1, generator=gen).squeeze(-1)


def new_cache(model: WindowedLM, plan: torch.Tensor, backend: str = "auto", decode: str = "auto") -> KVCache:
    """An empty per-head cache for `model` under `plan` ([n_layer, n_head]); decode: see kvcache.choose_decode."""
    return KVCache(plan, model.n_kv_head, model.seq_len, backend, model.sinks, decode)


@torch.inference_mode()
def forward_cached(model: WindowedLM, idx: torch.Tensor, cache: KVCache, plan: torch.Tensor) -> torch.Tensor:
    """Logits [B, V] of the next token after idx [B, T] (positions after the cached ones); the cache
    takes idx in. The LM head runs on the last position only: once per generated token.

    In inference mode (about 13 % less CPU time per decode step than no_grad at the demo's size): the
    cache's tensors are inference tensors, so a cache is used through this function only, and what the
    engine caches across calls (band masks, rotary tables) is made outside inference mode.

    A small decode step (DECODE_ONE_THREAD_WORK) runs on one intra-op thread of the calling thread
    (inference/threads.py), its large attention calls excepted (kvcache.PARALLEL_CALL_WORK)."""
    width = model.n_head * model.head_dim
    if idx.shape[1] == 1 and idx.shape[0] * width * width <= DECODE_ONE_THREAD_WORK and idx.device.type == "cpu":
        with one_thread():
            return _forward_cached(model, idx, cache, plan)
    return _forward_cached(model, idx, cache, plan)


def _forward_cached(model: WindowedLM, idx: torch.Tensor, cache: KVCache, plan: torch.Tensor) -> torch.Tensor:
    x = model.embed(idx, cache.start)
    return model.logits(model.run_layers(x, plan, cache=cache.layers)[:, -1:])[:, 0]


@torch.no_grad()
def generate(
    model: WindowedLM,
    prompt: torch.Tensor,
    plan: torch.Tensor | None = None,
    max_new_tokens: int = 64,
    sampling: Sampling = Sampling(),
    backend: str = "auto",
) -> Generation:
    """Continue prompt [B, T0] token ids under `plan` (default: the model's own).

    Stops after max_new_tokens or when T0 + n reaches the model's seq_len ("context").
    """
    seq_len = model.seq_len
    plan = model.plan if plan is None else plan
    if prompt.dim() != 2 or prompt.shape[1] < 1:
        raise AAHError(f"prompt must be token ids [B, T] with T >= 1; got shape {tuple(prompt.shape)}")
    T0 = prompt.shape[1]
    if T0 > seq_len:
        raise AAHError(f"the prompt has {T0} tokens; the model's context is {seq_len}: shorten it")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise AAHError(f"max_new_tokens must be an integer >= 0; got {max_new_tokens!r}")
    model.eval()
    gen = torch.Generator(device=prompt.device).manual_seed(sampling.seed)
    cache = new_cache(model, plan, backend)
    new: list[torch.Tensor] = []
    sizes: list[int] = []
    reason: StopReason = "context" if T0 >= seq_len else "max_new_tokens"
    if T0 < seq_len and max_new_tokens > 0:
        logits = forward_cached(model, prompt, cache, plan)  # (B, V)
        while True:
            sizes.append(cache.nbytes())
            new.append(sample(logits, sampling, gen))
            if len(new) == max_new_tokens:
                reason = "max_new_tokens"
                break
            if T0 + len(new) == seq_len:
                reason = "context"
                break
            logits = forward_cached(model, new[-1].view(-1, 1), cache, plan)
    tokens = torch.stack(new, dim=1) if new else prompt.new_zeros((prompt.shape[0], 0))
    return Generation(tokens, reason, T0, sizes)
