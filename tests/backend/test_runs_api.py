"""Runs, metrics, plans, compare, diff, views, the paper reference and demo seeding over HTTP,
on a SQLite and on a PostgreSQL store."""

from __future__ import annotations

import pytest

from backend.store import metric_store, run_store
from backend.store.db import transaction
from tests.backend.conftest import TINY_PLAN
from tests.conftest import DATABASES

API = "/api/v1"
PAPER = "paper (reported)"
pytestmark = pytest.mark.parametrize("client", DATABASES, indirect=True, scope="module")


@pytest.fixture(scope="module")
def logged_run(client) -> int:
    """A run with metrics (including NaN and inf) and two plans, written through the store."""
    sessions = client.app.state.sessions
    with transaction(sessions) as s:
        run_id = run_store.create_run(s, name="logged", experiment="tests", status="FINISHED", preset="tiny",
                                  params={"train.lr": "0.001"}, seq_len=64)
        rows = [("train_loss", step, 5.0 - step / 10, 100.0 + step) for step in range(1, 11)]
        rows += [("val_loss", 5, 4.5, 105.0), ("val_loss", 10, float("nan"), 110.0)]
        rows += [("grad_norm", 3, float("inf"), 103.0), ("grad_norm", 4, float("-inf"), 104.0)]
        metric_store.log_metrics(s, run_id, rows)
        run_store.log_plan(s, run_id, 5, [[64, 64], [64, 64]])
        run_store.log_plan(s, run_id, 10, [[4, None], [16, 8]])
    return run_id


def test_the_store_is_the_parametrized_database(client, request):
    engine = client.app.state.sessions.kw["bind"]
    assert engine.dialect.name == request.node.callspec.params["client"]


def test_health(client):
    body = client.get(f"{API}/health").json()
    assert body["status"] == "ok" and body["models"] == 1 and body["runs"] >= 11 and body["version"]


def test_presets(client):
    presets = {p["name"]: p for p in client.get(f"{API}/presets").json()}
    assert {"demo", "tiny"} <= set(presets) and presets["tiny"]["group"] == "demo"


def test_paper_reference_experiment(client):
    runs = client.get(f"{API}/runs", params={"experiment": PAPER}).json()
    assert len(runs) == 10
    assert all(r["read_only"] and r["status"] == "FINISHED" for r in runs)
    by_name = {r["name"]: r for r in runs}
    shallow = by_name["shallow_freeze · Table 1"]
    assert shallow["summary"]["val_loss"] == 6.5367 and shallow["summary"]["acr"] == 0.3724
    assert shallow["params"]["source"].startswith("arXiv 2608.19203")
    assert by_name["baseline · Table 2"]["summary"]["infer_tokens_per_s"] == 14420
    assert shallow["params"]["method"] == shallow["group"] == "shallow_freeze"  # one naming: the preset's
    metrics = client.get(f"{API}/runs/{shallow['id']}/metrics", params={"keys": "val_loss"}).json()
    assert metrics["series"]["val_loss"]["step"] == [10000]
    r = client.post(f"{API}/runs/{shallow['id']}/cancel")
    assert r.status_code == 409 and "read-only" in r.json()["detail"]


def test_demo_run_seeded_with_history_and_plan(client):
    runs = client.get(f"{API}/runs", params={"experiment": "demo"}).json()
    assert len(runs) == 1
    demo = runs[0]
    assert demo["status"] == "FINISHED" and demo["checkpoint"] == "models/demo"
    assert demo["params"]["model.n_layer"] == "2" and demo["data_hash"]
    series = client.get(f"{API}/runs/{demo['id']}/metrics").json()["series"]
    assert series["train_loss"]["step"] == [1, 2] and "val_loss" in series
    windows = client.get(f"{API}/runs/{demo['id']}/windows").json()
    assert windows["windows"] == TINY_PLAN and windows["step"] == 2 and windows["seq_len"] == 64


