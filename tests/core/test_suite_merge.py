"""A suite pack as the source of truth (aah_core/suite_merge.py): its report regenerated from the pack alone equals
the one written from the run folders, and rows trained later merge into it by run identity, refusing duplicates
and runs whose settings differ from the pack's."""

import copy
import gzip
import json
import math
from pathlib import Path

import pytest

from aah_core.cli import main
from aah_core.errors import AAHError
from aah_core.suite_merge import add_to_pack, check_addition, study_from_pack, study_text, write_report
from aah_core.suite_pack import folder_runs, pack_suite, read_pack, run_line, thin_history, thin_plans
from aah_core.suite_study import RETRIEVAL_SET, render_study, run_study, summarize_study
from tests.core.test_suite import SMOKE

FIRST, LATER = ["baseline", "fixed_window"], ["shallow_freeze"]  # fixed_window at its preset window (no matching)
ALL = ["baseline", "shallow_freeze", "fixed_window"]  # the suite's row order
ROOT = Path(__file__).resolve().parents[2]
# each shipped pack and the report written from it
SHIPPED = [(ROOT / "data" / "suite" / f"paper-{scale}.jsonl.gz", ROOT / "docs" / f"reproduction-{scale}.md")
           for scale in ("mini", "long")]


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """Every row on both corpora (2 seeds) in one folder, trained once."""
    out = tmp_path_factory.mktemp("study")
    smoke = {**SMOKE, "train.max_steps": 2, "train.eval_every": 2}
    got = run_study("tiny", 2, out, ["code", "english"], False, out / "report.md", rows=ALL,
                    overrides=smoke, command=f"aah suite paper --seeds 2 --rows {','.join(ALL)}")
    return out, got


def _first_rows_pack(out: Path, study: dict, dest: Path) -> None:
    """The pack as shipped before the later rows: FIRST only, with the study's header as pack_suite writes it."""
    first = {**study, "corpora": {c: {**r, "rows": {k: v for k, v in r["rows"].items() if k in FIRST}}
                                  for c, r in study["corpora"].items()}}
    pack_suite(out, dest, {"study": summarize_study(first)}, rows=FIRST)


def test_the_report_of_a_pack_is_the_report_of_its_run_folders(study, tmp_path):
    out, got = study
    dest = tmp_path / "all.jsonl.gz"
    pack_suite(out, dest)
    header, runs = read_pack(dest)
    again = study_from_pack(header, runs)
    assert study_text(again) == render_study(got) == (out / "report.md").read_text()
    assert json.dumps(summarize_study(again), sort_keys=True) == json.dumps(summarize_study(got), sort_keys=True)


def test_the_report_says_where_its_runs_planted_the_passkey(study):
    _, got = study  # tiny scale: the key's repeat ends the sequence, as in every suite before the setting
    assert RETRIEVAL_SET["end"] in render_study(got) and RETRIEVAL_SET["start"] not in render_study(got)
    start = {**got, "corpora": {c: {**r, "settings": {**r["settings"], "train.retrieval_anchor": "start"}}
                                for c, r in got["corpora"].items()}}
    assert RETRIEVAL_SET["start"] in render_study(start) and RETRIEVAL_SET["end"] not in render_study(start)


def test_later_rows_merge_into_the_pack_as_if_packed_together(study, tmp_path):
    out, got = study
    dest, together = tmp_path / "pack.jsonl.gz", tmp_path / "together.jsonl.gz"
    _first_rows_pack(out, got, dest)
    pack_suite(out, together)
    n, merged = add_to_pack(out, dest, LATER, command="aah suite paper --seeds 2 --rows shallow_freeze",
                            machine={"cpu": "test cpu"})
    assert n == len(LATER) * 2 * 2
    header, runs = read_pack(dest)
    _, expected = read_pack(together)
    assert [run_line(r) for r in runs] == [run_line(r) for r in expected]  # every line, in pack_suite's order
    assert header["command"] == f"aah suite paper --seeds 2 --rows {','.join(ALL)}"
    (added,) = header["additions"]
    assert added["rows"] == LATER and added["runs"] == n and added["machine"] == {"cpu": "test cpu"}
    assert json.dumps(header["summary"]["study"], sort_keys=True) == json.dumps(summarize_study(got), sort_keys=True)
    assert list(merged["corpora"]["english"]["rows"]) == ALL
    assert "Added to the pack later" in study_text(merged) and "shallow_freeze, 4 runs by" in study_text(merged)
    before = dest.read_bytes()
    with pytest.raises(AAHError, match="shallow_freeze seed 0 .* already in the pack"):
        add_to_pack(out, dest, LATER)
    assert dest.read_bytes() == before  # refused: nothing written


