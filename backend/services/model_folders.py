"""Registering a model folder: the path is accepted only under the model roots (AAH_MODEL_DIRS),
resolved first so neither '..' nor a symlink leads out; the folder is described by the engine
(no weights read) and stored in the catalogue, so it survives a restart. Used by
POST /api/v1/models and by `aah models add`."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

from sqlalchemy.orm import Session

from aah_core.model_files import ModelDescription, describe_model
from aah_core.paths import ReadRoots
from backend.schemas.errors import Conflict, InvalidInput
from backend.settings import Settings
from backend.store import catalog

MAX_ID = 48


def _roots_text(roots: Sequence[Path]) -> str:
    return ", ".join(str(r) for r in roots) or "(none configured)"


def confine_model_path(raw: str, roots: Sequence[Path]) -> Path:
    """The resolved folder `raw` names (relative to the first root), if it lies under a root; else 422
    naming the roots (and nothing about what lies outside them)."""
    refusal = InvalidInput(f"path: {raw[:200]!r} is not under a model root; allowed roots (AAH_MODEL_DIRS): "
                           f"{_roots_text(roots)}")
    if not roots:
        raise refusal
    try:
        given = Path(raw).expanduser()
        real = (given if given.is_absolute() else roots[0] / given).resolve()
    except (OSError, RuntimeError, ValueError):  # NUL bytes, symlink loops, unreadable components
        raise refusal from None
    if not any(real == root or real.is_relative_to(root) for root in roots):
        raise refusal
    try:
        is_folder = real.is_dir()
    except (OSError, ValueError):  # a name too long, a component that is not a folder
        is_folder = False
    if not is_folder:
        raise InvalidInput(f"path: {raw[:200]!r} is not a folder under the model roots ({_roots_text(roots)})")
    return real


def read_roots(settings: Settings, stored: str) -> ReadRoots:
    """Where a model stored at `stored` may read from: its folder's files under the data dir (a checkpoint,
    stored relative) or the model roots (a registered folder, stored absolute); a checkpoint's corpus and
    tokenizer under the path roots, never the service's own store or logs."""
    folder = settings.model_roots if Path(stored).is_absolute() else [settings.data_dir]
    return ReadRoots(folder, settings.path_roots, settings.private_paths)


def stored_path(path: Path, data_dir: Path) -> str:
    """Relative to the data dir when inside it (the store moves with it), else absolute."""
    return str(path.relative_to(data_dir)) if path.is_relative_to(data_dir) else str(path)


def _new_id(s: Session, name: str) -> str:
    base = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")[:MAX_ID] or "model"
    taken = {e.id for e in catalog.list_checkpoints(s)}
    candidate, n = base, 2
    while candidate in taken:
        candidate, n = f"{base[: MAX_ID - 4]}-{n}", n + 1
    return candidate


def register_model_folder(s: Session, raw_path: str, name: str | None, seq_len: int | None,
                          settings: Settings, eval_tokens: int | None = None) -> tuple[str, ModelDescription]:
    """Check, describe and store a model folder; returns (its new model id, its description). Every file
    of the folder must resolve under the model roots (no link leads out). `eval_tokens` (tokens per
    evaluation set) must hold at least one sequence of the model's seq_len."""
    path = confine_model_path(raw_path, settings.model_roots)
    stored = stored_path(path, settings.data_dir)
    try:
        description = describe_model(path, seq_len, read_roots(settings, str(path)))
    except Exception as exc:  # a malformed folder is the client's error (422), whatever the engine raised
        raise InvalidInput(f"path: {str(exc) or exc.__class__.__name__}") from None
    if eval_tokens is not None and eval_tokens < description.seq_len:
        raise InvalidInput(f"eval_tokens: {eval_tokens} is less than one sequence of this model's "
                           f"seq_len={description.seq_len}")
    existing = catalog.find_checkpoint_by_path(s, stored)
    if existing is not None:
        raise Conflict(f"path: {path} is already registered as model {existing.id!r}")
    model_id = _new_id(s, name or path.name)
    catalog.register_checkpoint(s, catalog.CheckpointEntry(
        id=model_id, name=name or path.name, path=stored, run_id=None, preset=description.preset, fingerprint=None,
        seq_len=seq_len, eval_tokens=eval_tokens))
    return model_id, description
