"""`aah suite paper` on a smoke scale: every row runs per seed, matched rows follow full_adaptive, the report renders."""

import json

from aah_core.cli import main
from aah_core.paper import ROWS
from aah_core.suite import matched_overrides, run_config, run_suite, summarize

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


def test_cli_refuses_a_bad_seed_count(capsys):
    assert main(["suite", "paper", "--seeds", "0", "--doc", ""]) == 2
    assert "--seeds must be between 1 and 10" in capsys.readouterr().err
