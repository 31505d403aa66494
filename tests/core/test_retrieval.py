"""Passkey retrieval at a distance (issue 27): a fixed set, 1.0 for a model that copies, chance for a random one,
and `retrieval@<d>` logged at every evaluation of a run that trains with a synthetic task."""

import json
import math

import pytest
import torch

from aah_core import train as train_module
from aah_core.analysis.retrieval import (
    CUE_LEN,
    KEY_LEN,
    MEAN_KEY,
    evaluate_retrieval,
    logged_set,
    metric_key,
    retrieval_chance,
    retrieval_distances,
    retrieval_set,
    retrieval_starts,
    retrieval_table,
)
from aah_core.config import RunConfig, apply_overrides
from aah_core.data import ByteTokenizer
from aah_core.errors import InvalidConfig
from aah_core.model import WindowedGPT
from aah_core.presets import get_preset
from aah_core.suite import SCALES
from aah_core.train import JsonlSink, train

T = 128


class CopyingStandIn(torch.nn.Module):
    """A hand-built model that copies perfectly, the rule an induction head learns: at each position, find
    the earlier position whose preceding tokens match the longest suffix of the context so far, and predict
    the token that followed it there. One-hot logits; it ignores the plan (full attention)."""

    def __init__(self, vocab: int, sources: int = T) -> None:
        super().__init__()
        self.vocab, self.sources = vocab, sources  # it copies only from the first `sources` positions
        self.seq_len, self.tokenizer = T, ByteTokenizer()
        self.anchor = torch.nn.Parameter(torch.zeros(1))  # so the evaluator finds a device
        self.plan = torch.full((1, 1), T)

    def embed(self, idx: torch.Tensor) -> torch.Tensor:
        return idx

    def run_layers(self, idx: torch.Tensor, plan: torch.Tensor, backend: str = "auto") -> torch.Tensor:
        out = torch.zeros(*idx.shape, self.vocab)
        for b, seq in enumerate(idx.tolist()):
            for t in range(len(seq)):
                best, pick = 0, seq[t]
                for j in range(min(t, self.sources)):  # the suffix ending at j that matches the one ending at t
                    n = 0
                    while n <= j and seq[j - n] == seq[t - n]:
                        n += 1
                    if n > best:
                        best, pick = n, seq[j + 1]
                out[b, t, pick] = 1.0
        return out

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        return x


