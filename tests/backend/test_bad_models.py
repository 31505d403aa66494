"""Bad values that reach the models are refused, never a 500 (issue 21 item 5): JSON nested past what a
parser can walk (request bodies, an uploaded config.json or plan.json), a checkpoint whose tokenizer gives
ids beyond its model's vocabulary, sampling at extreme temperatures and top_p, and a model whose weights
are not finite."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
import torch
from fastapi.testclient import TestClient

from aah_core.checkpoint import FILES, load_checkpoint, save_checkpoint
from aah_core.config import RunConfig, apply_overrides
from aah_core.model import WindowedGPT
from backend.schemas.tracking import SECRET_HEADER

API = "/api/v1"
DEEP = 5_000  # levels: past the recursion limit of Python's json decoder


def _nested(depth: int, open_: str = '{"a":', close: str = "}", leaf: str = "1") -> bytes:
    return (open_ * depth + leaf + close * depth).encode()


def upload_checkpoint(client: TestClient, config: RunConfig, files: dict[str, bytes]) -> tuple[int, object]:
    """A tracked run of `config` with `files` uploaded as its checkpoint; (run id, the commit's response)."""
    created = client.post(f"{API}/tracking/runs", json={"run_key": uuid.uuid4().hex, "name": "bad", "preset": "tiny",
                                                        "config": config.to_dict()})
    assert created.status_code == 201, created.text
    run_id, secret = created.json()["run"]["id"], {SECRET_HEADER: created.json()["write_secret"]}
    for name, data in files.items():
        r = client.put(f"{API}/tracking/runs/{run_id}/checkpoint/{name}", content=data, headers=secret)
        assert r.status_code == 200, r.text
    return run_id, client.post(f"{API}/tracking/runs/{run_id}/checkpoint", headers=secret)


def _files(folder: Path) -> dict[str, bytes]:
    return {name: (folder / name).read_bytes() for name in FILES}


def _saved(tmp_path: Path, model: WindowedGPT, config: RunConfig) -> dict[str, bytes]:
    return _files(save_checkpoint(tmp_path / "ckpt", model, config))


@pytest.mark.parametrize("path", ["/views", "/runs/compare", "/tracking/runs"])
def test_a_request_body_nested_too_deep_is_a_422(client, path):
    for body in (_nested(DEEP), _nested(DEEP, "[", "]", "")):
        r = client.post(API + path, content=body, headers={"Content-Type": "application/json"})
        assert r.status_code == 422 and "nested too deeply" in r.json()["detail"], r.text


def test_nested_free_json_in_a_request_is_a_422(client, tiny_demo):
    config = load_checkpoint(tiny_demo).config.to_dict()
    deep = json.loads(_nested(500))  # parses, but nothing may walk it recursively later (json.dumps, the store)
    r = client.post(f"{API}/tracking/runs", json={"run_key": uuid.uuid4().hex, "name": "n", "preset": "tiny",
                                                  "config": {**config, "meta": deep}})
    assert r.status_code == 422 and "nested deeper than 64 levels" in r.json()["detail"], r.text


@pytest.mark.parametrize("name", ["config.json", "plan.json"])
def test_an_uploaded_checkpoint_file_nested_too_deep_is_a_422(client, tiny_demo, name):
    config = load_checkpoint(tiny_demo).config
    run_id, r = upload_checkpoint(client, config, {**_files(tiny_demo), name: _nested(DEEP)})
    assert r.status_code == 422 and f"{name}: JSON nested too deeply" in r.json()["detail"], r.text
    assert f"run-{run_id}" not in {m["id"] for m in client.get(f"{API}/models").json()}


def test_a_tokenizer_beyond_the_models_vocabulary_is_a_422(client, tiny_demo, tmp_path):
    """A model of vocabulary 100 beside the byte tokenizer (ids up to 255): every evaluation set holds ids
    the embedding does not have."""
    config = apply_overrides(load_checkpoint(tiny_demo).config, {"model.vocab_size": 100})
    torch.manual_seed(0)
    run_id, r = upload_checkpoint(client, config, _saved(tmp_path, WindowedGPT(config.model), config))
    assert r.status_code == 200, r.text
    model = f"{API}/models/run-{run_id}"
    windows = client.get(f"{model}/windows").json()["windows"]
    replies = [client.post(f"{model}/evaluate", json={"windows": windows, "eval_set": s}) for s in ("text", "copy")]
    replies += [client.get(f"{model}/texts"), client.get(f"{model}/attention")]
    for reply in replies:
        assert reply.status_code == 422, reply.text
        assert "beyond the model's vocabulary of 100" in reply.json()["detail"]


@pytest.mark.parametrize("sampling", [{"temperature": 1e-300}, {"temperature": 1e-300, "top_p": 1e-300},
                                      {"temperature": 1.0, "top_p": 1e-300}, {"temperature": 5e-324, "top_k": 3}])
def test_extreme_sampling_settings_are_greedy_not_a_crash(client, sampling):
    """A vanishing temperature or top_p leaves only the most likely token: the greedy continuation."""
    body = {"prompt": "The window", "max_new_tokens": 12}
    greedy = client.post(f"{API}/models/demo/generate", json=body)
    r = client.post(f"{API}/models/demo/generate", json={**body, **sampling, "seed": 3})
    assert greedy.status_code == 200 and r.status_code == 200, r.text
    assert r.json()["tokens"] == greedy.json()["tokens"]


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_model_with_non_finite_weights_cannot_generate(client, tiny_demo, tmp_path, bad):
    ckpt = load_checkpoint(tiny_demo)
    with torch.no_grad():
        ckpt.model.blocks[1].mlp.fc.weight[0, 0] = bad
    run_id, r = upload_checkpoint(client, ckpt.config, _saved(tmp_path, ckpt.model, ckpt.config))
    assert r.status_code == 200, r.text
    for sampling in ({"temperature": 0.0}, {"temperature": 0.8, "top_k": 5}, {"temperature": 1.0, "top_p": 0.9}):
        reply = client.post(f"{API}/models/run-{run_id}/generate", json={"prompt": "abc", **sampling})
        assert reply.status_code == 422, reply.text
        assert "logits are not finite" in reply.json()["detail"]
