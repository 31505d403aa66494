"""Corpora and tokenizer folders come only from the allowed roots (the data dir and AAH_CORPUS_DIRS):
refused before a job is accepted, refused again by the worker, never served by the model endpoints,
and no answer reveals whether something outside the roots exists (issue 10 item 1)."""

from __future__ import annotations

import json
import shutil

import httpx
import pytest

from aah_core.checkpoint import FORMAT
from backend.jobs.worker import run_job
from backend.store import catalog, run_store
from backend.store.db import make_engine, make_session_factory, transaction
from backend.store.migrate import upgrade
from tests.frontend.stack import running_api

API = "/api/v1"
SECRET = "TOP-SECRET-MARKER " * 400  # long enough to be a corpus; its size must never show
FAST = {"train.max_steps": 2, "train.eval_every": 2, "train.eval_batches": 1}


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    """A real uvicorn with a data dir, one extra corpus root, and an outside folder holding a secret."""
    base = tmp_path_factory.mktemp("roots")
    data, corpora, outside = base / "data", base / "corpora", base / "outside"
    for d in (data, corpora, outside):
        d.mkdir()
    (outside / "secret.txt").write_text(SECRET)
    (corpora / "ok.txt").write_text("def f(x):\n    return x + 1\n" * 400)
    (data / "escape.txt").symlink_to(outside / "secret.txt")
    (corpora / "escape-dir").symlink_to(outside, target_is_directory=True)
    env = {"AAH_CORPUS_DIRS": str(corpora), "AAH_SEED_DEMO": "false", "AAH_SEED_PAPER": "false",
           "AAH_SEED_SUITE": "false"}
    with running_api(data, base / "api.log", env) as url:
        with httpx.Client(base_url=url + API, timeout=30) as client:
            yield client, data, corpora, outside


def _outside_values(data, corpora, outside) -> list[tuple[str, str]]:
    return [
        ("data.corpus", str(outside / "secret.txt")),
        ("data.corpus", str(outside / "missing.txt")),
        ("data.corpus", "../outside/secret.txt"),
        ("data.corpus", f"{corpora}/../outside/secret.txt"),
        ("data.corpus", "/proc/self/environ"),
        ("data.corpus", "/usr"),
        ("data.corpus", str(data / "escape.txt")),
        ("data.corpus", "escape.txt"),
        ("data.corpus", str(corpora / "escape-dir" / "secret.txt")),
        ("data.corpus", str(corpora / "escape-dir")),
        ("data.tokenizer_dir", str(outside)),
        ("data.tokenizer_dir", str(corpora / "escape-dir")),
    ]


def test_paths_outside_the_roots_are_refused_before_the_job(live):
    client, data, corpora, outside = live
    details = {}
    for key, value in _outside_values(data, corpora, outside):
        overrides = {**FAST, key: value}
        if key == "data.tokenizer_dir":
            overrides["data.tokenizer"] = "gpt2"
        r = client.post("/runs", json={"preset": "tiny", "overrides": overrides})
        assert r.status_code == 422, (value, r.text)
        detail = r.json()["detail"]
        assert str(data) in detail and str(corpora) in detail and "AAH_CORPUS_DIRS" in detail, detail
        assert "TOP-SECRET" not in detail and str(len(SECRET)) not in detail
        details[value] = detail.replace(repr(value), "<value>")
    nul = client.post("/runs", json={"preset": "tiny", "overrides": {**FAST, "data.corpus": "/tmp/a\x00b"}})
    assert nul.status_code == 422 and "control character U+0000" in nul.json()["detail"]  # refused at the schema
    # an existing and a missing outside file get the same answer: no existence oracle
    assert details[str(outside / "secret.txt")] == details[str(outside / "missing.txt")]
    assert client.get("/runs").json() == []  # nothing was accepted


def _register_copy(data, tiny_demo, model_id: str, corpus: str) -> None:
    """A copy of the tiny demo checkpoint in the data dir whose config names ``corpus``."""
    shutil.copytree(tiny_demo, data / model_id)
    header = json.loads((data / model_id / "config.json").read_text())
    assert header["format"] == FORMAT
    header["config"]["data"]["corpus"] = corpus
    (data / model_id / "config.json").write_text(json.dumps(header))
    engine = make_engine(data / "aah.db")
    with transaction(make_session_factory(engine)) as s:
        catalog.register_checkpoint(s, catalog.CheckpointEntry(model_id, model_id, model_id, None, None, None))
    engine.dispose()


