"""The shipped reproduction: a packed suite (aah suite ... --pack) seeded into a fresh store as source
'suite' runs, one group per row and one run per seed, with metric histories and window plans."""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient

from aah_core.paper import PAPER_ROWS
from aah_core.suite import LR_SCALES, MATCHED_ROWS, paired, run_suite, summarize
from aah_core.suite_pack import pack_suite, read_pack, thin_history, thin_plans
from aah_core.suite_study import run_study, summarize_study
from backend.app import create_app
from backend.seed.suite import experiment_name
from backend.settings import SHIPPED_SUITES, Settings
from tests.backend.conftest import make_settings
from tests.core.test_suite import SMOKE

API = "/api/v1"
ROWS = ["baseline", "full_adaptive"]
SUITE_ROWS = (*PAPER_ROWS, *MATCHED_ROWS)


@pytest.fixture(scope="module")
def suite_dir(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("suite")
    smoke = {**SMOKE, "train.max_steps": 8, "train.eval_every": 4}
    report = run_suite(seeds=2, out=out, doc=None, overrides=smoke, rows=ROWS, command="aah suite paper --seeds 2")
    return out, report


def _client(tmp_path: Path, *suite_files: Path) -> TestClient:
    settings = make_settings(tmp_path / "data", None, suite_files=list(suite_files), seed_paper=False,
                             preload_models=False)
    return TestClient(create_app(settings), base_url="http://localhost")


def _suite_runs(c: TestClient) -> list[dict]:
    return c.get(f"{API}/runs", params={"source": "suite", "limit": 1000}).json()


def test_pack_holds_every_event_of_every_run(suite_dir, tmp_path):
    out, report = suite_dir
    dest = tmp_path / "suite.jsonl.gz"
    assert pack_suite(out, dest, summarize(report)) == 4
    pack_suite(out, tmp_path / "again.jsonl.gz", summarize(report))
    assert dest.read_bytes() == (tmp_path / "again.jsonl.gz").read_bytes()  # deterministic bytes
    assert pack_suite(out, tmp_path / "baseline.jsonl.gz", rows=["baseline"]) == 2  # a subset of the rows
    header, runs = read_pack(dest)
    assert header["kind"] == "suite" and header["command"] == "aah suite paper --seeds 2"
    runs = list(runs)
    assert sorted((r.row, r.seed) for r in runs) == [(row, s) for row in ROWS for s in (0, 1)]
    for run in runs:
        folder = out / f"{run.row}-s{run.seed}"
        lines = (folder / "ckpt.metrics.jsonl").read_text().splitlines()
        assert run.metrics == [json.loads(line) for line in lines]
        assert run.plans == [json.loads(line) for line in (folder / "ckpt.plans.jsonl").read_text().splitlines()]
        assert run.config["train"]["seed"] == run.seed and run.meta["data_hash"]


def test_fresh_store_seeds_the_pack_as_groups_of_seeds_once(suite_dir, tmp_path):
    out, report = suite_dir
    dest = tmp_path / "suite.jsonl.gz"
    pack_suite(out, dest, summarize(report))
    _, packed = read_pack(dest)
    packed = {(r.row, r.seed): r for r in packed}
    with _client(tmp_path, dest) as c:
        runs = _suite_runs(c)
        assert [(r["group"], r["seed"]) for r in runs] == [(row, s) for row in ROWS for s in (0, 1)]  # rows in order
        for r in runs:
            p = packed[(r["group"], r["seed"])]
            assert r["status"] == "FINISHED" and r["experiment"] == "paper suite · tiny scale"
            assert r["params"]["train.seed"] == str(p.seed) and r["params"]["model.n_layer"] == "2"
            assert "reproduction" in r["tags"] and r["progress"]["step"] == p.metrics[-1]["step"]
            series = c.get(f"{API}/runs/{r['id']}/metrics", params={"keys": "train_loss"}).json()["series"]
            assert series["train_loss"]["value"] == [e["train_loss"] for e in p.metrics if "train_loss" in e]
            steps = c.get(f"{API}/runs/{r['id']}/windows").json()["steps"]
            assert steps == [e["step"] for e in p.plans]
        (grp,) = c.get(f"{API}/runs/groups", params={"source": "suite", "group": "full_adaptive",
                                                     "keys": "val_loss"}).json()
        losses = [packed[("full_adaptive", s)].result["val_loss"] for s in (0, 1)]
        assert grp["seeds"] == [0, 1] and grp["stats"]["val_loss"]["mean"] == pytest.approx(np.mean(losses))
        assert grp["stats"]["val_loss"]["std"] == pytest.approx(np.std(losses, ddof=1))
        first = sorted(r["id"] for r in runs)
    with _client(tmp_path, dest) as c:  # the same file again: nothing re-imported
        assert sorted(r["id"] for r in _suite_runs(c)) == first


def test_a_thinned_pack_imports_what_it_holds_and_says_so(suite_dir, tmp_path):
    out, report = suite_dir
    dest = tmp_path / "thin.jsonl.gz"
    pack_suite(out, dest, summarize(report), every=4)
    with _client(tmp_path, dest) as c:
        for r in _suite_runs(c):
            lines = (out / f"{r['group']}-s{r['seed']}" / "ckpt.metrics.jsonl").read_text().splitlines()
            shipped = thin_history([json.loads(line) for line in lines], 4)
            series = c.get(f"{API}/runs/{r['id']}/metrics", params={"keys": "train_loss"}).json()["series"]
            assert series["train_loss"]["step"] == [e["step"] for e in shipped if "train_loss" in e]
            assert "Training metrics shipped every 4th step" in r["description"]
            folder = out / f"{r['group']}-s{r['seed']}"
            plans = thin_plans([json.loads(line) for line in (folder / "ckpt.plans.jsonl").read_text().splitlines()], 4)
            assert c.get(f"{API}/runs/{r['id']}/windows").json()["steps"] == [p["step"] for p in plans]
    full = tmp_path / "full.jsonl.gz"
    pack_suite(out, full, summarize(report))
    with _client(tmp_path / "other", full) as c:  # a pack of every step says nothing of the kind
        assert all("shipped every" not in r["description"] for r in _suite_runs(c))


def test_a_changed_pack_replaces_the_runs_and_a_broken_one_is_refused(suite_dir, tmp_path):
    out, report = suite_dir
    dest = tmp_path / "suite.jsonl.gz"
    pack_suite(out, dest, summarize(report))
    with _client(tmp_path, dest) as c:
        first = {r["id"] for r in _suite_runs(c)}
    lines = gzip.decompress(dest.read_bytes()).decode().splitlines()
    dest.write_bytes(gzip.compress(("\n".join(lines[:2]) + "\n").encode()))  # the header and one run
    with _client(tmp_path, dest) as c:
        runs = _suite_runs(c)
        assert len(runs) == 1 and not {r["id"] for r in runs} & first
    bad = json.loads(lines[1])
    bad["plans"][0]["windows"] = [[0]]  # not a plan of this model
    dest.write_bytes(gzip.compress(("\n".join([lines[0], json.dumps(bad)]) + "\n").encode()))
    with _client(tmp_path, dest) as c:  # refused as a whole; the service starts and keeps what it had
        assert len(_suite_runs(c)) == 1
    (tmp_path / "junk.gz").write_bytes(b"not gzip")
    with _client(tmp_path / "other", tmp_path / "junk.gz") as c:
        assert _suite_runs(c) == [] and c.get(f"{API}/health").status_code == 200


def test_several_packs_import_side_by_side_and_a_bad_one_stops_no_other(suite_dir, tmp_path):
    out, report = suite_dir
    tiny, other = tmp_path / "tiny.jsonl.gz", tmp_path / "other.jsonl.gz"
    pack_suite(out, tiny, summarize(report))
    header, runs = read_pack(tiny)
    lines = gzip.decompress(tiny.read_bytes()).decode().splitlines()
    other.write_bytes(gzip.compress(("\n".join([json.dumps({**header, "scale": "other"}), *lines[1:]]) + "\n").encode()))
    (tmp_path / "junk.gz").write_bytes(b"not gzip")
    with _client(tmp_path, tmp_path / "junk.gz", tiny, tmp_path / "absent.jsonl.gz", other) as c:
        by_experiment: dict[str, list] = {}
        for r in _suite_runs(c):
            by_experiment.setdefault(r["experiment"], []).append((r["group"], r["seed"]))
        expected = sorted((run.row, run.seed) for run in runs)
        assert {e: sorted(v) for e, v in by_experiment.items()} == {"paper suite · tiny scale": expected,
                                                                      "paper suite · other scale": expected}


def test_the_service_ships_both_reproductions_by_default():
    assert Settings().suite_files == list(SHIPPED_SUITES)
    assert [p.name for p in SHIPPED_SUITES] == ["paper-mini.jsonl.gz", "paper-long.jsonl.gz"]


STUDY_ROWS = ["baseline", "fixed_window"]  # fixed_window at its preset window (no full_adaptive to match)


def test_a_study_imports_one_experiment_per_corpus_and_the_lr_sweep(tmp_path):
    """Issue 27: both corpora and the learning-rate sweep in one pack; every run lands in its experiment and
    group with its corpus and lr scale, retrieval is stored like any metric, and GET /runs/groups/paired
    pairs the rows by seed with the engine's interval."""
    smoke = {**SMOKE, "train.max_steps": 4, "train.eval_every": 4}
    study = run_study("tiny", 2, tmp_path / "study", ["code", "english"], True, None, rows=STUDY_ROWS, overrides=smoke)
    dest = tmp_path / "study.jsonl.gz"
    n = pack_suite(tmp_path / "study", dest, {**summarize(study["corpora"]["code"]), "study": summarize_study(study)})
    assert n == 2 * len(STUDY_ROWS) * 2 + len(LR_SCALES) * len(STUDY_ROWS)
    header, packed = read_pack(dest)
    packed = list(packed)
    with _client(tmp_path, dest) as c:
        runs = _suite_runs(c)
        assert sorted((r["experiment"], r["group"], r["seed"]) for r in runs) == sorted(
            (experiment_name(header, p.corpus, p.lr_scale), p.row if p.lr_scale == 1 else f"{p.row} · lr×{p.lr_scale:g}",
             p.seed) for p in packed)
        assert {r["experiment"] for r in runs} == {"paper suite · tiny scale", "paper suite · tiny scale · english",
                                                  "paper suite · tiny scale · lr sensitivity"}
        for r in runs:
            p = next(p for p in packed if (p.row, p.seed, p.corpus, p.lr_scale) == (
                r["group"].split(" · ")[0], r["seed"], r["params"]["suite.corpus"], float(r["params"]["suite.lr_scale"])))
            assert r["params"]["data.corpus"] == {"code": "default", "english": "english"}[p.corpus]
            assert r["summary"]["retrieval_mean"] == pytest.approx(p.result["retrieval_mean"], rel=1e-12)
            assert any(k.startswith("retrieval@") for k in r["summary"])
        english = "paper suite · tiny scale · english"
        got = c.get(f"{API}/runs/groups/paired", params={"experiment": english, "base": "fixed_window",
                                                          "keys": "val_text_loss,retrieval_mean"}).json()
        assert {(d["group"], d["key"]) for d in got} == {("baseline", k) for k in ("val_text_loss", "retrieval_mean")}
        rows = study["corpora"]["english"]["rows"]
        for d in got:
            expected = paired([a[d["key"]] - b[d["key"]] for a, b in zip(rows[d["group"]], rows["fixed_window"])])
            assert d["seeds"] == [0, 1] and d["mean"] == pytest.approx(expected["mean"], abs=1e-12)
            assert d["ci95"] == pytest.approx(expected["ci95"], abs=1e-12)
            assert d["resolved"] == (not expected["within_noise"])
        missing = c.get(f"{API}/runs/groups/paired", params={"experiment": english, "base": "nope", "keys": "val_loss"})
        assert missing.status_code == 404 and "nope" in missing.json()["detail"]


def test_a_fresh_data_dir_lists_the_shipped_reproductions(tmp_path):
    shipped = [p for p in SHIPPED_SUITES if p.is_file()]
    if not shipped:
        pytest.skip("the shipped suites are not in this checkout")
    with _client(tmp_path, *shipped) as c:
        runs = _suite_runs(c)
        for path in shipped:
            header, packed = read_pack(path)
            study = header["summary"]["study"]
            assert len([r for r in runs if r["params"]["suite.scale"] == header["scale"]]) == len(list(packed))
            for corpus, rows in study["corpora"].items():  # every row of every corpus, 3 seeds, the suite's own means
                assert {"baseline", "full_adaptive", *MATCHED_ROWS} <= set(rows) <= set(SUITE_ROWS)
                groups = c.get(f"{API}/runs/groups", params={"source": "suite", "keys": "val_loss,retrieval_mean",
                                                             "experiment": experiment_name(header, corpus)}).json()
                assert {g["group"] for g in groups} == set(rows)
                for g in groups:
                    assert g["seeds"] == [0, 1, 2]
                    assert math.isclose(g["stats"]["val_loss"]["mean"], rows[g["group"]]["val_loss"][0], rel_tol=1e-12)
                    assert math.isclose(g["stats"]["retrieval_mean"]["mean"], rows[g["group"]]["retrieval_mean"][0],
                                        rel_tol=1e-12)
            swept = c.get(f"{API}/runs/groups", params={"source": "suite", "keys": "val_text_loss",
                                                        "experiment": experiment_name(header, "code", 2.0)}).json()
            assert {g["group"] for g in swept} == {f"{row} · lr×{s:g}" for s in LR_SCALES
                                                   for row in ("baseline", "full_adaptive", "fixed_window")}
            adaptive = next(r for r in runs if r["group"] == "full_adaptive" and r["params"]["suite.scale"] == header["scale"])
            assert len(c.get(f"{API}/runs/{adaptive['id']}/windows").json()["steps"]) > 2  # windows change
