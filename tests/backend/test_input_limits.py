"""Bounded input on a real uvicorn (issue 10 items 5 and 7): every out-of-bounds override, a corpus
root that is not a corpus and a config too large for this machine are 422 naming the field before any
run exists; hostile view states are 422, not 500; the paper's experiment takes no runs; checkpoints
with huge or inconsistent config.json files do not stop the API from starting and are listed as
unavailable with the reason."""

from __future__ import annotations

import json
import shutil

import httpx
import pytest

from aah_client import ApiClient
from backend.schemas.views import MAX_VIEW_STATE_DEPTH
from backend.seed.demo import DEMO_ID
from backend.seed.paper import EXPERIMENT as PAPER
from backend.store import catalog
from backend.store.db import make_engine, make_session_factory, transaction
from backend.store.migrate import upgrade
from tests.frontend.stack import running_api

API = "/api/v1"
BAD_OVERRIDES = [  # (overrides, the field the 422 must name); the first seven are the review's
    ({"model.n_layer": 1e19}, "model.n_layer"),
    ({"model.d_model": 65536}, "model.d_model"),
    ({"train.batch_size": 1e7}, "train.batch_size"),
    ({"model.seq_len": 1e7}, "model.seq_len"),
    ({"train.threads": 1e5}, "train.threads"),
    ({"data.corpus": "/usr"}, "data.corpus"),
    ({"train.max_steps": 2**62}, "train.max_steps"),
    ({"train.max_steps": 1e30}, "train.max_steps"),
    ({"train.lr": 1e300}, "train.lr"),
    ({"train.lr": "nan"}, "train.lr"),
    ({"model.n_layer": 2.5}, "model.n_layer"),
    ({"train.seed": -1}, "train.seed"),
    ({"controller.mode": "aah", "controller.control_dim": 10**9}, "controller.control_dim"),
    ({"model.d_model": 16384, "model.n_layer": 64}, "model.d_model"),  # in bounds; cannot fit in memory
    ({"train.batch_size": 65536, "model.seq_len": 8192, "model.buckets": [8, None]}, "train.batch_size"),
]


def _bad_checkpoint(tiny_demo, root, name, **model):
    folder = root / name
    shutil.copytree(tiny_demo, folder)
    header = json.loads((folder / "config.json").read_text())
    header["config"]["model"].update(model)
    (folder / "config.json").write_text(json.dumps(header))
    return folder


@pytest.fixture(scope="module")
def live(tmp_path_factory, tiny_demo):
    """A real uvicorn whose store already lists two hostile checkpoints; corpus roots /usr and a
    folder of binaries (neither a corpus); the demo and the paper's tables seeded; no job may start."""
    base = tmp_path_factory.mktemp("limits")
    data, binaries = base / "data", base / "binaries"
    binaries.mkdir()
    (binaries / "lib.so").write_bytes(b"\x7fELF" + b"\0" * 1000)
    models = data / "models"
    models.mkdir(parents=True)
    huge = _bad_checkpoint(tiny_demo, models, "huge", d_model=65536, n_head=2)
    inconsistent = _bad_checkpoint(tiny_demo, models, "inconsistent", d_model=16384)
    engine = make_engine(data / "aah.db")
    upgrade(engine)
    with transaction(make_session_factory(engine)) as s:
        for folder in (huge, inconsistent):
            catalog.register_checkpoint(s, catalog.CheckpointEntry(
                folder.name, folder.name, str(folder.relative_to(data)), None, None, None))
    engine.dispose()
    env = {"AAH_CORPUS_DIRS": f"/usr:{binaries}", "AAH_DEMO_DIR": str(tiny_demo), "AAH_MAX_JOBS": "0",
           "AAH_SEED_SUITE": "false"}  # the shipped reproduction plays no part here
    with running_api(data, base / "api.log", env) as url:
        with httpx.Client(base_url=url + API, timeout=60) as client:
            yield client, binaries


