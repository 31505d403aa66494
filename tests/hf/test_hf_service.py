"""Hugging Face model folders through the service: registered over HTTP (token-protected) or with
`aah models add`, evaluated, mapped and swept exactly like the demo model; refused outside the roots."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from aah_launcher.cli import main as aah
from backend.app import create_app
from backend.settings import Settings
from tests.hf.tiny import MAX_POS, SLIDING

TOKEN = "hf-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def _settings(data_dir: Path, root: Path) -> Settings:
    return Settings(data_dir=data_dir, model_dirs=str(root), api_token=TOKEN, seed_demo=False, seed_paper=False,
                    seed_suite=False, preload_models=False)


@pytest.fixture(scope="module")
def service(hf_root, tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("hf-data")
    with TestClient(create_app(_settings(data_dir, hf_root))) as client:
        yield client, data_dir


def test_registering_needs_the_token(service, hf_root):
    client, _ = service
    r = client.post("/api/v1/models", json={"path": str(hf_root / "llama"), "name": None})
    assert r.status_code == 401


def test_a_registered_gemma3_shows_its_native_windows_and_evaluates(service, hf_root):
    client, _ = service
    r = client.post("/api/v1/models", json={"path": str(hf_root / "gemma3"), "name": "Tiny Gemma 3"}, headers=AUTH)
    assert r.status_code == 201, r.text
    info = r.json()
    assert (info["family"], info["dtype"], info["seq_len"], info["n_layer"], info["n_head"]) == (
        "gemma3_text", "float32", MAX_POS, 3, 4)
    assert info["buckets"] == [1, 2, 4, 8, 16, 32, 64, None]
    model_id = info["id"]
    assert model_id in [m["id"] for m in client.get("/api/v1/models").json()]
    windows = client.get(f"/api/v1/models/{model_id}/windows").json()["windows"]
    assert windows == [[SLIDING] * 4, [None] * 4, [SLIDING] * 4]

    own = client.post(f"/api/v1/models/{model_id}/evaluate", json={"windows": windows, "eval_set": "english",
                                                                    "per_token": True}, headers=AUTH).json()
    assert own["delta"] == 0.0 and own["loss"] > 0
    assert "".join(own["per_token"]["tokens"]).startswith("The Keeper of the Northern Light")  # its own tokenizer
    edited = [[1, 2, None, 8], [None, 4, None, None], [SLIDING] * 4]
    r = client.post(f"/api/v1/models/{model_id}/evaluate", json={"windows": edited, "eval_set": "text"}, headers=AUTH)
    assert r.status_code == 200, r.text
    assert r.json()["loss"] != pytest.approx(r.json()["baseline_loss"], abs=1e-6)
    loaded = client.get(f"/api/v1/models/{model_id}").json()  # loaded now: its dtype as measured here
    precision = loaded["precision"]
    assert precision["choice"] == "measured" and loaded["dtype"] == precision["dtype"]
    if precision["dtype"] == "bfloat16":
        assert precision["loss_delta"] == pytest.approx(precision["loss_bfloat16"] - precision["loss_float32"])

    heat = client.get(f"/api/v1/models/{model_id}/attention", params={"layer": 1, "head": 3}).json()
    assert heat["n_tokens"] > 0 and heat["window"] is None
    mass = client.get(f"/api/v1/models/{model_id}/retained-mass").json()
    assert len(mass["mass"]) == 3 and len(mass["mass"][0][0]) == len(info["buckets"])
    sens = client.get(f"/api/v1/models/{model_id}/sensitivity", params={"eval_set": "english"}).json()
    assert len(sens["delta"]) == 3 and any(abs(v) > 0 for row in sens["delta"] for head in row for v in head)
    passkey = client.post(f"/api/v1/models/{model_id}/retrieval", json={"windows": edited, "per_cell": 2},
                          headers=AUTH).json()
    assert passkey["windows"] == edited and len(passkey["end"]) == len(passkey["distances"]) > 0  # its own tokenizer
    assert all(0.0 <= a <= 1.0 for a in passkey["end"]) and passkey["key_chars_per_cell"] == 8


def test_paths_outside_the_roots_symlinks_out_and_pickles_are_refused(service, hf_root, tmp_path):
    client, _ = service
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    for path in (str(outside), str(hf_root / ".." / "elsewhere"), "/etc"):
        r = client.post("/api/v1/models", json={"path": path, "name": None}, headers=AUTH)
        assert r.status_code == 422 and str(hf_root) in r.json()["detail"], r.text
    link = hf_root / "link-out"
    link.symlink_to(outside, target_is_directory=True)
    try:
        r = client.post("/api/v1/models", json={"path": str(link), "name": None}, headers=AUTH)
        assert r.status_code == 422 and "not under a model root" in r.json()["detail"]
    finally:
        link.unlink()
    pickled = hf_root / "pickled"
    pickled.mkdir()
    (pickled / "config.json").write_text((hf_root / "llama" / "config.json").read_text())
    (pickled / "pytorch_model.bin").write_bytes(b"not even a pickle")
    r = client.post("/api/v1/models", json={"path": "pickled", "name": None}, headers=AUTH)
    assert r.status_code == 422 and "only pickle weights" in r.json()["detail"]


def test_aah_models_add_registers_a_folder_that_survives_a_restart(hf_root, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("AAH_MODEL_DIRS", str(hf_root))
    data_dir = tmp_path / "data"
    assert aah(["models", "add", str(hf_root / "mistral"), "--name", "Tiny Mistral", "--seq-len", "32",
                "--data-dir", str(data_dir)]) == 0
    assert "registered 'tiny-mistral'" in capsys.readouterr().out
    assert aah(["models", "add", "/etc", "--data-dir", str(data_dir)]) == 2
    assert "not under a model root" in capsys.readouterr().err
    with TestClient(create_app(_settings(data_dir, hf_root))) as client:  # a fresh service on the same store
        info = client.get("/api/v1/models/tiny-mistral").json()
        assert (info["family"], info["seq_len"]) == ("mistral", 32)
        r = client.post("/api/v1/models/tiny-mistral/evaluate", json={"windows": [[None] * 4] * 2}, headers=AUTH)
        assert r.status_code == 200, r.text
        assert r.json()["delta"] != 0.0  # full windows differ from Mistral's native 6
        r = client.post("/api/v1/models", json={"path": str(hf_root / "mistral"), "name": None}, headers=AUTH)
        assert r.status_code == 409


def test_a_models_eval_sets_hold_the_tokens_it_was_registered_with(service, hf_root):
    client, _ = service
    r = client.post("/api/v1/models", json={"path": str(hf_root / "qwen3"), "eval_tokens": MAX_POS - 1}, headers=AUTH)
    assert r.status_code == 422 and "eval_tokens" in r.json()["detail"]
    r = client.post("/api/v1/models", json={"path": str(hf_root / "qwen3"), "eval_tokens": 2 * MAX_POS + 5},
                    headers=AUTH)
    assert r.status_code == 201, r.text
    info = r.json()
    assert (info["eval_seqs"], info["eval_tokens"]) == (2, 2 * MAX_POS)  # whole sequences, rounded down
    windows = client.get(f"/api/v1/models/{info['id']}/windows").json()["windows"]
    r = client.post(f"/api/v1/models/{info['id']}/evaluate", json={"windows": windows, "eval_set": "text"},
                    headers=AUTH)
    assert r.status_code == 200, r.text
    batch = client.app.state.registry.get(info["id"]).batch("text")
    assert tuple(batch.idx.shape) == (2, MAX_POS)
