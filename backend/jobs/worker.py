"""A training job in its own process: ``python -m backend.jobs.worker --run-id N --data-dir DIR``.

The service starts one per run (services/jobs.py), with the store's URL in ``AAH_DATABASE_URL``
(the default SQLite file in the data dir when it is unset). The run's config is read from the store;
metrics stream back through ``SqliteMetricsSink``. SIGINT (a cancel) and SIGTERM (the service
stops, or died: see services/workers.py) ask the training loop to stop at the next step; the run
ends KILLED with a checkpoint and the reason. An orphaned worker exits at the latest
``ORPHAN_EXIT_S`` seconds after its server died. SIGKILL is handled by the parent.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from pathlib import Path

from aah_core.config import RunConfig
from aah_core.errors import InvalidConfig
from aah_core.paths import confine_data_paths
from aah_core.train import train
from backend.jobs.lifecycle import CANCELLED, ORPHAN_EXIT_S, SERVICE_STOPPED, orphaned, watch_parent
from backend.jobs.sink import SqliteMetricsSink
from backend.settings import Settings
from backend.store import run_store
from backend.store.db import make_engine, make_session_factory, transaction

logger = logging.getLogger("backend.jobs.worker")
SPOOL_DIR = "spool"  # under the data dir


def run_job(db_url: str, run_id: int, data_dir: Path, roots: list[Path] | None = None,
            parent_pid: int | None = None) -> int:
    engine = make_engine(db_url)
    sessions = make_session_factory(engine)
    try:  # the service checked the paths when it accepted the job; check again (symlinks may have moved)
        with transaction(sessions) as s:
            config = confine_data_paths(RunConfig.from_dict(run_store.run_config(s, run_id) or {}),
                                        [data_dir, *(roots or [])])
    except InvalidConfig as exc:
        with transaction(sessions) as s:
            run_store.end_run(s, run_id, "FAILED", str(exc))
        engine.dispose()
        logger.error("run %d refused: %s", run_id, exc)
        return 1
    sink = SqliteMetricsSink(sessions, run_id, data_dir, config.model.seq_len)
    _stop_on_signals(sink, run_id, parent_pid)
    out_dir = data_dir / "runs" / str(run_id) / "checkpoint"
    # the final checkpoint, when out_dir cannot take it: the data dir's spool folder (the service serves it
    # from there; nothing of the service is written outside the data dir)
    fallbacks = (data_dir / SPOOL_DIR / f"run-{run_id}-checkpoint",)
    try:
        result = train(config, out_dir, [sink], fallbacks=fallbacks)
    except Exception:  # train() already reported FAILED with the error through the sink
        logger.exception("run %d failed", run_id)
        return 1
    finally:
        engine.dispose()
    if sink.recorded_end:
        logger.info("run %d ended %s at step %d", run_id, result.status, result.step)
    elif sink.backlog():  # the service replays the spool once this process has exited
        logger.warning("run %d stopped %s at step %d; the store was unavailable, its end waits in %s",
                       run_id, result.status, result.step, sink.spool_path)
    else:  # the service ended the run first (e.g. it found it orphaned): its record stands
        logger.warning("run %d stopped %s at step %d, but the store already had its end; not recorded",
                       run_id, result.status, result.step)
    return 0


def _stop_on_signals(sink: SqliteMetricsSink, run_id: int, parent_pid: int | None) -> None:
    """SIGINT: cancelled; SIGTERM: the service stops; the server gone: stop, then exit for sure."""
    exit_timer = threading.Timer(ORPHAN_EXIT_S, os._exit, args=(3,))
    exit_timer.daemon = True
    once = threading.Lock()

    def _orphaned() -> None:
        if once.acquire(blocking=False):
            logger.warning("run %d: the service is gone; stopping (exit in %.0f s at the latest)", run_id,
                           ORPHAN_EXIT_S)
            exit_timer.start()
        sink.request_stop(SERVICE_STOPPED)

    def _terminate(*_: object) -> None:
        if orphaned(parent_pid):
            _orphaned()
        sink.request_stop(SERVICE_STOPPED)

    signal.signal(signal.SIGINT, lambda *_: sink.request_stop(CANCELLED))
    signal.signal(signal.SIGTERM, _terminate)
    watch_parent(parent_pid, _orphaned)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--run-id", type=int, required=True)
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--parent-pid", type=int, help="the server's pid: this worker stops when it dies")
    parser.add_argument("--root", type=Path, action="append", default=[],
                        help="a folder (besides the data dir) that corpora and tokenizers may come from")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    data_dir = args.data_dir.resolve()
    return run_job(Settings(data_dir=data_dir).db_url, args.run_id, data_dir, [r.resolve() for r in args.root],
                   args.parent_pid)


if __name__ == "__main__":
    code = main()
    logging.shutdown()
    sys.stdout.flush()
    # skip the interpreter's teardown (torch's can take seconds on a busy machine, and daemon threads,
    # such as the orphan exit timer, cannot run during it): everything worth keeping is written
    os._exit(code)
