"""GET /health: liveness plus counts.

/health must answer quickly however loaded the service is (a supervisor or load balancer decides on
it), so it touches neither the database nor a thread: the counts come from ``StoreCounts``, which
reads them in a thread at most every ``MAX_AGE_S`` seconds, in the background once a first value
exists. Under load a thread hop and two SQLite statements cost more than the whole answer (each
statement gives up and takes back the GIL among busy worker threads), and a count a second old is
as good for a status line.
"""

from __future__ import annotations

import asyncio
import logging
import time

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from sqlalchemy.orm import Session, sessionmaker

from backend import __version__
from backend.schemas.models import HealthResponse
from backend.store.catalog import count_checkpoints
from backend.store.db import transaction
from backend.store.run_store import count_runs

logger = logging.getLogger(__name__)
router = APIRouter(tags=["health"])
MAX_AGE_S = 1.0


class StoreCounts:
    """(models, runs) in the store, refreshed off the event loop; used from the event loop only."""

    def __init__(self, sessions: sessionmaker[Session]) -> None:
        self.sessions = sessions
        self._value: tuple[int, int] | None = None
        self._read_at = 0.0
        self._refresh: asyncio.Task | None = None

    def _read(self) -> tuple[int, int]:
        with transaction(self.sessions) as s:
            return count_checkpoints(s), count_runs(s)

    async def _update(self) -> tuple[int, int]:
        value = await run_in_threadpool(self._read)
        self._value, self._read_at = value, time.monotonic()
        return value

    def _updated(self, task: asyncio.Task) -> None:
        self._refresh = None
        if not task.cancelled() and task.exception() is not None:
            logger.warning("health: the store counts could not be read: %s", task.exception())

    async def get(self) -> tuple[int, int]:
        """The counts: read now the first time (errors propagate), else at most MAX_AGE_S old plus
        the time one background read takes."""
        if self._value is None:
            return await self._update()
        if time.monotonic() - self._read_at > MAX_AGE_S and self._refresh is None:
            self._refresh = asyncio.create_task(self._update())
            self._refresh.add_done_callback(self._updated)
        return self._value


@router.get("/health")
async def read_health(request: Request) -> HealthResponse:
    """Service status, version, and how many models and runs the store holds (counts at most about a
    second old)."""
    models, runs = await request.app.state.store_counts.get()
    return HealthResponse(status="ok", version=__version__, models=models, runs=runs)
