"""HFWindowedLM: a Hugging Face causal LM behind the one model interface (aah_core.model_api).

No model code is copied. Layers are transformers' own modules, called with the arguments the
model's own forward passes them; the embedding, final norm and LM head run inside the model's
own forward. To get at those pieces, the forward is run with the decoder layers swapped for
stand-ins (under a lock, only for that call): a stand-in records the arguments its layer would
get (position embeddings, masks: these depend only on the length T and are cached per T), hands
back the residual it was given, and the last one can inject a residual from outside, so

    embed(idx)   = the residual the model's forward hands layer 0 (the forward stops at the
                   last stand-in: no final norm, no LM head)
    logits(x)    = the model's forward with the last layer's output replaced by x
    token_losses(x, targets) = the same forward stopped at the LM head (a tap takes its place and
                   keeps the hidden state it gets), then aah_core.head_loss's chunked cross-entropy
    run_layers() = the real layers called one by one with the recorded arguments

The windows reach transformers' attention call through aah_core.hf.attention.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from aah_core.head_loss import head_token_losses
from aah_core.hf.attention import CURRENT, Captured, LayerCall
from aah_core.hf.folder import HFTokenizer
from aah_core.model import token_losses
from aah_core.model_api import LayerCache, power_of_two_buckets

LayerArgs = tuple[tuple[Any, ...], dict[str, Any]]


class _Stop(Exception):
    """Raised by a stand-in or the head tap once the forward has given what was asked: the rest of the
    model's forward (the remaining layers' stand-ins, the final norm, the LM head) never runs."""


class _StandIn(nn.Module):
    """Takes a decoder layer's place during one forward: records its call, passes the residual on
    (the last one hands back `output` when given, else stops the forward: nothing after it is needed)."""

    def __init__(self, index: int, calls: dict[int, LayerArgs], inputs: dict[int, torch.Tensor],
                 output: torch.Tensor | None, last: bool) -> None:
        super().__init__()
        self.index, self.calls, self.inputs, self.output, self.last = index, calls, inputs, output, last

    def forward(self, hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        self.calls[self.index] = (args, kwargs)
        self.inputs[self.index] = hidden_states
        if self.last and self.output is None:
            raise _Stop
        return hidden_states if self.output is None else self.output


class _HeadTap(nn.Module):
    """Takes the LM head's place: records the final (normed) hidden state it gets and stops the forward."""

    def __init__(self, seen: dict[str, torch.Tensor]) -> None:
        super().__init__()
        self.seen = seen

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        self.seen["hidden"] = hidden_states
        raise _Stop


def _decoder_layers(model: nn.Module, n_layer: int) -> nn.ModuleList:
    """The model's list of decoder layers: its one ModuleList of n_layer modules that own attention."""
    found = [m for m in model.modules()
             if isinstance(m, nn.ModuleList) and len(m) == n_layer and all(hasattr(x, "self_attn") or hasattr(x, "attn")
                                                                           for x in m)]
    if len(found) != 1:
        raise ValueError(f"cannot find the decoder layers of {type(model).__name__} ({len(found)} candidates)")
    return found[0]


