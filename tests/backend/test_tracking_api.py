"""The tracking API: create (idempotent on the run key), batch log (a step sent twice is stored once),
status, checkpoint upload (validated, registered as a model), on SQLite and PostgreSQL."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from aah_core.checkpoint import FILES
from backend.schemas.tracking import MAX_METRICS_PER_BATCH, SECRET_HEADER
from backend.store import metric_store, run_store
from backend.store.db import transaction
from backend.store.tables import Metric
from tests.conftest import DATABASES

API = "/api/v1/tracking/runs"
pytestmark = pytest.mark.parametrize("client", DATABASES, indirect=True, scope="module")


def create(client: TestClient, ckpt: Path, key: str | None = None, **extra: object):
    config = json.loads((ckpt / "config.json").read_text())["config"]
    body = {"run_key": key or uuid.uuid4().hex, "name": "far away", "experiment": "elsewhere", "preset": "tiny",
            "config": config, "data_hash": "abc123", "git_rev": "0123456789ab", "total_steps": 6, **extra}
    return client.post(API, json=body)


def tracked(client: TestClient, ckpt: Path, **extra: object) -> tuple[int, dict[str, str]]:
    """A new tracked run: its id, and the header that carries its write secret."""
    r = create(client, ckpt, **extra)
    assert r.status_code == 201, r.text
    return r.json()["run"]["id"], {SECRET_HEADER: r.json()["write_secret"]}


def test_create_is_idempotent_on_the_run_key(client, tiny_demo):
    key = uuid.uuid4().hex
    first = create(client, tiny_demo, key, group="row-a", seed=2, tags=["gpu"])
    assert first.status_code == 201, first.text
    run = first.json()["run"]
    assert first.json()["created"] and run["source"] == "tracked" and run["status"] == "RUNNING"
    assert len(first.json()["write_secret"]) >= 32
    assert (run["group"], run["seed"], run["tags"], run["data_hash"], run["progress"]["total_steps"]) == \
        ("row-a", 2, ["gpu"], "abc123", 6)
    assert run["params"]["model.n_layer"] == "2" and run["params"]["preset"] == "tiny"
    again = create(client, tiny_demo, key)
    assert again.status_code == 200 and not again.json()["created"] and again.json()["run"]["id"] == run["id"]
    assert again.json()["write_secret"] is None  # shown once
    assert len(client.get("/api/v1/runs", params={"experiment": "elsewhere", "group": "row-a"}).json()) == 1


@pytest.mark.parametrize("body", [{"run_key": "short"}, {"run_key": "has space in it"}, {"config": {"model": 3}},
                                  {"source": "job"}, {"config": {"train": {"lr": "fast"}}}])
def test_create_refuses_bad_input(client, tiny_demo, body):
    r = create(client, tiny_demo, **body) if "run_key" not in body else create(client, tiny_demo, body["run_key"])
    assert r.status_code == 422 and r.json()["detail"]


def test_a_batch_sent_twice_is_stored_once(client, tiny_demo):
    run_id, auth = tracked(client, tiny_demo)
    batch = {"metrics": [{"key": "train_loss", "step": s, "value": 5.0 - s, "time": 1e9 + s} for s in (1, 2, 3)]
             + [{"key": "val_loss", "step": 3, "value": "nan", "time": 1e9}],
             "plans": [{"step": 1, "windows": [[4, None], [16, 8]]}, {"step": 3, "windows": [[2, 2], [None, 64]]}],
             "step": 3}
    r = client.post(f"{API}/{run_id}/log", json=batch, headers=auth)
    assert r.status_code == 200, r.text
    assert (r.json()["metrics_written"], r.json()["plans_written"]) == (4, 2)
    again = client.post(f"{API}/{run_id}/log", json=batch, headers=auth)
    assert (again.json()["metrics_written"], again.json()["plans_written"]) == (0, 0)
    series = client.get(f"/api/v1/runs/{run_id}/metrics").json()["series"]
    assert series["train_loss"]["step"] == [1, 2, 3] and series["train_loss"]["value"] == [4.0, 3.0, 2.0]
    assert series["val_loss"]["value"] == ["nan"]
    windows = client.get(f"/api/v1/runs/{run_id}/windows").json()
    assert windows["steps"] == [1, 3] and windows["windows"] == [[2, 2], [None, None]]  # 64 = seq_len: full
    assert client.get(f"/api/v1/runs/{run_id}").json()["progress"]["step"] == 3



def stored_points(client: TestClient, run_id: int) -> list[tuple]:
    """(key, step, value, special, timestamp) of every stored point of the run, by key and step."""
    with transaction(client.app.state.sessions) as s:
        return [tuple(row) for row in s.execute(
            select(Metric.key, Metric.step, Metric.value, Metric.special, Metric.timestamp)
            .where(Metric.run_id == run_id).order_by(Metric.key, Metric.step))]


def test_series_columns_arrive_exactly_and_a_step_sent_twice_is_stored_once(client, tiny_demo):
    run_id, auth = tracked(client, tiny_demo)
    lr = {"step": [0, 10, 20], "value": [1e-300, 99.0, 0.1 + 0.2], "time": [1.5e9, 1.5e9 + 0.001, 2e9]}
    batch = {"series": {"lr": lr, "loss": {"step": [5, 5, 7, 9], "value": [2.5, 99.0, "nan", None],
                                           "time": [1.0, 2.0, 3.0, 4.0]},
                        "grad": {"step": [1, 2], "value": ["inf", "-inf"], "time": [0.0, 1e11]}},
             "metrics": [{"key": "loss", "step": 3, "value": 4.0, "time": 0.5},
                         {"key": "lr", "step": 10, "value": 7.0, "time": 9.0}],  # rows come first: this one stays
             "step": 20}
    r = client.post(f"{API}/{run_id}/log", json=batch, headers=auth)
    assert r.status_code == 200 and r.json()["metrics_written"] == 9, r.text
    expected = [("grad", 1, None, "inf", 0.0), ("grad", 2, None, "-inf", 1e11),
                ("loss", 3, 4.0, None, 0.5), ("loss", 5, 2.5, None, 1.0), ("loss", 7, None, "nan", 3.0),
                ("loss", 9, None, "nan", 4.0),
                ("lr", 0, 1e-300, None, 1.5e9), ("lr", 10, 7.0, None, 9.0), ("lr", 20, 0.1 + 0.2, None, 2e9)]
    assert stored_points(client, run_id) == expected
    again = client.post(f"{API}/{run_id}/log", json={"series": {"loss": {"step": [5, 11], "value": [0.0, 1.0],
                                                                                "time": [5.0, 6.0]}}},
                        headers=auth)
    assert again.json()["metrics_written"] == 1
    assert stored_points(client, run_id) == [*expected[:6], ("loss", 11, 1.0, None, 6.0), *expected[6:]]
    with transaction(client.app.state.sessions) as s:
        assert metric_store.metrics_version(s, run_id) == (10, 3)
        assert run_store.latest_values(s, [run_id])[run_id] == {"grad": "-inf", "loss": 1.0, "lr": 0.1 + 0.2}
    assert client.get(f"/api/v1/runs/{run_id}").json()["progress"]["step"] == 20


@pytest.mark.parametrize(("series", "where"), [
    ({"loss": {"step": [1, 2], "value": [1.0], "time": [1.0, 2.0]}}, "series.loss: Value error, step, value and"),
    ({"loss": {"step": [1, -2], "value": [1.0, 2.0], "time": [1.0, 2.0]}}, "series.loss.step.1: Input should be"),
    ({"loss": {"step": [1], "value": ["big"], "time": [1.0]}}, "series.loss.value.0"),
    ({"loss": {"step": [1], "value": [1.0], "time": [-1.0]}}, "series.loss.time.0: Input should be"),
    ({"loss": {"step": [1], "value": [1.0]}}, "series.loss.time: Field required"),
    ({"loss": {"step": [1], "value": [1.0], "time": [1.0], "when": [1.0]}}, "series.loss.when: Extra inputs"),
    ({"k" * 251: {"step": [1], "value": [1.0], "time": [1.0]}}, ".[key]: String should have at most 250"),
    ({"loss": {"step": list(range(MAX_METRICS_PER_BATCH + 1)), "value": [1.0] * (MAX_METRICS_PER_BATCH + 1),
               "time": [1.0] * (MAX_METRICS_PER_BATCH + 1)}}, "series.loss.step: List should have at most"),
    ({"a": {"step": list(range(MAX_METRICS_PER_BATCH)), "value": [1.0] * MAX_METRICS_PER_BATCH,
            "time": [1.0] * MAX_METRICS_PER_BATCH}, "b": {"step": [1], "value": [1.0], "time": [1.0]}},
     f"request: Value error, metrics and series hold more than {MAX_METRICS_PER_BATCH} points"),
])
def test_bad_series_are_refused_naming_the_field(client, tiny_demo, series, where):
    run_id, auth = tracked(client, tiny_demo)
    r = client.post(f"{API}/{run_id}/log", json={"series": series}, headers=auth)
    assert r.status_code == 422 and where in r.json()["detail"], r.text
    assert stored_points(client, run_id) == []

def test_log_refuses_bad_plans_and_foreign_runs(client, tiny_demo):
    run_id, auth = tracked(client, tiny_demo)
    r = client.post(f"{API}/{run_id}/log", json={"plans": [{"step": 1, "windows": [[4, 4, 4], [4, 4, 4]]}]},
                    headers=auth)
    assert r.status_code == 422 and "plans.0" in r.json()["detail"]
    with transaction(client.app.state.sessions) as s:
        job = run_store.create_run(s, name="job", experiment="jobs")
    r = client.post(f"{API}/{job}/log", json={"metrics": []}, headers=auth)
    assert r.status_code == 403 and "read-only for tracking" in r.json()["detail"]
    paper = client.get("/api/v1/runs", params={"source": "paper"}).json()[0]["id"]
    assert client.post(f"{API}/{paper}/status", json={"status": "FAILED"}, headers=auth).status_code == 403
    assert client.post(f"{API}/{10**9}/log", json={}, headers=auth).status_code == 404


def test_final_status_is_idempotent(client, tiny_demo):
    run_id, auth = tracked(client, tiny_demo)
    r = client.post(f"{API}/{run_id}/status", json={"status": "FINISHED", "step": 6, "checkpoint_ref": "/elsewhere/ck"},
                    headers=auth)
    assert r.status_code == 200 and r.json()["status"] == "FINISHED" and r.json()["checkpoint"] == "/elsewhere/ck"
    again = client.post(f"{API}/{run_id}/status", json={"status": "FINISHED", "step": 9, "checkpoint_ref": "/x"},
                        headers=auth)
    assert again.status_code == 200 and again.json() == r.json()  # an ended run changes no more
    assert client.post(f"{API}/{run_id}/status", json={"status": "FAILED"}, headers=auth).status_code == 409
    assert client.post(f"{API}/{run_id}/status", json={"status": "RUNNING"}, headers=auth).status_code == 409
    assert client.get(f"/api/v1/runs/{run_id}").json()["ended_at"] is not None


def upload(client: TestClient, run_id: int, ckpt: Path, auth: dict[str, str],
           replace: dict[str, bytes] | None = None):
    for name in FILES:
        data = (replace or {}).get(name, (ckpt / name).read_bytes())
        r = client.put(f"{API}/{run_id}/checkpoint/{name}", content=data, headers=auth)
        assert r.status_code == 200 and r.json()["bytes"] == len(data), r.text
    return client.post(f"{API}/{run_id}/checkpoint", headers=auth)


def test_checkpoint_upload_registers_a_model(client, tiny_demo):
    run_id, auth = tracked(client, tiny_demo)
    r = upload(client, run_id, tiny_demo, auth)
    assert r.status_code == 200, r.text
    assert r.json()["model_id"] == f"run-{run_id}" and r.json()["n_params"] > 0
    models = {m["id"]: m for m in client.get("/api/v1/models").json()}
    assert models[f"run-{run_id}"]["run_id"] == run_id and models[f"run-{run_id}"]["n_layer"] == 2
    assert client.get(f"/api/v1/runs/{run_id}").json()["checkpoint"] == f"tracked/run-{run_id}/checkpoint"
    again = client.post(f"{API}/{run_id}/checkpoint", headers=auth)  # a retried commit (its answer was lost)
    assert again.status_code == 200 and again.json() == r.json()
    assert upload(client, run_id, tiny_demo, auth).status_code == 200  # again: replaced, still one model
    windows = client.get(f"/api/v1/models/run-{run_id}/windows")
    assert windows.status_code == 200 and windows.json()["windows"] == [[4, None], [16, 8]]


def test_checkpoint_upload_refuses_other_files_and_corrupt_weights(client, tiny_demo):
    run_id, auth = tracked(client, tiny_demo)
    r = client.put(f"{API}/{run_id}/checkpoint/model.pt", content=b"\x80\x04pickle", headers=auth)
    assert r.status_code == 422 and "no pickles" in r.json()["detail"]
    assert client.post(f"{API}/{run_id}/checkpoint", headers=auth).status_code == 422  # nothing uploaded yet
    r = upload(client, run_id, tiny_demo, auth, {"model.safetensors": b"not safetensors at all"})
    assert r.status_code == 422 and "model.safetensors" in r.json()["detail"]
    assert f"run-{run_id}" not in {m["id"] for m in client.get("/api/v1/models").json()}
    assert client.post(f"{API}/{run_id}/checkpoint", headers=auth).status_code == 422  # the refused files were not kept
