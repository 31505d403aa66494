"""BoundedExecutor on its own: admission, sharing, failures and departing waiters."""

from __future__ import annotations

import asyncio
import threading

import pytest

from backend.schemas.errors import Busy
from backend.services.executor import BoundedExecutor


def test_a_failure_reaches_every_sharer_and_frees_the_slot():
    async def scenario() -> None:
        ex = BoundedExecutor("t", workers=1, queue=0)
        gate = threading.Event()

        def boom() -> None:
            gate.wait(10)
            raise ValueError("bad input")

        first = asyncio.ensure_future(ex.run("k", boom))
        await asyncio.sleep(0)
        second = asyncio.ensure_future(ex.run("k", boom))
        await asyncio.sleep(0)
        with pytest.raises(Busy) as info:  # capacity 1, a different key
            await ex.run("other", lambda: None)
        assert info.value.retry_after >= 1
        gate.set()
        for waiter in (first, second):
            with pytest.raises(ValueError, match="bad input"):
                await waiter
        assert ex.computations == 1 and ex.joined == 1 and ex.admitted == 0
        assert await ex.run("other", lambda: 7) == 7
        ex.shutdown()

    asyncio.run(scenario())


def test_a_waiter_that_leaves_does_not_cancel_the_shared_job():
    async def scenario() -> None:
        ex = BoundedExecutor("t", workers=1, queue=0)
        gate = threading.Event()
        first = asyncio.ensure_future(ex.run("k", lambda: gate.wait(10) and "done"))
        await asyncio.sleep(0)
        second = asyncio.ensure_future(ex.run("k", lambda: "never run"))
        await asyncio.sleep(0)
        first.cancel()  # the first client disconnected
        await asyncio.sleep(0)
        gate.set()
        assert await second == "done"
        assert ex.computations == 1
        ex.shutdown()

    asyncio.run(scenario())
