"""Text corpora: the bundled default (offline, redistributable) or any user text file / folder.

The split is by document (every k-th document goes to validation) so it never depends on
sampling; the content hash covers the documents, the tokenizer and the split rule.
"""

from __future__ import annotations

import gzip
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import torch

from aah_core.data.tokenizers import Tokenizer
from aah_core.errors import InvalidConfig
from aah_core.shipped import shipped_data_dir

DEFAULT_CORPUS = shipped_data_dir() / "corpus" / "python-stdlib-3.11.jsonl.gz"
SEPARATOR = "\n\n"


@dataclass
class Corpus:
    train: torch.Tensor  # [N] int64 token ids
    val: torch.Tensor
    data_hash: str
    name: str


def _read_documents(source: str) -> tuple[list[tuple[str, str]], str]:
    """(name, text) documents in a fixed order, and a display name for the source."""
    if source == "default":
        with gzip.open(DEFAULT_CORPUS, "rt", encoding="utf-8") as f:
            docs = [(d["name"], d["text"]) for d in map(json.loads, f)]
        return docs, DEFAULT_CORPUS.name
    path = Path(source).expanduser()
    if path.is_file():
        return [(path.name, path.read_text(encoding="utf-8", errors="replace"))], path.name
    if path.is_dir():
        root = path.resolve()  # files are read only from inside the folder: symlinks that leave it are skipped
        files = sorted(p for p in path.rglob("*") if p.suffix in (".txt", ".md", ".py", ".rst") and p.is_file()
                       and p.resolve().is_relative_to(root))
        if not files:
            raise InvalidConfig(f"data.corpus folder {str(path)!r} holds no .txt/.md/.py/.rst files")
        return [(str(p.relative_to(path)), p.read_text(encoding="utf-8", errors="replace")) for p in files], path.name
    raise InvalidConfig(f"data.corpus={source!r} is neither 'default' nor an existing file or folder")


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
