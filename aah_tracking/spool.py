"""The local spool: tracking operations the server did not take, one JSON object per line, in order.

A spool always starts with its run's create operation, so it can be replayed by a later process
(`aah sync RUN_DIR`) that knows nothing else; replaying is idempotent on the server. It lives beside
the run's checkpoint folder, as the metrics and plans histories do: ``<out>.tracking.jsonl``. The create
operation holds the run's write secret, so the file is made readable by its owner only.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path

from aah_tracking.transport import Op, Transport


def spool_path(run_dir: str | Path) -> Path:
    """The spool of the run whose checkpoint folder is ``run_dir`` (``--out`` of `aah train`)."""
    run_dir = Path(run_dir)
    return run_dir.parent / f"{run_dir.name}.tracking.jsonl"


def tracked_marker(run_dir: str | Path) -> Path:
    """``<out>.tracked.json``: written when `aah train --tracking-uri` starts tracking the run in ``run_dir``
    (its run key and server, no secret), so `aah import` knows the folder is tracked already."""
    run_dir = Path(run_dir)
    return run_dir.parent / f"{run_dir.name}.tracked.json"


class Spool:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def append(self, ops: Iterable[Op]) -> None:
        """Append and flush to disk: a process that dies right after loses nothing spooled."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        with open(fd, "a") as f:
            for op in ops:
                f.write(json.dumps(op, allow_nan=False) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def read(self) -> list[Op]:
        """The spooled operations (a last line torn by a crash is left out)."""
        if not self.path.is_file():
            return []
        ops = []
        for line in self.path.read_text().splitlines():
            try:
                ops.append(json.loads(line))
            except json.JSONDecodeError:
                continue
        return ops

    def clear(self) -> None:
        self.path.unlink(missing_ok=True)


def replay(transport: Transport, ops: Iterable[Op]) -> int:
    """Send operations in order (raises Unreachable or Refused at the first that fails); returns how many."""
    sent = 0
    for op in ops:
        transport.send(op)
        sent += 1
    return sent
