"""Data: corpora, tokenizers, synthetic long-range tasks and deterministic batching."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from aah_core.config import DataConfig
from aah_core.data.corpus import Corpus, load_corpus
from aah_core.data.synthetic import copy_chance, copy_sequences, recall_sequences
from aah_core.data.tokenizers import ByteTokenizer, Tokenizer, make_tokenizer
from aah_core.shipped import shipped_data_dir

__all__ = ["ByteTokenizer", "Corpus", "DataStream", "EvalBatch", "Tokenizer", "copy_chance", "make_tokenizer"]

EVAL_SEED = 1234
EVAL_SETS = ("mixed", "text", "english", "copy")
ENGLISH_TEXT = shipped_data_dir() / "corpus" / "english.txt"
# evaluation copy spans start above the small windows, so cutting a recall head below them shows
EVAL_COPY_MIN_SPAN = 50


@dataclass
class EvalBatch:
    idx: torch.Tensor  # [B, T]
    targets: torch.Tensor  # [B, T], -1 = ignored
    kinds: list[str]  # "text" | "copy" | "recall" per row

    def to(self, device: torch.device | str) -> "EvalBatch":
        """The same batch with its tensors on `device` (the batch itself when already there)."""
        device = torch.device(device)
        if self.idx.device == device:
            return self
        return EvalBatch(self.idx.to(device), self.targets.to(device), self.kinds)


class DataStream:
    """Training batches (seeded, per rank) and fixed evaluation batches for one data config."""

    def __init__(self, cfg: DataConfig, seq_len: int, seed: int = 0, rank: int = 0,
                 tokenizer: Tokenizer | None = None, eval_only: bool = False) -> None:
        """`tokenizer` overrides the one cfg names (a model's own, e.g. a Hugging Face tokenizer);
        `eval_only` tokenizes only the validation split (no train_batch then)."""
        self.cfg = cfg
        self.seq_len = seq_len
        self.tokenizer = tokenizer or make_tokenizer(cfg.tokenizer, cfg.tokenizer_dir)
        self._english: torch.Tensor | None = None
        self.corpus = load_corpus(cfg.corpus, self.tokenizer, cfg.val_fraction, with_train=not eval_only)
        if len(self.corpus.val) <= seq_len + 1:
            raise ValueError(f"validation split ({len(self.corpus.val)} tokens) is shorter than seq_len+1")
        self.gen = torch.Generator().manual_seed(seed * 1000 + rank)

    @property
    def data_hash(self) -> str:
        return self.corpus.data_hash

    def _text(self, ids: torch.Tensor, n: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        starts = torch.randint(len(ids) - self.seq_len - 1, (n,), generator=gen)
        rows = torch.stack([ids[s : s + self.seq_len + 1] for s in starts.tolist()])  # (n, T+1)
        return rows[:, :-1], rows[:, 1:]

    def _synthetic(self, n: int, gen: torch.Generator, min_span: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.cfg.synthetic == "recall":
            x, y, _ = recall_sequences(self.tokenizer, n, self.seq_len, gen)
        else:
            max_span = min(self.cfg.copy_max_span, self.seq_len - 1)
            x, y, _ = copy_sequences(self.tokenizer, n, self.seq_len, min(min_span, max_span), max_span, gen,
                                     self.cfg.copy_max_lead)
        return x, y

    def train_batch(self, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """A training batch [B, T]: text windows mixed with synthetic sequences by data.synthetic_fraction."""
        n_syn = 0 if self.cfg.synthetic == "none" else round(batch_size * self.cfg.synthetic_fraction)
        xs, ys = [], []
        if batch_size - n_syn:
            x, y = self._text(self.corpus.train, batch_size - n_syn, self.gen)
            xs.append(x)
            ys.append(y)
        if n_syn:
            x, y = self._synthetic(n_syn, self.gen, self.cfg.copy_min_span)
            xs.append(x)
            ys.append(y)
        return torch.cat(xs), torch.cat(ys)

    def _spaced(self, ids: torch.Tensor, n: int, kind: str) -> EvalBatch:
        """n evenly spaced windows of seq_len+1 tokens over ids: deterministic and spread out."""
        if len(ids) <= self.seq_len + 1:
            raise ValueError(f"the {kind} eval set has {len(ids)} tokens, fewer than seq_len+1={self.seq_len + 1}")
        stride = max(1, (len(ids) - self.seq_len - 1) // max(n, 1))
        rows = torch.stack([ids[i * stride : i * stride + self.seq_len + 1] for i in range(n)])
        return EvalBatch(rows[:, :-1], rows[:, 1:], [kind] * n)

    def english_ids(self) -> torch.Tensor:
        """The bundled English text (data/corpus/english.txt) in this stream's tokenizer."""
        if self._english is None:
            self._english = torch.tensor(self.tokenizer.encode(ENGLISH_TEXT.read_text(encoding="utf-8")), dtype=torch.long)
        return self._english

    def eval_batch(self, kind: str, n: int) -> EvalBatch:
        """A fixed batch: the same n sequences every time for the same config.

        kind: text (the corpus' validation split) | english (the bundled English text) | copy | mixed (text + copy).
        """
        if kind not in EVAL_SETS:
            raise ValueError(f"eval set must be one of {', '.join(map(repr, EVAL_SETS))}; got {kind!r}")
        if kind == "mixed":
            text, syn = self.eval_batch("text", n - n // 2), self.eval_batch("copy", n // 2)
            return EvalBatch(torch.cat((text.idx, syn.idx)), torch.cat((text.targets, syn.targets)), text.kinds + syn.kinds)
        gen = torch.Generator().manual_seed(EVAL_SEED)
        if kind == "text":
            return self._spaced(self.corpus.val, n, "text")
        if kind == "english":
            return self._spaced(self.english_ids(), n, "english")
        if self.cfg.synthetic == "none":
            raise ValueError("this model was trained without a synthetic task (data.synthetic='none')")
        x, y = self._synthetic(n, gen, EVAL_COPY_MIN_SPAN)
        return EvalBatch(x, y, [self.cfg.synthetic] * n)
