"""Training jobs: one worker process per run, a cap on concurrent jobs, cancel, and clean-up.

A watcher thread waits on each worker. Whatever way the worker ends (normal exit, crash,
SIGKILL, out of memory), the watcher makes sure the run leaves SCHEDULED/RUNNING: a worker
that died without reporting gets FAILED (exit code + the tail of its log) or KILLED (when
it was cancelled or killed by a signal). Runs left active by a previous service process
are failed at startup (``store.reconcile_active_runs``).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy.orm import Session, sessionmaker

from aah_core.errors import AAHError
from aah_core.config import apply_overrides
from aah_core.paths import confine_data_paths
from aah_core.presets import get_preset
from backend import store
from backend.db import transaction
from backend.errors import Conflict, InvalidInput, Unavailable
from backend.schemas import RunCreate, RunPublic
from backend.settings import Settings

logger = logging.getLogger(__name__)
REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_EXPERIMENT = "default"


@dataclass
class Job:
    run_id: int
    process: subprocess.Popen
    log_path: Path
    cancelled: threading.Event = field(default_factory=threading.Event)
    done: threading.Event = field(default_factory=threading.Event)


class JobManager:
    def __init__(self, settings: Settings, sessions: sessionmaker[Session]) -> None:
        self.settings = settings
        self.sessions = sessions
        self._jobs: dict[int, Job] = {}
        self._lock = threading.Lock()

    def active(self) -> int:
        with self._lock:
            return sum(not job.done.is_set() for job in self._jobs.values())

    def start(self, body: RunCreate) -> RunPublic:
        try:
            config = apply_overrides(get_preset(body.preset), dict(body.overrides))
            config = confine_data_paths(config, self.settings.path_roots)
        except AAHError as exc:
            raise InvalidInput(f"overrides: {exc}") from None
        except (ValueError, TypeError, OverflowError) as exc:
            raise InvalidInput(f"overrides: {exc}") from None
        with self._lock:
            # forget finished workers (their runs are in the store), so the table holds live jobs only
            self._jobs = {rid: job for rid, job in self._jobs.items() if not job.done.is_set()}
            running = len(self._jobs)
            if running >= self.settings.max_jobs:
                raise Unavailable(f"{running} training job(s) running; the cap is {self.settings.max_jobs} "
                                  "(AAH_MAX_JOBS). Wait for one to end or cancel one.")
            with transaction(self.sessions) as s:
                run_id = store.create_run(
                    s, name=body.name or f"{body.preset}", experiment=body.experiment or DEFAULT_EXPERIMENT,
                    preset=body.preset, params=store.flatten_params(config.to_dict()), config=config.to_dict(), seq_len=config.model.seq_len,
                    total_steps=config.train.max_steps)
            try:
                job = self._spawn(run_id)
            except OSError as exc:  # no worker started: the run must not stay SCHEDULED forever
                error = f"could not start the worker process ({exc.__class__.__name__}: {exc})"
                with transaction(self.sessions) as s:
                    store.end_run(s, run_id, "FAILED", error)
                raise Unavailable(f"run {run_id}: {error}") from None
            self._jobs[run_id] = job
        threading.Thread(target=self._watch, args=(job,), name=f"job-{run_id}", daemon=True).start()
        with transaction(self.sessions) as s:
            return store.get_run(s, run_id)

    def _spawn(self, run_id: int) -> Job:
        out = self.settings.data_dir / "runs" / str(run_id)
        out.mkdir(parents=True, exist_ok=True)
        log_path = out / "worker.log"
        # the store URL goes through the environment: a PostgreSQL password must not show in `ps`
        env = {**os.environ, "AAH_DATABASE_URL": self.settings.db_url,
               "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}
        cmd = [sys.executable, "-m", "backend.worker", "--run-id", str(run_id), "--data-dir", str(self.settings.data_dir)]
        cmd += [arg for root in self.settings.path_roots[1:] for arg in ("--root", str(root))]
        with log_path.open("ab") as log:
            process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                       env=env, cwd=str(REPO_ROOT), start_new_session=True)
        with transaction(self.sessions) as s:
            store.update_run(s, run_id, pid=process.pid)
        logger.info("run %d: worker started (pid %d)", run_id, process.pid)
        return Job(run_id, process, log_path)

    def _watch(self, job: Job) -> None:
        code = job.process.wait()
        try:
            if job.cancelled.is_set():
                status, error = "KILLED", "cancelled by the user"
            elif code < 0:
                status, error = "KILLED", f"worker killed by signal {signal.Signals(-code).name}"
            else:
                status, error = "FAILED", f"worker exited with code {code}: {_tail(job.log_path)}"
            with transaction(self.sessions) as s:
                if store.end_run(s, job.run_id, status, error):  # no-op when the worker reported its end
                    logger.warning("run %d: %s (%s)", job.run_id, status, error)
        except Exception:
            logger.exception("run %d: could not record the end of the worker", job.run_id)
        finally:
            job.done.set()

    def cancel(self, run_id: int, wait_s: float = 5.0) -> RunPublic:
        with transaction(self.sessions) as s:
            run = store.get_run(s, run_id)
            if run.read_only:
                raise Conflict(f"run {run_id} is read-only (a reference experiment); it cannot be cancelled")
            if run.status not in ("SCHEDULED", "RUNNING"):
                raise Conflict(f"run {run_id} already ended ({run.status}); only SCHEDULED or RUNNING runs "
                               "can be cancelled")
        job = self._jobs.get(run_id)
        if job is not None and not job.done.is_set():
            self._stop(job, wait_s)
        with transaction(self.sessions) as s:
            store.end_run(s, run_id, "KILLED", "cancelled by the user")
            return store.get_run(s, run_id)

    def _stop(self, job: Job, wait_s: float) -> None:
        """SIGTERM (the loop stops at the next step and checkpoints), SIGKILL after the grace period."""
        job.cancelled.set()
        _signal(job.process, signal.SIGTERM)
        if job.done.wait(min(wait_s, self.settings.job_grace_s)):
            return
        remaining = max(0.0, self.settings.job_grace_s - wait_s)
        timer = threading.Timer(remaining, _signal, args=(job.process, signal.SIGKILL))
        timer.daemon = True
        timer.start()

    def shutdown(self) -> None:
        """Stop every worker (the service is going away); their runs end KILLED."""
        with self._lock:
            jobs = [j for j in self._jobs.values() if not j.done.is_set()]
        for job in jobs:
            job.cancelled.set()
            _signal(job.process, signal.SIGTERM)
        for job in jobs:
            if not job.done.wait(self.settings.job_grace_s):
                _signal(job.process, signal.SIGKILL)
                job.done.wait(5.0)
            with transaction(self.sessions) as s:
                store.end_run(s, job.run_id, "KILLED", "the service stopped while this run was active")


def _signal(process: subprocess.Popen, sig: signal.Signals) -> None:
    if process.poll() is None:
        try:
            process.send_signal(sig)
        except ProcessLookupError:
            pass


def _tail(path: Path, n: int = 1500) -> str:
    try:
        text = path.read_bytes()[-n:].decode(errors="replace").strip()
    except OSError:
        return "(no worker log)"
    return text.splitlines()[-1] if text else "(empty worker log)"
