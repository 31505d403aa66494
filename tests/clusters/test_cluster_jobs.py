"""Jobs on a real Ray head and a real Slurm (each test runs once per engine): a tiny job submitted with
`aah submit` ends FINISHED with its points and model, a running job is cancelled and the engine agrees,
a GPU job waits PENDING with the engine's reason and can be cancelled, an unreachable engine is a 503
naming the target, a job outlives a restart of its server, and the API token never reaches a job."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from backend.app import create_app
from backend.settings import Settings
from tests.clusters.conftest import TOKEN, ClusterApi, engine_processes, slurm_job_state
from tests.clusters.engines import RAY_START_TIMEOUT_S, free_port
from tests.frontend.stack import ROOT

ACTIVE = ("SCHEDULED", "PENDING", "RUNNING")


def engine_says(request: pytest.FixtureRequest, engine: str, job_id: str) -> str:
    """The job's state in the engine's own words (Ray's JobStatus, Slurm's JobState); GONE if unknown."""
    if engine == "ray":
        from ray.job_submission import JobSubmissionClient

        client = JobSubmissionClient(request.getfixturevalue("ray_head").address)
        known = {job.submission_id: str(job.status.value) for job in client.list_jobs()}
        return known.get(job_id, "GONE")
    return slurm_job_state(request.getfixturevalue("slurm"), job_id)


def running(run: dict) -> bool:
    return run["status"] == "RUNNING" and run["summary"].get("train_loss") is not None


def train_loss_steps(api: ClusterApi, run_id: int) -> list[int]:
    return api.get(f"/runs/{run_id}/metrics", keys="train_loss")["series"]["train_loss"]["step"]


def test_tiny_job_submitted_from_a_shell_finishes_with_its_points_and_model(api: ClusterApi) -> None:
    steps = 30
    cmd = [sys.executable, "-m", "aah_launcher.cli", "submit", "--target", api.target, "--preset", "tiny", "--set",
           f"train.max_steps={steps}", "--server", api.url, "--token", TOKEN, "--follow", "--poll-s", "0.5"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=180, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stdout + done.stderr
    first = done.stdout.splitlines()[0]
    assert re.fullmatch(rf"run \d+ on {api.target} job \S+: (PENDING|RUNNING)( \(.*\))?", first), first
    assert f"FINISHED at step {steps}" in done.stdout  # the log tail, printed at the end
    run = api.get(f"/runs/{first.split()[1]}")
    assert run["status"] == "FINISHED" and run["target"] == api.target, run
    assert train_loss_steps(api, run["id"]) == list(range(1, steps + 1))
    assert f"run-{run['id']}" in {m["id"] for m in api.get("/models")}  # its checkpoint, uploaded and registered
    api.wait_run(run["id"], lambda r: r["engine_state"] == "FINISHED", 30)  # the engine says so too
    lines = api.get(f"/runs/{run['id']}/logs", tail=3)["lines"]
    assert 0 < len(lines) <= 3 and any(f"FINISHED at step {steps}" in line for line in lines)


def test_running_job_never_sees_the_token_and_is_cancelled(api: ClusterApi, engine: str,
                                                           request: pytest.FixtureRequest) -> None:
    run = api.submit(100_000)
    api.wait_run(run["id"], running)
    pids = engine_processes(f"aah-runs/run-{run['id']}")
    assert pids, "the job's processes are not on this node"
    secrets_seen = 0
    for pid in pids:
        cmdline, environ = (Path(f"/proc/{pid}/{name}").read_bytes() for name in ("cmdline", "environ"))
        assert TOKEN.encode() not in cmdline and TOKEN.encode() not in environ
        assert b"AAH_TRACKING_SECRET" not in cmdline and b"AAH_API_TOKEN" not in environ
        secrets_seen += b"AAH_TRACKING_SECRET=" in environ
    assert secrets_seen, "the job reports with its run's secret, from its environment"
    killed = api.cancel(run["id"])
    assert killed["status"] == "KILLED" and killed["engine_state"] == "KILLED", killed
    assert engine_says(request, engine, run["engine_job_id"]) == {"ray": "STOPPED", "slurm": "CANCELLED"}[engine]


def test_gpu_job_waits_with_the_engines_reason_and_can_be_cancelled(api: ClusterApi, engine: str,
                                                                    request: pytest.FixtureRequest) -> None:
    run = api.submit(30, gpus=1)
    pending = api.wait_run(run["id"], lambda r: r["status"] == "PENDING" and r["engine_state"] == "PENDING"
                           and not r["pending_reason"].startswith("submitted"), 60)
    words = {"ray": "waiting for resources", "slurm": "ReqNodeNotAvail"}[engine]  # each engine's own reason
    assert words in pending["pending_reason"], pending
    killed = api.cancel(run["id"])
    assert killed["status"] == "KILLED" and killed["pending_reason"] is None
    # Slurm ends a queued job at once; Ray cannot stop one whose resources never come, and fails it when
    # it gives up starting it: the server keeps asking, then deletes it from Ray's list
    settled = api.wait_run(run["id"], lambda r: r["engine_state"] not in ("PENDING", "RUNNING"),
                           RAY_START_TIMEOUT_S + 30)
    assert settled["status"] == "KILLED"
    assert engine_says(request, engine, run["engine_job_id"]) == {"ray": "GONE", "slurm": "CANCELLED"}[engine]


def test_unreachable_engine_is_a_503_naming_the_target(engine: str, request: pytest.FixtureRequest,
                                                       tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    if engine == "slurm":  # the live cluster's config with a controller port nothing listens on
        cluster = request.getfixturevalue("slurm")
        text = cluster.conf.read_text()
        port = text.split("SlurmctldPort=")[1].split()[0]
        conf = tmp_path / "slurm.conf"
        conf.write_text(text.replace(f"SlurmctldPort={port}", f"SlurmctldPort={free_port()}") + "MessageTimeout=2\n")
        monkeypatch.setenv("SLURM_CONF", str(conf))
    settings = Settings(data_dir=tmp_path / "data", seed_demo=False, seed_paper=False, seed_suite=False,
                        preload_models=False, reconcile_s=0, **({"ray_address": dead} if engine == "ray" else
                                                                {"slurm_partition": "aah"}))
    with TestClient(create_app(settings)) as client:
        r = client.post("/api/v1/runs", json={"preset": "tiny", "target": engine})
        assert r.status_code == 503, r.text
        assert r.json()["detail"].startswith(f"target {engine}: the engine cannot be reached")
        runs = client.get("/api/v1/runs").json()
        assert [run["status"] for run in runs] == ["FAILED"]  # no run left SCHEDULED
        targets = {t["name"]: t for t in client.get("/api/v1/targets").json()}
        assert targets[engine]["available"] is False and targets["local"]["available"] is True


def test_job_outlives_a_restart_of_its_server(api: ClusterApi, engine: str, request: pytest.FixtureRequest) -> None:
    steps = 200
    run = api.submit(steps)
    api.wait_run(run["id"], running)
    api.kill()
    try:
        assert engine_says(request, engine, run["engine_job_id"]) in ("RUNNING", "COMPLETING")
    finally:
        api.start()
    done = api.wait_run(run["id"], lambda r: r["status"] not in ACTIVE, 120)
    assert done["status"] == "FINISHED", done
    assert train_loss_steps(api, run["id"]) == list(range(1, steps + 1))  # what it sent while the server was away too
    assert api.wait_run(run["id"], lambda r: r["engine_state"] == "FINISHED", 30)["ended_at"] == done["ended_at"]
