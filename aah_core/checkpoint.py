"""Checkpoints: a directory with config.json, model.safetensors and plan.json. Never pickle.

Writes are atomic: everything goes to a temporary sibling directory that is renamed into
place, so a crash never leaves a half-written checkpoint.
"""

from __future__ import annotations

import json
import shutil
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from aah_core.config import RunConfig
from aah_core.data.tokenizers import make_tokenizer
from aah_core.errors import AAHError, CheckpointError
from aah_core.model import WindowedGPT
from aah_core.windows import plan_to_json, validate_plan

FORMAT = "aah-studio/checkpoint-v1"
PICKLE_SUFFIXES = (".pt", ".pth", ".bin", ".pkl", ".pickle", ".ckpt")
TIED = "lm_head.weight"  # shares storage with wte.weight; stored once


@dataclass
class Checkpoint:
    model: WindowedGPT
    config: RunConfig
    plan: torch.Tensor  # [n_layer, n_head]
    controller_state: dict[str, Any] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)


def save_checkpoint(
    path: str | Path,
    model: WindowedGPT,
    config: RunConfig,
    plan: torch.Tensor | None = None,
    controller_state: dict[str, Any] | None = None,
    meta: dict[str, Any] | None = None,
) -> Path:
    """Write a checkpoint directory atomically (temp dir + rename). Returns its path."""
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


def load_checkpoint(path: str | Path, device: str = "cpu") -> Checkpoint:
    """Load a checkpoint directory; refuses pickles, missing files and foreign or corrupt content."""
    path = Path(path)
    if path.is_file() and path.suffix in PICKLE_SUFFIXES:
        raise CheckpointError(f"{path}: pickle checkpoints are refused; use a directory with model.safetensors")
    if not path.is_dir():
        raise CheckpointError(f"{path}: no such checkpoint directory")
    for name in ("config.json", "model.safetensors", "plan.json"):
        if not (path / name).is_file():
            raise CheckpointError(f"{path}: missing {name}; a checkpoint holds config.json, model.safetensors, plan.json")
    header = _read_json(path / "config.json")
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise CheckpointError(f"{path}/config.json: not an AAH Studio checkpoint (format must be {FORMAT!r})")
    try:
        config = RunConfig.from_dict(header["config"])
        model = WindowedGPT(config.model, make_tokenizer(config.data.tokenizer, config.data.tokenizer_dir))
        state = load_file(str(path / "model.safetensors"), device=device)
    except (AAHError, KeyError, TypeError) as exc:
        raise CheckpointError(f"{path}/config.json: invalid configuration: {exc}") from None
    except (SafetensorError, OSError, ValueError) as exc:
        raise CheckpointError(f"{path}/model.safetensors: unreadable ({exc}); the file is corrupt or not safetensors") from None
    expected = set(model.state_dict()) - {TIED}
    if set(state) != expected:
        missing, extra = sorted(expected - set(state))[:3], sorted(set(state) - expected)[:3]
        raise CheckpointError(f"{path}: weights do not match the config (missing {missing}, unexpected {extra})")
    try:
        model.load_state_dict(state, strict=False)
    except RuntimeError as exc:
        raise CheckpointError(f"{path}: weight shapes do not match the config: {str(exc)[:200]}") from None
    plan_doc = _read_json(path / "plan.json")
    if not isinstance(plan_doc, dict) or "windows" not in plan_doc:
        raise CheckpointError(f"{path}/plan.json: expected an object with 'windows'")
    try:
        plan = validate_plan(plan_doc["windows"], config.model.n_layer, config.model.n_head, config.model.seq_len)
    except AAHError as exc:
        raise CheckpointError(f"{path}/plan.json: {exc}") from None
    model.set_plan(plan)
    model.to(device).eval()
    return Checkpoint(model, config, plan, plan_doc.get("controller") or {}, header.get("meta") or {})
