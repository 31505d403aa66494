"""Passkey retrieval at a distance: a task measure beside the loss (issue 27).

Each sequence plants a short key after a cue in random filler and repeats the cue at the end; the key
must then be reproduced `d` tokens after its first occurrence. Accuracy is the fraction of key characters
whose greedy prediction (teacher-forced, under the model's window plan) is right, per distance d, logged
as `retrieval@<d>` (and `retrieval_mean` over the distances). A head whose window is <= d cannot see the
key from where it must be reproduced, so the curve over d shows what a plan's short windows cost on a
long-range task.
The set is fixed: the same sequences for the same tokenizer and T.

Where the key sits is the run's `train.retrieval_anchor`. "end" (every run before the setting): the repeat
ends the sequence, so a short distance plants the key late, and a model that learned to copy only from the
sequence's start (the copy task starts every span there) scores by where the key sits, not by distance.
"start": the key is planted at the sequence's start and the repeat comes d tokens later, so every distance asks
the same copy from the start and only the distance changes (what a windowed head cannot reach shows as such).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from aah_core.data.synthetic import ALNUM, passkey_sequences
from aah_core.data.tokenizers import Tokenizer
from aah_core.model_api import WindowedLM

RETRIEVAL_SEED = 2718
CUE_LEN = KEY_LEN = 4
# distances as fractions of T: 16, 32, 64, 96, 120 at T=128
FRACTIONS = (1 / 8, 1 / 4, 1 / 2, 3 / 4, 15 / 16)
PER_DISTANCE = 64  # sequences at each distance (256 key characters)


def retrieval_distances(seq_len: int) -> list[int]:
    """The distances tested at context `seq_len`: FRACTIONS of T, kept where a cue and key fit both ends."""
    lo, hi = CUE_LEN + KEY_LEN, seq_len + 1 - CUE_LEN - KEY_LEN
    return sorted({min(hi, max(lo, round(f * seq_len))) for f in FRACTIONS}) if lo <= hi else []


def retrieval_chance() -> float:
    """The accuracy of any guess that does not look at the key: keys are uniform over ALNUM."""
    return 1 / len(ALNUM)


# the key's start for each train.retrieval_anchor: at the sequence's start, or where its repeat ends the sequence
ANCHOR_START: dict[str, int | None] = {"start": 0, "end": None}
MEAN_KEY = "retrieval_mean"  # over every distance (each distance has as many keys)


def metric_key(distance: int) -> str:
    return f"retrieval@{distance}"


@dataclass(frozen=True)
class RetrievalSet:
    distances: list[int]
    idx: torch.Tensor  # [len(distances) * n, T]
    targets: torch.Tensor  # [len(distances) * n, T], -1 off the key

    @property
    def per_distance(self) -> int:
        return len(self.idx) // max(1, len(self.distances))


def retrieval_set(tokenizer: Tokenizer, seq_len: int, n: int = PER_DISTANCE, start: int | None = None) -> RetrievalSet:
    """The fixed evaluation set: n sequences at each distance, from one seeded generator. The planted key
    starts at `start` where given (distances that do not fit from there are left out), else where its
    repeat ends the sequence."""
    gen = torch.Generator().manual_seed(RETRIEVAL_SEED)
    distances = [d for d in retrieval_distances(seq_len) if start is None or start + d + CUE_LEN + KEY_LEN <= seq_len + 1]
    parts = [passkey_sequences(tokenizer, n, seq_len, d, gen, CUE_LEN, KEY_LEN, start) for d in distances]
    if not parts:
        raise ValueError(f"no passkey distance fits at T={seq_len}" + ("" if start is None else f" from {start}"))
    return RetrievalSet(distances, torch.cat([x for x, _ in parts]), torch.cat([y for _, y in parts]))


def logged_set(tokenizer: Tokenizer, seq_len: int, anchor: str = "end") -> RetrievalSet:
    """The set a run logs as `retrieval@<d>` for its `train.retrieval_anchor` ("end" or "start")."""
    if anchor not in ANCHOR_START:
        raise ValueError(f"retrieval anchor must be one of {sorted(ANCHOR_START)}; got {anchor!r}")
    return retrieval_set(tokenizer, seq_len, start=ANCHOR_START[anchor])


def retrieval_starts(seq_len: int) -> list[int]:
    """Where the planted key starts in the by-position table: 0, T/4, T/2 and 3T/4."""
    return sorted({round(f * seq_len) for f in (0, 1 / 4, 1 / 2, 3 / 4)})


@torch.no_grad()
def evaluate_retrieval(model: WindowedLM, rset: RetrievalSet, plan: torch.Tensor | None = None,
                       backend: str = "auto", chunk: int = 64) -> dict[str, float]:
    """{"retrieval@<d>": fraction of key characters predicted right at distance d, and MEAN_KEY over every
    distance} under `plan` (default: the model's own)."""
    plan = model.plan if plan is None else plan
    device = next(model.parameters()).device
    correct = []
    for start in range(0, len(rset.idx), chunk):
        idx, targets = rset.idx[start:start + chunk].to(device), rset.targets[start:start + chunk].to(device)
        keep = targets >= 0
        final = model.run_layers(model.embed(idx), plan, backend=backend)
        logits = model.logits(final[keep].unsqueeze(0))[0]  # [key characters, V]: at the answers only ([B, T, C] in)
        correct.append((logits.argmax(-1) == targets[keep]).view(len(idx), -1).float())
    per_seq = torch.cat(correct).view(len(rset.distances), rset.per_distance, -1)
    out = {metric_key(d): float(acc) for d, acc in zip(rset.distances, per_seq.mean(dim=(1, 2)))}
    return {**out, MEAN_KEY: float(per_seq.mean())}


@dataclass(frozen=True)
class RetrievalTable:
    """Passkey accuracy per distance with the repeat ending the sequence (`end`, as training logs it) and with
    the planted key at fixed starts (`by_start[i][j]`: start i, distance j; None where it does not fit). A model
    that copies only from the sequence's start shows as a high first column over a low `end` at short distances."""

    distances: list[int]
    starts: list[int]
    end: list[float]
    by_start: list[list[float | None]]


def retrieval_table(model: WindowedLM, plan: torch.Tensor | None = None, n: int = PER_DISTANCE,
                    backend: str = "auto") -> RetrievalTable:
    """The table under `plan` (default: the model's own), n sequences per cell, at the model's seq_len."""
    T = model.seq_len
    distances, starts = retrieval_distances(T), retrieval_starts(T)
    at_end = evaluate_retrieval(model, retrieval_set(model.tokenizer, T, n), plan, backend)
    by_start = []
    for start in starts:
        acc = evaluate_retrieval(model, retrieval_set(model.tokenizer, T, n, start=start), plan, backend)
        by_start.append([acc.get(metric_key(d)) for d in distances])
    return RetrievalTable(distances, starts, [at_end[metric_key(d)] for d in distances], by_start)
