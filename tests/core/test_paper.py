"""The paper's numbers live in aah_core.paper, keyed by the presets that reproduce them."""

from aah_core import paper
from aah_core.presets import PRESETS


def test_every_reported_row_is_named_by_its_preset():
    assert paper.PAPER_ROWS == ("baseline", "grouping_off", "full_adaptive", "shallow_freeze", "deep_practical_reuse")
    assert all(PRESETS[row].group == "paper" for row in paper.PAPER_ROWS)


def test_table_metrics_use_the_keys_our_runs_report():
    shallow = next(r for r in paper.ROWS if r.row == "shallow_freeze")
    t1, t2 = paper.table1_metrics(shallow), paper.table2_metrics(shallow)
    assert t1["val_loss"] == 6.5367 and t1["acr"] == 0.3724 and t1["window_frac/full"] == 0.214
    assert t2["infer_tokens_per_s"] == 7053 and "train_loss" not in t2
    baseline = paper.table1_metrics(paper.ROWS[0])
    assert not any(k.startswith("window_frac/") for k in baseline) and "mean_acr_after_warmup" not in baseline
