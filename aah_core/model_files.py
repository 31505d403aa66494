"""Model folders the service can open, of either format, behind the one model interface:
an AAH Studio checkpoint (aah_core/checkpoint.py) or a local Hugging Face causal LM (aah_core/hf/).
The caller never asks which: `describe_model` reads a folder without its weights, `open_model`
loads it with the fixed evaluation data tokenized by the model's own tokenizer.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from aah_core.checkpoint import load_checkpoint, read_checkpoint_info
from aah_core.config import DataConfig
from aah_core.data import DataStream
from aah_core.errors import CheckpointError
from aah_core.hf.folder import is_hf_folder, read_config_json
from aah_core.hf.precision import Precision
from aah_core.model_api import WindowedLM, power_of_two_buckets
from aah_core.paths import ReadRoots, confine_data_paths, confine_folder_files

AAH_FAMILY = "aah"  # WindowedGPT, AAH Studio's own checkpoints
PRECISION_SAMPLE_SEQS = 1  # evaluation sequences the float32 / bfloat16 loss difference is measured on


@dataclass(frozen=True)
class ModelDescription:
    family: str  # "aah", or the Hugging Face model_type ("llama", "qwen3", ...)
    n_layer: int
    n_head: int  # query heads
    seq_len: int  # the evaluation context; windows >= seq_len are full
    buckets: list[int]  # window choices, ascending, full written as seq_len
    n_params: int
    dtype: str
    preset: str | None
    sinks: int = 0  # sink tokens every head sees besides its window (aah_core/windows.py)


@dataclass
class OpenedModel:
    model: WindowedLM
    stream: DataStream  # fixed evaluation batches and texts, in the model's own tokenizer
    precision: Precision | None = None  # a Hugging Face model's evaluation dtype, measured (aah_core/hf/precision.py)


def _hugging_face(path: Path) -> bool:
    """Read as a Hugging Face folder: its config.json names a model_type, or it is not a JSON object and
    there is no plan.json either (no AAH Studio checkpoint), so that the Hugging Face checks say what is
    wrong with it (too large, nested too deep)."""
    if is_hf_folder(path):
        return True
    return not (path / "plan.json").is_file() and not isinstance(read_config_json(path), dict)


def describe_model(path: str | Path, seq_len: int | None = None, roots: ReadRoots | None = None) -> ModelDescription:
    """What a model folder holds, without reading weights. `seq_len` applies to Hugging Face models
    (default min(model maximum, 1024)); a checkpoint's context is its own. With `roots` (a service), the
    folder's files and a checkpoint's corpus / tokenizer must lie under them (aah_core.paths), checked
    before anything is read. Raises CheckpointError or InvalidConfig."""
    path = Path(path)
    if roots is not None:
        confine_folder_files(path, roots.folder)
    if _hugging_face(path):
        from aah_core.hf import describe_hf_model

        hf = describe_hf_model(path, seq_len, dtype="float32")  # loaded in float32, then settled (open_model)
        return ModelDescription(hf.family, hf.n_layer, hf.n_head, hf.seq_len, power_of_two_buckets(hf.seq_len),
                                hf.n_params, hf.dtype, None)
    info = read_checkpoint_info(path)
    if roots is not None:
        confine_data_paths(info.config, roots.data, roots.private)
    m = info.config.model
    if seq_len is not None and seq_len != m.seq_len:
        raise CheckpointError(f"{path}: an AAH Studio checkpoint is evaluated at its own seq_len={m.seq_len}")
    return ModelDescription(AAH_FAMILY, m.n_layer, m.n_head, m.seq_len, m.bucket_windows, info.n_params, "float32",
                            info.config.preset, m.sinks)


def open_model(path: str | Path, seq_len: int | None = None, roots: ReadRoots | None = None) -> OpenedModel:
    """Load a model folder of either format, confined to `roots` as describe_model is; a Hugging Face model
    in the dtype that is faster here (aah_core/hf/precision.py, its loss difference measured). Raises
    CheckpointError or InvalidConfig (or ValueError for its data)."""
    path = Path(path)
    if roots is not None:
        confine_folder_files(path, roots.folder)
    if _hugging_face(path):
        from aah_core.hf import open_hf_model
        from aah_core.hf.precision import settle_precision

        model = open_hf_model(path, seq_len, dtype="float32")
        stream = DataStream(DataConfig(), model.seq_len, tokenizer=model.tokenizer, eval_only=True)
        precision = settle_precision(model, stream.eval_batch("text", PRECISION_SAMPLE_SEQS))
        return OpenedModel(model, stream, precision)
    ckpt = load_checkpoint(path, roots=roots)  # its data paths confined before its tokenizer is built
    stream = DataStream(ckpt.config.data, ckpt.config.model.seq_len, tokenizer=ckpt.model.tokenizer, eval_only=True)
    return OpenedModel(ckpt.model, stream)
