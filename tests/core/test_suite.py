"""`aah suite paper` on a smoke scale: every row runs per seed, matched rows follow full_adaptive, the report renders."""

import json

from aah_core.cli import main
from aah_core.paper import ROWS
from aah_core.suite import bucket_shares, matched_overrides, run_config, run_suite, summarize

SMOKE = {"model.n_layer": 2, "model.d_model": 32, "model.seq_len": 32, "model.buckets": [4, 8, 16, None],
         "train.batch_size": 2, "train.max_steps": 3, "train.eval_every": 3, "train.eval_batches": 1,
         "train.warmup_steps": 1, "controller.warmup_steps": 1, "controller.control_interval": 1}


def test_suite_runs_rows_over_seeds_and_writes_the_report(tmp_path):
    lines = []
    rows = ["baseline", "full_adaptive", "fixed_window", "sink_window", "local_global", "learned_budget"]
    report = run_suite(seeds=2, out=tmp_path / "runs", doc=tmp_path / "repro.md", overrides=SMOKE,
                       rows=rows, log=lines.append, command="aah suite paper --seeds 2")
    assert {name: len(runs) for name, runs in report["rows"].items()} == dict.fromkeys(rows, 2)
    matched = sum(r["causal_coverage"] for r in report["rows"]["full_adaptive"]) / 2
    assert report["rows"]["learned_budget"][0]["controller"]["budget"] == round(matched, 4)
    for row in ("fixed_window", "sink_window", "local_global"):  # the settings matching computes, as trained
        cfg = run_config(row, "tiny", 0, "faithful", None, SMOKE)
        wanted = {k.split(".", 1)[1]: v for k, v in matched_overrides(row, cfg, matched).items()}
        assert wanted.items() <= report["rows"][row][0]["controller"].items()
    text = (tmp_path / "repro.md").read_text()
    assert "aah suite paper --seeds 2" in text and "| full_adaptive |" in text
    assert all(f"| {row.row} | {row.table1.val_loss:.4f} |" in text for row in ROWS)  # the paper's numbers beside ours
    summary = summarize(report)
    assert set(summary["full_adaptive"]["delta_vs_baseline"]) == {"mean", "std", "ci95", "within_noise"}
    saved = json.loads((tmp_path / "repro.json").read_text())
    assert saved["summary"]["baseline"]["seeds"] == 2
    # finished runs are reused: a second call trains nothing
    again = []
    run_suite(seeds=2, out=tmp_path / "runs", doc=None, overrides=SMOKE, rows=["baseline"], log=again.append)
    assert not any("..." in line for line in again) and any("..." in line for line in lines)
    # ... unless their settings are not the ones asked for now: those are trained again, and the log says why
    # (the thread count is no setting of a run)
    changed = []
    first = (tmp_path / "runs" / "baseline-s1" / "result.json").read_text()
    run_suite(seeds=2, out=tmp_path / "runs", doc=None, rows=["baseline"], log=changed.append,
              overrides={**SMOKE, "train.retrieval_anchor": "start", "train.threads": 1})
    assert sum("trained with other settings (train.retrieval_anchor 'end' -> 'start')" in line for line in changed) == 2
    assert sum(line.endswith("...") for line in changed) == 2
    assert (tmp_path / "runs" / "baseline-s1" / "result.json").read_text() != first
    (tmp_path / "runs" / "baseline-s0" / "ckpt" / "config.json").unlink()  # a finished run whose settings cannot be read
    unreadable = []
    run_suite(seeds=2, out=tmp_path / "runs", doc=None, rows=["baseline"], log=unreadable.append,
              overrides={**SMOKE, "train.retrieval_anchor": "start"})
    assert [line.split(" ...")[0].split("] ")[1] for line in unreadable if line.endswith("...")] == ["baseline seed 0"]
    assert any("no readable checkpoint" in line for line in unreadable)


def test_window_shares_count_the_heads_between_buckets():
    # a sink_window or local_global row's windows (28, 17) are no bucket: their heads are "other", never dropped
    assert bucket_shares({"16": 0.0, "32": 0.0, "64": 0.0, "full": 0.25, "17": 0.75}, ["16", "32", "64", "full"]) \
        == [0.0, 0.0, 0.0, 0.25, 0.75]
    assert bucket_shares({"16": 0.5, "32": 0.5}, ["16", "32", "64", "full"]) == [0.5, 0.5, 0.0, 0.0, 0.0]


def test_cli_refuses_a_bad_seed_count(capsys):
    assert main(["suite", "paper", "--seeds", "0", "--doc", ""]) == 2
    assert "--seeds must be between 1 and 10" in capsys.readouterr().err


def test_study_pairs_adaptive_rows_with_the_matched_baselines_by_seed():
    """Issue 27: each adaptive row against fixed_window / sink_window / local_global, paired seed by seed, on the
    text loss and mean retrieval; rankings that change between corpora are listed pair by pair."""
    from aah_core.suite import paired
    from aah_core.suite_study import matched_comparisons, order_changes

    def runs(mode, losses, retrieval):
        return [{"controller": {"mode": mode}, "val_text_loss": v, "retrieval_mean": r} for v, r in zip(losses, retrieval)]

    rows = {"baseline": runs("static", [2.0, 2.1, 2.2], [0.5, 0.5, 0.5]),
            "full_adaptive": runs("aah", [1.9, 2.05, 2.1], [0.4, 0.45, 0.41]),
            "fixed_window": runs("static", [2.0, 2.0, 2.0], [0.3, 0.3, 0.3]),
            "local_global": runs("static", [1.95, 2.0, 2.2], [0.5, 0.4, 0.6])}
    got = matched_comparisons(rows)
    assert set(got) == {"full_adaptive"} and set(got["full_adaptive"]) == {"fixed_window", "local_global"}
    for base, d in got["full_adaptive"].items():
        assert d["loss"] == paired([a["val_text_loss"] - b["val_text_loss"] for a, b in zip(rows["full_adaptive"], rows[base])])
        assert d["retrieval_mean"] == paired([a["retrieval_mean"] - b["retrieval_mean"]
                                              for a, b in zip(rows["full_adaptive"], rows[base])])
    assert order_changes(["a", "b", "c"], ["c", "a", "b"]) == [("a", "c"), ("b", "c")]


def test_long_scale_trains_the_tiny_model_longer_with_the_papers_controller_share():
    tiny = run_config("full_adaptive", "tiny", 0, "faithful")
    long = run_config("full_adaptive", "long", 0, "faithful")
    assert (long.train.max_steps, long.train.warmup_steps, long.train.eval_every) == (5000, 100, 500)
    assert long.model == tiny.model and long.data == tiny.data  # the same model and data, only longer
    # the paper's controller warmup is 1 % of its schedule (100 of 10,000 steps), every 5 steps
    assert long.controller["warmup_steps"] / long.train.max_steps == 0.01
    assert long.controller["control_interval"] == 5
    assert run_config("baseline", "long", 0, "faithful").controller.get("mode") != "aah"  # no controller to set
    # its runs copy from the sequence's start, so their logged passkey plants the key there (analysis/retrieval.py)
    assert (long.train.retrieval_anchor, tiny.train.retrieval_anchor) == ("start", "end")