class HFWindowedLM(nn.Module):
    """A transformers causal LM (loaded with attn_implementation=ATTN_IMPLEMENTATION) with a window plan."""

    _plan: torch.Tensor

    def __init__(self, model: nn.Module, tokenizer: HFTokenizer, plan: torch.Tensor, seq_len: int,
                 folder: Path) -> None:
        super().__init__()
        self.hf = model.eval()
        # transformers' PretrainedConfig: which fields it holds depends on the model's family
        config: Any = model.config
        self.folder = folder
        self.family = str(config.model_type)
        self._tokenizer = tokenizer
        self._seq_len = seq_len
        self._n_layer = int(config.num_hidden_layers)
        self._n_head = int(config.num_attention_heads)
        self._n_kv_head = int(getattr(config, "num_key_value_heads", None) or self._n_head)
        self._head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // self._n_head)
        self._vocab = int(config.vocab_size)
        self.register_buffer("_plan", plan.clamp(max=seq_len).clone(), persistent=False)
        self._decoder = (_decoder_layers(model, self._n_layer),)  # a tuple: not registered twice
        self._layers = list(self._decoder[0])  # the real layers, whatever the list holds meanwhile
        self._swap = threading.Lock()
        self._calls: dict[int, list[LayerArgs]] = {}  # by T, at start 0
        self._step_calls: tuple[tuple[int, int], list[LayerArgs]] | None = None  # ((T, start), calls) of a step
        # the LM head (a Linear: weight [V, C], maybe a bias); nn.Module types its attributes as Tensor | Module
        self._head: nn.Module = model.get_output_embeddings()  # type: ignore[operator]
        self._head_name = next(name for name, m in model.named_children() if m is self._head)
        self._plain_head: bool | None = None  # logits = head(hidden) and nothing after? checked once

    # -- the interface's properties ---------------------------------------------------------

    @property
    def n_layer(self) -> int:
        return self._n_layer

    @property
    def n_head(self) -> int:
        return self._n_head

    @property
    def n_kv_head(self) -> int:
        return self._n_kv_head

    @property
    def head_dim(self) -> int:
        return self._head_dim

    @property
    def seq_len(self) -> int:
        return self._seq_len

    @property
    def vocab_size(self) -> int:
        return self._vocab

    @property
    def sinks(self) -> int:
        return 0  # the adapter runs the model's own layout: no sink tokens

    @property
    def plan(self) -> torch.Tensor:
        return self._plan

    @property
    def buckets(self) -> list[int]:
        return power_of_two_buckets(self._seq_len)

    @property
    def tokenizer(self) -> HFTokenizer:
        return self._tokenizer

    @property
    def dtype(self) -> torch.dtype:
        return next(self.hf.parameters()).dtype

    def cast(self, dtype: torch.dtype) -> None:
        """Run in `dtype` from now on: the weights are cast, the recorded layer arguments (rotary
        tables are in the weights' dtype) are dropped."""
        with self._swap:
            self.hf.to(dtype)
            self._calls, self._step_calls = {}, None

    # -- running the model's own forward with stand-ins ------------------------------------------

    def _own_forward(self, idx: torch.Tensor, output: torch.Tensor | None = None, start: int = 0,
                     tap_head: bool = False) -> tuple[Any, list[LayerArgs], torch.Tensor]:
        """The model's forward on idx (at positions start..) with stand-in layers: (its output, each
        layer's call, layer 0's input). Without `output` it stops at the last stand-in (output None);
        with `tap_head` it stops at the LM head and its output is the hidden state the head gets."""
        calls: dict[int, LayerArgs] = {}
        inputs: dict[int, torch.Tensor] = {}
        seen: dict[str, torch.Tensor] = {}
        last = self._n_layer - 1
        out: Any = None
        with self._swap, torch.no_grad():
            decoder = self._decoder[0]
            for i in range(self._n_layer):
                decoder[i] = _StandIn(i, calls, inputs, output if i == last else None, i == last)
            if tap_head:
                setattr(self.hf, self._head_name, _HeadTap(seen))
            try:
                positions = {} if start == 0 else {
                    "position_ids": torch.arange(start, start + idx.shape[1], device=idx.device).unsqueeze(0)}
                out = self.hf(input_ids=idx, use_cache=False, **positions)
            except _Stop:
                out = seen.get("hidden")
            finally:
                for i, layer in enumerate(self._layers):
                    decoder[i] = layer
                setattr(self.hf, self._head_name, self._head)
        return out, [calls[i] for i in range(self._n_layer)], inputs[0]

    def _layer_calls(self, T: int, start: int = 0) -> list[LayerArgs]:
        """The arguments each layer gets at positions start..start+T-1 (position embeddings, masks),
        recorded once per T for start 0; a generation step at start > 0 uses the ones its `embed` recorded."""
        step = self._step_calls
        calls = self._calls.get(T) if start == 0 else step[1] if step is not None and step[0] == (T, start) else None
        if calls is None:
            dummy = torch.zeros(1, T, dtype=torch.long, device=self._plan.device)
            calls = self._own_forward(dummy, start=start)[1]
            self._keep_calls(T, start, calls)
        return calls

    def _keep_calls(self, T: int, start: int, calls: list[LayerArgs]) -> None:
        """Keep the calls of start 0 per T, and the latest generation step's (one assignment: thread-safe)."""
        if start:
            self._step_calls = ((T, start), calls)
        else:
            self._calls.setdefault(T, calls)

    # -- the interface's methods -------------------------------------------------------------------

    def _check_length(self, T: int) -> None:
        if T > self._seq_len:
            raise ValueError(f"sequence length {T} exceeds this model's evaluation seq_len={self._seq_len}")

    @torch.no_grad()
    def embed(self, idx: torch.Tensor, start: int = 0) -> torch.Tensor:
        self._check_length(start + idx.shape[1])
        _, calls, x = self._own_forward(idx, start=start)
        self._keep_calls(idx.shape[1], start, calls)
        return x

    @torch.no_grad()
    def run_layers(
        self, x: torch.Tensor, plan: torch.Tensor, start: int = 0, end: int | None = None, backend: str = "auto",
        residuals: list[torch.Tensor] | None = None, cache: Sequence[LayerCache] | None = None,
        sinks: int | None = None,
    ) -> torch.Tensor:
        first = 0 if cache is None else cache[start].start  # position of x's first row
        self._check_length(first + x.shape[1])
        calls = self._layer_calls(x.shape[1], first)
        windows = plan.tolist()
        for layer in range(start, self._n_layer if end is None else end):
            if residuals is not None:
                residuals.append(x)
            args, kwargs = calls[layer]
            token = CURRENT.set(LayerCall(tuple(windows[layer]), backend, cache=None if cache is None else cache[layer],
                                          sinks=sinks or 0))
            try:
                out = self._layers[layer](x, *args, **kwargs)
            finally:
                CURRENT.reset(token)
            x = out[0] if isinstance(out, tuple) else out
        return x

    @torch.no_grad()
    def logits(self, x: torch.Tensor) -> torch.Tensor:
        dummy = torch.zeros(x.shape[:2], dtype=torch.long, device=x.device)
        return self._own_forward(dummy, output=x)[0].logits

    @torch.no_grad()
    def token_losses(self, x: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        if self._plain_head is None:
            self._plain_head = self._head_is_plain()
        if not self._plain_head:  # something follows the head (soft-capping, scaling): its logits, a sequence at a time
            return torch.cat([token_losses(self.logits(x[i : i + 1]), targets[i : i + 1]) for i in range(x.shape[0])])
        assert isinstance(self._head, nn.Linear)
        return head_token_losses(self._final_hidden(x), self._head.weight, self._head.bias, targets)

    def _final_hidden(self, x: torch.Tensor) -> torch.Tensor:
        """The hidden state the LM head gets (the model's final norm applied to the last layer's output x)."""
        dummy = torch.zeros(x.shape[:2], dtype=torch.long, device=x.device)
        return self._own_forward(dummy, output=x, tap_head=True)[0]

    def _head_is_plain(self) -> bool:
        """Does the model's forward give logits = head(hidden), nothing after? Checked on two positions."""
        if not isinstance(self._head, nn.Linear):
            return False
        x = self.embed(torch.zeros(1, 2, dtype=torch.long, device=self._plan.device))
        own = self.logits(x).float()
        ours = F.linear(self._final_hidden(x), self._head.weight, self._head.bias).float()
        return own.shape == ours.shape and torch.allclose(own, ours, rtol=1e-4, atol=1e-4)

    @torch.no_grad()
    def queries_keys(self, x: torch.Tensor, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        args, kwargs = self._layer_calls(x.shape[1])[layer]
        token = CURRENT.set(LayerCall((self._seq_len,) * self._n_head, capture=True))
        try:
            self._layers[layer](x, *args, **kwargs)
        except Captured as got:
            return got.q, got.k
        finally:
            CURRENT.reset(token)
        raise RuntimeError(f"layer {layer} of {self.family} never called its attention function")
