"""Hostile model records against a real uvicorn (issue 21 items 1 and 6): start-up never depends on one
record, nothing outside the roots is read, nothing is written outside the data dir, and model folders
whose links lead out, whose config claims more parameters than their weights hold, or whose config is
malformed are refused (422) or listed as unavailable with the reason, never a 500."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import httpx
import pytest
import torch
from safetensors.torch import save_file

from backend.store import catalog
from backend.store.db import make_engine, make_session_factory, transaction
from backend.store.migrate import upgrade
from tests.backend.test_tracking_api import tracked, upload
from tests.frontend.stack import running_api, running_api_process
from tests.hf.tiny import save_tiny_model
from tests.untouched import age, atime_updates, listing, read_since_aged

API = "/api/v1"
SECRET = "TOP-SECRET-MARKER"
# torch sets TORCHINDUCTOR_CACHE_DIR in its own process (here: the test's) and children inherit it: the
# server must choose its caches itself, so none of these reaches it
INHERITED_CACHES = dict.fromkeys(("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "TIKTOKEN_CACHE_DIR",
                                  "DATA_GYM_CACHE_DIR"))


@pytest.fixture
def world(tmp_path):
    """A data dir, an outside folder with hostile GPT-2 tokenizer files (encoder.json and vocab.bpe that
    disagree: tiktoken's loader asserted on them) and an empty HOME and TMPDIR for the server."""
    names = ("data", "outside", "home", "tmp")
    data, outside, home, tmp = (tmp_path / n for n in names)
    for folder in (data, outside, home, tmp):
        folder.mkdir()
    (outside / "encoder.json").write_text(json.dumps({SECRET: 0}))
    (outside / "vocab.bpe").write_text(f"#version: 0.2\n{SECRET} x\n")
    env = {"HOME": str(home), "TMPDIR": str(tmp), "AAH_SEED_PAPER": "false", "AAH_SEED_SUITE": "false",
           **INHERITED_CACHES}
    return tmp_path, data, outside, home, tmp, env


def _unavailable(client: httpx.Client) -> dict[str, str]:
    r = client.get(f"{API}/models/unavailable")
    assert r.status_code == 200, r.text
    return {m["id"]: m["reason"] for m in r.json()}


def test_a_tracked_checkpoint_naming_an_outside_tokenizer_never_stops_the_service(world, tiny_demo):
    base, data, outside, home, tmp, env = world
    env = {**env, "AAH_DEMO_DIR": str(tiny_demo)}
    files = [outside / "encoder.json", outside / "vocab.bpe"]
    age(*files)
    outside_before = listing(outside)
    hostile = json.loads((tiny_demo / "config.json").read_text())
    hostile["config"]["data"].update(tokenizer="gpt2", tokenizer_dir=str(outside))
    with running_api(data, base / "api.log", env) as url, httpx.Client(base_url=url, timeout=60) as client:
        run_id, auth = tracked(client, tiny_demo)
        r = upload(client, run_id, tiny_demo, auth, {"config.json": json.dumps(hostile).encode()})
        assert r.status_code == 200, r.text  # a record: the training machine's paths are its own
        model = f"run-{run_id}"
        texts = client.get(f"{API}/models/{model}/texts")
        assert texts.status_code == 503 and "allowed root" in texts.json()["detail"], texts.text
        assert SECRET not in texts.text
        assert "allowed root" in _unavailable(client)[model]
        good = client.get(f"{API}/models/demo/texts")  # a good model loads beside it
        assert good.status_code == 200 and good.json()
    # the restart: preload meets the record, and the service starts anyway
    with running_api(data, base / "api2.log", env) as url, httpx.Client(base_url=url, timeout=60) as client:
        assert client.get(f"{API}/health").json()["status"] == "ok"
        reason = _unavailable(client)[model]
        assert "data.tokenizer_dir" in reason and "allowed root" in reason and SECRET not in reason
        assert model not in {m["id"] for m in client.get(f"{API}/models").json()}
        assert client.get(f"{API}/models/demo/windows").status_code == 200
    if atime_updates(base):
        assert read_since_aged(*files) == []
    assert listing(outside) == outside_before
    assert listing(home, tmp) == set()  # tiktoken's cache, torch's compiler cache: all under the data dir


# ---- Hugging Face folders -------------------------------------------------------------------------------

BIG = {"hidden_size": 4096, "vocab_size": 65536, "intermediate_size": 11008}
MALFORMED = {"zero-heads": {"num_attention_heads": 0}, "word-heads": {"num_attention_heads": "four"},
             "float-layers": {"num_hidden_layers": 2.5}}
DEEP = '{"model_type": "llama", "x": ' + "[" * 100_000 + "]" * 100_000 + "}"


def _variant(good: Path, folder: Path, config: dict | str | None = None) -> Path:
    """A copy of the good folder, with its config.json changed or replaced."""
    shutil.copytree(good, folder, symlinks=True)  # a link is copied as a link, never read
    if isinstance(config, dict):
        doc = json.loads((good / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({**doc, **config}))
    elif isinstance(config, str):
        (folder / "config.json").write_text(config)
    return folder


@pytest.fixture(scope="module")
def hf_live(tmp_path_factory):
    """A real uvicorn whose model root holds a good tiny llama and hostile variants; the store already
    lists the hostile ones (`pre-*`), registered before the start."""
    base = tmp_path_factory.mktemp("hostile-hf")
    data, outside = base / "data", base / "outside"
    models = data / "models"
    models.mkdir(parents=True)
    outside.mkdir()
    good = save_tiny_model("llama", base / "good")
    shutil.copy(good / "tokenizer.json", outside / "tokenizer.json")
    big = _variant(good, models / "pre-big", BIG)
    save_file({"x": torch.zeros(1)}, str(big / "model.safetensors"))
    hostile = {"pre-big": big, "pre-deep": _variant(good, models / "pre-deep", DEEP)}
    for name, change in MALFORMED.items():
        hostile[f"pre-{name}"] = _variant(good, models / f"pre-{name}", change)
    linked = _variant(good, models / "pre-linked")
    (linked / "tokenizer.json").unlink()
    (linked / "tokenizer.json").symlink_to(outside / "tokenizer.json")
    hostile["pre-linked"] = linked
    engine = make_engine(data / "aah.db")
    upgrade(engine)
    with transaction(make_session_factory(engine)) as s:
        for model_id, folder in hostile.items():
            catalog.register_checkpoint(s, catalog.CheckpointEntry(model_id, model_id, str(folder), None, None, None))
    engine.dispose()
    age(outside / "tokenizer.json")
    home, tmp = base / "home", base / "tmp"
    home.mkdir(), tmp.mkdir()
    env = {"AAH_SEED_DEMO": "false", "AAH_SEED_PAPER": "false", "AAH_SEED_SUITE": "false", "HOME": str(home),
           "TMPDIR": str(tmp), **INHERITED_CACHES}
    with running_api_process(data, base / "api.log", env) as (url, proc):
        with httpx.Client(base_url=url, timeout=120) as client:
            yield client, proc, base, good, models, outside


def test_hostile_folders_registered_before_the_start_are_unavailable_with_the_reason(hf_live):
    client, *_ = hf_live
    assert client.get(f"{API}/health").json()["status"] == "ok"
    reasons = _unavailable(client)
    assert "does not match the weights" in reasons["pre-big"]
    assert "num_attention_heads must be an integer" in reasons["pre-zero-heads"]
    assert "num_attention_heads must be an integer" in reasons["pre-word-heads"]
    assert "num_hidden_layers must be an integer" in reasons["pre-float-layers"]
    assert "nested JSON deeper" in reasons["pre-deep"]
    assert "tokenizer.json is a link that leads out" in reasons["pre-linked"]
    assert client.get(f"{API}/models").json() == []
    for model_id in reasons:
        r = client.get(f"{API}/models/{model_id}/texts")
        assert r.status_code == 503 and r.json()["detail"] == reasons[model_id], r.text


def _peak_rss(proc) -> int:
    """The server's peak resident memory so far, in bytes (VmHWM)."""
    for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def test_a_config_claiming_more_parameters_than_its_weights_is_refused_before_allocation(hf_live):
    client, proc, _, good, models, _ = hf_live
    folder = _variant(good, models / "big", BIG)
    save_file({"x": torch.zeros(1)}, str(folder / "model.safetensors"))
    before = _peak_rss(proc)
    r = client.post(f"{API}/models", json={"path": str(folder), "name": "big"})
    assert r.status_code == 422 and "parameter count does not match" in r.json()["detail"], r.text
    claimed = int(r.json()["detail"].split("describes ")[1].split(" parameters")[0].replace(",", ""))
    assert claimed >= 2 * BIG["vocab_size"] * BIG["hidden_size"]  # at least the embedding and the head
    assert _peak_rss(proc) - before < claimed * 4 // 10  # nothing of its float32 size was ever allocated


@pytest.mark.parametrize("name", [*MALFORMED, "deep"])
def test_malformed_configs_are_422_on_registration(hf_live, name):
    client, _, _, good, models, _ = hf_live
    folder = _variant(good, models / f"new-{name}", DEEP if name == "deep" else MALFORMED[name])
    r = client.post(f"{API}/models", json={"path": str(folder), "name": None})
    assert r.status_code == 422 and "config.json" in r.json()["detail"], r.text


def test_a_link_out_of_a_registered_folder_is_refused(hf_live):
    client, _, base, good, models, outside = hf_live
    folder = _variant(good, models / "later-linked")
    r = client.post(f"{API}/models", json={"path": str(folder), "name": None})
    assert r.status_code == 201, r.text
    model_id = r.json()["id"]
    (folder / "tokenizer.json").unlink()  # after registration, a link out takes the file's place
    (folder / "tokenizer.json").symlink_to(outside / "tokenizer.json")
    r = client.get(f"{API}/models/{model_id}/texts")
    assert r.status_code == 503 and "tokenizer.json is a link that leads out" in r.json()["detail"], r.text
    assert model_id in _unavailable(client)
    r = client.post(f"{API}/models", json={"path": str(_variant(folder, models / "copy-linked")), "name": None})
    assert r.status_code == 422 and "link that leads out" in r.json()["detail"], r.text
    if atime_updates(base):
        assert read_since_aged(outside / "tokenizer.json") == []


def test_a_good_folder_beside_them_loads_and_writes_nothing_outside_the_data_dir(hf_live):
    client, _, base, good, models, _ = hf_live
    r = client.post(f"{API}/models", json={"path": str(_variant(good, models / "fine")), "name": None})
    assert r.status_code == 201, r.text
    assert client.get(f"{API}/models/{r.json()['id']}/texts").status_code == 200
    r = client.post(f"{API}/models/{r.json()['id']}/evaluate", json={"windows": [[None] * 4] * 2})
    assert r.status_code == 200, r.text
    assert listing(base / "home", base / "tmp") == set()  # transformers, tokenizers, torch: nothing here


def test_an_export_of_a_loaded_folder_whose_file_became_a_link_out_is_refused(hf_live):
    client, _, base, _, models, outside = hf_live
    folder = save_tiny_model("qwen3", models / "exported-linked")  # a family whose export is a transformers folder
    model_id = client.post(f"{API}/models", json={"path": str(folder), "name": None}).json()["id"]
    body = {"windows": client.get(f"{API}/models/{model_id}/windows").json()["windows"],  # loaded now
            "granularity": "transformers"}
    assert client.post(f"{API}/models/{model_id}/round", json=body).status_code == 200  # exportable as it is
    (folder / "tokenizer.json").unlink()
    (folder / "tokenizer.json").symlink_to(outside / "tokenizer.json")
    r = client.post(f"{API}/models/{model_id}/export", json=body)
    assert r.status_code == 503 and "tokenizer.json is a link that leads out" in r.json()["detail"], r.text
    if atime_updates(base):
        assert read_since_aged(outside / "tokenizer.json") == []  # an export copies the tokenizer: not this one


def test_a_corpus_that_is_the_store_is_refused(hf_live, tiny_demo):
    # on the module's server (a server of its own cost a start): a tracked run's model, which no test above lists
    client, *_ = hf_live
    hostile = json.loads((tiny_demo / "config.json").read_text())
    hostile["config"]["data"]["corpus"] = "aah.db"
    r = client.post(f"{API}/runs", json={"preset": "tiny", "overrides": {"data.corpus": "aah.db"}})
    assert r.status_code == 422 and "data.corpus" in r.json()["detail"], r.text
    run_id, auth = tracked(client, tiny_demo)
    assert upload(client, run_id, tiny_demo, auth, {"config.json": json.dumps(hostile).encode()}).status_code == 200
    texts = client.get(f"{API}/models/run-{run_id}/texts")
    assert texts.status_code == 503 and "SQLite" not in texts.text, texts.text
    assert "data.corpus" in _unavailable(client)[f"run-{run_id}"]
