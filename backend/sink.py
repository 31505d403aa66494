"""A training callback that writes a run's lifecycle, metrics and plans into the SQLite store.

Metric rows are buffered and written in batches (every ``flush_rows`` rows or ``flush_s``
seconds, and always before a plan, a checkpoint or the end), each batch in one short
transaction, so readers see consistent data and the writer holds the lock briefly.
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
from backend import catalog, store
from backend.db import transaction

logger = logging.getLogger(__name__)


class SqliteMetricsSink(Callback):
    """Streams one run into the store. ``request_stop()`` (e.g. on SIGTERM) makes training stop."""

    def __init__(self, sessions: sessionmaker[Session], run_id: int, data_dir: Path, seq_len: int,
                 flush_rows: int = 500, flush_s: float = 1.0) -> None:
        self.sessions = sessions
        self.run_id = run_id
        self.data_dir = data_dir
        self.seq_len = seq_len
        self.flush_rows = flush_rows
        self.flush_s = flush_s
        self._rows: list[store.MetricRow] = []
        self._step: int | None = None
        self._last_flush = time.monotonic()
        self._stop = threading.Event()
        self._stop_reason: str | None = None
        self.recorded_end = False  # whether this sink, not the service, recorded the run's end
        self._checkpoint: Path | None = None
        self._lock = threading.Lock()

    # -- the Callback protocol ------------------------------------------------------------

    def on_start(self, info: dict[str, Any]) -> None:
        with transaction(self.sessions) as s:
            store.update_run(s, self.run_id, status="RUNNING", started_at=store.now_ms(), pid=os.getpid(),
                             total_steps=int(info.get("total_steps") or 0) or None,
                             progress_step=int(info.get("start_step") or 0), seq_len=self.seq_len,
                             data_hash=info.get("data_hash"), git_rev=info.get("git_rev"))

    def on_metrics(self, step: int, metrics: dict[str, float]) -> None:
        now = time.time()
        with self._lock:
            self._rows.extend((key, step, float(value), now) for key, value in metrics.items())
            self._step = step
            due = len(self._rows) >= self.flush_rows or time.monotonic() - self._last_flush >= self.flush_s
        if due:
            self.flush()

    def on_plan(self, step: int, plan: torch.Tensor) -> None:
        self.flush()
        with transaction(self.sessions) as s:
            store.log_plan(s, self.run_id, step, plan_to_json(plan, self.seq_len))

    def on_checkpoint(self, step: int, path: Path) -> None:
        self.flush()
        self._checkpoint = Path(path)
        with transaction(self.sessions) as s:
            store.update_run(s, self.run_id, checkpoint=self._relative(path))

    def on_end(self, status: str, error: str | None) -> None:
        self.flush()
        if status == "KILLED" and error is None:
            error = self._stop_reason
        with transaction(self.sessions) as s:
            ended = self.recorded_end = store.end_run(s, self.run_id, status, error)
            if ended and status in ("FINISHED", "KILLED") and self._checkpoint is not None:
                run = store.get_run(s, self.run_id)
                catalog.register_checkpoint(s, catalog.CheckpointEntry(
                    id=f"run-{self.run_id}", name=run.name, path=self._relative(self._checkpoint),
                    run_id=self.run_id, preset=run.preset, fingerprint=None))

    def should_stop(self) -> bool:
        return self._stop.is_set()

    # -- helpers --------------------------------------------------------------------------

    def request_stop(self, reason: str) -> None:
        """Stop at the next step; a run stopped so ends KILLED with ``reason`` as its error."""
        if not self._stop.is_set():
            self._stop_reason = reason
        self._stop.set()

    def flush(self) -> int:
        """Write buffered metric rows and progress in one transaction; returns rows written."""
        with self._lock:
            rows, self._rows = self._rows, []
            step = self._step
            self._last_flush = time.monotonic()
        if not rows and step is None:
            return 0
        with transaction(self.sessions) as s:
            written = store.log_metrics(s, self.run_id, rows)
            if step is not None:
                store.update_run(s, self.run_id, progress_step=step)
        return written

    def _relative(self, path: Path) -> str:
        path = Path(path).resolve()
        return str(path.relative_to(self.data_dir)) if path.is_relative_to(self.data_dir) else str(path)
