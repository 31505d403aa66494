"""Text corpora: the bundled default (offline, redistributable) or any user text file / folder.

The split is by document (every k-th document goes to validation) so it never depends on
sampling; the content hash covers the documents, the tokenizer and the split rule.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from aah_core.data.tokenizers import Tokenizer
from aah_core.errors import InvalidConfig
from aah_core.shipped import shipped_data_dir

DEFAULT_CORPUS = shipped_data_dir() / "corpus" / "python-stdlib-3.11.jsonl.gz"
# the bundled corpora by the name data.corpus gives them: code (the default) and English prose
BUNDLED_CORPORA = {"default": DEFAULT_CORPUS, "english": shipped_data_dir() / "corpus" / "python-docs-3.11.jsonl.gz"}
SEPARATOR = "\n\n"
TEXT_SUFFIXES = (".txt", ".md", ".py", ".rst")
# A corpus is read whole into memory and tokenized: bound what a path may bring in, and how far a
# folder is walked to find out (a folder such as /usr is refused after MAX_CORPUS_ENTRIES, not read).
MAX_CORPUS_BYTES = 256 << 20
MAX_CORPUS_ENTRIES = 20_000


@dataclass
class Corpus:
    train: torch.Tensor  # [N] int64 token ids
    val: torch.Tensor
    data_hash: str
    name: str


def corpus_files(folder: Path) -> list[Path]:
    """The text files of a corpus folder, sorted; symlinks that leave the folder are skipped. Refuses a
    folder with no text files, more than MAX_CORPUS_ENTRIES entries or more than MAX_CORPUS_BYTES of text."""
    root = folder.resolve()
    files: list[Path] = []
    entries = size = 0
    folders = [root]
    while folders:
        with os.scandir(folders.pop()) as listing:  # DirEntry caches its type: one syscall per entry at most
            for entry in listing:
                entries += 1
                if entries > MAX_CORPUS_ENTRIES:
                    raise InvalidConfig(f"data.corpus folder {str(folder)!r} has more than {MAX_CORPUS_ENTRIES:,} "
                                        "entries; it is not a corpus (point at a folder of text files)")
                if entry.is_dir(follow_symlinks=False):  # symlinked folders are not entered
                    folders.append(Path(entry.path))
                elif entry.name.endswith(TEXT_SUFFIXES) and entry.is_file():
                    path = Path(entry.path)
                    if entry.is_symlink() and not path.resolve().is_relative_to(root):
                        continue
                    files.append(path)
                    size += entry.stat().st_size
                    if size > MAX_CORPUS_BYTES:
                        raise _too_large(folder)
    if not files:
        raise InvalidConfig(f"data.corpus folder {str(folder)!r} holds no {'/'.join(TEXT_SUFFIXES)} files")
    return sorted(files)


def _too_large(path: Path) -> InvalidConfig:
    return InvalidConfig(f"data.corpus {str(path)!r} holds more than {MAX_CORPUS_BYTES >> 20} MiB of text; "
                         "use a smaller corpus")


def check_corpus(source: str) -> list[Path]:
    """The files a corpus source names ([] for a bundled corpus), after refusing one that cannot be used
    (missing, no text, too large): only names and sizes are looked at, nothing is read."""
    if source in BUNDLED_CORPORA:
        return []
    path = Path(source).expanduser()
    if path.is_file():
        if not path.name.endswith(TEXT_SUFFIXES):  # never a database, a log or a weights file
            raise InvalidConfig(f"data.corpus file {path.name!r} is not a text file; a corpus file ends in "
                                f"{'/'.join(TEXT_SUFFIXES)}")
        if path.stat().st_size > MAX_CORPUS_BYTES:
            raise _too_large(path)
        return [path]
    if path.is_dir():
        return corpus_files(path)
    raise InvalidConfig(f"data.corpus={source!r} is neither a bundled corpus ({', '.join(BUNDLED_CORPORA)}) "
                        "nor an existing file or folder")


def _read_documents(source: str) -> tuple[list[tuple[str, str]], str]:
    """(name, text) documents in a fixed order, and a display name for the source."""
    if source in BUNDLED_CORPORA:
        with gzip.open(BUNDLED_CORPORA[source], "rt", encoding="utf-8") as f:
            docs = [(d["name"], d["text"]) for d in map(json.loads, f)]
        return docs, BUNDLED_CORPORA[source].name
    files, path = check_corpus(source), Path(source).expanduser()
    names = [path.name] if path.is_file() else [str(p.relative_to(path.resolve())) for p in files]
    return [(name, p.read_text(encoding="utf-8", errors="replace")) for name, p in zip(names, files)], path.name


def load_corpus(source: str, tokenizer: Tokenizer, val_fraction: float, with_train: bool = True) -> Corpus:
    """Tokenise a corpus and split it deterministically into train and validation ids (train left
    empty when not `with_train`: evaluation needs only the validation split)."""
    docs, name = _read_documents(source)
    digest = hashlib.sha256(f"{tokenizer.name}|{val_fraction}".encode())
    every = max(2, round(1 / val_fraction))
    train_text, val_text = [], []
    if len(docs) == 1:  # one file: the last val_fraction of it is validation
        text = docs[0][1]
        cut = int(len(text) * (1 - val_fraction))
        train_text, val_text = [text[:cut]], [text[cut:]]
        digest.update(text.encode())
    else:
        for i, (doc_name, text) in enumerate(docs):
            digest.update(doc_name.encode() + b"\0" + text.encode() + b"\0")
            (val_text if i % every == every // 2 else train_text).append(text)
    train = torch.tensor(tokenizer.encode(SEPARATOR.join(train_text)) if with_train else [], dtype=torch.long)
    val = torch.tensor(tokenizer.encode(SEPARATOR.join(val_text)), dtype=torch.long)
    if len(val) < 2 or (with_train and len(train) < 2):
        raise InvalidConfig(f"corpus {name!r} is too small to split (train {len(train)}, val {len(val)} tokens)")
    return Corpus(train=train, val=val, data_hash=digest.hexdigest()[:16], name=name)
