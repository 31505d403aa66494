"""A training callback that writes a run's lifecycle, metrics and plans into the store, and never
stops training because the store cannot take them.

Callbacks only queue operations (backend/spool.py); a writer thread writes them in batches (every
``flush_rows`` rows or ``flush_s`` seconds), each batch in one short transaction. When the store
fails (a write lock held past the busy timeout, a full disk), the batch goes to the run's spool
file, and, if even that cannot be written, stays in memory; the writer retries with backoff and
replays the backlog in order once the store answers. At the end the sink keeps trying for
``end_wait_s`` seconds to write everything and the run's end; what is left stays in the spool,
which the server replays when the worker has exited.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

import torch
from sqlalchemy.orm import Session, sessionmaker

from aah_core.train import Callback
from aah_core.windows import plan_to_json
from backend.jobs import spool
from backend.store import run_store
from backend.store.db import transaction

logger = logging.getLogger(__name__)
MAX_BACKOFF_S = 10.0


class SqliteMetricsSink(Callback):
    """Streams one run into the store. ``request_stop(reason)`` (e.g. on SIGTERM) makes training stop."""

    def __init__(self, sessions: sessionmaker[Session], run_id: int, data_dir: Path, seq_len: int,
                 flush_rows: int = 500, flush_s: float = 1.0, end_wait_s: float = 30.0) -> None:
        self.sessions = sessions
        self.run_id = run_id
        self.data_dir = data_dir
        self.seq_len = seq_len
        self.flush_rows = flush_rows
        self.flush_s = flush_s
        self.end_wait_s = end_wait_s
        self.spool_path = spool.spool_path(data_dir, run_id)
        self.recorded_end = False  # whether this sink, not the service, recorded the run's end
        self._lock = threading.Lock()  # guards the queue below
        self._ops: list[spool.Op] = []
        self._rows: list[list] = []
        self._step: int | None = None
        self._write_lock = threading.Lock()  # one writer at a time: the thread, flush() or on_end
        self._unsaved: list[spool.Op] = []  # neither in the store nor in the spool (both failed)
        self._failing = False
        self._stop = threading.Event()
        self._stop_reason: str | None = None
        self._checkpoint: str | None = None
        self._wake = threading.Event()
        self._closed = threading.Event()
        self._writer = threading.Thread(target=self._write_loop, name=f"sink-{run_id}", daemon=True)
        self._writer.start()

    # -- the Callback protocol ------------------------------------------------------------

    def on_start(self, info: dict[str, Any]) -> None:
        self._queue({"op": "run", "fields": {
            "status": "RUNNING", "started_at": run_store.now_ms(), "pid": os.getpid(),
            "total_steps": int(info.get("total_steps") or 0) or None,
            "progress_step": int(info.get("start_step") or 0),
            "seq_len": self.seq_len, "data_hash": info.get("data_hash"), "git_rev": info.get("git_rev")}})

    def on_metrics(self, step: int, metrics: dict[str, float]) -> None:
        now = time.time()
        with self._lock:
            self._rows.extend([key, step, float(value), now] for key, value in metrics.items())
            self._step = step
            due = len(self._rows) >= self.flush_rows
        if due:
            self._wake.set()

    def on_plan(self, step: int, plan: torch.Tensor) -> None:
        self._queue({"op": "plan", "step": step, "windows": plan_to_json(plan, self.seq_len)})

    def on_checkpoint(self, step: int, path: Path) -> None:
        self._checkpoint = self._relative(path)
        self._queue({"op": "run", "fields": {"checkpoint": self._checkpoint}})

    def on_end(self, status: str, error: str | None) -> None:
        """Write everything and the end, trying for ``end_wait_s``; what is left stays in the spool."""
        self._closed.set()
        self._wake.set()
        self._writer.join(timeout=self.end_wait_s)
        if status == "KILLED" and error is None:
            error = self._stop_reason
        self._queue({"op": "end", "status": status, "error": error, "checkpoint": self._checkpoint})
        deadline, delay = time.monotonic() + self.end_wait_s, 0.1
        while self._write() is None and time.monotonic() < deadline:
            time.sleep(delay)
            delay = min(delay * 2, MAX_BACKOFF_S)
        if self.backlog():
            logger.error("run %d: the store did not take its last %s; %s", self.run_id,
                         "operations" if not self._unsaved else "operations, and the spool failed too",
                         f"they wait in {self.spool_path}" if not self._unsaved else "they are lost")

    def should_stop(self) -> bool:
        return self._stop.is_set()

    # -- helpers --------------------------------------------------------------------------

    def request_stop(self, reason: str) -> None:
        """Stop at the next step; a run stopped so ends KILLED with ``reason`` as its error."""
        if not self._stop.is_set():
            self._stop_reason = reason
        self._stop.set()

    def flush(self) -> int:
        """Write what is queued now (one try); returns metric rows written (0 if the store failed)."""
        return self._write() or 0

    def backlog(self) -> bool:
        """Operations wait in the spool or in memory (the store did not take them yet)."""
        return bool(self._unsaved) or self.spool_path.exists()

    def _queue(self, op: spool.Op) -> None:
        with self._lock:
            self._take_rows()
            self._ops.append(op)
        self._wake.set()

    def _take_rows(self) -> None:
        """Queued metric rows (and the progress step) become operations, in order (lock held)."""
        if self._rows:
            self._ops.append({"op": "metrics", "rows": self._rows})
            self._ops.append({"op": "run", "fields": {"progress_step": self._step}})
            self._rows = []

    def _write_loop(self) -> None:
        delay = self.flush_s
        while not self._closed.is_set():
            self._wake.wait(delay)
            self._wake.clear()
            if self._closed.is_set():
                return
            written = self._write()
            delay = self.flush_s if written is not None else min(max(delay, self.flush_s) * 2, MAX_BACKOFF_S)

    def _write(self) -> int | None:
        """Backlog first, then the queue, in one transaction; returns rows written, None if the store failed."""
        with self._write_lock:
            with self._lock:
                self._take_rows()
                ops, self._ops = self._ops, []
            batch = self._unsaved + ops
            if not batch and not self.spool_path.exists():
                return 0
            try:
                if spool.replay(self.sessions, self.run_id, self.spool_path):
                    self.recorded_end = True
                with transaction(self.sessions) as s:
                    ended = spool.apply(s, self.run_id, batch)
            except spool.STORE_ERRORS as exc:
                self._keep(batch, exc)
                return None
            self._unsaved = []
            self.recorded_end = self.recorded_end or ended
            if self._failing:
                logger.warning("run %d: the store answers again; the backlog is written", self.run_id)
                self._failing = False
            return sum(len(op["rows"]) for op in batch if op["op"] == "metrics")

    def _keep(self, batch: list[spool.Op], exc: BaseException) -> None:
        if not self._failing:
            logger.warning("run %d: the store failed (%s: %s); spooling to %s and retrying", self.run_id,
                           type(exc).__name__, str(exc).splitlines()[0][:200], self.spool_path)
            self._failing = True
        try:
            spool.append(self.spool_path, batch)
            self._unsaved = []
        except OSError as spool_exc:
            if not self._unsaved:
                logger.warning("run %d: the spool failed too (%s); keeping %d operation(s) in memory",
                               self.run_id, spool_exc, len(batch))
            self._unsaved = batch

    def _relative(self, path: Path) -> str:
        path = Path(path).resolve()
        return str(path.relative_to(self.data_dir)) if path.is_relative_to(self.data_dir) else str(path)
