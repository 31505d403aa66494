"""Checkpoints: a directory with config.json, model.safetensors and plan.json. Never pickle.

Writes are atomic: everything goes to a temporary sibling directory that is renamed into
place, so a crash never leaves a half-written checkpoint. `read_checkpoint_info` is the one
reader of a checkpoint's files without its weights (what a service lists and registers);
`load_checkpoint` builds the model. Training also writes trainer.safetensors (optimizer moments,
generator states: aah_core.train_state), which only `read_train_state` reads, to resume.
"""

from __future__ import annotations

import json
import math
import shutil
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file

from aah_core.config import RunConfig
from aah_core.data.tokenizers import make_tokenizer
from aah_core.errors import AAHError, CheckpointError
from aah_core.meta import shapes_only
from aah_core.model import WindowedGPT
from aah_core.paths import ReadRoots, confine_data_paths, confine_folder_files
from aah_core.windows import plan_to_json, validate_plan

FORMAT = "aah-studio/checkpoint-v1"
FILES = ("config.json", "model.safetensors", "plan.json")
PICKLE_SUFFIXES = (".pt", ".pth", ".bin", ".pkl", ".pickle", ".ckpt")
TRAINER = "trainer.safetensors"  # optional: what resuming needs beyond the model (aah_core.train_state)
TIED = "lm_head.weight"  # shares storage with wte.weight; stored once


@dataclass
class Checkpoint:
    model: WindowedGPT
    config: RunConfig
    plan: torch.Tensor  # [n_layer, n_head]
    controller_state: dict[str, Any] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class CheckpointInfo:
    """What a checkpoint says about itself, read and validated without loading its weights."""

    config: RunConfig
    plan: torch.Tensor  # [n_layer, n_head], validated against config.model; full written as seq_len
    n_params: int  # elements of the stored tensors (the tied lm_head is stored once)
    meta: dict[str, Any] = field(default_factory=dict)
    controller_state: dict[str, Any] = field(default_factory=dict)


