"""Worker processes as the operating system sees them, and the store kept true to them.

A worker is ``python -m backend.jobs.worker --run-id N --data-dir DIR --parent-pid P``. It dies with its
server: it asks the kernel for SIGTERM when the thread that started it dies (PR_SET_PDEATHSIG; the
server starts each worker from a thread that lives exactly as long as that worker) and it polls its
parent as a fallback (``backend.jobs.lifecycle.watch_parent``). Either way it stops at the next step, writes a checkpoint,
records KILLED and exits within ``ORPHAN_EXIT_S``.

``reconcile`` makes every SCHEDULED/RUNNING job run in the store match a live worker: a worker of
this data dir whose server is gone is stopped (SIGTERM, SIGKILL after the grace period) and its run
ends KILLED; a run whose worker is gone ends FAILED. The server runs it at start and every
``AAH_RECONCILE_S`` seconds. Process checks read Linux's /proc; elsewhere no process counts as a
worker, so every such run is settled as gone.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy.orm import Session, sessionmaker

from backend.jobs import spool
from backend.jobs.lifecycle import SERVICE_STOPPED
from backend.store import run_store
from backend.store.db import transaction

logger = logging.getLogger(__name__)
WORKER_MODULE = "backend.jobs.worker"
SCHEDULED_GRACE_MS = 60_000  # a run without a pid yet may be another server's job being started


def worker_command(run_id: int, data_dir: Path, roots: Collection[Path], parent_pid: int) -> list[str]:
    cmd = [sys.executable, "-m", WORKER_MODULE, "--run-id", str(run_id), "--data-dir", str(data_dir),
           "--parent-pid", str(parent_pid)]
    return cmd + [arg for root in roots for arg in ("--root", str(root))]


# ---- the server's side ---------------------------------------------------------------------

@dataclass(frozen=True)
class WorkerProcess:
    pid: int
    run_id: int
    data_dir: Path
    parent_pid: int | None


def _alive(pid: int) -> bool:
    """A process that exists and is not a zombie (an orphan's zombie may wait long for its reaper)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] not in ("Z", "X")


def _ppid(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def find_worker(pid: int | None) -> WorkerProcess | None:
    """The live worker process with this pid, read from its command line, or None."""
    if not pid or not _alive(pid):
        return None
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return None
    if WORKER_MODULE not in argv:
        return None
    args = dict(zip(argv, argv[1:]))
    try:
        parent = args.get("--parent-pid")
        return WorkerProcess(pid, int(args["--run-id"]), Path(args["--data-dir"]), int(parent) if parent else None)
    except (KeyError, ValueError):
        return None


def owned_by_live_server(worker: WorkerProcess) -> bool:
    """The server that started this worker still runs (its parent is the pid it was started with)."""
    return worker.parent_pid is not None and _ppid(worker.pid) == worker.parent_pid and _alive(worker.parent_pid)


def stop_process(pid: int, grace_s: float) -> bool:
    """SIGTERM (the worker checkpoints and records its end), SIGKILL after ``grace_s``; True once gone."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return True
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if not _alive(pid):
                return True
            time.sleep(0.05)
    return not _alive(pid)


def live_worker(run: run_store.ActiveRun, data_dir: Path) -> WorkerProcess | None:
    """The run's worker if it is alive and really is this data dir's worker for this run."""
    worker = find_worker(run.pid)
    if worker is None or worker.run_id != run.id or worker.data_dir.resolve() != data_dir:
        return None
    return worker


def foreign_live_workers(sessions: sessionmaker[Session], data_dir: Path, own: Collection[int]) -> int:
    """Live workers of this store that this server did not start (another server's, or strays)."""
    with transaction(sessions) as s:
        runs = run_store.active_job_runs(s)
    return sum(run.id not in own and live_worker(run, data_dir) is not None for run in runs)


def _replay(sessions: sessionmaker[Session], run_id: int, data_dir: Path) -> bool | None:
    """Write a dead worker's spool into the store: whether it recorded the run's end; None on failure."""
    try:
        return spool.replay(sessions, run_id, spool.spool_path(data_dir, run_id))
    except spool.STORE_ERRORS as exc:
        logger.warning("run %d: its spool could not be written yet (%s)", run_id, exc)
        return None


def reconcile(sessions: sessionmaker[Session], data_dir: Path, own: Collection[int], grace_s: float,
              run_ids: Collection[int] | None = None) -> list[int]:
    """Settle active job runs that have no live worker of a live server; returns the runs ended.

    ``own``: runs whose workers this server watches (left alone). ``run_ids``: only these runs.
    """
    with transaction(sessions) as s:
        runs = [r for r in run_store.active_job_runs(s) if r.id not in own and (run_ids is None or r.id in run_ids)]
    ended = []
    for run in runs:
        worker = live_worker(run, data_dir)
        if worker is not None and owned_by_live_server(worker):
            continue  # another server's job, alive and watched
        if worker is not None:
            logger.warning("run %d: stopping its orphaned worker (pid %d)", run.id, worker.pid)
            stop_process(worker.pid, grace_s)
            status, error = "KILLED", f"{SERVICE_STOPPED}; its orphaned worker (pid {worker.pid}) was stopped"
        elif run.status == "SCHEDULED" and run.pid is None and run_store.now_ms() - run.created_at < SCHEDULED_GRACE_MS:
            continue  # no pid yet: maybe being started by another server right now
        else:
            gone = f"its worker (pid {run.pid}) is gone" if run.pid else "it has no worker"
            status, error = "FAILED", f"interrupted: {gone}; {SERVICE_STOPPED} or the worker died unrecorded"
        replayed = _replay(sessions, run.id, data_dir)  # what the worker could not write, maybe its end
        if replayed is not False:
            ended += [run.id] if replayed else []  # (None: the store failed; next time)
            continue
        with transaction(sessions) as s:
            if run_store.end_run(s, run.id, status, error):  # no-op when the worker recorded its own end
                logger.warning("run %d: %s (%s)", run.id, status, error)
                ended.append(run.id)
    return ended
