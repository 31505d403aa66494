"""Targets without an engine: which targets a server lists, how a job's target and resources are
validated (422 naming the field), the per-target cap, an engine that does not answer (503 naming the
target, the run FAILED and never left SCHEDULED), the logs endpoint, and the run write secret that a
cluster job's tracking writes carry instead of the API token. Jobs on real engines: tests/clusters/."""

from __future__ import annotations

import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from backend.app import create_app
from backend.schemas.tracking import SECRET_HEADER
from backend.services.tracking import secret_hash
from backend.store import run_store
from backend.store.db import transaction
from tests.backend.conftest import make_settings
from tests.clusters.engines import free_port
from tests.frontend.stack import ROOT

TOKEN = "targets-test-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    """An app with a ray target whose engine does not answer (nothing listens on its port)."""
    data = tmp_path_factory.mktemp("targets")
    settings = make_settings(data, None, seed_paper=False, preload_models=False, api_token=TOKEN,
                             ray_address=f"http://127.0.0.1:{free_port()}", max_jobs_slurm=0)
    with TestClient(create_app(settings)) as c:
        yield c


def post_run(client: TestClient, **body: object) -> tuple[int, str]:
    r = client.post("/api/v1/runs", json={"preset": "tiny", **body}, headers=AUTH)
    return r.status_code, r.json()["detail"] if r.status_code >= 400 else ""


def test_a_server_without_cluster_settings_has_only_local_and_imports_no_engine() -> None:
    code = ("import sys, tempfile; from pathlib import Path; from fastapi.testclient import TestClient;"
            "from backend.app import create_app; from backend.settings import Settings;"
            "s = Settings(data_dir=Path(tempfile.mkdtemp()), seed_demo=False, seed_paper=False, seed_suite=False);"
            "c = TestClient(create_app(s)).__enter__(); print([t['name'] for t in c.get('/api/v1/targets').json()]);"
            "print(sorted(m for m in sys.modules if m == 'ray' or m.endswith(ENGINE_MODULES)))")
    code = code.replace("ENGINE_MODULES", repr(("ray_target", "slurm_target", "slurmrest_target")))
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "AAH_ALLOWED_HOSTS": "testserver"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.splitlines() == ["['local']", "[]"]


def test_targets_list_each_with_why_it_is_unavailable(client: TestClient) -> None:
    targets = {t["name"]: t for t in client.get("/api/v1/targets").json()}
    assert list(targets) == ["local", "ray"]
    assert targets["local"]["available"] is True and targets["local"]["kind"] == "local"
    assert targets["ray"]["available"] is False and "does not answer" in targets["ray"]["detail"]


@pytest.mark.parametrize(("body", "field"), [
    ({"target": "local", "resources": {"gpus": 1}}, "resources.gpus"),  # this machine has none (CPU wheel)
    ({"target": "local", "resources": {"nodes": 2}}, "resources.nodes"),
    ({"target": "local", "resources": {"time_limit_min": 30}}, "resources.time_limit_min"),
    ({"target": "ray", "resources": {"nodes": 2}}, "resources.nodes"),  # Ray Jobs run on one node
    ({"target": "ray", "resources": {"time_limit_min": 30}}, "resources.time_limit_min"),
    ({"target": "kubernetes"}, "target"),
    ({"target": "slurm"}, "target"),  # not configured here
], ids=["local-gpus", "local-nodes", "local-time", "ray-nodes", "ray-time", "unknown", "unconfigured"])
def test_target_and_resources_are_validated_naming_the_field(client: TestClient, body: dict, field: str) -> None:
    status, detail = post_run(client, **body)
    assert status == 422 and detail.startswith(f"{field}: "), detail


@pytest.mark.parametrize("resources", [{"gpus": -1}, {"cpus": 0}, {"memory_gb": 0}, {"nodes": 0}, {"gpus": "two"},
                                       {"disk_gb": 10}], ids=["gpus", "cpus", "memory", "nodes", "type", "unknown"])
def test_resources_out_of_range_are_a_422(client: TestClient, resources: dict) -> None:
    status, detail = post_run(client, target="ray", resources=resources)
    assert status == 422 and f"resources.{next(iter(resources))}" in detail, detail


def test_an_engine_that_does_not_answer_is_a_503_naming_it_and_no_run_stays_scheduled(client: TestClient) -> None:
    before = {r["id"] for r in client.get("/api/v1/runs").json()}
    status, detail = post_run(client, target="ray")
    assert status == 503 and detail.startswith("target ray: the engine cannot be reached"), detail
    (run,) = [r for r in client.get("/api/v1/runs").json() if r["id"] not in before]
    assert run["status"] == "FAILED" and run["target"] == "ray" and run["error"].startswith("not submitted: target ray")


def test_the_cap_applies_per_target(tmp_path: Path) -> None:
    settings = make_settings(tmp_path, None, seed_paper=False, preload_models=False,
                             ray_address=f"http://127.0.0.1:{free_port()}", max_jobs_ray=0)
    with TestClient(create_app(settings)) as c:
        r = c.post("/api/v1/runs", json={"preset": "tiny", "target": "ray"})
        assert r.status_code == 503 and "AAH_MAX_JOBS_RAY" in r.json()["detail"]
        assert c.get("/api/v1/runs").json() == []  # refused before any run was made


def test_logs_of_a_run_without_output_and_bad_tails(client: TestClient) -> None:
    sessions = client.app.state.sessions
    with transaction(sessions) as s:
        run_id = run_store.create_run(s, name="queued", experiment="default")
    logs = client.get(f"/api/v1/runs/{run_id}/logs", params={"tail": 5}).json()
    assert logs == {"run_id": run_id, "target": "local", "engine_job_id": None, "lines": []}
    assert client.get(f"/api/v1/runs/{run_id}/logs", params={"tail": 0}).status_code == 422
    assert client.get("/api/v1/runs/999999/logs").status_code == 404


def _cluster_run(client: TestClient, status: str = "PENDING") -> tuple[int, str]:
    secret = secrets.token_urlsafe(32)
    with transaction(client.app.state.sessions) as s:
        run_id = run_store.create_run(s, name="on-ray", experiment="default", target="ray", status=status,
                                  config={"model": {"n_layer": 2, "n_head": 2, "seq_len": 64}})
        run_store.update_run(s, run_id, write_secret_hash=secret_hash(secret), engine_job_id="raysubmit_x")
    return run_id, secret


def log(client: TestClient, run_id: int, headers: dict[str, str]) -> tuple[int, dict]:
    body = {"metrics": [{"key": "train_loss", "step": 1, "value": 2.5, "time": 1.0}]}
    r = client.post(f"/api/v1/tracking/runs/{run_id}/log", json=body, headers=headers)
    return r.status_code, r.json()


def test_a_cluster_jobs_run_takes_writes_with_its_secret_and_no_token(client: TestClient) -> None:
    run_id, secret = _cluster_run(client)
    status, _ = log(client, run_id, {SECRET_HEADER: secret})
    assert status == 200
    run = client.get(f"/api/v1/runs/{run_id}").json()
    assert run["status"] == "RUNNING" and run["summary"]["train_loss"] == 2.5  # it reports: it runs


def test_a_cluster_jobs_run_refuses_writes_without_its_own_secret(client: TestClient) -> None:
    run_id, secret = _cluster_run(client)
    other_id, other = _cluster_run(client)
    assert log(client, run_id, AUTH)[0] == 403  # even the API token: only the job writes its run
    assert log(client, run_id, {SECRET_HEADER: other})[0] == 403  # another run's secret
    assert log(client, run_id, {SECRET_HEADER: "guess"})[0] == 403
    assert log(client, other_id, {SECRET_HEADER: other})[0] == 200
    # a secret opens tracking writes to its run only: anything else still needs the token
    r = client.post("/api/v1/runs", json={"preset": "tiny"}, headers={SECRET_HEADER: secret})
    assert r.status_code == 401
    with transaction(client.app.state.sessions) as s:
        tracked = run_store.create_run(s, name="tracked", experiment="tracked", source="tracked", status="RUNNING")
    assert log(client, tracked, {SECRET_HEADER: secret})[0] == 403


def test_a_queued_job_its_engine_ended_is_cleared_from_the_engines_list_or_followed_until_it_can_be() -> None:
    """Ray may give up on a job still waiting for resources while its cancel waits (a FAILED job, still listed):
    the cancel and the poller then delete it from Ray's list; while Ray refuses, the run stays followed."""
    from backend.services.target_jobs import _cleared
    from backend.services.targets import EngineState

    class Engine:
        def __init__(self, deletes: bool) -> None:
            self.deletes, self.forgotten = deletes, []

        def forget(self, job_id: str) -> bool:
            self.forgotten.append(job_id)
            return self.deletes

    failed = EngineState("FAILED", "job supervisor actor failed to start")
    engine = Engine(deletes=True)
    assert _cleared(engine, "j1", "PENDING", failed) == failed and engine.forgotten == ["j1"]
    refusing = Engine(deletes=False)
    assert _cleared(refusing, "j2", "PENDING", failed) == EngineState("PENDING", failed.reason)
    untouched = Engine(deletes=True)  # a job that ran, one still queued, one already gone: nothing to delete
    for was, state in (("RUNNING", failed), ("PENDING", EngineState("PENDING", "waiting")),
                       ("PENDING", EngineState("GONE", "unknown"))):
        assert _cleared(untouched, "j3", was, state) == state
    assert untouched.forgotten == []
