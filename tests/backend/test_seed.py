"""First-start seeding: the demo is registered once, and re-imported when the shipped files change."""

from __future__ import annotations

import json
import shutil

from fastapi.testclient import TestClient

from backend.app import create_app
from tests.backend.conftest import make_settings

API = "/api/v1"


def _demo_runs(client):
    return client.get(f"{API}/runs", params={"experiment": "demo"}).json()


def test_demo_is_seeded_once_and_refreshed_when_the_shipped_files_change(tmp_path, tiny_demo):
    shipped = tmp_path / "shipped"
    shutil.copytree(tiny_demo, shipped)
    settings = make_settings(tmp_path / "data", shipped, seed_paper=False, preload_models=False)
    with TestClient(create_app(settings)) as c:
        first = _demo_runs(c)
        assert len(first) == 1 and [m["id"] for m in c.get(f"{API}/models").json()] == ["demo"]
    with TestClient(create_app(settings)) as c:  # unchanged files: nothing re-imported
        assert _demo_runs(c) == first
    with (shipped / "history.jsonl").open("a") as f:  # "the trained checkpoint replaced the placeholder"
        f.write(json.dumps({"step": 3, "time": 3.0, "train_loss": 1.25, "val_loss": None}) + "\n")
    with TestClient(create_app(settings)) as c:
        runs = _demo_runs(c)
        assert len(runs) == 1 and runs[0]["id"] > first[0]["id"]  # a new run; ids are never reused
        assert runs[0]["summary"]["train_loss"] == 1.25 and runs[0]["summary"]["val_loss"] == "nan"
        models = c.get(f"{API}/models").json()
        assert [m["id"] for m in models] == ["demo"] and models[0]["run_id"] == runs[0]["id"]
        assert (tmp_path / "data" / "models" / "demo" / "history.jsonl").read_text().count("\n") == 3


def test_a_demo_inside_the_data_dir_is_referenced_not_copied(tmp_path, tiny_demo):
    data_dir = tmp_path / "data"
    shutil.copytree(tiny_demo, data_dir / "demo")
    with TestClient(create_app(make_settings(data_dir, data_dir / "demo", seed_paper=False))) as c:
        assert _demo_runs(c)[0]["checkpoint"] == "demo"
        assert not (data_dir / "models").exists()
        assert c.get(f"{API}/models/demo/windows").status_code == 200


def test_no_demo_means_no_models_and_no_error(tmp_path):
    with TestClient(create_app(make_settings(tmp_path, tmp_path / "missing", seed_paper=False))) as c:
        assert c.get(f"{API}/models").json() == [] and _demo_runs(c) == []


def test_a_demo_with_an_invalid_plan_is_not_registered(tmp_path, tiny_demo):
    shipped = tmp_path / "shipped"
    shutil.copytree(tiny_demo, shipped)
    doc = json.loads((shipped / "plan.json").read_text())
    doc["windows"][0][0] = 0  # window 0 is not a window
    (shipped / "plan.json").write_text(json.dumps(doc))
    with TestClient(create_app(make_settings(tmp_path / "data", shipped, seed_paper=False))) as c:
        assert c.get(f"{API}/models").json() == [] and _demo_runs(c) == []
