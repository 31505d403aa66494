"""Workers never outlive their server and every run's end is true and recorded once (issue 10 item 3):
a SIGKILLed uvicorn takes its worker with it, a restarted server stops a stray worker, the job cap
counts workers it did not start, and a run whose worker died is never relabelled by a cancel."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

from aah_core.config import apply_overrides
from aah_core.presets import get_preset
from backend.app import create_app
from backend.jobs.lifecycle import SERVICE_STOPPED
from backend.services.workers import find_worker
from backend.store import run_store
from backend.store.db import make_engine, make_session_factory, transaction
from backend.store.migrate import upgrade
from backend.store.tables import Run
from tests.backend.conftest import make_settings
from tests.frontend.stack import ROOT, api_command, free_port, wait_ready

API = "/api/v1"
LONG = {"train.max_steps": 100000, "train.eval_every": 1000}
QUIET = {"AAH_SEED_DEMO": "false", "AAH_SEED_PAPER": "false", "AAH_SEED_SUITE": "false",
         "AAH_PRELOAD_MODELS": "false"}

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return True
    return state in ("Z", "X")  # an orphan's zombie waits for its reaper; it runs nothing


def _until(check, timeout: float, what: str):  # noqa: ANN001, ANN202
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"{what} not within {timeout:.0f} s")


def _start_server(data: Path, log: Path, **env: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("AAH_")}
    full_env.update({"AAH_DATA_DIR": str(data), "PYTHONPATH": str(ROOT), **QUIET, **env})
    proc = subprocess.Popen(api_command(port), cwd=ROOT, env=full_env, stdout=log.open("a"),
                            stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    wait_ready(url + API + "/health", proc, log, 120)
    return proc, url


def _run(url: str, run_id: int) -> dict:
    return httpx.get(f"{url}{API}/runs/{run_id}", timeout=10).json()


def _sessions(data: Path):  # noqa: ANN202
    engine = make_engine(data / "aah.db")
    upgrade(engine)
    return make_session_factory(engine)


def _pid(sessions, run_id: int) -> int | None:  # noqa: ANN001
    with transaction(sessions) as s:
        return s.get(Run, run_id).pid


def test_a_sigkilled_server_takes_its_worker_along_and_the_restart_shows_the_true_end(tmp_path):
    data, log = tmp_path / "data", tmp_path / "api.log"
    server, url = _start_server(data, log)
    worker = None
    try:
        run_id = httpx.post(f"{url}{API}/runs", json={"preset": "tiny", "overrides": LONG}, timeout=30).json()["id"]
        _until(lambda: (_run(url, run_id).get("progress") or {}).get("step", 0) >= 2, 120, "two steps")
        worker = _pid(_sessions(data), run_id)
        assert worker and find_worker(worker) is not None
        server.send_signal(signal.SIGKILL)
        server.wait(10)
        # The worker exits ORPHAN_EXIT_S after noticing; the limit here only detects a worker that never does.
        _until(lambda: _gone(worker), 60, "the orphaned worker's exit")
    finally:
        if server.poll() is None:
            server.kill()
        if worker and not _gone(worker):  # leave no stray behind when the check fails
            os.kill(worker, signal.SIGKILL)
    server, url = _start_server(data, log)
    try:
        run = _run(url, run_id)
        worker_log = (data / "runs" / str(run_id) / "worker.log").read_text()
        # the worker stopped at its next step, wrote its weights and recorded why, once (on failure: its log says
        # how far it got)
        assert (run["status"], run["error"]) == ("KILLED", SERVICE_STOPPED), worker_log[-2000:]
        assert run["checkpoint"] == f"runs/{run_id}/checkpoint"
        assert (data / run["checkpoint"] / "config.json").exists()
        assert httpx.get(f"{url}{API}/models/run-{run_id}", timeout=30).status_code == 200
        assert f"run {run_id} ended KILLED" in worker_log and "FINISHED" not in worker_log
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(30)


def _scheduled_run(sessions) -> int:  # noqa: ANN001
    config = apply_overrides(get_preset("tiny"), LONG)
    with transaction(sessions) as s:
        return run_store.create_run(s, name="stray", experiment="default", preset="tiny", config=config.to_dict())


def _worker_cmd(run_id: int, data: Path) -> list[str]:
    return [sys.executable, "-m", "backend.jobs.worker", "--run-id", str(run_id), "--data-dir", str(data)]


def _env() -> dict[str, str]:
    return {**{k: v for k, v in os.environ.items() if not k.startswith("AAH_")}, "PYTHONPATH": str(ROOT)}


def test_a_restarted_server_stops_a_stray_worker_and_records_one_end(tmp_path):
    """A worker left behind (started without a parent to watch, then orphaned) is stopped at start."""
    data = tmp_path / "data"
    sessions = _sessions(data)
    run_id = _scheduled_run(sessions)
    log = tmp_path / "stray.log"
    # the shell exits at once: the worker is orphaned before it trains, as after a server's crash
    subprocess.run(["sh", "-c", f'"$@" >{log} 2>&1 &', "sh", *_worker_cmd(run_id, data)], env=_env(), check=True)
    _until(lambda: _progress(sessions, run_id) >= 1, 120, "the stray's first step")
    stray = _pid(sessions, run_id)
    settings = make_settings(data, None, seed_paper=False, seed_suite=False, reconcile_s=0, job_grace_s=20)
    with TestClient(create_app(settings)) as client:
        assert _gone(stray)
        run = client.get(f"{API}/runs/{run_id}").json()
    assert run["status"] == "KILLED" and run["error"] == SERVICE_STOPPED and run["checkpoint"], run
    assert log.read_text().count("ended KILLED") == 1


def _progress(sessions, run_id: int) -> int:  # noqa: ANN001
    with transaction(sessions) as s:
        return run_store.get_run(s, run_id).progress.step if run_store.get_run(s, run_id).progress else 0


def test_the_job_cap_counts_a_live_worker_another_server_started(tmp_path):
    data = tmp_path / "data"
    sessions = _sessions(data)
    run_id = _scheduled_run(sessions)
    # this test process plays the other server: the worker's parent, alive
    other = subprocess.Popen(_worker_cmd(run_id, data) + ["--parent-pid", str(os.getpid())], env=_env(),
                             stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        _until(lambda: _pid(sessions, run_id), 120, "the worker's start")
        settings = make_settings(data, None, seed_paper=False, seed_suite=False, max_jobs=1, reconcile_s=0)
        with TestClient(create_app(settings)) as client:
            assert client.get(f"{API}/runs/{run_id}").json()["status"] in ("SCHEDULED", "RUNNING")
            full = client.post(f"{API}/runs", json={"preset": "tiny", "overrides": LONG})
            assert full.status_code == 503 and "AAH_MAX_JOBS" in full.json()["detail"]
            cancel = client.post(f"{API}/runs/{run_id}/cancel")
            assert cancel.status_code == 409 and "another server" in cancel.json()["detail"]
        assert other.poll() is None  # not ours to stop
    finally:
        other.send_signal(signal.SIGINT)
        other.wait(60)
    with transaction(sessions) as s:
        run = run_store.get_run(s, run_id)
    assert run.status == "KILLED" and run.error == "cancelled by the user"


def test_a_run_whose_worker_died_ends_failed_and_a_cancel_does_not_relabel_it(tmp_path):
    dead = subprocess.Popen(["true"])
    dead.wait()
    settings = make_settings(tmp_path, None, seed_paper=False, seed_suite=False, reconcile_s=0.2)
    with TestClient(create_app(settings)) as client:
        sessions = client.app.state.sessions
        with transaction(sessions) as s:  # as a worker that died unrecorded (e.g. disk full) leaves it
            ticked = run_store.create_run(s, name="dead", experiment="x", status="RUNNING")
            cancelled = run_store.create_run(s, name="dead too", experiment="x", status="RUNNING")
            run_store.update_run(s, ticked, pid=dead.pid)
            run_store.update_run(s, cancelled, pid=dead.pid)
        r = client.post(f"{API}/runs/{cancelled}/cancel")
        assert r.status_code == 409 and "already ended (FAILED)" in r.json()["detail"]
        run = client.get(f"{API}/runs/{cancelled}").json()
        assert run["status"] == "FAILED" and f"worker (pid {dead.pid}) is gone" in run["error"]
        # the periodic pass settles a run nobody asks about
        _until(lambda: client.get(f"{API}/runs/{ticked}").json()["status"] == "FAILED", 10, "the periodic pass")