def test_runs_filters_and_paging(client, logged_run):
    tiny = client.get(f"{API}/runs", params={"preset": "tiny", "experiment": "tests"}).json()
    assert [r["id"] for r in tiny] == [logged_run]
    assert client.get(f"{API}/runs", params={"status": "RUNNING"}).json() == []
    page = client.get(f"{API}/runs", params={"limit": 2, "offset": 1}).json()
    everything = client.get(f"{API}/runs").json()
    assert [r["id"] for r in page] == [r["id"] for r in everything[1:3]]
    assert client.get(f"{API}/runs", params={"status": "DONE"}).status_code == 422
    assert client.get(f"{API}/runs", params={"limit": 0}).status_code == 422


def test_read_run(client, logged_run):
    run = client.get(f"{API}/runs/{logged_run}").json()
    assert run["name"] == "logged" and run["experiment"] == "tests" and run["params"] == {"train.lr": "0.001"}
    # the latest value per key; a non-finite one keeps its kind
    assert run["summary"] == {"grad_norm": "-inf", "train_loss": pytest.approx(4.0), "val_loss": "nan"}
    assert run["n_keys"] == 3
    assert client.get(f"{API}/runs/999999").status_code == 404
    assert client.get(f"{API}/runs/abc").status_code == 422


def test_metrics_series_and_nonfinite_values(client, logged_run):
    series = client.get(f"{API}/runs/{logged_run}/metrics").json()["series"]
    assert set(series) == {"train_loss", "val_loss", "grad_norm"}
    assert series["val_loss"] == {"step": [5, 10], "value": [4.5, "nan"], "timestamp": [105.0, 110.0],
                                  "nonfinite": {"step": [10], "kind": ["nan"], "total": 1}}
    assert series["grad_norm"]["value"] == ["inf", "-inf"]
    part = client.get(f"{API}/runs/{logged_run}/metrics",
                      params={"keys": "train_loss", "min_step": 3, "max_step": 5}).json()["series"]
    assert list(part) == ["train_loss"] and part["train_loss"]["step"] == [3, 4, 5]
    r = client.get(f"{API}/runs/{logged_run}/metrics", params={"min_step": 5, "max_step": 3})
    assert r.status_code == 422 and "min_step" in r.json()["detail"]
    assert client.get(f"{API}/runs/{logged_run}/metrics", params={"min_step": -1}).status_code == 422
    assert client.get(f"{API}/runs/999999/metrics").status_code == 404


def test_run_windows_by_step(client, logged_run):
    latest = client.get(f"{API}/runs/{logged_run}/windows").json()
    assert latest["steps"] == [5, 10] and latest["step"] == 10 and latest["windows"] == TINY_PLAN
    first = client.get(f"{API}/runs/{logged_run}/windows", params={"step": 5}).json()
    assert first["windows"] == [[None, None], [None, None]]
    r = client.get(f"{API}/runs/{logged_run}/windows", params={"step": 7})
    assert r.status_code == 404 and "stored steps: 5, 10" in r.json()["detail"]


def test_compare(client, logged_run):
    paper = client.get(f"{API}/runs", params={"experiment": PAPER, "limit": 1}).json()[0]["id"]
    body = {"run_ids": [logged_run, paper], "keys": ["train_loss", "val_loss"], "agg": "min"}
    out = client.post(f"{API}/runs/compare", json=body).json()
    assert out["keys"] == ["train_loss", "val_loss"] and [r["id"] for r in out["runs"]] == [logged_run, paper]
    assert out["table"][0] == {"run_id": logged_run, "values": {"train_loss": pytest.approx(4.0), "val_loss": 4.5},
                               "steps": None}
    assert out["series"][str(logged_run)]["train_loss"]["step"] == list(range(1, 11))
    at = client.post(f"{API}/runs/compare", json={**body, "agg": "at_step", "step": 7}).json()
    assert at["table"][0]["values"] == {"train_loss": pytest.approx(4.3), "val_loss": 4.5}
    # the step each value was read at: the nearest stored step at or before 7 (val_loss only has 5)
    assert at["table"][0]["steps"] == {"train_loss": 7, "val_loss": 5}
    early = client.post(f"{API}/runs/compare", json={**body, "agg": "at_step", "step": 3}).json()
    assert early["table"][0]["steps"] == {"train_loss": 3, "val_loss": None}
    assert early["table"][0]["values"]["val_loss"] is None
    last = client.post(f"{API}/runs/compare", json={**body, "agg": "last"}).json()
    assert last["table"][0]["values"]["val_loss"] == "nan"
    maxed = client.post(f"{API}/runs/compare", json={**body, "agg": "max"}).json()
    assert maxed["table"][0]["values"]["train_loss"] == pytest.approx(4.9)