def test_the_set_is_fixed_and_plants_each_key_d_tokens_back():
    assert retrieval_distances(T) == [16, 32, 64, 96, 120]
    a, b = retrieval_set(ByteTokenizer(), T), retrieval_set(ByteTokenizer(), T)
    assert torch.equal(a.idx, b.idx) and torch.equal(a.targets, b.targets)
    assert a.per_distance * len(a.distances) == len(a.idx)
    for i, (x, y) in enumerate(zip(a.idx.tolist(), a.targets.tolist())):
        d = a.distances[i // a.per_distance]
        full = x + [y[-1]]  # the sequence with its last target: the key ends at position T
        answers = [t for t, v in enumerate(y) if v >= 0]
        assert answers == list(range(T - KEY_LEN, T))
        key = full[T + 1 - KEY_LEN:]
        assert full[T + 1 - KEY_LEN - d:T + 1 - d] == key  # the key, d tokens before its reproduction
        cue = full[T + 1 - KEY_LEN - CUE_LEN:T + 1 - KEY_LEN]
        assert sum(full[s:s + CUE_LEN] == cue for s in range(T + 2 - CUE_LEN)) == 2  # only where it was planted


def test_a_model_that_copies_retrieves_every_key():
    rset = retrieval_set(ByteTokenizer(), T, n=8)
    assert evaluate_retrieval(CopyingStandIn(256), rset) == {**{metric_key(d): 1.0 for d in rset.distances},
                                                             MEAN_KEY: 1.0}


def test_a_key_planted_at_a_start_is_reproduced_d_tokens_later():
    assert retrieval_starts(T) == [0, 32, 64, 96]
    rset = retrieval_set(ByteTokenizer(), T, n=4, start=32)
    assert rset.distances == [16, 32, 64]  # 96 and 120 do not fit after 32
    for i, (x, y) in enumerate(zip(rset.idx.tolist(), rset.targets.tolist())):
        d = rset.distances[i // rset.per_distance]
        repeat = 32 + d + CUE_LEN  # where the key is reproduced
        assert [t for t, v in enumerate(y) if v >= 0] == list(range(repeat - 1, repeat - 1 + KEY_LEN))
        assert y[repeat - 1:repeat - 1 + KEY_LEN] == x[32 + CUE_LEN:32 + CUE_LEN + KEY_LEN] == x[repeat:repeat + KEY_LEN]
    with pytest.raises(ValueError, match="no passkey distance fits at T=128 from 121"):
        retrieval_set(ByteTokenizer(), T, start=121)


def test_a_model_that_copies_only_from_the_start_scores_by_where_the_key_sits_not_by_distance():
    # the shape the by-position table exposes: trained with every copy at the sequence's start, a model
    # retrieves far keys (planted early) and misses near ones (planted late) at the end of the sequence
    anchored = CopyingStandIn(256, sources=40)
    at_end = evaluate_retrieval(anchored, retrieval_set(ByteTokenizer(), T, n=4))
    assert at_end[metric_key(16)] == at_end[metric_key(32)] == 0.0 and at_end[metric_key(120)] == 1.0
    from_start = evaluate_retrieval(anchored, retrieval_set(ByteTokenizer(), T, n=4, start=0))
    assert from_start == {**{metric_key(d): 1.0 for d in retrieval_distances(T)}, MEAN_KEY: 1.0}


def test_the_logged_set_plants_the_key_where_the_runs_anchor_says():
    # "end" (the default, and every run before the setting) is the set above; "start" puts every key at the
    # sequence's start, so a model that copies from the start is right at every distance
    anchored = CopyingStandIn(256, sources=40)
    assert logged_set(ByteTokenizer(), T).idx.equal(retrieval_set(ByteTokenizer(), T).idx)
    start = logged_set(ByteTokenizer(), T, "start")
    assert start.idx.equal(retrieval_set(ByteTokenizer(), T, start=0).idx) and start.distances == retrieval_distances(T)
    assert evaluate_retrieval(anchored, start)[MEAN_KEY] == 1.0
    at_end = evaluate_retrieval(anchored, logged_set(ByteTokenizer(), T, "end"))  # near keys sit late: missed
    assert at_end[metric_key(16)] < 0.1 and at_end[metric_key(120)] == 1.0
    with pytest.raises(ValueError, match="retrieval anchor must be one of"):
        logged_set(ByteTokenizer(), T, "middle")
    assert RunConfig().train.retrieval_anchor == "end"  # a config from before the setting reads as it was trained
    with pytest.raises(InvalidConfig, match="train.retrieval_anchor must be 'end' or 'start'"):
        apply_overrides(RunConfig(), {"train.retrieval_anchor": "middle"})


def test_the_table_puts_each_start_beside_the_end_and_leaves_out_what_does_not_fit():
    # a stand-in that copies from the first 40 positions only: keys planted at 0 and 32 are found at every
    # distance that fits, keys at 64 and 96 never, and at the end only the far keys (planted at 25 and 1)
    table = retrieval_table(CopyingStandIn(256, sources=40), n=2)
    assert (table.distances, table.starts) == ([16, 32, 64, 96, 120], [0, 32, 64, 96])
    assert table.end == [0.0, 0.0, 0.0, 1.0, 1.0]
    assert table.by_start == [[1.0] * 5, [1.0, 1.0, 1.0, None, None], [0.0, 0.0, None, None, None],
                              [0.0, None, None, None, None]]


def test_a_random_model_is_at_chance():
    cfg = apply_overrides(get_preset("baseline"), SCALES["mini"])
    torch.manual_seed(0)
    rset = retrieval_set(ByteTokenizer(), T)
    acc = evaluate_retrieval(WindowedGPT(cfg.model).eval(), rset)
    assert acc.pop(MEAN_KEY) == pytest.approx(sum(acc.values()) / len(acc))
    p, n = retrieval_chance(), len(rset.idx) * KEY_LEN
    assert p == 1 / 62  # keys uniform over letters and digits
    # over every key character: within 4 binomial standard errors of chance; no distance far above it
    assert abs(sum(acc.values()) / len(acc) - p) <= 4 * math.sqrt(p * (1 - p) / n)
    assert max(acc.values()) <= p + 4 * math.sqrt(p * (1 - p) / (n / len(acc)))


def test_runs_with_a_synthetic_task_log_retrieval_at_every_evaluation(tmp_path, monkeypatch):
    cfg = apply_overrides(get_preset("tiny"), {"train.max_steps": 4, "train.eval_every": 2})
    train(cfg, tmp_path / "ckpt", [JsonlSink(tmp_path / "m.jsonl")])
    events = [json.loads(line) for line in (tmp_path / "m.jsonl").read_text().splitlines()]
    evals = [e for e in events if "val_loss" in e]
    keys = [metric_key(d) for d in retrieval_distances(cfg.model.seq_len)]
    assert [e["step"] for e in evals] == [2, 4]
    assert all(0.0 <= e[k] <= 1.0 for e in evals for k in keys)
    # a run logs the set of its own anchor
    anchors = []
    real = train_module.logged_set
    monkeypatch.setattr(train_module, "logged_set", lambda tok, t, anchor: anchors.append(anchor) or real(tok, t, anchor))
    train(apply_overrides(cfg, {"train.retrieval_anchor": "start"}), tmp_path / "start", [])
    assert anchors == ["start", "start"]
    plain = apply_overrides(cfg, {"data.synthetic": "none"})
    train(plain, tmp_path / "plain", [JsonlSink(tmp_path / "p.jsonl")])
    assert not any(k.startswith("retrieval@") for line in (tmp_path / "p.jsonl").read_text().splitlines()
                   for k in json.loads(line))
