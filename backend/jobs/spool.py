"""What a training worker has to tell the store, as operations that can wait on disk.

The metrics sink writes operations (run fields, metric rows, a plan, the run's end) to the store.
When the store cannot take them (a write lock held past the busy timeout, a full disk), they are
appended to ``runs/<id>/metrics.spool.jsonl``, one JSON object per line, and replayed in order
later: by the worker at its next write, or by the server when the worker has exited
(``replay``, called by the job watcher and by reconciliation).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session, sessionmaker

from backend.store import catalog, metric_store, run_store
from backend.store.db import transaction

logger = logging.getLogger(__name__)
SPOOL_NAME = "metrics.spool.jsonl"
STORE_ERRORS = (DBAPIError, OSError)  # the database is locked, full, read-only or gone
# {"op": "run", "fields": {...}} | {"op": "metrics", "rows": [[key, step, value, time], ...]}
# | {"op": "plan", "step": int, "windows": [[...]]} | {"op": "end", "status", "error", "checkpoint"}
Op = dict[str, Any]


def spool_path(data_dir: Path, run_id: int) -> Path:
    return data_dir / "runs" / str(run_id) / SPOOL_NAME


def apply(s: Session, run_id: int, ops: Iterable[Op]) -> bool:
    """Apply operations in order within the caller's transaction; True if one of them ended the run."""
    ended = False
    for op in ops:
        kind = op["op"]
        if kind == "metrics":
            metric_store.log_metrics(s, run_id, [tuple(row) for row in op["rows"]])
        elif kind == "run":
            fields = dict(op["fields"])
            if "status" in fields and not run_store.is_active(s, run_id):  # never reopen an ended run
                fields = {k: v for k, v in fields.items() if k not in ("status", "pid")}
            run_store.update_run(s, run_id, **fields)
        elif kind == "plan":
            run_store.log_plan(s, run_id, op["step"], op["windows"])
        elif kind == "end":
            ended = record_end(s, run_id, op["status"], op.get("error"), op.get("checkpoint")) or ended
        else:
            raise ValueError(f"unknown spooled operation {kind!r}")
    return ended


def record_end(s: Session, run_id: int, status: str, error: str | None, checkpoint: str | None) -> bool:
    """End an active run, once; a FINISHED or KILLED run's checkpoint becomes a served model."""
    ended = run_store.end_run(s, run_id, status, error)
    if ended and status in ("FINISHED", "KILLED") and checkpoint is not None:
        run = run_store.get_run(s, run_id)
        catalog.register_checkpoint(s, catalog.CheckpointEntry(
            id=f"run-{run_id}", name=run.name, path=checkpoint, run_id=run_id, preset=run.preset,
            fingerprint=None))
    return ended


def append(path: Path, ops: list[Op]) -> None:
    """Add operations to the spool, durably (fsync): they may be the only copy. Raises OSError."""
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "".join(json.dumps(op) + "\n" for op in ops)
    with path.open("a") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def read(path: Path) -> list[Op]:
    """The spooled operations; a torn last line (a crash while appending) is dropped."""
    ops = []
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return []
    for line in lines:
        try:
            ops.append(json.loads(line))
        except json.JSONDecodeError:
            logger.warning("%s: dropped a torn line", path)
    return ops


def replay(sessions: sessionmaker[Session], run_id: int, path: Path) -> bool:
    """Move a spool into the store in one transaction, then delete it; True if it ended the run.

    Raises a STORE_ERRORS exception (the spool stays for the next try) when the store cannot take it.
    """
    ops = read(path)
    if not ops:
        path.unlink(missing_ok=True)
        return False
    with transaction(sessions) as s:
        ended = apply(s, run_id, ops)
    path.unlink(missing_ok=True)
    logger.info("run %d: %d spooled operation(s) written to the store", run_id, len(ops))
    return ended
