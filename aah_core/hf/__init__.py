"""Local Hugging Face causal LMs with per-head windows, behind the one model interface.

`open_hf_model(folder)` loads a folder (config.json, *.safetensors, tokenizer.json) with
transformers, offline (HF_HUB_OFFLINE, local_files_only=True), safetensors only, and returns an
HFWindowedLM whose own plan holds the config's native windows. transformers is imported only here.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from aah_core.errors import CheckpointError
from aah_core.hf.folder import (
    HFTokenizer,
    check_config_json,
    check_parameter_count,
    eval_seq_len,
    is_hf_folder,
    model_dtype,
    native_plan,
    weight_files,
)

__all__ = ["HFModelInfo", "describe_hf_model", "is_hf_folder", "open_hf_model", "read_hf_config"]


def _offline() -> None:
    """No hub, no telemetry, no progress bars: set before transformers (and huggingface_hub) load."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")


def read_hf_config(folder: Path):
    """transformers' reading of a folder's config.json (offline; defaults filled in)."""
    _offline()
    from transformers import AutoConfig
    from transformers.utils import logging

    logging.disable_progress_bar()

    check_config_json(folder)
    try:
        return AutoConfig.from_pretrained(str(folder), local_files_only=True, trust_remote_code=False)
    except Exception as exc:  # a config class may raise anything on odd values (ZeroDivisionError, TypeError, ...)
        raise CheckpointError(f"{folder}/config.json: not a config transformers can read "
                              f"({exc.__class__.__name__}: {str(exc)[:200]})") from None


@dataclass(frozen=True)
class HFModelInfo:
    family: str  # config.model_type, e.g. "llama"
    n_layer: int
    n_head: int  # query heads
    n_kv_head: int
    seq_len: int  # the evaluation context
    max_seq_len: int
    dtype: str
    n_params: int


def describe_hf_model(folder: str | Path, seq_len: int | None = None, dtype: str | None = None) -> HFModelInfo:
    """What a folder holds, from config.json and the safetensors headers (no weights read)."""
    folder = Path(folder)
    files = weight_files(folder)
    config = read_hf_config(folder)
    n_params = check_parameter_count(config, files)
    from aah_core.hf.folder import max_context

    n_head = int(config.num_attention_heads)
    return HFModelInfo(
        family=str(config.model_type), n_layer=int(config.num_hidden_layers), n_head=n_head,
        n_kv_head=int(getattr(config, "num_key_value_heads", None) or n_head), seq_len=eval_seq_len(config, seq_len),
        max_seq_len=max_context(config), dtype=str(model_dtype(config, dtype)).removeprefix("torch."),
        n_params=n_params,
    )


def open_hf_model(folder: str | Path, seq_len: int | None = None, dtype: str | None = None):
    """Load a local causal-LM folder as an HFWindowedLM (its own plan: the config's native windows)."""
    folder = Path(folder)
    files = weight_files(folder)  # refuses pickle-only folders before transformers sees them
    tokenizer = HFTokenizer.from_folder(folder)
    config = read_hf_config(folder)
    check_parameter_count(config, files)  # nothing is allocated for a config its weights do not match
    T = eval_seq_len(config, seq_len)
    torch_dtype = model_dtype(config, dtype)
    from transformers import AutoModelForCausalLM

    from aah_core.hf.adapter import HFWindowedLM
    from aah_core.hf.attention import ATTN_IMPLEMENTATION, register

    register()
    try:
        model = AutoModelForCausalLM.from_pretrained(
            str(folder), local_files_only=True, use_safetensors=True, trust_remote_code=False,
            attn_implementation=ATTN_IMPLEMENTATION, dtype=torch_dtype,
        )
    except Exception as exc:  # whatever transformers raises on this folder makes it unusable, not a crash
        raise CheckpointError(f"{folder}: transformers cannot load this causal LM ({exc.__class__.__name__}: "
                              f"{str(exc)[:200]})") from None
    if getattr(model.config, "attn_logit_softcapping", None) is not None:
        raise CheckpointError(f"{folder}: attention logit soft-capping ({model.config.model_type}) is not supported")
    return HFWindowedLM(model, tokenizer, native_plan(model.config, T), T, folder)
