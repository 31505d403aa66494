"""Token auth on mutating endpoints, paths confined to the data dir, startup reconciliation."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from backend.app import create_app
from backend.store import catalog, run_store
from backend.store.db import make_engine, make_session_factory, transaction
from backend.store.migrate import upgrade
from tests.backend.conftest import make_settings

API = "/api/v1"
TOKEN = "s3cret-token"


@pytest.fixture(scope="module")
def secured(tmp_path_factory):
    settings = make_settings(tmp_path_factory.mktemp("secured"), None, api_token=TOKEN, seed_paper=False)
    with TestClient(create_app(settings)) as c:
        yield c


def test_reads_need_no_token(secured):
    assert secured.get(f"{API}/health").status_code == 200
    assert secured.get(f"{API}/runs").status_code == 200


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {TOKEN}"},
                                     {"Authorization": TOKEN}])
def test_mutations_need_the_token(secured, headers):
    for method, path, body in [("post", "/views", {"name": "v", "page": "p", "state": {}}),
                               ("delete", "/views/1", None), ("patch", "/views/1", {"name": "x"}),
                               ("put", "/views/order", {"ids": [1]}), ("post", "/runs", {"preset": "tiny"}),
                               ("post", "/runs/1/cancel", None), ("patch", "/runs/1", {"notes": "x"})]:
        r = secured.request(method.upper(), f"{API}{path}", json=body, headers=headers)
        assert r.status_code == 401, (path, headers)
        assert "AAH_API_TOKEN" in r.json()["detail"]
        assert r.headers["www-authenticate"] == "Bearer"


def test_the_right_token_passes(secured):
    r = secured.post(f"{API}/views", json={"name": "v", "page": "p", "state": {}},
                     headers={"Authorization": f"Bearer {TOKEN}"})
    assert r.status_code == 201


def test_openapi_requires_the_token_on_writes_only(secured):
    """With a token set, a write operation needs it: bearerAuth alone, no anonymous ``{}`` alternative."""
    spec = secured.get("/openapi.json").json()
    assert spec["components"]["securitySchemes"]["bearerAuth"]["scheme"] == "bearer"
    for path, item in spec["paths"].items():
        for method, op in item.items():
            if method in ("post", "put", "patch", "delete"):
                assert op["security"] == [{"bearerAuth": []}], (method, path)
                assert "401" in op["responses"]
            else:
                assert "security" not in op and "401" not in op["responses"], (method, path)


def test_checkpoint_paths_outside_the_data_dir_are_refused(tmp_path, tiny_demo):
    settings = make_settings(tmp_path / "data", None, seed_paper=False)
    with TestClient(create_app(settings)) as c:
        with transaction(c.app.state.sessions) as s:
            catalog.register_checkpoint(s, catalog.CheckpointEntry("evil", "evil", "../../" + str(tiny_demo),
                                                                   None, None, None))
        assert c.get(f"{API}/models").json() == []  # listed models are only the readable ones
        r = c.get(f"{API}/models/evil/windows")
        assert r.status_code == 503 and "outside AAH_DATA_DIR" in r.json()["detail"]


def test_stale_running_runs_fail_at_startup(tmp_path):
    settings = make_settings(tmp_path, None, seed_paper=False)
    engine = make_engine(settings.db_path)
    upgrade(engine)
    with transaction(make_session_factory(engine)) as s:
        run_id = run_store.create_run(s, name="orphan", experiment="x", status="RUNNING")
    engine.dispose()
    with TestClient(create_app(settings)) as c:
        run = c.get(f"{API}/runs/{run_id}").json()
    assert run["status"] == "FAILED" and "interrupted" in run["error"] and run["ended_at"]
