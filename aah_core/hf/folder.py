"""A local Hugging Face causal-LM folder: checks (safetensors only, tokenizer.json), its config,
its native window plan and its tokenizer. Nothing here loads weights or reaches a hub.
"""

from __future__ import annotations

import json
import math
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


MAX_CONFIG_BYTES = 1 << 20  # real configs are a few KB
MAX_LAYERS = MAX_HEADS = 1024  # the API's layer/head indices stop there too
# config.json sizes that transformers divides by or builds that many modules from: each must be a positive int
SIZE_KEYS = ("num_hidden_layers", "n_layer", "num_attention_heads", "n_head", "num_key_value_heads", "hidden_size",
             "n_embd", "head_dim", "intermediate_size", "vocab_size", "max_position_embeddings", "n_positions")
BOUNDED_KEYS = {"num_hidden_layers": MAX_LAYERS, "n_layer": MAX_LAYERS, "num_attention_heads": MAX_HEADS,
                "n_head": MAX_HEADS}


def read_config_json(path: Path) -> Any:
    """config.json parsed (None when missing or not JSON); deep nesting is not JSON we read."""
    file = path / "config.json"
    try:
        if file.stat().st_size > MAX_CONFIG_BYTES:
            return None
        return json.loads(file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        return None


def is_hf_folder(path: str | Path) -> bool:
    """A folder whose config.json names a Hugging Face model_type (not an AAH Studio checkpoint)."""
    config = read_config_json(Path(path))
    return isinstance(config, dict) and isinstance(config.get("model_type"), str) and "format" not in config


def check_config_json(folder: Path) -> None:
    """Refuse a config.json that transformers would choke on (CheckpointError naming the key): too large or
    nested, or a size that is not a positive integer (zero heads, "four" layers) or beyond the bounds."""
    config = read_config_json(folder)
    if not isinstance(config, dict):
        raise CheckpointError(f"{folder}/config.json: not a JSON object of at most {MAX_CONFIG_BYTES >> 20} MiB "
                              "(nested JSON deeper than Python's recursion limit is refused too)")
    for key in SIZE_KEYS:
        value = config.get(key)
        if value is None:  # absent or null: the family's default
            continue
        limit = BOUNDED_KEYS.get(key, 1 << 40)
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= limit:
            raise CheckpointError(f"{folder}/config.json: {key} must be an integer in [1, {limit:,}]; got {value!r:.40}")


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


def stored_sizes(files: list[Path]) -> dict[str, int]:
    """Elements of each stored tensor, by name, from the safetensors headers (no tensor is read)."""
    sizes: dict[str, int] = {}
    try:
        for file in files:
            with safe_open(str(file), framework="pt") as f:
                for key in f.keys():
                    sizes[key] = math.prod(int(d) for d in f.get_slice(key).get_shape())
    except (OSError, SafetensorError) as exc:
        raise CheckpointError(f"{file}: unreadable safetensors header ({exc})") from None
    return sizes


def check_parameter_count(config: Any, files: list[Path]) -> int:
    """The parameters of the model `config` describes, counted on the meta device (nothing allocated), after
    checking them against the safetensors headers' total: a config that claims a larger model than its
    weights (which transformers would fill with random values) is refused before anything is built."""
    from transformers import AutoModelForCausalLM

    try:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
    except Exception as exc:  # transformers' model classes raise anything on an odd config
        raise CheckpointError(f"config.json describes no model transformers can build ({exc.__class__.__name__}: "
                              f"{str(exc)[:200]})") from None
    expected = sum(p.numel() for p in model.parameters())  # tied weights once, as save_pretrained stores them
    buffers = {name for name, _ in model.named_buffers()}  # some families also store buffers: not parameters
    stored = sum(n for name, n in stored_sizes(files).items() if name not in buffers)
    if stored != expected:
        raise CheckpointError(f"config.json describes {expected:,} parameters but the safetensors files hold "
                              f"{stored:,}: the parameter count does not match the weights")
    return expected


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
