"""A local Hugging Face causal-LM folder: checks (safetensors only, tokenizer.json), its config,
its native window plan and its tokenizer. Nothing here loads weights or reaches a hub.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open

from aah_core.errors import CheckpointError
from aah_core.windows import decode_window

DEFAULT_SEQ_LEN = 1024  # the evaluation context when the model allows more
PICKLE_WEIGHTS = ("*.bin", "*.pt", "*.pth", "*.ckpt", "*.pkl", "*.pickle")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
# family (config.model_type) -> the layer-type names that mean a windowed layer
WINDOWED_LAYER_TYPES = {"sliding_attention"}
FULL_LAYER_TYPES = {"full_attention"}


def is_hf_folder(path: str | Path) -> bool:
    """A folder whose config.json names a Hugging Face model_type (not an AAH Studio checkpoint)."""
    try:
        config = json.loads((Path(path) / "config.json").read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False
    return isinstance(config, dict) and isinstance(config.get("model_type"), str) and "format" not in config


def weight_files(folder: Path) -> list[Path]:
    """The folder's safetensors weight files; refuses a folder that holds only pickles (never opened)."""
    files = sorted(folder.glob("*.safetensors"))
    if files:
        return files
    pickles = sorted(p.name for pattern in PICKLE_WEIGHTS for p in folder.glob(pattern))
    if pickles:
        raise CheckpointError(
            f"{folder}: only pickle weights ({', '.join(pickles[:3])}); AAH Studio never unpickles. "
            "Convert them to safetensors (model.safetensors) with a tool you trust, then add the folder again"
        )
    raise CheckpointError(f"{folder}: no *.safetensors weights; a model folder holds config.json and model.safetensors")


def count_parameters(files: list[Path]) -> int:
    """Parameters from the safetensors headers, without reading the tensors."""
    total = 0
    try:
        for file in files:
            with safe_open(str(file), framework="pt") as f:
                for key in f.keys():
                    n = 1
                    for d in f.get_slice(key).get_shape():
                        n *= int(d)
                    total += n
    except (OSError, SafetensorError) as exc:
        raise CheckpointError(f"{file}: unreadable safetensors header ({exc})") from None
    return total


def max_context(config: Any) -> int:
    """The longest context the config allows (max_position_embeddings, or n_positions for GPT-2)."""
    for name in ("max_position_embeddings", "n_positions"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    raise CheckpointError(f"config of model_type {config.model_type!r} gives no maximum context")


def eval_seq_len(config: Any, requested: int | None) -> int:
    """The evaluation context: requested (<= the model's maximum), else min(maximum, 1024)."""
    limit = max_context(config)
    if requested is None:
        return min(limit, DEFAULT_SEQ_LEN)
    if isinstance(requested, bool) or not isinstance(requested, int) or not 2 <= requested <= limit:
        raise CheckpointError(f"seq_len must be an integer in [2, {limit}] (this model's maximum); got {requested!r}")
    return requested


def layer_windows(config: Any) -> list[int | None]:
    """The native window of each layer from the config (None = full).

    `layer_types` when present; otherwise `sliding_window`, gated by `use_sliding_window` and, for
    layers below `max_window_layers`, full (the rule transformers itself applies to such configs).
    transformers' `sliding_window = w` means query i sees keys i - w < j <= i: our window w.
    """
    n_layer = int(config.num_hidden_layers)
    window = getattr(config, "sliding_window", None)
    types = getattr(config, "layer_types", None)
    if types is not None:
        out: list[int | None] = []
        for layer, kind in enumerate(types[:n_layer]):
            if kind in WINDOWED_LAYER_TYPES and window:
                out.append(int(window))
            elif kind in FULL_LAYER_TYPES or kind in WINDOWED_LAYER_TYPES:
                out.append(None)
            else:
                raise CheckpointError(f"layer {layer} has attention type {kind!r}; only full and sliding layers are supported")
        return out
    if not window or not getattr(config, "use_sliding_window", True):
        return [None] * n_layer
    first = getattr(config, "max_window_layers", 0) or 0
    return [int(window) if layer >= first else None for layer in range(n_layer)]


def native_plan(config: Any, seq_len: int) -> torch.Tensor:
    """[n_layer, n_head] int64: each layer's native window for all its query heads, clamped to seq_len."""
    rows = [[decode_window(w, seq_len)] * int(config.num_attention_heads) for w in layer_windows(config)]
    return torch.tensor(rows, dtype=torch.long)


def model_dtype(config: Any, requested: str | None) -> torch.dtype:
    """float32 or bfloat16: requested, else the config's own (float16 runs as float32 on CPU)."""
    name = requested or str(getattr(config, "dtype", None) or "float32").removeprefix("torch.")
    if name == "float16":
        name = "float32"
    if name not in DTYPES:
        raise CheckpointError(f"dtype {name!r} is not supported; use one of {sorted(DTYPES)}")
    return DTYPES[name]


@dataclass
class HFTokenizer:
    """The model's own tokenizer from its tokenizer.json (the `tokenizers` library; no hub)."""

    name: str
    vocab_size: int
    _tok: Any

    @classmethod
    def from_folder(cls, folder: Path) -> HFTokenizer:
        from tokenizers import Tokenizer

        file = folder / "tokenizer.json"
        if not file.is_file():
            raise CheckpointError(f"{folder}: no tokenizer.json; the model's own tokenizer is needed to evaluate text")
        try:
            tok = Tokenizer.from_file(str(file))
        except Exception as exc:  # the tokenizers library raises its own exception type
            raise CheckpointError(f"{file}: not a readable tokenizer ({exc})") from None
        return cls(f"hf:{folder.name}", tok.get_vocab_size(with_added_tokens=True), tok)

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=False)

    def decode_token(self, token_id: int) -> str:
        """The token's own text (decoded alone), e.g. ' the'; its raw vocabulary entry when that is empty."""
        text = self._tok.decode([token_id], skip_special_tokens=False)
        return text if text else (self._tok.id_to_token(token_id) or f"<{token_id}>")
