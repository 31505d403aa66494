"""The worker's side of a job's life: it dies with its server.

A worker asks the kernel for SIGTERM when its server dies (PR_SET_PDEATHSIG) and polls its parent as
a fallback; either way it stops at the next step, writes a checkpoint, records KILLED and exits within
``ORPHAN_EXIT_S``. The server's side (starting workers, reconciling the store with them) is
``backend.services.workers``.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable

logger = logging.getLogger(__name__)
PR_SET_PDEATHSIG = 1
ORPHAN_EXIT_S = 3.0  # an orphaned worker gets this long to checkpoint and record its end, then exits
SERVICE_STOPPED = "the service stopped while this run was active"
CANCELLED = "cancelled by the user"


def watch_parent(parent_pid: int | None, on_orphaned: Callable[[], None], poll_s: float = 0.5) -> None:
    """Call ``on_orphaned`` once the server that started this process is gone.

    PR_SET_PDEATHSIG (Linux) delivers SIGTERM at once; it is asked for before the parent is
    checked, so a server that died in between is noticed too. A daemon thread also polls
    ``os.getppid()`` (other systems, or a parent that set no death signal).
    """
    if parent_pid is None:
        return
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        except (OSError, AttributeError):
            logger.warning("no parent-death signal on this system; polling the parent instead")

    def _poll() -> None:
        while os.getppid() == parent_pid:
            time.sleep(poll_s)
        on_orphaned()

    threading.Thread(target=_poll, name="parent-watch", daemon=True).start()


def orphaned(parent_pid: int | None) -> bool:
    return parent_pid is not None and os.getppid() != parent_pid
