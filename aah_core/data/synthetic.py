"""Synthetic long-range tasks with a known dependency distance.

- copy: a random span of S characters repeated to fill the sequence, after a lead of o random characters
  (o = 0 unless a maximum lead is given); every token at position >= o + S is predictable from the token
  exactly S positions earlier (distance S). Without a lead the first copy always sits at the sequence's
  start, and a model can learn to copy from there only: it then fails to retrieve a key planted further
  in (docs/reproduction-mini.md measures it).
- recall: key-value pairs, then the keys again in a new order; each value must be recalled
  from where its key appeared (distance = gap between the two occurrences).
Only answer positions carry targets; the rest are -1 (ignored), so the loss on these
sequences measures long-range ability alone. Chance is ln(alphabet size).
"""

from __future__ import annotations

import math
import string

import torch

from aah_core.data.tokenizers import Tokenizer

ALNUM = string.ascii_letters + string.digits  # 62 characters
KEYS = string.ascii_letters  # 52 recall keys
VALUES = string.digits


def _ids(tokenizer: Tokenizer, chars: str) -> torch.Tensor:
    ids = [tokenizer.encode(c) for c in chars]
    if any(len(i) != 1 for i in ids):
        raise ValueError("synthetic tasks need every alphabet character to be a single token")
    return torch.tensor([i[0] for i in ids], dtype=torch.long)


def copy_chance() -> float:
    return math.log(len(ALNUM))


def copy_sequences(
    tokenizer: Tokenizer, n: int, seq_len: int, min_span: int, max_span: int, gen: torch.Generator,
    max_lead: int = 0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """n copy sequences: x, y [n, T] (y = -1 off the answers) and the span S of each [n].

    Each span starts after a lead of random characters, uniform in [0, min(max_lead, T - S)] (so at least
    one answer remains); max_lead = 0 draws nothing for it, so those sequences are the same as before
    leads existed."""
    alphabet = _ids(tokenizer, ALNUM)
    spans = torch.randint(min_span, max_span + 1, (n,), generator=gen)
    seqs = torch.empty(n, seq_len + 1, dtype=torch.long)
    y_mask = torch.zeros(n, seq_len, dtype=torch.bool)
    for i, s in enumerate(spans.tolist()):
        span = alphabet[torch.randint(len(alphabet), (s,), generator=gen)]
        lead = 0
        if max_lead > 0:
            lead = int(torch.randint(min(max_lead, seq_len - s) + 1, (1,), generator=gen))
            seqs[i, :lead] = alphabet[torch.randint(len(alphabet), (lead,), generator=gen)]
        seqs[i, lead:] = span.repeat(math.ceil((seq_len + 1 - lead) / s))[: seq_len + 1 - lead]
        y_mask[i, lead + s - 1 :] = True  # target at t is token t+1, an answer when t+1 >= lead + s
    y = seqs[:, 1:].masked_fill(~y_mask, -1)
    return seqs[:, :-1], y, spans


def recall_sequences(
    tokenizer: Tokenizer, n: int, seq_len: int, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """n recall sequences 'Kv Kv ... | K?' : x, y [n, T] and the mean key-to-query distance [n]."""
    keys, values, bar = _ids(tokenizer, KEYS), _ids(tokenizer, VALUES), _ids(tokenizer, "|")
    n_pairs = min(len(KEYS), (seq_len - 1) // 4)
    x = torch.empty(n, seq_len + 1, dtype=torch.long)
    y_mask = torch.zeros(n, seq_len, dtype=torch.bool)
    distances = torch.empty(n)
    for i in range(n):
        order = torch.randperm(len(KEYS), generator=gen)[:n_pairs]
        vals = values[torch.randint(len(VALUES), (n_pairs,), generator=gen)]
        pairs = torch.stack((keys[order], vals), dim=1).flatten()  # K v K v ...
        query_order = torch.randperm(n_pairs, generator=gen)
        queries = torch.stack((keys[order[query_order]], vals[query_order]), dim=1).flatten()
        seq = torch.cat((pairs, bar, queries))
        seq = torch.cat((seq, bar.repeat(seq_len + 1 - len(seq))))[: seq_len + 1]
        x[i] = seq
        start = 2 * n_pairs + 1
        answer_pos = start + 2 * torch.arange(n_pairs) + 1  # positions of recalled values
        answer_pos = answer_pos[answer_pos <= seq_len]
        y_mask[i, answer_pos - 1] = True
        distances[i] = (answer_pos - (2 * query_order[: len(answer_pos)] + 1)).float().mean()
    y = x[:, 1:].masked_fill(~y_mask, -1)
    return x[:, :-1], y, distances


def passkey_sequences(
    tokenizer: Tokenizer, n: int, seq_len: int, distance: int, gen: torch.Generator, cue_len: int = 4, key_len: int = 4,
    first: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """n passkey sequences: random filler with a cue and a key planted once at position `first`, then the cue
    again and the key to reproduce, `distance` tokens after its first occurrence (x, y [n, T]; y = -1 off the
    key). By default the repeat ends the sequence (the question comes last, as in a needle-in-a-haystack
    test); a smaller `first` moves both copies towards the start, distance unchanged.

    The cue appears exactly twice in each sequence (resampled otherwise), so the planted key is the only
    one a model that copies can retrieve. Chance is 1 / len(ALNUM) per key character.
    """
    alphabet = _ids(tokenizer, ALNUM)
    needle = cue_len + key_len
    if not needle <= distance <= seq_len + 1 - needle:
        raise ValueError(f"passkey distance must be in [{needle}, {seq_len + 1 - needle}] at T={seq_len}; got {distance}")
    last = seq_len + 1 - needle - distance  # the latest start: the repeat then ends at position T
    first = last if first is None else first
    if not 0 <= first <= last:
        raise ValueError(f"a passkey at distance {distance} starts in [0, {last}] at T={seq_len}; got {first}")
    key = slice(first + distance + cue_len, first + distance + needle)  # the repeated key's positions
    x = torch.empty(n, seq_len + 1, dtype=torch.long)
    for i in range(n):
        while True:
            seq = alphabet[torch.randint(len(alphabet), (seq_len + 1,), generator=gen)]
            seq[first + distance : first + distance + needle] = seq[first : first + needle]
            windows = seq.unfold(0, cue_len, 1)  # every cue_len-gram; the cue must occur at its two places only
            if int((windows == seq[first : first + cue_len]).all(dim=1).sum()) == 2:
                break
        x[i] = seq
    y = torch.full((n, seq_len), -1, dtype=torch.long)
    y[:, key.start - 1 : key.stop - 1] = x[:, key]  # target t is token t+1
    return x[:, :-1], y
