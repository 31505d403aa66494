"""Training jobs: one worker process per run, a cap on concurrent jobs, cancel, and clean-up.

Each worker is started by a thread of its own that then waits on it, so the worker's parent-death
signal (services/workers.py) fires only if the server itself dies. Whatever way the worker ends
(normal exit, crash, SIGKILL, out of memory), that thread makes sure the run leaves
SCHEDULED/RUNNING: a worker that died without reporting gets FAILED (exit code + the tail of its
log) or KILLED (when it was killed by a signal). The worker records its own end otherwise, once:
SIGINT means cancelled by the user, SIGTERM that the service stopped. Runs without a live worker
(a server that was SIGKILLed, a worker that died unrecorded) are reconciled at start and every
``AAH_RECONCILE_S`` seconds; the job cap counts every live worker of the store, not only ours.
"""

from __future__ import annotations

import logging
import os
import queue
import signal
import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy.orm import Session, sessionmaker

from aah_core.config import RunConfig, apply_overrides
from aah_core.errors import AAHError
from aah_core.paths import confine_data_paths
from aah_core.presets import get_preset
from aah_core.resources import check_fits
from backend.jobs import lifecycle, spool
from backend.schemas.errors import Conflict, InvalidInput, Unavailable
from backend.schemas.runs import RunCreate, RunPublic
from backend.services import workers
from backend.services.worker_env import worker_env
from backend.settings import Settings
from backend.store import run_store
from backend.store.db import transaction
from backend.store.tables import ACTIVE_STATUSES

