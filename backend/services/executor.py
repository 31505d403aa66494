"""Bounded executors: where the service's slow work runs, so that no client can starve the others.

A ``BoundedExecutor`` has a fixed number of worker threads and a queue limit. A request whose work
would not fit (``workers + queue`` jobs admitted already) is refused at once with 429 and a
``Retry-After`` estimated from recent job durations, instead of waiting behind everyone else.
Identical concurrent requests (the same ``key``) share one computation (single-flight): the second
one waits for the first's result and takes no room in the queue.

``run`` is called from the event loop only (async routes), so its bookkeeping needs no lock; the
awaiting request holds no thread while it waits. ``json_response`` runs a function returning a
response model and serialises it in the worker thread too, so the event loop only copies bytes.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections.abc import Callable, Hashable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from pydantic import BaseModel
from starlette.responses import Response

from backend.schemas.errors import Busy

T = TypeVar("T")
RETRY_AFTER_MAX_S = 60
BUSY: dict[int | str, dict[str, Any]] = {
    429: {"description": "Too many jobs of this kind running or queued: retry after `Retry-After` s"}}
"""The 429 answer, for the OpenAPI ``responses`` of every route that uses an executor."""
_EMA = 0.2  # weight of the newest job in the mean job duration


class BoundedExecutor:
    def __init__(self, name: str, workers: int, queue: int) -> None:
        self.name = name
        self.workers = workers
        self.capacity = workers + queue
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix=f"aah-{name}")
        self._inflight: dict[Hashable, asyncio.Future] = {}
        self._admitted = 0
        self._mean_s = 1.0
        self._lock = threading.Lock()  # guards the counters the worker threads update
        self.computations = 0  # jobs started since the service started
        self.joined = 0  # requests that shared a running job instead of starting one

    @property
    def admitted(self) -> int:
        """Jobs running or queued now."""
        return self._admitted

    def retry_after(self) -> int:
        """Seconds until a slot is likely free: the queue ahead divided among the workers."""
        wait = self._mean_s * max(self._admitted - self.workers + 1, 1) / self.workers
        return min(max(1, math.ceil(wait)), RETRY_AFTER_MAX_S)

    async def run(self, key: Hashable | None, fn: Callable[[], T]) -> T:
        """``fn()`` in a worker thread; shared with a running call of the same ``key`` (None: never shared).

        Raises Busy (429) when the executor is full. A waiter that goes away (client disconnect)
        does not cancel the job others may be waiting for.
        """
        shared = self._inflight.get(key) if key is not None else None
        if shared is not None:
            self.joined += 1
            return await asyncio.shield(shared)
        if self._admitted >= self.capacity:
            raise Busy(f"the server is busy: {self._admitted} {self.name} jobs are running or queued "
                       f"(limit {self.capacity}); retry in a few seconds", self.retry_after())
        self._admitted += 1
        future = asyncio.wrap_future(self._pool.submit(self._timed, fn))
        if key is not None:
            self._inflight[key] = future
        future.add_done_callback(lambda done: self._finished(key, done))
        return await asyncio.shield(future)

    async def json_response(self, key: Hashable | None, fn: Callable[[], BaseModel]) -> Response:
        """``run`` for a route: the model is serialised to JSON in the worker thread as well."""
        body = await self.run(key, lambda: fn().model_dump_json().encode())
        return Response(content=body, media_type="application/json")

    def _timed(self, fn: Callable[[], T]) -> T:
        with self._lock:
            self.computations += 1
        t0 = time.perf_counter()
        try:
            return fn()
        finally:
            elapsed = time.perf_counter() - t0
            with self._lock:
                self._mean_s = (1 - _EMA) * self._mean_s + _EMA * elapsed

    def _finished(self, key: Hashable | None, done: asyncio.Future) -> None:
        self._admitted -= 1
        if key is not None and self._inflight.get(key) is done:
            del self._inflight[key]
        if not done.cancelled():
            done.exception()  # retrieved: a failure nobody awaited any more is not logged as lost

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
