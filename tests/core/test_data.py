import math

import pytest
import torch

from aah_core.config import DataConfig
from aah_core.data import DataStream, copy_chance
from aah_core.data.synthetic import copy_sequences, recall_sequences
from aah_core.data.tokenizers import ByteTokenizer, make_tokenizer
from aah_core.errors import InvalidConfig


def test_default_corpus_split_and_hash_are_deterministic():
    a, b = DataStream(DataConfig(), 64), DataStream(DataConfig(), 64)
    assert a.data_hash == b.data_hash
    assert torch.equal(a.corpus.val, b.corpus.val)
    assert len(a.corpus.train) > 10 * len(a.corpus.val) > 0
    assert torch.equal(a.eval_batch("mixed", 6).idx, b.eval_batch("mixed", 6).idx)
    assert torch.equal(a.train_batch(4)[0], b.train_batch(4)[0])  # same seed, same batches


def test_user_file_corpus_and_hash_changes_with_content(tmp_path):
    f = tmp_path / "t.txt"
    f.write_text("hello world " * 200)
    h1 = DataStream(DataConfig(corpus=str(f)), 32).data_hash
    f.write_text("hello there " * 200)
    assert DataStream(DataConfig(corpus=str(f)), 32).data_hash != h1


def test_missing_corpus_is_a_clear_error(tmp_path):
    with pytest.raises(InvalidConfig, match=r"neither a bundled corpus \(default, english\) nor an existing file"):
        DataStream(DataConfig(corpus=str(tmp_path / "nope")), 32)


def test_the_english_corpus_is_bundled_beside_the_code_corpus():
    """Issue 27's second corpus: data.corpus=english is prose, split by document, and names no path."""
    from aah_core.data.corpus import BUNDLED_CORPORA
    from aah_core.paths import confine_data_paths
    from aah_core.presets import get_preset

    english, code = (DataStream(DataConfig(corpus=c), 32, eval_only=True) for c in ("english", "default"))
    assert english.corpus.name == BUNDLED_CORPORA["english"].name and english.data_hash != code.data_hash
    rate = {name: (t.count(" the ") / len(t), t.count("self.") / len(t)) for name, t in
            (("english", bytes(english.corpus.val.tolist()).decode()), ("code", bytes(code.corpus.val.tolist()).decode()))}
    assert rate["english"][0] > 2 * rate["code"][0] and rate["english"][1] < rate["code"][1] / 10  # prose, not source
    cfg = get_preset("tiny")
    cfg.data.corpus = "english"
    assert confine_data_paths(cfg, roots=[]) is cfg  # a bundled corpus is no user path: no root is needed


def test_copy_task_answers_are_exactly_span_back():
    gen = torch.Generator().manual_seed(0)
    x, y, spans = copy_sequences(ByteTokenizer(), 8, 64, 5, 20, gen)
    for row in range(8):
        s = int(spans[row])
        answers = (y[row] >= 0).nonzero().flatten()
        assert answers[0] == s - 1 and len(answers) == 64 - s + 1
        for t in answers.tolist():  # target t is token t+1, which equals token t+1-s
            assert y[row, t] == x[row, t + 1 - s]
    assert copy_chance() == pytest.approx(math.log(62))


def test_copy_spans_after_a_random_lead_answer_from_span_back_only():
    args = (ByteTokenizer(), 64, 64, 5, 20)
    x0, y0, spans0 = copy_sequences(*args, torch.Generator().manual_seed(0))
    same = copy_sequences(*args, torch.Generator().manual_seed(0), max_lead=0)
    assert all(torch.equal(a, b) for a, b in zip((x0, y0, spans0), same))  # no lead: the sequences as before
    x, y, spans = copy_sequences(*args, torch.Generator().manual_seed(0), max_lead=64)
    leads = []
    for row in range(64):
        s, answers = int(spans[row]), (y[row] >= 0).nonzero().flatten()
        lead = int(answers[0]) + 1 - s
        assert 0 <= lead <= 64 - s and len(answers) == 64 - s - lead + 1
        assert all(y[row, t] == x[row, t + 1 - s] for t in answers.tolist())  # every answer is span back
        leads.append(lead)
    assert len(set(leads)) > 20 and min(leads) < 10 and max(leads) > 30  # spread over the sequence


def test_recall_task_values_follow_their_keys():
    gen = torch.Generator().manual_seed(1)
    x, y, dist = recall_sequences(ByteTokenizer(), 2, 128, gen)
    row_x, row_y = x[0].tolist(), y[0].tolist()
    answers = [t for t, v in enumerate(row_y) if v >= 0]
    assert answers and (dist > 0).all()
    for t in answers:
        key = row_x[t]  # the query key sits just before the value to recall
        first = row_x.index(key)
        assert row_y[t] == row_x[first + 1]


def test_gpt2_tokenizer_needs_local_files(tmp_path):
    with pytest.raises(InvalidConfig, match="encoder.json and vocab.bpe"):
        make_tokenizer("gpt2", str(tmp_path))