def test_a_run_with_other_settings_or_seeds_than_the_pack_is_refused(study, tmp_path):
    out, got = study
    dest = tmp_path / "pack.jsonl.gz"
    _first_rows_pack(out, got, dest)
    header, runs = read_pack(dest)
    packed = [run_line(r) for r in runs]
    new = folder_runs(out, LATER)
    check_addition(header, packed, new)  # as trained: accepted
    for change, message in ((lambda r: r["config"]["train"].update(max_steps=3), "train.max_steps 3 .pack: 2"),
                            (lambda r: r["config"]["data"].update(synthetic="none"), "data.synthetic"),
                            (lambda r: r["config"]["train"].update(seed=1), "train.seed 1 .pack: 0"),
                            (lambda r: r["meta"].update(data_hash="other"), "data hash 'other'"),
                            (lambda r: r["config"]["controller"].update(warmup_steps=7), "controller.warmup_steps 7"),
                            (lambda r: r.update(seed=2), "no run of that seed"),
                            (lambda r: r.update(impl="fixed"), "controller impl 'fixed'")):
        bad = copy.deepcopy(new)
        change(bad[0])
        with pytest.raises(AAHError, match=message):
            check_addition(header, packed, bad)
    with pytest.raises(AAHError, match="already in the pack"):  # twice in one addition
        check_addition(header, packed, new + new[:1])


def test_cli_writes_the_report_from_a_pack_and_keeps_the_hand_written_sections(study, tmp_path, capsys):
    out, got = study
    dest, doc = tmp_path / "pack.jsonl.gz", tmp_path / "doc.md"
    pack_suite(out, dest)
    hand = "## How it was run (added by hand)\n\nWritten by a person.\n"
    doc.write_text("# stale generated text\n\n" + hand)
    assert main(["suite", "paper", "--from-pack", str(dest), "--doc", str(doc)]) == 0
    assert doc.read_text() == render_study(got).rstrip("\n") + "\n\n" + hand
    assert json.loads(doc.with_suffix(".json").read_text())["summary"]["rankings"] == summarize_study(got)["rankings"]


def test_a_thinned_history_keeps_every_kth_step_each_evaluation_each_extreme_and_each_non_finite_value():
    events = [{"step": t, "time": 1.0 * t, "train_loss": 5.0 - t / 100, "lr": 1e-3} for t in range(1, 101)]
    events[36]["train_loss"] = 9.0  # a spike at step 37
    events[52]["train_loss"] = math.nan  # a divergence at step 53, in a window whose other steps look fine
    events[64]["train_loss"] = -1.0  # a dip at step 65
    events[49].update(val_loss=3.0, retrieval_mean=0.5)  # an evaluation at step 50 (a multiple: kept anyway)
    events.insert(73, {"step": 73, "time": 73.5, "val_loss": 2.5, "retrieval@16": 0.1})  # one at step 73, its own event
    thinned = thin_history(events, 10)
    kept = [(e["step"], sorted(e)) for e in thinned]
    assert all(e in events for e in thinned) and thinned == sorted(thinned, key=events.index)  # events as they were
    steps = sorted({step for step, _ in kept})
    assert {1, 100} <= set(steps) and {10, 20, 30, 40, 50, 60, 70, 80, 90} <= set(steps)
    assert 37 in steps and 53 in steps and 65 in steps  # the spike, the NaN and the dip
    assert (73, ["retrieval@16", "step", "time", "val_loss"]) in kept
    # in each 10-step window: its multiple, the first/last event, an evaluation, a non-finite value, its lowest and
    # highest train_loss; nothing else (the loss falls steadily, so a window's extremes sit at its ends)
    assert len(thinned) <= 2 + 10 * 3 + 3 and len(thinned) < len(events) / 2
    assert thin_history(events, 1) == events and thin_history([], 10) == []


