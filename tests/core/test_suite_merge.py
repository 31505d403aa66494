"""A suite pack as the source of truth (aah_core/suite_merge.py): its report regenerated from the pack alone equals
the one written from the run folders, and rows trained later merge into it by run identity, refusing duplicates
and runs whose settings differ from the pack's."""

import copy
import gzip
import json
from pathlib import Path

import pytest

from aah_core.cli import main
from aah_core.errors import AAHError
from aah_core.suite_merge import add_to_pack, check_addition, study_from_pack, study_text, write_report
from aah_core.suite_pack import folder_runs, pack_suite, read_pack, run_line
from aah_core.suite_study import RETRIEVAL_SET, render_study, run_study, summarize_study
from tests.core.test_suite import SMOKE

FIRST, LATER = ["baseline", "fixed_window"], ["shallow_freeze"]  # fixed_window at its preset window (no matching)
ALL = ["baseline", "shallow_freeze", "fixed_window"]  # the suite's row order
SHIPPED = Path(__file__).resolve().parents[2] / "data" / "suite" / "paper-mini.jsonl.gz"
SHIPPED_DOC = SHIPPED.parents[2] / "docs" / "reproduction-mini.md"


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


def test_cli_refuses_two_pack_modes(capsys):
    with pytest.raises(SystemExit):
        main(["suite", "paper", "--pack", "a.jsonl.gz", "--add-to-pack", "b.jsonl.gz"])
    assert "not allowed with argument" in capsys.readouterr().err


@pytest.mark.skipif(not SHIPPED.is_file(), reason="the shipped suite file is not in this checkout")
def test_the_shipped_report_is_the_report_of_the_shipped_pack(tmp_path):
    """docs/reproduction-mini.md's generated part, the shipped pack's header summary and its .json are what the
    pack's runs give; the hand-written sections follow."""
    header, runs = read_pack(SHIPPED)
    shipped = study_from_pack(header, runs)
    text = SHIPPED_DOC.read_text()
    generated = study_text(shipped)
    assert text.startswith(generated.rstrip("\n") + "\n\n## ") and "(added by hand)" in text[len(generated):]
    assert json.dumps(header["summary"]["study"], sort_keys=True) == json.dumps(summarize_study(shipped), sort_keys=True)
    write_report(tmp_path / "again.md", shipped)
    assert json.loads((tmp_path / "again.json").read_text())["summary"] == \
        json.loads(SHIPPED_DOC.with_suffix(".json").read_text())["summary"]
    with gzip.open(SHIPPED, "rt") as f:
        assert sum(1 for _ in f) - 1 == sum(len(v) for r in [*shipped["corpora"].values(), *shipped["lr"].values()]
                                            for v in r["rows"].values())