def test_compare_errors(client, logged_run):
    r = client.post(f"{API}/runs/compare", json={"run_ids": [logged_run], "agg": "at_step"})
    assert r.status_code == 422 and "step" in r.json()["detail"]
    assert client.post(f"{API}/runs/compare", json={"run_ids": [logged_run, 999999]}).status_code == 404
    assert client.post(f"{API}/runs/compare", json={"run_ids": []}).status_code == 422


def test_windows_diff(client, logged_run):
    r = client.post(f"{API}/windows/diff", json={"a": {"run_id": logged_run, "step": 5}, "b": {"model_id": "demo"}})
    body = r.json()
    assert body["a"] == [[None, None], [None, None]] and body["b"] == TINY_PLAN
    assert body["changed"] == [[True, False], [True, True]] and body["n_changed"] == 3
    inline = client.post(f"{API}/windows/diff", json={"a": {"model_id": "demo"}, "b": {"windows": [[4, 64], [16, 2]]}})
    assert inline.json()["n_changed"] == 1 and inline.json()["b"] == [[4, None], [16, 2]]
    bad = client.post(f"{API}/windows/diff", json={"a": {"model_id": "demo"}, "b": {"windows": [[4]]}})
    assert bad.status_code == 422 and "shape" in bad.json()["detail"]
    assert client.post(f"{API}/windows/diff", json={"a": {"run_id": 999999}, "b": {"model_id": "demo"}}
                       ).status_code == 404
    assert client.post(f"{API}/windows/diff", json={"a": {"model_id": "zz"}, "b": {"model_id": "demo"}}
                       ).status_code == 404


def test_views_crud(client):
    created = client.post(f"{API}/views", json={"name": "slide 1", "page": "editor", "state": {"layer": 1}})
    assert created.status_code == 201
    view = created.json()
    assert client.get(f"{API}/views/{view['id']}").json() == view
    assert view in client.get(f"{API}/views").json()
    assert client.delete(f"{API}/views/{view['id']}").status_code == 204
    assert client.get(f"{API}/views/{view['id']}").status_code == 404
    assert client.delete(f"{API}/views/{view['id']}").status_code == 404


def test_views_are_renamed_reordered_and_deleted(client):
    ids = [client.post(f"{API}/views", json={"name": f"v{i}", "page": "editor", "state": {}}).json()["id"]
           for i in range(3)]
    renamed = client.patch(f"{API}/views/{ids[1]}", json={"name": "the middle one"})
    assert renamed.status_code == 200 and renamed.json()["name"] == "the middle one"
    assert client.get(f"{API}/views/{ids[1]}").json()["name"] == "the middle one"
    order = [ids[2], ids[0], ids[1]]
    listed = client.put(f"{API}/views/order", json={"ids": order})
    assert listed.status_code == 200 and [v["id"] for v in listed.json()] == order
    assert [v["id"] for v in client.get(f"{API}/views").json()] == order  # the order is kept
    new = client.post(f"{API}/views", json={"name": "v3", "page": "editor", "state": {}}).json()["id"]
    assert [v["id"] for v in client.get(f"{API}/views").json()] == [*order, new]  # a new view comes last
    r = client.put(f"{API}/views/order", json={"ids": order})
    assert r.status_code == 422 and f"missing [{new}]" in r.json()["detail"]
    r = client.put(f"{API}/views/order", json={"ids": [*order, new, 99999]})
    assert r.status_code == 422 and "no such view [99999]" in r.json()["detail"]
    r = client.put(f"{API}/views/order", json={"ids": [*order, new, new]})
    assert r.status_code == 422 and "repeated" in r.json()["detail"]
    assert client.patch(f"{API}/views/{ids[0]}", json={"name": ""}).status_code == 422
    assert client.patch(f"{API}/views/99999", json={"name": "x"}).status_code == 404
    assert client.delete(f"{API}/views/{ids[0]}").status_code == 204
    assert [v["id"] for v in client.get(f"{API}/views").json()] == [ids[2], ids[1], new]


