"""A training job in its own process: ``python -m backend.worker --run-id N --data-dir DIR``.

The service starts one per run (services/jobs.py), with the store's URL in ``AAH_DATABASE_URL``
(the default SQLite file in the data dir when it is unset). The run's config is read from the store;
metrics stream back through ``SqliteMetricsSink``. SIGTERM asks the training loop to stop
at the next step (the run ends KILLED with a checkpoint); SIGKILL is handled by the parent.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from pathlib import Path

from aah_core.config import RunConfig
from aah_core.train import train
from backend import store
from backend.db import make_engine, make_session_factory, transaction
from backend.settings import Settings
from backend.sink import SqliteMetricsSink

logger = logging.getLogger("backend.worker")


def run_job(db_url: str, run_id: int, data_dir: Path) -> int:
    engine = make_engine(db_url)
    sessions = make_session_factory(engine)
    with transaction(sessions) as s:
        config = RunConfig.from_dict(store.run_config(s, run_id) or {})
    sink = SqliteMetricsSink(sessions, run_id, data_dir, config.model.seq_len)
    signal.signal(signal.SIGTERM, lambda *_: sink.request_stop())
    signal.signal(signal.SIGINT, lambda *_: sink.request_stop())
    out_dir = data_dir / "runs" / str(run_id) / "checkpoint"
    try:
        result = train(config, out_dir, [sink])
    except Exception:  # train() already reported FAILED with the error through the sink
        logger.exception("run %d failed", run_id)
        return 1
    finally:
        engine.dispose()
    logger.info("run %d ended %s at step %d", run_id, result.status, result.step)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--run-id", type=int, required=True)
    parser.add_argument("--data-dir", type=Path, required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    data_dir = args.data_dir.resolve()
    return run_job(Settings(data_dir=data_dir).db_url, args.run_id, data_dir)


if __name__ == "__main__":
    sys.exit(main())
