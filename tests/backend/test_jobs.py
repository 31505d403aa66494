"""Training jobs in worker processes: finish, cancel, a killed worker, the job cap, bad input."""

from __future__ import annotations

import os
import signal
import time

import pytest
from fastapi.testclient import TestClient

from backend.app import create_app
from tests.backend.conftest import make_settings

API = "/api/v1"
TINY = {"train.max_steps": 3, "train.eval_every": 3, "train.eval_batches": 1}
LONG = {"train.max_steps": 100000, "train.eval_every": 1000}


@pytest.fixture(scope="module")
def jobs_client(tmp_path_factory):
    settings = make_settings(tmp_path_factory.mktemp("jobs"), None, seed_paper=False, max_jobs=2, job_grace_s=5.0)
    with TestClient(create_app(settings)) as c:
        yield c


def _wait(client, run_id, done, timeout=120.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        run = client.get(f"{API}/runs/{run_id}").json()
        if done(run):
            return run
        time.sleep(0.2)
    raise AssertionError(f"run {run_id} did not get there in {timeout}s: {run}")


def test_bad_presets_and_overrides_are_422(jobs_client):
    r = jobs_client.post(f"{API}/runs", json={"preset": "nope"})
    assert r.status_code == 422 and "unknown preset 'nope'" in r.json()["detail"]
    r = jobs_client.post(f"{API}/runs", json={"preset": "tiny", "overrides": {"train.nope": 1}})
    assert r.status_code == 422 and "train.nope" in r.json()["detail"]
    r = jobs_client.post(f"{API}/runs", json={"preset": "tiny", "overrides": {"train.max_steps": "inf"}})
    assert r.status_code == 422 and r.json()["detail"].startswith("overrides:")
    r = jobs_client.post(f"{API}/runs", json={"preset": "tiny", "overrides": {"model.n_head": 3}})
    assert r.status_code == 422 and "divisible" in r.json()["detail"]


@pytest.mark.parametrize("preset, overrides, field", [
    ("full_adaptive", {"controller.ema_alpha": 2.0}, "controller.ema_alpha"),
    ("full_adaptive", {"controller.topology": "tree"}, "controller.topology"),
    ("full_adaptive", {"controller.nope": 1}, "controller.nope"),
    ("tiny", {"controller.mode": "magic"}, "controller.mode"),
    ("tiny", {"controller.window": 0}, "controller.window"),
    ("tiny", {"controller.plan": [[4, 4]]}, "controller.plan"),
    ("learned_budget", {"controller.budget": "lots"}, "controller.budget"),
    ("static_per_layer", {"controller.layer_windows": [4]}, "controller.layer_windows"),
], ids=["range", "choice", "unknown", "mode", "window", "plan-shape", "type", "layers"])
def test_bad_controller_settings_are_422_at_once_naming_the_field(jobs_client, preset, overrides, field):
    before = jobs_client.get(f"{API}/runs").json()
    r = jobs_client.post(f"{API}/runs", json={"preset": preset, "overrides": overrides})
    assert r.status_code == 422 and field in r.json()["detail"], r.json()
    assert jobs_client.get(f"{API}/runs").json() == before  # no run was created


def test_cap_cancel_and_kill(jobs_client):
    """Two long jobs fill the cap (a third is 503); one is cancelled (KILLED), the other SIGKILLed."""
    a = jobs_client.post(f"{API}/runs", json={"preset": "tiny", "overrides": LONG, "name": "a"})
    b = jobs_client.post(f"{API}/runs", json={"preset": "tiny", "overrides": LONG, "name": "b"})
    assert a.status_code == b.status_code == 202
    assert a.json()["status"] in ("SCHEDULED", "RUNNING") and a.json()["params"]["train.max_steps"] == "100000"
    full = jobs_client.post(f"{API}/runs", json={"preset": "tiny", "overrides": TINY})
    assert full.status_code == 503 and "AAH_MAX_JOBS" in full.json()["detail"]
    a_id, b_id = a.json()["id"], b.json()["id"]
    running = _wait(jobs_client, a_id, lambda r: r["progress"] and r["progress"]["step"] >= 1)
    assert running["status"] == "RUNNING" and running["progress"]["total_steps"] == 100000
    cancelled = jobs_client.post(f"{API}/runs/{a_id}/cancel").json()
    assert cancelled["status"] == "KILLED"
    again = jobs_client.post(f"{API}/runs/{a_id}/cancel")
    assert again.status_code == 409 and "already ended" in again.json()["detail"]

    _wait(jobs_client, b_id, lambda r: r["status"] == "RUNNING")
    pid = jobs_client.app.state.jobs._jobs[b_id].process.pid
    os.kill(pid, signal.SIGKILL)
    killed = _wait(jobs_client, b_id, lambda r: r["status"] not in ("SCHEDULED", "RUNNING"))
    assert killed["status"] == "KILLED" and "SIGKILL" in killed["error"]
    assert jobs_client.post(f"{API}/runs/999999/cancel").status_code == 404


def test_a_job_runs_to_the_end_and_its_model_is_served(jobs_client):
    r = jobs_client.post(f"{API}/runs", json={"preset": "tiny", "overrides": TINY, "experiment": "jobs"})
    run_id = r.json()["id"]
    run = _wait(jobs_client, run_id, lambda r: r["status"] not in ("SCHEDULED", "RUNNING"))
    assert run["status"] == "FINISHED", run["error"]
    assert run["progress"] == {"step": 3, "total_steps": 3} and run["experiment"] == "jobs"
    assert run["checkpoint"] == f"runs/{run_id}/checkpoint" and run["data_hash"]
    series = jobs_client.get(f"{API}/runs/{run_id}/metrics", params={"keys": "train_loss,val_loss"}).json()
    assert series["series"]["train_loss"]["step"] == [1, 2, 3] and series["series"]["val_loss"]["step"] == [3]
    assert jobs_client.get(f"{API}/runs/{run_id}/windows").json()["windows"] == [[None, None], [None, None]]
    model = jobs_client.get(f"{API}/models/run-{run_id}").json()
    assert model["run_id"] == run_id and model["n_layer"] == 2
    ev = jobs_client.post(f"{API}/models/run-{run_id}/evaluate", json={"windows": [[1, 1], [1, 1]]})
    assert ev.status_code == 200 and ev.json()["delta"] != 0


def test_a_crashing_job_ends_failed_with_its_error(jobs_client):
    (jobs_client.app.state.settings.data_dir / "tiny.txt").write_text("too short to split")
    r = jobs_client.post(f"{API}/runs", json={"preset": "tiny", "overrides": {**TINY, "data.corpus": "tiny.txt"}})
    run = _wait(jobs_client, r.json()["id"], lambda r: r["status"] not in ("SCHEDULED", "RUNNING"))
    assert run["status"] == "FAILED" and "too small to split" in run["error"]


def test_a_worker_that_cannot_start_is_503_and_its_run_fails(jobs_client, monkeypatch):
    import subprocess

    def refuse(*args, **kwargs):
        raise OSError(24, "Too many open files")

    monkeypatch.setattr(subprocess, "Popen", refuse)
    r = jobs_client.post(f"{API}/runs", json={"preset": "tiny", "overrides": TINY, "name": "no worker"})
    assert r.status_code == 503 and "could not start the worker" in r.json()["detail"]
    (run,) = [x for x in jobs_client.get(f"{API}/runs").json() if x["name"] == "no worker"]
    assert run["status"] == "FAILED" and "Too many open files" in run["error"]