@pytest.mark.parametrize("overrides, field", BAD_OVERRIDES, ids=[f"{f}-{i}" for i, (_, f) in enumerate(BAD_OVERRIDES)])
def test_bad_overrides_are_422_naming_the_field(live, overrides, field):
    client, _ = live
    r = client.post("/runs", json={"preset": "tiny", "overrides": overrides})
    assert r.status_code == 422, r.text
    assert field in r.json()["detail"]


def test_no_bad_override_left_a_run(live):
    client, binaries = live
    r = client.post("/runs", json={"preset": "tiny", "overrides": {"data.corpus": str(binaries)}})
    assert r.status_code == 422 and "holds no .txt/.md/.py/.rst files" in r.json()["detail"]
    assert client.get("/runs", params={"experiment": "default"}).json() == []


@pytest.mark.parametrize("depth", [MAX_VIEW_STATE_DEPTH + 1, 300, 950])
def test_deeply_nested_view_states_are_422(live, depth):
    client, _ = live
    state = '{"a":' * depth + "1" + "}" * depth
    r = client.post("/views", content=f'{{"name":"deep","page":"p","state":{state}}}',
                    headers={"content-type": "application/json"})
    # 422 from the depth check, or from the body parser when the JSON parser's own nesting limit comes first
    assert (r.status_code, r.json()["detail"].split(", ")[-1]) in (
        (422, f"state is nested deeper than {MAX_VIEW_STATE_DEPTH} levels"),
        (422, "request body: JSON nested too deeply to read (keep it under 64 levels)")), r.text


@pytest.mark.parametrize("state", [r'{"\ud800":1}', r'{"x":"\udc00"}', r'{"x":["ok","a\ud83d"]}'])
def test_view_states_with_lone_surrogates_are_422(live, state):
    client, _ = live
    r = client.post("/views", content=f'{{"name":"s","page":"p","state":{state}}}',
                    headers={"content-type": "application/json"})
    assert r.status_code == 422 and "lone surrogate" in r.json()["detail"]


def test_views_within_the_limits_are_kept_as_sent(live):
    client, _ = live
    state: dict = {"leaf": "ünïcode ✓ \U0001F600", "n": 2**62}
    for _ in range(MAX_VIEW_STATE_DEPTH - 2):
        state = {"a": state}
    r = client.post("/views", json={"name": "ok", "page": "p", "state": state})
    assert r.status_code == 201, r.text
    assert client.get(f"/views/{r.json()['id']}").json()["state"] == state


def test_runs_cannot_be_filed_under_the_paper_experiment(live):
    client, _ = live
    before = client.get("/runs", params={"experiment": PAPER, "limit": 1000}).json()
    assert before and all(run["read_only"] for run in before)
    r = client.post("/runs", json={"preset": "tiny", "experiment": PAPER})
    assert r.status_code == 409 and "read-only" in r.json()["detail"]
    assert len(client.get("/runs", params={"experiment": PAPER, "limit": 1000}).json()) == len(before)


def test_huge_checkpoints_are_unavailable_with_their_reason(live):
    """The API started (the fixture waited for /health) and serves the demo; the two hostile
    checkpoints are left out of /models and listed with why."""
    client, _ = live
    assert [m["id"] for m in client.get("/models").json()] == [DEMO_ID]
    unavailable = {m["id"]: m["reason"] for m in client.get("/models/unavailable").json()}
    assert set(unavailable) == {"huge", "inconsistent"}
    assert "model.d_model must be an integer in" in unavailable["huge"]
    assert "weight shapes do not match the config" in unavailable["inconsistent"]
    r = client.get("/models/huge/windows")
    assert r.status_code == 503 and "model.d_model" in r.json()["detail"]


def test_the_python_client_lists_the_unavailable_models_with_their_reasons(live):
    """aah_client against the same real API: unavailable_models() is GET /models/unavailable."""
    client, _ = live
    with ApiClient(str(client.base_url).rstrip("/").removesuffix(API)) as api:
        listed = api.unavailable_models()
        assert [m["id"] for m in api.models()] == [DEMO_ID]
    assert listed == client.get("/models/unavailable").json()
    assert {m["id"] for m in listed} == {"huge", "inconsistent"} and all(m["reason"] for m in listed)
