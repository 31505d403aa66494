"""Paths from users (corpora, tokenizer folders) are accepted only under allowed roots.

A path is resolved first (``..`` and every symlink followed) and only then compared with the
roots, so neither ``../`` nor a symlink that points out of a root gets through. A refusal
names the roots and the setting, never anything found outside them: it does not say whether
an outside path exists, what it is, or where a symlink leads.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from aah_core.config import RunConfig
from aah_core.data.corpus import check_corpus
from aah_core.errors import InvalidConfig

# The data settings that name files or folders, and the value that names no path.
PATH_SETTINGS = {"corpus": "default", "tokenizer_dir": ""}


def _refusal(key: str, value: str, roots: Sequence[Path]) -> InvalidConfig:
    shown = value if len(value) <= 200 else value[:200] + "..."
    return InvalidConfig(f"{key}={shown!r} is not under an allowed root; allowed roots: "
                         f"{', '.join(str(r) for r in roots)} (the data dir and AAH_CORPUS_DIRS)")


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
    if not any(real == root or real.is_relative_to(root) for root in roots):
        raise _refusal(key, value, roots)
    if not real.exists():
        raise InvalidConfig(f"{key}={value!r}: no such file or folder under the allowed roots")
    return real


def confine_data_paths(config: RunConfig, roots: Sequence[Path]) -> RunConfig:
    """The config with data.corpus / data.tokenizer_dir replaced by their resolved paths inside
    ``roots`` (the bundled corpus and an empty tokenizer folder name no path and pass as they are).
    A corpus inside the roots must also be one (aah_core.data.corpus.check_corpus: text, bounded)."""
    changes: dict[str, Any] = {}  # str fields of DataConfig (PATH_SETTINGS), typed Any for dataclasses.replace
    for name, no_path in PATH_SETTINGS.items():
        value = getattr(config.data, name)
        if value != no_path:
            changes[name] = str(confine(value, roots, f"data.{name}"))
    if "corpus" in changes:
        check_corpus(changes["corpus"])
    if not changes:
        return config
    return dataclasses.replace(config, data=dataclasses.replace(config.data, **changes))