@pytest.mark.parametrize("body", [
    {"name": "", "page": "p", "state": {}},
    {"name": "x" * 121, "page": "p", "state": {}},
    {"name": "x", "page": "p", "state": []},
    {"name": "x", "page": "p", "state": {"big": "y" * 70_000}},
    {"name": "x", "page": "p"},
])
def test_views_validation(client, body):
    assert client.post(f"{API}/views", json=body).status_code == 422


def test_body_size_limit(client):
    r = client.post(f"{API}/views", content=b"{" + b" " * 2_000_000 + b"}", headers={"content-type": "application/json"})
    assert r.status_code == 413 and "larger than the limit" in r.json()["detail"]


def test_cors_only_for_the_ui_origin(client):
    ok = client.get(f"{API}/health", headers={"Origin": "http://127.0.0.1:8501"})
    assert ok.headers.get("access-control-allow-origin") == "http://127.0.0.1:8501"
    other = client.get(f"{API}/health", headers={"Origin": "http://evil.example"})
    assert "access-control-allow-origin" not in other.headers


def test_openapi_is_served(client):
    spec = client.get("/openapi.json").json()
    assert "/api/v1/models/{model_id}/evaluate" in spec["paths"]


def test_openapi_documents_errors_and_auth(client):
    """No token on this server: nothing requires auth, so the spec carries no security and no 401
    (tests/backend/test_security.py checks the spec of a server with a token)."""
    spec = client.get("/openapi.json").json()
    evaluate = spec["paths"]["/api/v1/models/{model_id}/evaluate"]["post"]
    assert "security" not in evaluate and "401" not in evaluate["responses"]
    assert "securitySchemes" not in spec["components"]
    assert evaluate["responses"]["422"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/Error"}
    assert "security" not in spec["paths"]["/api/v1/runs"]["get"]
    assert spec["components"]["schemas"]["Error"]["properties"]["detail"]["type"] == "string"


def test_metric_reads_see_new_rows_despite_the_response_cache(client):
    sessions = client.app.state.sessions
    with transaction(sessions) as s:
        run_id = run_store.create_run(s, name="growing", experiment="tests", status="RUNNING")
        metric_store.log_metrics(s, run_id, [("loss", 1, 1.0, 1.0)])
    url = f"{API}/runs/{run_id}/metrics"
    assert client.get(url).json()["series"]["loss"]["step"] == [1]
    assert client.get(url).json()["series"]["loss"]["step"] == [1]  # served from the cache
    with transaction(sessions) as s:
        metric_store.log_metrics(s, run_id, [("loss", 2, 0.5, 2.0)])
    loss = client.get(url).json()["series"]["loss"]
    assert (loss["step"], loss["value"], loss["timestamp"]) == ([1, 2], [1.0, 0.5], [1.0, 2.0])


def test_downsampled_metrics(client, logged_run):
    url = f"{API}/runs/{logged_run}/metrics"
    body = client.get(url, params={"keys": "train_loss,val_loss", "max_points": 3}).json()
    loss = body["series"]["train_loss"]  # 10 points 4.9 .. 4.0: one bucket, its max and min (= the last)
    assert body["downsampled"] == ["train_loss"] and body["series"]["val_loss"]["step"] == [5, 10]
    assert loss["step"] == [1, 10] and loss["value"] == [pytest.approx(4.9), pytest.approx(4.0)]
    zoom = client.get(url, params={"keys": "train_loss", "max_points": 5, "min_step": 3, "max_step": 8}).json()
    assert zoom["downsampled"] == ["train_loss"] and len(zoom["series"]["train_loss"]["step"]) <= 5
    assert zoom["series"]["train_loss"]["step"][0] == 3 and zoom["series"]["train_loss"]["step"][-1] == 8
    whole = client.get(url, params={"keys": "train_loss", "max_points": 10}).json()
    assert whole["downsampled"] == [] and whole["series"]["train_loss"]["step"] == list(range(1, 11))
    for bad in (2, 0, 100_001, "x"):
        assert client.get(url, params={"max_points": bad}).status_code == 422

