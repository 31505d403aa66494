"""The first start of a server on a data dir: ``first_start_lock`` is held while it migrates the store and
seeds it, so that two servers started at once on one data dir do it once.

Each seeding checks first whether its content is there; without the lock, two servers started at once on
a fresh data dir both found it missing and both seeded it (two demo runs), or failed on each other's
half-made tables. A file lock in the data dir (what the servers share); it is released when its process
ends, however it ends.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from filelock import FileLock, Timeout

logger = logging.getLogger(__name__)
SETUP_LOCK = ".setup.lock"  # in the data dir


@contextmanager
def first_start_lock(data_dir: Path) -> Iterator[None]:
    """Held while the server migrates and seeds the store; a second server waits for the first to finish."""
    lock = FileLock(data_dir / SETUP_LOCK)
    try:
        lock.acquire(timeout=0)
    except Timeout:
        logger.info("another server is setting up %s; waiting for it to finish", data_dir)
        lock.acquire()
    try:
        yield
    finally:
        lock.release()
