"""POST /models/{id}/round and /export on the demo checkpoint: the loss is /evaluate's, the KV figures
/cost's; exports are written under <data dir>/exports and come back as a zip."""

from __future__ import annotations

import io
import json
import zipfile

import pytest

from backend.app import create_app
from tests.backend.conftest import make_settings

API = "/api/v1"
T = 64
PLAN = [[4, None], [16, 8]]  # the tiny demo: 2 layers x 2 heads, seq_len 64 (no grouped-query attention)
GRAINS = ("head", "kv_group", "layer", "transformers")


@pytest.mark.parametrize("mode", ["up", "budget"])
@pytest.mark.parametrize("grain", GRAINS)
def test_round_loss_is_evaluates_and_kv_is_costs(client, grain, mode):
    r = client.post(f"{API}/models/demo/round", json={"windows": PLAN, "granularity": grain, "mode": mode,
                                                     "eval_set": "text"})
    assert r.status_code == 200, r.text
    body = r.json()
    evaluated = client.post(f"{API}/models/demo/evaluate", json={"windows": body["windows"], "eval_set": "text"})
    assert body["loss"] == evaluated.json()["loss"]
    for key in ("acr", "causal_coverage", "tile_coverage"):
        assert body[key] == evaluated.json()[key], key
    plan_loss = client.post(f"{API}/models/demo/evaluate", json={"windows": PLAN, "eval_set": "text"}).json()["loss"]
    assert body["plan_loss"] == plan_loss and body["delta"] == body["loss"] - plan_loss
    cost = client.post(f"{API}/models/demo/cost", json={"windows": body["windows"], "context": T}).json()
    for key in ("kv_bytes", "kv_bytes_full", "attention_pairs", "attention_pairs_full"):
        assert body[key] == cost[key], key
    head_kv = client.post(f"{API}/models/demo/cost", json={"windows": PLAN, "context": T}).json()["kv_bytes"]
    assert body["kv_bytes_plan"] == head_kv
    assert body["kv_bytes"] <= head_kv if mode == "budget" else body["kv_bytes"] >= head_kv
    assert grain in body["note"] and body["granularity"] == grain


def test_round_up_layer_and_transformers_by_hand(client):
    """Layer maxima: full, 16. layer: [[full, full], [16, 16]]; transformers: w=16 lets layer 1 slide."""
    r = client.post(f"{API}/models/demo/round", json={"windows": PLAN, "granularity": "layer"}).json()
    assert r["windows"] == [[None, None], [16, 16]]
    r = client.post(f"{API}/models/demo/round", json={"windows": PLAN, "granularity": "transformers"}).json()
    assert r["windows"] == [[None, None], [16, 16]] and r["window"] == 16


@pytest.mark.parametrize("body", [
    {"windows": PLAN, "granularity": "vllm"},
    {"windows": PLAN, "mode": "down"},
    {"windows": [[4, None]]},
    {"windows": [[0, None], [16, 8]]},
    {"windows": PLAN, "eval_set": "nope"},
], ids=["grain", "mode", "shape", "window-0", "eval-set"])
def test_bad_round_requests_are_422(client, body):
    r = client.post(f"{API}/models/demo/round", json=body)
    assert r.status_code == 422 and r.json()["detail"], r.text


def _unzip(content: bytes) -> dict[str, bytes]:
    with zipfile.ZipFile(io.BytesIO(content)) as z:
        return {name.split("/", 1)[1]: z.read(name) for name in z.namelist()}


@pytest.fixture(scope="module")
def guarded(tmp_path_factory, tiny_demo):
    """An app with AAH_API_TOKEN set, and its data dir."""
    from fastapi.testclient import TestClient

    data_dir = tmp_path_factory.mktemp("export-data")
    with TestClient(create_app(make_settings(data_dir, tiny_demo, api_token="tok"))) as c:
        yield c, data_dir


def test_export_needs_the_token_and_writes_a_checkpoint_with_the_rounded_plan(guarded):
    client, data_dir = guarded
    body = {"windows": PLAN, "granularity": "layer", "mode": "up"}
    assert client.post(f"{API}/models/demo/export", json=body).status_code == 401
    r = client.post(f"{API}/models/demo/export", json=body, headers={"Authorization": "Bearer tok"})
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "application/zip"
    files = _unzip(r.content)
    assert {"config.json", "model.safetensors", "plan.json", "serving.json", "README.md"} <= set(files)
    rounded = client.post(f"{API}/models/demo/round", json=body, headers={"Authorization": "Bearer tok"}).json()
    assert json.loads(files["plan.json"])["windows"] == rounded["windows"] == [[None, None], [16, 16]]
    assert json.loads(files["serving.json"])["layer_windows"] == [None, 16]
    folder = data_dir / r.headers["x-export-folder"]
    assert folder.is_dir() and folder.resolve().is_relative_to(data_dir.resolve())
    assert (folder / "model.safetensors").read_bytes() == files["model.safetensors"]


@pytest.mark.parametrize("name", ["../escape", "a/b", "/etc", ".hidden", "x" * 65])
def test_export_names_stay_under_the_data_dir(guarded, name):
    client, data_dir = guarded
    r = client.post(f"{API}/models/demo/export", json={"windows": PLAN, "name": name},
                    headers={"Authorization": "Bearer tok"})
    assert r.status_code == 422, r.text
    assert not (data_dir.parent / "escape").exists()


def test_an_export_name_taken_is_409(guarded):
    client, _ = guarded
    body = {"windows": PLAN, "name": "mine"}
    auth = {"Authorization": "Bearer tok"}
    assert client.post(f"{API}/models/demo/export", json=body, headers=auth).status_code == 200
    r = client.post(f"{API}/models/demo/export", json=body, headers=auth)
    assert r.status_code == 409 and "mine" in r.json()["detail"]


def test_an_export_that_cannot_be_written_is_503(guarded):
    """A file where the exports folder belongs: writing fails (an OSError), the answer says so."""
    client, data_dir = guarded
    exports, aside = data_dir / "exports", data_dir / "exports-aside"
    if exports.exists():
        exports.rename(aside)
    exports.write_text("not a folder")
    try:
        r = client.post(f"{API}/models/demo/export", json={"windows": PLAN, "name": "blocked"},
                        headers={"Authorization": "Bearer tok"})
        assert r.status_code == 503 and "cannot write the export under exports/" in r.json()["detail"], r.text
    finally:
        exports.unlink()
        if aside.exists():
            aside.rename(exports)
