"""A decoder-only pre-LN Transformer whose attention takes a per-head window plan.

Reading order follows nanoGPT: rotary helper -> attention -> MLP -> Block -> WindowedGPT.
The plan is an integer tensor [n_layer, n_head]; layer l's attention gets row l.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable, Sequence
from typing import cast

import torch
import torch.nn as nn
import torch.nn.functional as F

from aah_core.attention import windowed_attention
from aah_core.attention.reference import attention_probs as reference_probs
from aah_core.data.tokenizers import Tokenizer
from aah_core.errors import AAHError
from aah_core.head_loss import head_token_losses
from aah_core.inference.block_step import BlockStep
from aah_core.inference.kvcache import LayerKVCache
from aah_core.model_api import LayerCache
from aah_core.model_config import ModelConfig
from aah_core.windows import full_plan

# observer(layer, q, k, v, y): sees each layer's per-head tensors [B, H, T, D] (controller features)
Observer = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], None]


class Rotary(nn.Module):
    """Rotary position embedding (RoFormer): rotate channel pairs by position-dependent angles.

    A pair (x1, x2) at position p is the complex number x1 + i x2 times e^{i p f}: one complex multiply per
    call (the tables' complex form is built once per device and dtype), whatever the layout of x."""

    cos: torch.Tensor
    sin: torch.Tensor

    def __init__(self, head_dim: int, seq_len: int, base: float) -> None:
        super().__init__()
        # computed on the CPU whatever the default device, then moved to it: the same values everywhere (and
        # on meta, where the model is built for its shapes, no Python meta kernels: aah_core/meta.py)
        cpu = torch.device("cpu")
        inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float64, device=cpu) / head_dim))
        angles = torch.outer(torch.arange(seq_len, dtype=torch.float64, device=cpu), inv_freq)  # (T, D/2)
        device = torch.get_default_device()
        self.register_buffer("cos", angles.cos().float().to(device), persistent=False)
        self.register_buffer("sin", angles.sin().float().to(device), persistent=False)
        self._tables: dict[tuple[torch.device, torch.dtype, torch.dtype], torch.Tensor] = {}

    def table(self, dtype: torch.dtype) -> torch.Tensor:
        """cos + i sin [seq_len, D/2] as a complex tensor of real dtype `dtype` (float32 or float64)."""
        key = (self.cos.device, self.cos.dtype, dtype)
        if key not in self._tables:
            with torch.inference_mode(False):  # kept across calls: never an inference tensor (decoding runs in one)
                self._tables[key] = torch.complex(self.cos.to(dtype), self.sin.to(dtype))
        return self._tables[key]

    def forward(self, x: torch.Tensor, start: int = 0) -> torch.Tensor:
        """x: [..., T, D] at positions start .. start+T-1 -> same shape, rotated (in float32 at least, cast
        back to x's dtype: bf16 angles would be off by ~1e-2). A strided x (a view of the fused qkv
        projection) is read in place; the result has x's layout."""
        T = x.shape[-2]
        xf = x.to(torch.promote_types(x.dtype, torch.float32)).unflatten(-1, (-1, 2))  # (..., T, D/2, 2)
        if xf.storage_offset() % 2 or any(s % 2 for s in xf.stride()[:-1]):
            xf = xf.contiguous()  # view_as_complex needs every stride but the last even
        rotated = torch.view_as_complex(xf) * self.table(xf.dtype)[start : start + T]  # (..., T, D/2)
        return torch.view_as_real(rotated).flatten(-2).to(x.dtype)

    def at(self, x: torch.Tensor, pos: int) -> torch.Tensor:
        """forward() of one position pos for x [B, n, D] float32 or float64 with even row strides (a decode
        step's q and k rows of the fused projection) -> [B, n, D] contiguous: the same complex multiply with
        none of forward's general-layout steps."""
        B, n, D = x.shape
        pairs = torch.view_as_complex(x.view(B, n, D // 2, 2))  # (B, n, D/2)
        return torch.view_as_real(pairs * self.table(x.dtype)[pos]).view(B, n, D)


class WindowedSelfAttention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int) -> None:
        super().__init__()
        self.layer = layer
        self.n_head = cfg.n_head
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=False)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.dropout = cfg.dropout
        self.sinks = cfg.sinks
        self.resid_drop = nn.Dropout(cfg.dropout)
        self.rotary = Rotary(cfg.d_model // cfg.n_head, cfg.seq_len, cfg.rope_base) if cfg.positions == "rope" else None
        self.observer: Observer | None = None
        # a learned controller trains through a soft window: an additive score bias [H, T, T] (controller/learned.py)
        self.window_bias: Callable[[int], torch.Tensor] | None = None

    def heads(self, x: torch.Tensor, start: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x: [B, T, C] at positions start.. -> q, k, v each [B, H, T, D] (rotary applied to q and k).

        Views of the one fused projection (no copy); q and k are rotated together, in one call."""
        B, T, C = x.shape
        H = self.n_head
        qkv = F.linear(x.reshape(B * T, C), self.qkv.weight).view(B, T, 3 * H, C // H).transpose(1, 2)  # (B, 3H, T, D)
        if self.rotary is None:
            return qkv[:, :H], qkv[:, H : 2 * H], qkv[:, 2 * H :]
        q, k = self.rotary(qkv[:, : 2 * H], start).split(H, dim=1)
        return q, k, qkv[:, 2 * H :]

    def forward(
        self, x: torch.Tensor, windows: tuple[int, ...], backend: str, cache: LayerCache | None = None,
        sinks: int | None = None,
    ) -> torch.Tensor:
        """sinks: the sink tokens of this call (None: the model's own)."""
        B, T, C = x.shape
        q, k, v = self.heads(x, 0 if cache is None else cache.start)
        p = self.dropout if self.training else 0.0
        if cache is not None:  # incremental decoding: the cache holds the plan's windows
            y = cache.attend(q, k, v)  # (B, H, T, D)
        elif self.window_bias is not None and self.training:
            bias = self.window_bias(T).to(q.dtype)  # (H, T, T), -inf above the diagonal
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=p)  # (B, H, T, D)
        else:
            sinks = self.sinks if sinks is None else sinks
            y = windowed_attention(q, k, v, windows, backend=backend, dropout_p=p, sinks=sinks)  # (B, H, T, D)
        if self.observer is not None:
            self.observer(self.layer, q, k, v, y)
        y = y.transpose(1, 2).reshape(B, T, C)  # (B, T, C)
        return self.resid_drop(self.proj(y))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.fc = nn.Linear(cfg.d_model, cfg.mlp_ratio * cfg.d_model)
        self.proj = nn.Linear(cfg.mlp_ratio * cfg.d_model, cfg.d_model)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.proj(F.gelu(self.fc(x))))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.attn = WindowedSelfAttention(cfg, layer)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.mlp = MLP(cfg)
        self._c_step: tuple[weakref.ref, BlockStep | None] | None = None  # (the cache it was prepared for, the step)

    def forward(
        self, x: torch.Tensor, windows: tuple[int, ...], backend: str, cache: LayerCache | None = None,
        sinks: int | None = None,
    ) -> torch.Tensor:
        x = x + self.attn(self.ln1(x), windows, backend, cache, sinks)
        return x + self.mlp(self.ln2(x))

    def cached(self, x: torch.Tensor, cache: LayerCache) -> torch.Tensor:
        """forward() through a KV cache, in eval mode (no dropout), with functional calls on 2-D rows: a decode
        step is a few dozen small operations per layer whose fixed cost (Python, dispatch, allocation) is most
        of their time, so each step here is one operation where the math allows (the residual adds ride in
        addmm; on CPU the GELU in the MLP's first addmm). A float32 step on CPU whose cache reads its rings
        without masks is one C call (inference/block_step.py)."""
        B, T, C = x.shape
        rows = x.reshape(B * T, C)
        if T == 1 and not torch.is_grad_enabled() and isinstance(cache, LayerKVCache):
            step = self._step_in_c(cache)
            if step is not None and rows.dtype == torch.float32:
                out = cache.step_block(step, rows.contiguous())
                if out is not None:
                    return out.view(B, T, C)
        attn, mlp = self.attn, self.mlp
        if T == 1 and attn.rotary is not None and attn.observer is None and x.dtype in _STEP_DTYPES:
            H, D = attn.n_head, C // attn.n_head
            qkv = F.linear(_norm(self.ln1, rows), attn.qkv.weight)  # (B, 3C): rows of q | k | v heads
            qk = attn.rotary.at(qkv[:, : 2 * C].view(B, 2 * H, D), cache.start).view(B, 2 * H, 1, D)
            y = cache.attend(qk[:, :H], qk[:, H:], qkv[:, 2 * C :].view(B, H, 1, D))  # (B, H, 1, D)
        else:
            q, k, v = attn.heads(_norm(self.ln1, x), cache.start)
            y = cache.attend(q, k, v)  # (B, H, T, D)
            if attn.observer is not None:
                attn.observer(attn.layer, q, k, v, y)
            y = y.transpose(1, 2)  # (B, T, H, D)
        rows = torch.addmm(rows, y.reshape(B * T, C), attn.proj.weight.t())  # x + proj(y)
        h = _norm(self.ln2, rows)
        if h.device.type == "cpu" and not torch.is_grad_enabled():
            # exact GELU in place after the addmm (no autograd formula; CUDA's fused epilogue is tanh-GELU)
            h = torch._addmm_activation(mlp.fc.bias, h, mlp.fc.weight.t(), use_gelu=True)
        else:
            h = F.gelu(F.linear(h, mlp.fc.weight, mlp.fc.bias))
        return torch.addmm(rows, h, mlp.proj.weight.t()).add_(mlp.proj.bias).view(B, T, C)

    def _step_in_c(self, cache: LayerCache) -> BlockStep | None:
        """This block's steps in C (inference/block_step.py) for `cache`, or None: decided and prepared at a
        cache's first step, so a model moved, cast or given an observer between generations is read again."""
        if self._c_step is None or self._c_step[0]() is not cache:
            self._c_step = weakref.ref(cache), BlockStep(self) if BlockStep.takes(self) else None
        return self._c_step[1]


_STEP_DTYPES = (torch.float32, torch.float64)  # Rotary.at rotates in the input's dtype: no bf16 / fp16 rounding


def _norm(ln: nn.LayerNorm, x: torch.Tensor) -> torch.Tensor:
    return F.layer_norm(x, ln.normalized_shape, ln.weight, ln.bias, ln.eps)


class WindowedGPT(nn.Module):
    """GPT with a per-head window plan. `self.plan` [n_layer, n_head] is the model's own plan.

    Satisfies aah_core.model_api.WindowedLM; `tokenizer` is the one its data config names
    (given by load_checkpoint; a model built without one has none to give).
    """

    plan: torch.Tensor  # a buffer: moves with the model, not saved with its weights

    def __init__(self, cfg: ModelConfig, tokenizer: Tokenizer | None = None) -> None:
        super().__init__()
        self.config = cfg
        self._tokenizer = tokenizer
        self.wte = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.wpe = nn.Embedding(cfg.seq_len, cfg.d_model) if cfg.positions == "learned" else None
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg, layer) for layer in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # tied
        self.register_buffer("plan", full_plan(cfg.n_layer, cfg.n_head, cfg.seq_len), persistent=False)
        self.apply(self._init_weights)
        # residual projections scaled by 1/sqrt(2 n_layer) (GPT-2); the paper's default init started at loss ~62
        for name, p in self.named_parameters():
            if name.endswith("attn.proj.weight") or name.endswith("mlp.proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layer))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    @property
    def n_layer(self) -> int:
        return self.config.n_layer

    @property
    def n_head(self) -> int:
        return self.config.n_head

    @property
    def n_kv_head(self) -> int:
        return self.config.n_head

    @property
    def head_dim(self) -> int:
        return self.config.d_model // self.config.n_head

    @property
    def seq_len(self) -> int:
        return self.config.seq_len

    @property
    def vocab_size(self) -> int:
        return self.config.vocab_size

    @property
    def sinks(self) -> int:
        return self.config.sinks

    @property
    def tokenizer(self) -> Tokenizer:
        if self._tokenizer is None:  # not an AttributeError: nn.Module.__getattr__ would hide its message
            raise AAHError("this model was built without a tokenizer; load it with aah_core.checkpoint.load_checkpoint")
        return self._tokenizer

    @property
    def buckets(self) -> list[int]:
        """The window choices of this model, full written as seq_len."""
        return self.config.bucket_windows

    def block(self, layer: int) -> Block:
        """Block `layer` (to a type checker an nn.ModuleList holds plain Modules)."""
        return cast(Block, self.blocks[layer])

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def set_plan(self, plan: torch.Tensor) -> None:
        """Replace the model's own plan ([n_layer, n_head] integers, already validated)."""
        if tuple(plan.shape) != tuple(self.plan.shape):
            raise ValueError(f"plan shape {tuple(plan.shape)} != {tuple(self.plan.shape)}")
        self.plan.copy_(plan.clamp(max=self.config.seq_len))

    def embed(self, idx: torch.Tensor, start: int = 0) -> torch.Tensor:
        """idx: [B, T] token ids at positions start.. -> the residual stream entering layer 0, [B, T, C]."""
        T = idx.shape[1]
        if start + T > self.config.seq_len:
            raise ValueError(f"sequence length {start + T} exceeds model.seq_len={self.config.seq_len}")
        x = F.embedding(idx, self.wte.weight)
        if self.wpe is not None:
            x = x + self.wpe(torch.arange(start, start + T, device=idx.device))
        return self.drop(x) if self.training else x  # (no dropout call at all in eval: decode steps are short)

    def run_layers(
        self, x: torch.Tensor, plan: torch.Tensor, start: int = 0, end: int | None = None, backend: str = "auto",
        residuals: list[torch.Tensor] | None = None, cache: Sequence[LayerCache] | None = None,
        sinks: int | None = None,
    ) -> torch.Tensor:
        """Run blocks start..end-1 on residual x [B, T, C]; appends each block's input to `residuals`.

        With `cache` (one LayerCache per layer, aah_core/kvcache.py) x holds the positions after the
        cached ones and attention goes through the cache, which was built for `plan` (and its sinks).
        `sinks`: sink tokens for this call instead of the model's own (None).
        """
        layers = range(start, self.config.n_layer if end is None else end)
        if cache is not None and not self.training:  # decoding (the cache knows its sinks): the lean path
            blocks = cast(list[Block], list(self.blocks))  # (indexing an nn.ModuleList costs 10-20 us a block)
            for layer in layers:
                if residuals is not None:
                    residuals.append(x)
                x = blocks[layer].cached(x, cache[layer])
            return x
        windows = plan.tolist()
        for layer in layers:
            if residuals is not None:
                residuals.append(x)
            x = self.blocks[layer](x, tuple(windows[layer]), backend, None if cache is None else cache[layer], sinks)
        return x

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """Final residual [B, T, C] -> logits [B, T, V]."""
        return F.linear(_norm(self.ln_f, x), self.lm_head.weight)

    def token_losses(self, x: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Final residual [B, T, C] and targets [B, T] -> per-token cross-entropy [B, T] (0 where the
        target is -1), the vocabulary taken in chunks."""
        return head_token_losses(self.ln_f(x), self.lm_head.weight, None, targets)

    def queries_keys(self, x: torch.Tensor, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The residual entering `layer` [B, T, C] -> its q, k [B, H, T, D] (rotary applied)."""
        block = self.block(layer)
        q, k, _ = block.attn.heads(block.ln1(x))
        return q, k

    def forward(
        self, idx: torch.Tensor, targets: torch.Tensor | None = None, plan: torch.Tensor | None = None,
        backend: str = "auto",
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """idx, targets: [B, T] (targets -1 are ignored). Returns (logits [B, T, V], mean loss or None)."""
        plan = self.plan if plan is None else plan
        logits = self.logits(self.run_layers(self.embed(idx), plan, backend=backend))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-1)
        return logits, loss

    @torch.no_grad()
    def attention_probs(self, idx: torch.Tensor, plan: torch.Tensor, layer: int) -> torch.Tensor:
        """Per-head attention probabilities of `layer` under `plan`, via the reference path: [B, H, T, T]."""
        q, k = self.queries_keys(self.run_layers(self.embed(idx), plan, end=layer), layer)
        return reference_probs(q, k, tuple(plan[layer].tolist()))


def token_losses(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Per-token cross-entropy [B, T]; positions with target -1 are 0."""
    losses = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-1, reduction="none")
    return losses.view_as(targets)