logger = logging.getLogger(__name__)
REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_EXPERIMENT = "default"
END_RETRY_S = (1.0, 2.0, 4.0, 8.0, 16.0)  # waits between tries to record a worker's end


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
        self._closing = threading.Event()
        self._reconciler: threading.Thread | None = None

    def reconcile(self, run_ids: list[int] | None = None) -> list[int]:
        """End the active job runs that no live worker serves (stopping orphaned workers first)."""
        with self._lock:  # start() holds it from creating a run until its worker is in the table
            own = {rid for rid, job in self._jobs.items() if not job.done.is_set()}
            return workers.reconcile(self.sessions, self.settings.data_dir, own, self.settings.job_grace_s,
                                     run_ids)

    def start_reconciling(self) -> None:
        """Reconcile now, then every ``reconcile_s`` seconds in a daemon thread (0: only now)."""
        ended = self.reconcile()
        if ended:
            logger.warning("runs %s had no live worker and are now ended", ended)
        if self.settings.reconcile_s > 0:
            self._reconciler = threading.Thread(target=self._reconcile_loop, name="reconcile", daemon=True)
            self._reconciler.start()

    def _reconcile_loop(self) -> None:
        while not self._closing.wait(self.settings.reconcile_s):
            try:
                self.reconcile()
            except Exception:  # the database may be briefly unavailable: try again next time
                logger.exception("reconciling runs with their workers failed")

    def start(self, body: RunCreate) -> RunPublic:
        config = job_config(body, self.settings, fits_here=True)
        experiment = job_experiment(self.sessions, body)
        with self._lock:
            # forget finished workers (their runs are in the store), so the table holds live jobs only
            self._jobs = {rid: job for rid, job in self._jobs.items() if not job.done.is_set()}
            running = len(self._jobs) + workers.foreign_live_workers(self.sessions, self.settings.data_dir,
                                                                     set(self._jobs))
            if running >= self.settings.max_jobs:
                raise Unavailable(f"{running} training job(s) running; the cap is {self.settings.max_jobs} "
                                  "(AAH_MAX_JOBS). Wait for one to end or cancel one.")
            with transaction(self.sessions) as s:
                run_id = run_store.create_run(
                    s, name=body.name or f"{body.preset}", experiment=experiment,
                    preset=body.preset, params=run_store.flatten_params(config.to_dict()), config=config.to_dict(),
                    seq_len=config.model.seq_len,
                    total_steps=config.train.max_steps)
            started: queue.Queue[Job | OSError] = queue.Queue(maxsize=1)
            threading.Thread(target=self._run_worker, args=(run_id, started), name=f"job-{run_id}",
                             daemon=True).start()
            job = started.get()
            if isinstance(job, OSError):  # no worker started: the run must not stay SCHEDULED forever
                error = f"could not start the worker process ({job.__class__.__name__}: {job})"
                with transaction(self.sessions) as s:
                    run_store.end_run(s, run_id, "FAILED", error)
                raise Unavailable(f"run {run_id}: {error}") from None
            self._jobs[run_id] = job
        with transaction(self.sessions) as s:
            return run_store.get_run(s, run_id)

    def _run_worker(self, run_id: int, started: queue.Queue[Job | OSError]) -> None:
        """Start the worker and wait on it, in this one thread: the worker's parent-death signal is
        tied to the thread that forked it, so that thread must outlive the worker."""
        try:
            job = self._spawn(run_id)
        except OSError as exc:
            started.put(exc)
            return
        started.put(job)
        self._watch(job)

    def _spawn(self, run_id: int) -> Job:
        out = self.settings.data_dir / "runs" / str(run_id)
        out.mkdir(parents=True, exist_ok=True)
        log_path = out / "worker.log"
        env = worker_env(self.settings.db_url, REPO_ROOT)  # an allow-list: no AAH_API_TOKEN
        cmd = workers.worker_command(run_id, self.settings.data_dir, self.settings.path_roots[1:], os.getpid())
        with log_path.open("ab") as log:
            process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                       env=env, cwd=str(REPO_ROOT), start_new_session=True)
        with transaction(self.sessions) as s:
            run_store.update_run(s, run_id, pid=process.pid)
        logger.info("run %d: worker started (pid %d)", run_id, process.pid)
        return Job(run_id, process, log_path)

    def _watch(self, job: Job) -> None:
        code = job.process.wait()
        if job.cancelled.is_set():
            status, error = "KILLED", lifecycle.CANCELLED
        elif code < 0:
            status, error = "KILLED", f"worker killed by signal {signal.Signals(-code).name}"
        else:
            status, error = "FAILED", f"worker exited with code {code}: {_tail(job.log_path)}"
        try:
            for delay in END_RETRY_S:  # the store may be briefly locked or full
                try:
                    self._record_end(job.run_id, status, error)
                    return
                except spool.STORE_ERRORS as exc:
                    logger.warning("run %d: the end of its worker is not recorded yet (%s); retrying in %.1f s",
                                   job.run_id, type(exc).__name__, delay)
                    if self._closing.wait(delay):
                        break
            logger.error("run %d: the end of its worker was not recorded; the reconciler will", job.run_id)
        except Exception:
            logger.exception("run %d: could not record the end of the worker", job.run_id)
        finally:
            job.done.set()

    def _record_end(self, run_id: int, status: str, error: str) -> None:
        # what the worker could not write (the store was locked or full) waits in its spool, maybe its end
        spool.replay(self.sessions, run_id, spool.spool_path(self.settings.data_dir, run_id))
        with transaction(self.sessions) as s:
            if run_store.end_run(s, run_id, status, error):  # no-op when the worker recorded its end
                logger.warning("run %d: %s (%s)", run_id, status, error)

    def cancel(self, run_id: int, wait_s: float = 5.0) -> RunPublic:
        with transaction(self.sessions) as s:
            run = run_store.get_run(s, run_id)
            if run.read_only:
                raise Conflict(f"run {run_id} is read-only (a reference experiment); it cannot be cancelled")
            check_active(run)
        job = self._jobs.get(run_id)
        if job is not None and not job.done.is_set():
            self._stop(job, wait_s)
        else:  # not ours: a stray or dead worker is settled as what it is, never relabelled "cancelled"
            self.reconcile([run_id])
            with transaction(self.sessions) as s:
                check_active(run_store.get_run(s, run_id))  # another server's live job: it is not ours to stop
            raise Conflict(f"run {run_id} belongs to another server's worker; cancel it there")
        with transaction(self.sessions) as s:
            run_store.end_run(s, run_id, "KILLED", lifecycle.CANCELLED)
            return run_store.get_run(s, run_id)

    def _stop(self, job: Job, wait_s: float) -> None:
        """SIGINT (the loop stops at the next step, checkpoints and records the cancel), SIGKILL after
        the grace period."""
        job.cancelled.set()
        _signal(job.process, signal.SIGINT)
        if job.done.wait(min(wait_s, self.settings.job_grace_s)):
            return
        remaining = max(0.0, self.settings.job_grace_s - wait_s)
        timer = threading.Timer(remaining, _signal, args=(job.process, signal.SIGKILL))
        timer.daemon = True
        timer.start()

    def shutdown(self) -> None:
        """Stop every worker (the service is going away); their runs end KILLED."""
        self._closing.set()
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
                run_store.end_run(s, job.run_id, "KILLED", lifecycle.SERVICE_STOPPED)


def job_config(body: RunCreate, settings: Settings, fits_here: bool) -> RunConfig:
    """The job's validated config (422 naming the override); ``fits_here``: it must fit this machine too."""
    try:
        config = apply_overrides(get_preset(body.preset), dict(body.overrides))
        config = confine_data_paths(config, settings.path_roots, settings.private_paths)
        if fits_here:
            check_fits(config)
    except (AAHError, ValueError, TypeError, OverflowError) as exc:
        raise InvalidInput(f"overrides: {exc}") from None
    return config


def job_experiment(sessions: sessionmaker[Session], body: RunCreate) -> str:
    """The job's experiment; a read-only one is a 409 (a refusal for good comes before one for now, 503)."""
    experiment = body.experiment or DEFAULT_EXPERIMENT
    with transaction(sessions) as s:
        run_store.check_experiment_writable(s, experiment)
    return experiment


def check_active(run: RunPublic) -> None:
    if run.status not in ACTIVE_STATUSES:
        raise Conflict(f"run {run.id} already ended ({run.status}); only SCHEDULED, PENDING or RUNNING runs can be "
                       "cancelled")


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
