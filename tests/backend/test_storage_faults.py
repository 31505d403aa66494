"""Storage faults lose no training (issue 10 item 6): a write lock held past the busy timeout and a
full disk (a real EFBIG from RLIMIT_FSIZE) lose no metric and no weights, a dead worker's spool
reaches the store, a failing run keeps its weights, and a read-only data dir stops the server with
one line naming it."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from aah_core.checkpoint import load_checkpoint
from aah_core.config import apply_overrides
from aah_core.presets import get_preset
from aah_core.train import Callback, train
from backend.app import create_app
from backend.jobs import spool
from backend.jobs.sink import SqliteMetricsSink
from backend.store import run_store
from backend.store.db import make_engine, make_session_factory, transaction
from backend.store.migrate import upgrade
from backend.store.tables import Metric
from tests.backend.conftest import make_settings
from tests.frontend.stack import ROOT, api_command, free_port

API = "/api/v1"
STEPS = 30
CONFIG = {"train.max_steps": STEPS, "train.eval_every": 10, "train.eval_batches": 1}


def _store(data: Path, busy_timeout_ms: int = 30_000):  # noqa: ANN202
    engine = make_engine(data / "aah.db", busy_timeout_ms=busy_timeout_ms)
    upgrade(engine)
    sessions = make_session_factory(engine)
    with transaction(sessions) as s:
        run_id = run_store.create_run(s, name="fault", experiment="x", preset="tiny")
    return sessions, run_id


def _train_loss_steps(sessions, run_id: int) -> list[int]:  # noqa: ANN001
    with transaction(sessions) as s:
        return list(s.scalars(select(Metric.step).where(Metric.run_id == run_id, Metric.key == "train_loss")
                              .order_by(Metric.step)))


class _At(Callback):
    """Calls ``actions[step]()`` after the metrics of that step."""

    def __init__(self, actions: dict) -> None:
        self.actions = actions
        self.seen: dict[int, object] = {}

    def on_metrics(self, step: int, metrics: dict[str, float]) -> None:
        if step in self.actions:
            self.seen[step] = self.actions[step]()


def test_a_write_lock_held_past_the_busy_timeout_loses_no_metric_and_no_weights(tmp_path):
    sessions, run_id = _store(tmp_path, busy_timeout_ms=200)
    locker = sqlite3.connect(tmp_path / "aah.db", timeout=5, isolation_level=None)
    locker.execute("BEGIN IMMEDIATE")  # another connection holds the write lock from before the start
    sink = SqliteMetricsSink(sessions, run_id, tmp_path, seq_len=64, flush_s=0.05, end_wait_s=30)

    def spooled() -> bool:  # the writer gave up on the store (busy timeout) and spooled what it had
        deadline = time.monotonic() + 30
        while not sink.spool_path.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        return sink.spool_path.exists()

    at = _At({10: spooled, 20: lambda: locker.execute("ROLLBACK")})
    config = apply_overrides(get_preset("tiny"), CONFIG)
    result = train(config, tmp_path / "runs" / str(run_id) / "checkpoint", [sink, at])
    assert at.seen[10] is True, "the lock never outlasted the busy timeout: nothing was spooled"
    assert result.status == "FINISHED" and sink.recorded_end
    assert _train_loss_steps(sessions, run_id) == list(range(1, STEPS + 1))
    assert not sink.spool_path.exists()
    with transaction(sessions) as s:
        run = run_store.get_run(s, run_id)
    assert run.status == "FINISHED" and run.progress.step == STEPS and run.checkpoint == f"runs/{run_id}/checkpoint"
    assert load_checkpoint(tmp_path / run.checkpoint).meta["step"] == STEPS


FULL_DISK = textwrap.dedent("""
    import json, resource, sys
    from pathlib import Path
    from aah_core.config import apply_overrides
    from aah_core.presets import get_preset
    from aah_core.train import Callback, train
    from backend.store.db import make_engine, make_session_factory
    from backend.jobs.sink import SqliteMetricsSink

    data, run_id, steps = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    sessions = make_session_factory(make_engine(data / "aah.db"))
    sink = SqliteMetricsSink(sessions, run_id, data, seq_len=64, flush_s=0.05)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)

    class DiskFull(Callback):
        failed = []
        def on_metrics(self, step, metrics):
            if step == 5:  # from here on no file of this process may grow: writes fail with EFBIG
                resource.setrlimit(resource.RLIMIT_FSIZE, (0, hard))
            if step == 25:
                try:
                    (data / "probe").write_text("x")
                except OSError as exc:
                    self.failed.append(exc.errno)
                resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))

    config = apply_overrides(get_preset("tiny"), {"train.max_steps": steps, "train.eval_every": 10,
                                                  "train.eval_batches": 1, "train.checkpoint_every": 10})
    result = train(config, data / "runs" / str(run_id) / "checkpoint", [sink, DiskFull()])
    print(json.dumps({"status": result.status, "failed": DiskFull.failed, "recorded": sink.recorded_end}))
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_FSIZE semantics of Linux")
def test_a_full_disk_during_training_loses_no_metric_and_no_weights(tmp_path):
    """Steps 5-25 run with every file write failing (EFBIG); the step-10/20 checkpoints fail too."""
    sessions, run_id = _store(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", FULL_DISK, str(tmp_path), str(run_id), str(STEPS)], env=env,
                         capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result == {"status": "FINISHED", "failed": [27], "recorded": True}  # 27: EFBIG, the fault was real
    assert "the store failed" in out.stderr and "checkpoint not written" in out.stderr
    assert _train_loss_steps(sessions, run_id) == list(range(1, STEPS + 1))
    with transaction(sessions) as s:
        run = run_store.get_run(s, run_id)
    assert run.status == "FINISHED" and run.checkpoint
    assert load_checkpoint(tmp_path / run.checkpoint).meta["step"] == STEPS
    assert not spool.spool_path(tmp_path, run_id).exists()


def test_a_dead_workers_spool_and_end_reach_the_store_at_start(tmp_path):
    sessions, run_id = _store(tmp_path)
    with transaction(sessions) as s:
        run_store.update_run(s, run_id, status="RUNNING", pid=2**22 + 7)  # no such process
    spool.append(spool.spool_path(tmp_path, run_id), [
        {"op": "metrics", "rows": [["train_loss", 1, 2.5, 1.0], ["train_loss", 2, float("nan"), 2.0]]},
        {"op": "run", "fields": {"progress_step": 2}},
        {"op": "end", "status": "FINISHED", "error": None, "checkpoint": None}])
    settings = make_settings(tmp_path, None, seed_paper=False, seed_suite=False, reconcile_s=0)
    with TestClient(create_app(settings)) as client:
        run = client.get(f"{API}/runs/{run_id}").json()
        series = client.get(f"{API}/runs/{run_id}/metrics", params={"keys": "train_loss"}).json()
    assert run["status"] == "FINISHED" and run["error"] is None  # the worker's own end, not "interrupted"
    assert series["series"]["train_loss"]["step"] == [1, 2]
    assert not spool.spool_path(tmp_path, run_id).exists()


def test_a_run_that_fails_mid_training_keeps_its_weights(tmp_path):
    sessions, run_id = _store(tmp_path)
    sink = SqliteMetricsSink(sessions, run_id, tmp_path, seq_len=64, flush_s=0.05)

    def boom() -> None:
        raise RuntimeError("the data loader broke")

    config = apply_overrides(get_preset("tiny"), CONFIG)
    with pytest.raises(RuntimeError, match="loader broke"):
        train(config, tmp_path / "runs" / str(run_id) / "checkpoint", [sink, _At({7: boom})])
    with transaction(sessions) as s:
        run = run_store.get_run(s, run_id)
    assert run.status == "FAILED" and "loader broke" in run.error
    assert run.checkpoint and load_checkpoint(tmp_path / run.checkpoint).meta["step"] == 7


def _read_only_dir(path: Path) -> None:
    path.mkdir()
    if os.geteuid() != 0:
        path.chmod(0o555)
        return
    made = subprocess.run(["mount", "--bind", "-o", "ro", str(path), str(path)], capture_output=True)
    if made.returncode != 0:
        pytest.skip(f"root here, and no read-only bind mount ({made.stderr.decode().strip()})")


def test_a_read_only_data_dir_stops_the_server_with_one_line_naming_it(tmp_path):
    data = tmp_path / "data"
    _read_only_dir(data)
    env = {k: v for k, v in os.environ.items() if not k.startswith("AAH_")}
    env.update({"AAH_DATA_DIR": str(data), "PYTHONPATH": str(ROOT), "AAH_SEED_DEMO": "false"})
    try:
        out = subprocess.run(api_command(free_port()), env=env, cwd=ROOT, capture_output=True, text=True,
                             timeout=120)
    finally:
        if os.geteuid() == 0:
            subprocess.run(["umount", str(data)], check=False)
    text = out.stdout + out.stderr
    assert out.returncode != 0 and "Traceback" not in text, text
    (line,) = [x for x in text.splitlines() if "cannot start" in x]
    assert str(data) in line and "not writable" in line


def test_the_end_of_a_worker_is_recorded_after_the_store_was_locked(tmp_path, monkeypatch):
    from backend.services import jobs

    sessions, run_id = _store(tmp_path, busy_timeout_ms=100)
    with transaction(sessions) as s:
        run_store.update_run(s, run_id, status="RUNNING")
    (tmp_path / "worker.log").write_text("ValueError: the corpus broke\n")
    process = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    process.wait()
    monkeypatch.setattr(jobs, "END_RETRY_S", (0.3,) * 10)
    manager = jobs.JobManager(make_settings(tmp_path, None), sessions)
    locker = sqlite3.connect(tmp_path / "aah.db", timeout=5, isolation_level=None, check_same_thread=False)
    locker.execute("BEGIN IMMEDIATE")  # held for ~1 s, ten times the busy timeout
    threading.Timer(1.0, locker.execute, args=("ROLLBACK",)).start()
    manager._watch(jobs.Job(run_id, process, tmp_path / "worker.log"))
    with transaction(sessions) as s:
        run = run_store.get_run(s, run_id)
    assert run.status == "FAILED" and run.error == "worker exited with code 3: ValueError: the corpus broke"