def test_a_thinned_pack_keeps_the_first_plan_of_each_window_and_the_last():
    plans = [{"step": t, "time": 1.0 * t, "windows": [[t]]} for t in [1, *range(5, 101, 5), 103]]
    assert [p["step"] for p in thin_plans(plans, 20)] == [1, 20, 40, 60, 80, 100, 103]
    assert [p["step"] for p in thin_plans(plans[1:-1], 10)] == [5, *range(10, 101, 10)]  # 5 is window 0's first
    assert thin_plans(plans, 1) == plans and thin_plans([], 20) == []


def test_a_thinned_pack_says_so_reports_as_the_full_one_and_takes_additions_thinned_alike(study, tmp_path):
    out, got = study  # two training steps a run: every = 2 keeps each step (step 1 is the first, step 2 a multiple)
    full, thin = tmp_path / "full.jsonl.gz", tmp_path / "thin.jsonl.gz"
    pack_suite(out, full)
    pack_suite(out, thin, every=2)
    (h_full, runs_full), (h_thin, runs_thin) = read_pack(full), read_pack(thin)
    assert "history_every" not in h_full and h_thin["history_every"] == 2
    assert [r.metrics for r in runs_full] == [r.metrics for r in runs_thin]
    assert study_text(study_from_pack(*read_pack(thin))) == render_study(got)
    partial = tmp_path / "partial.jsonl.gz"  # the first rows thinned, then the later ones merged in
    first = {**got, "corpora": {c: {**r, "rows": {k: v for k, v in r["rows"].items() if k in FIRST}}
                                for c, r in got["corpora"].items()}}
    pack_suite(out, partial, {"study": summarize_study(first)}, rows=FIRST, every=2)
    add_to_pack(out, partial, LATER, command="later")
    assert read_pack(partial)[0]["history_every"] == 2


def test_cli_packs_thinned_histories_and_refuses_a_bad_stride(capsys):
    assert main(["suite", "paper", "--pack", "a.jsonl.gz", "--pack-every", "0"]) != 0
    assert "--pack-every must be >= 1; got 0" in capsys.readouterr().err


def test_cli_refuses_two_pack_modes(capsys):
    with pytest.raises(SystemExit):
        main(["suite", "paper", "--pack", "a.jsonl.gz", "--add-to-pack", "b.jsonl.gz"])
    assert "not allowed with argument" in capsys.readouterr().err


@pytest.mark.parametrize("pack,doc", SHIPPED, ids=[doc.stem for _, doc in SHIPPED])
def test_the_shipped_report_is_the_report_of_the_shipped_pack(pack, doc, tmp_path):
    """docs/reproduction-<scale>.md's generated part, the shipped pack's header summary and its .json are what
    the pack's runs give; the hand-written sections follow."""
    if not pack.is_file():
        pytest.skip(f"{pack.name} is not in this checkout")
    header, runs = read_pack(pack)
    shipped = study_from_pack(header, runs)
    text = doc.read_text()
    generated = study_text(shipped)
    assert text.startswith(generated.rstrip("\n") + "\n\n## ") and "(added by hand)" in text[len(generated):]
    assert json.dumps(header["summary"]["study"], sort_keys=True) == json.dumps(summarize_study(shipped), sort_keys=True)
    write_report(tmp_path / "again.md", shipped)
    assert json.loads((tmp_path / "again.json").read_text())["summary"] == \
        json.loads(doc.with_suffix(".json").read_text())["summary"]
    with gzip.open(pack, "rt") as f:
        assert sum(1 for _ in f) - 1 == sum(len(v) for r in [*shipped["corpora"].values(), *shipped["lr"].values()]
                                            for v in r["rows"].values())