def save_checkpoint(
    path: str | Path,
    model: WindowedGPT,
    config: RunConfig,
    plan: torch.Tensor | None = None,
    controller_state: dict[str, Any] | None = None,
    meta: dict[str, Any] | None = None,
    train_state: dict[str, torch.Tensor] | None = None,
) -> Path:
    """Write a checkpoint directory atomically (temp dir + rename), with `train_state` (tensors from
    aah_core.train_state.capture_train_state) as trainer.safetensors when given. Returns its path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.tmp-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items() if k != TIED}
        save_file(state, str(tmp / "model.safetensors"), metadata={"format": FORMAT})
        header = {"format": FORMAT, "config": config.to_dict(), "meta": meta or {}}
        (tmp / "config.json").write_text(json.dumps(header, indent=2))
        plan = model.plan if plan is None else plan
        seq_len = config.model.seq_len
        plan_doc = {"seq_len": seq_len, "windows": plan_to_json(plan, seq_len), "controller": controller_state or {}}
        (tmp / "plan.json").write_text(json.dumps(plan_doc))
        if train_state is not None:
            save_file(train_state, str(tmp / TRAINER), metadata={"format": FORMAT})
        if path.exists():
            old = path.parent / f".{path.name}.old-{uuid.uuid4().hex[:8]}"
            path.rename(old)
            tmp.rename(path)
            shutil.rmtree(old)
        else:
            tmp.rename(path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return path


def _read_json(file: Path) -> Any:
    try:
        return json.loads(file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{file}: not valid JSON ({exc.__class__.__name__}); the checkpoint is corrupt") from None
    except RecursionError:  # json's decoder recurses once per level of nesting
        raise CheckpointError(f"{file}: JSON nested too deeply to read; the checkpoint is corrupt") from None


def _check_files(path: Path) -> None:
    if path.is_file() and path.suffix in PICKLE_SUFFIXES:
        raise CheckpointError(f"{path}: pickle checkpoints are refused; use a directory with model.safetensors")
    if not path.is_dir():
        raise CheckpointError(f"{path}: no such checkpoint directory")
    for name in FILES:
        if not (path / name).is_file():
            raise CheckpointError(f"{path}: missing {name}; a checkpoint holds {', '.join(FILES)}")


def _read_config(path: Path) -> tuple[RunConfig, dict[str, Any]]:
    header = _read_json(path / "config.json")
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise CheckpointError(f"{path}/config.json: not an AAH Studio checkpoint (format must be {FORMAT!r})")
    try:
        config = RunConfig.from_dict(header["config"])
    except (AAHError, KeyError, TypeError) as exc:
        raise CheckpointError(f"{path}/config.json: invalid configuration: {exc}") from None
    meta = header.get("meta") or {}
    if not isinstance(meta, dict):
        raise CheckpointError(f"{path}/config.json: 'meta' must be an object")
    return config, meta


def _read_plan(path: Path, config: RunConfig) -> tuple[torch.Tensor, dict[str, Any]]:
    plan_doc = _read_json(path / "plan.json")
    if not isinstance(plan_doc, dict) or "windows" not in plan_doc:
        raise CheckpointError(f"{path}/plan.json: expected an object with 'windows'")
    m = config.model
    try:
        plan = validate_plan(plan_doc["windows"], m.n_layer, m.n_head, m.seq_len)
    except AAHError as exc:
        raise CheckpointError(f"{path}/plan.json: {exc}") from None
    controller_state = plan_doc.get("controller") or {}
    if not isinstance(controller_state, dict):
        raise CheckpointError(f"{path}/plan.json: 'controller' must be an object")
    return plan, controller_state


def _unreadable_weights(path: Path, exc: Exception) -> CheckpointError:
    return CheckpointError(f"{path}/model.safetensors: unreadable ({exc}); the file is corrupt or not safetensors")


def _stored_params(path: Path, config: RunConfig) -> int:
    """Elements in model.safetensors (read from its header), after checking every stored tensor's name and
    shape against the model the config describes, built on the meta device for its shapes only (nothing is
    allocated or initialised): a config.json with huge dimensions is refused here, before a model of that
    size is ever built."""
    with shapes_only():
        expected = {k: tuple(v.shape) for k, v in WindowedGPT(config.model).state_dict().items() if k != TIED}
    try:
        with safe_open(str(path / "model.safetensors"), framework="pt") as f:
            stored = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    except (SafetensorError, OSError, ValueError) as exc:
        raise _unreadable_weights(path, exc) from None
    if set(stored) != set(expected):
        missing, extra = sorted(set(expected) - set(stored))[:3], sorted(set(stored) - set(expected))[:3]
        raise CheckpointError(f"{path}: weights do not match the config (missing {missing}, unexpected {extra})")
    wrong = [f"{k}: {stored[k]} instead of {expected[k]}" for k in sorted(stored) if stored[k] != expected[k]]
    if wrong:
        raise CheckpointError(f"{path}: weight shapes do not match the config ({'; '.join(wrong[:3])})")
    return sum(math.prod(shape) for shape in stored.values())


def read_checkpoint_info(path: str | Path) -> CheckpointInfo:
    """Config, validated plan, parameter count and meta of a checkpoint directory, from its JSON files and
    the safetensors header only (no weights are read). Raises CheckpointError naming the bad file."""
    path = Path(path)
    _check_files(path)
    config, meta = _read_config(path)
    plan, controller_state = _read_plan(path, config)
    return CheckpointInfo(config, plan, _stored_params(path, config), meta, controller_state)


def read_train_state(path: str | Path) -> dict[str, torch.Tensor] | None:
    """The trainer state a training run stored beside its checkpoint, or None when there is none."""
    file = Path(path) / TRAINER
    if not file.is_file():
        return None
    try:
        return load_file(str(file))
    except (SafetensorError, OSError, ValueError) as exc:
        raise CheckpointError(f"{file}: unreadable ({exc}); the file is corrupt or not safetensors") from None


def verify_checkpoint(path: str | Path) -> CheckpointInfo:
    """For checkpoints that arrive from elsewhere (an upload) and must load later: `read_checkpoint_info`,
    which checks every stored tensor's name and shape against the model its config describes."""
    return read_checkpoint_info(path)


def load_checkpoint(path: str | Path, device: str = "cpu", roots: ReadRoots | None = None) -> Checkpoint:
    """Load a checkpoint directory; refuses pickles, missing files and foreign or corrupt content.

    With ``roots`` (a service), the folder's files and every path its config names (corpus, tokenizer
    folder and files) are confined to them before anything is read (aah_core.paths): the returned config
    holds the resolved paths. Without, the config's paths are taken as they are (the local `aah` command)."""
    path = Path(path)
    if roots is not None:
        confine_folder_files(path, roots.folder)
    _check_files(path)
    config, meta = _read_config(path)
    if roots is not None:
        config = confine_data_paths(config, roots.data, roots.private)
    _stored_params(path, config)  # names and shapes checked from the header: the load below matches them
    try:
        model = WindowedGPT(config.model, make_tokenizer(config.data.tokenizer, config.data.tokenizer_dir))
        state = load_file(str(path / "model.safetensors"), device=device)
    except AAHError as exc:
        raise CheckpointError(f"{path}/config.json: invalid configuration: {exc}") from None
    except (SafetensorError, OSError, ValueError) as exc:
        raise _unreadable_weights(path, exc) from None
    model.load_state_dict(state, strict=False)
    plan, controller_state = _read_plan(path, config)
    model.set_plan(plan)
    model.to(device).eval()
    return Checkpoint(model, config, plan, controller_state, meta)