def test_a_corpus_inside_a_root_is_accepted_and_served(live, tiny_demo):
    client, data, corpora, _ = live
    # a relative path is taken from the data dir; it resolves into the corpora root, so it is allowed
    r = client.post("/runs", json={"preset": "tiny", "overrides": {**FAST, "data.corpus": "../corpora/ok.txt"}})
    assert r.status_code == 202, r.text
    assert r.json()["params"]["data.corpus"] == str(corpora / "ok.txt")  # stored resolved
    client.post(f"/runs/{r.json()['id']}/cancel")
    _register_copy(data, tiny_demo, "good", str(corpora / "ok.txt"))
    texts = client.get("/models/good/texts")
    assert texts.status_code == 200 and "return x + 1" in json.dumps(texts.json())


def test_a_checkpoint_whose_corpus_is_outside_is_not_served(live, tiny_demo):
    """A registered checkpoint naming an outside corpus: its texts and maps are refused, nothing leaks."""
    client, data, _, outside = live
    _register_copy(data, tiny_demo, "evil", str(outside / "secret.txt"))
    for path in ("/models/evil/texts", "/models/evil/attention?layer=0&head=0", "/models/evil/windows"):
        r = client.get(path)
        assert r.status_code == 503, (path, r.text)
        assert "TOP-SECRET" not in r.text and "allowed root" in r.json()["detail"]
    assert "TOP-SECRET" not in client.get("/models").text


def test_the_worker_refuses_an_outside_corpus_itself(tmp_path):
    """Defence in depth: a stored config that names an outside file (e.g. a symlink changed after the
    job was accepted) fails in the worker before anything is read, with an error naming only the roots."""
    data, outside = tmp_path / "data", tmp_path / "outside"
    data.mkdir(), outside.mkdir()
    (outside / "secret.txt").write_text(SECRET)
    engine = make_engine(data / "aah.db")
    upgrade(engine)
    config = {"preset": "tiny", "data": {"corpus": str(data / "link.txt")}}
    (data / "link.txt").symlink_to(outside / "secret.txt")
    with transaction(make_session_factory(engine)) as s:
        run_id = run_store.create_run(s, name="x", experiment="x", config=config)
    assert run_job(data / "aah.db", run_id, data) == 1
    with transaction(make_session_factory(engine)) as s:
        run = run_store.get_run(s, run_id)
    engine.dispose()
    assert run.status == "FAILED" and "allowed root" in run.error and str(data) in run.error
    assert str(outside) not in run.error and str(len(SECRET)) not in run.error
    assert not (data / "runs" / str(run_id) / "checkpoint").exists()


def test_model_roots_default_to_data_models_and_the_hf_cache_when_it_exists(tmp_path, monkeypatch):
    from backend.settings import Settings

    monkeypatch.delenv("AAH_MODEL_DIRS", raising=False)
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    data = tmp_path / "data"
    home = tmp_path / "hf-home"
    monkeypatch.setenv("HF_HOME", str(home))
    assert Settings(data_dir=data).model_roots == [data.resolve() / "models"]  # no cache on disk: not a root
    (home / "hub").mkdir(parents=True)
    assert Settings(data_dir=data).model_roots == [data.resolve() / "models", (home / "hub").resolve()]
    hub = tmp_path / "hub-cache"
    hub.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))  # HF_HUB_CACHE wins over HF_HOME, as in huggingface_hub
    assert Settings(data_dir=data).model_roots == [data.resolve() / "models", hub.resolve()]
    monkeypatch.setenv("AAH_MODEL_DIRS", f"{tmp_path / 'a'},{tmp_path / 'b'}")  # set: exactly these
    assert Settings(data_dir=data).model_roots == [(tmp_path / "a").resolve(), (tmp_path / "b").resolve()]
    monkeypatch.delenv("HF_HUB_CACHE")
    monkeypatch.delenv("HF_HOME")
    monkeypatch.delenv("AAH_MODEL_DIRS")
    monkeypatch.setenv("HOME", str(tmp_path / "user"))
    (tmp_path / "user" / ".cache" / "huggingface" / "hub").mkdir(parents=True)  # the default cache
    assert Settings(data_dir=data).model_roots[1] == (tmp_path / "user" / ".cache" / "huggingface" / "hub").resolve()
