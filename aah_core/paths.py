"""Paths from users (corpora, tokenizer folders) are accepted only under allowed roots.

A path is resolved first (``..`` and every symlink followed) and only then compared with the
roots, so neither ``../`` nor a symlink that points out of a root gets through. A refusal
names the roots and the setting, never anything found outside them: it does not say whether
an outside path exists, what it is, or where a symlink leads.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aah_core.config import RunConfig
from aah_core.data.corpus import BUNDLED_CORPORA, check_corpus
from aah_core.data.tokenizers import GPT2_FILES
from aah_core.errors import InvalidConfig

# The data settings that name files or folders, and the value that names no path.
PATH_SETTINGS = {"corpus": "default", "tokenizer_dir": ""}
MAX_FOLDER_ENTRIES = 10_000  # a model folder holds a few dozen files; this is not a model folder


def _refusal(key: str, value: str, roots: Sequence[Path]) -> InvalidConfig:
    shown = value if len(value) <= 200 else value[:200] + "..."
    return InvalidConfig(f"{key}={shown!r} is not under an allowed root; allowed roots: "
                         f"{', '.join(str(r) for r in roots)} (the data dir and AAH_CORPUS_DIRS)")


def _inside(real: Path, roots: Sequence[Path]) -> bool:
    return any(real == root or real.is_relative_to(root) for root in roots)


def confine(value: str, roots: Sequence[Path], key: str) -> Path:
    """``value`` as a resolved path inside one of ``roots`` (resolved folders), else InvalidConfig.

    A relative value is taken relative to the first root. The path must exist.
    """
    if not roots:
        raise InvalidConfig(f"{key}: no allowed roots are configured (set AAH_CORPUS_DIRS)")
    raw = Path(value)
    try:
        real = (raw if raw.is_absolute() else roots[0] / raw).resolve()
    except (OSError, RuntimeError, ValueError):  # loops, NUL bytes, unreadable components
        raise _refusal(key, value, roots) from None
    if not _inside(real, roots):
        raise _refusal(key, value, roots)
    if not real.exists():
        raise InvalidConfig(f"{key}={value!r}: no such file or folder under the allowed roots")
    return real


@dataclass(frozen=True)
class ReadRoots:
    """Where a served model may read from. ``folder``: the roots its folder's own files must resolve under
    (the data dir for checkpoints, the model roots for registered folders); ``data``: the roots of the
    corpus and tokenizer a checkpoint names; ``private``: paths under those that are never data (the
    service's store, its journals, its logs)."""

    folder: Sequence[Path]
    data: Sequence[Path]
    private: Sequence[Path] = ()


def confine_folder_files(folder: Path, roots: Sequence[Path]) -> None:
    """Refuse a model folder (InvalidConfig) any entry of which resolves outside ``roots``: whichever of its
    files a loader opens (config, weights, tokenizer, generation config), none is a symlink that leads out.
    Links that stay inside (a Hugging Face cache snapshot's links to its blobs) are fine. Real subfolders
    are checked too; at most MAX_FOLDER_ENTRIES entries are looked at."""
    if not _inside(folder.resolve(), roots):
        raise InvalidConfig(f"model folder {folder.name!r} is not under an allowed root")
    seen = 0
    folders = [folder]
    while folders:
        with os.scandir(folders.pop()) as listing:
            for entry in listing:
                seen += 1
                if seen > MAX_FOLDER_ENTRIES:
                    raise InvalidConfig(f"model folder {folder.name!r} has more than {MAX_FOLDER_ENTRIES:,} entries; "
                                        "it is not a model folder")
                if entry.is_dir(follow_symlinks=False):
                    folders.append(Path(entry.path))
                elif entry.is_symlink():
                    try:
                        real = Path(entry.path).resolve()
                    except (OSError, RuntimeError):  # a link loop
                        real = None
                    if real is None or not _inside(real, roots):
                        raise InvalidConfig(f"model folder {folder.name!r}: {Path(entry.path).relative_to(folder)} "
                                            "is a link that leads out of the allowed roots; refusing the folder")


def _confine_tokenizer_files(folder: Path, roots: Sequence[Path]) -> None:
    """Each file the tokenizer reads from its (confined) folder must itself resolve under the roots: a
    symlink inside the folder must not lead out."""
    for name in GPT2_FILES:
        try:
            real = (folder / name).resolve()
        except (OSError, RuntimeError):
            real = None
        if real is None or not _inside(real, roots):
            raise _refusal(f"data.tokenizer_dir file {name}", str(folder / name), roots)


def confine_data_paths(config: RunConfig, roots: Sequence[Path], private: Sequence[Path] = ()) -> RunConfig:
    """The config with data.corpus / data.tokenizer_dir replaced by their resolved paths inside
    ``roots`` (a bundled corpus and an empty tokenizer folder name no path and pass as they are), and
    the tokenizer's files checked the same way. Nothing outside the roots is opened or read: a checkpoint
    is built only from what this returns. A corpus inside the roots must also be one
    (aah_core.data.corpus.check_corpus: text files, bounded), and never one of ``private`` (the service's
    store, its journals, its logs) nor inside one."""
    changes: dict[str, Any] = {}  # str fields of DataConfig (PATH_SETTINGS), typed Any for dataclasses.replace
    for name, no_path in PATH_SETTINGS.items():
        value = getattr(config.data, name)
        if value != no_path and not (name == "corpus" and value in BUNDLED_CORPORA):
            changes[name] = str(confine(value, roots, f"data.{name}"))
    if "tokenizer_dir" in changes:
        _confine_tokenizer_files(Path(changes["tokenizer_dir"]), roots)
    if "corpus" in changes:
        corpus = Path(changes["corpus"])
        if _inside(corpus, [p.resolve() for p in private]):
            raise InvalidConfig(f"data.corpus={config.data.corpus!r} is the service's own store or logs, not a corpus")
        check_corpus(changes["corpus"])
    if not changes:
        return config
    return dataclasses.replace(config, data=dataclasses.replace(config.data, **changes))


def library_caches(data_dir: Path) -> dict[str, str]:
    """Environment variables that keep the caches of the libraries the engine uses under
    ``data_dir/cache`` (by default tiktoken caches in the system temp folder, torch's compiler and
    triton in the temp folder and the home folder), so that a service writes nothing outside its data dir."""
    cache = data_dir / "cache"
    return {"TIKTOKEN_CACHE_DIR": str(cache / "tiktoken"), "DATA_GYM_CACHE_DIR": str(cache / "tiktoken"),
            "TORCHINDUCTOR_CACHE_DIR": str(cache / "torchinductor"), "TRITON_CACHE_DIR": str(cache / "triton")}
