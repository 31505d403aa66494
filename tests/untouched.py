"""Evidence that files were never read: each file gets an access time far in the past, and a read
would move it to now (Linux's default `relatime` updates an access time older than the file's
modification time). A filesystem mounted `noatime` cannot show this; `atime_updates` says so, and the
tests that rely on it skip that one assertion there with the reason."""

from __future__ import annotations

import os
from pathlib import Path

OLD = 946_684_800  # 2000-01-01: before any file's modification time here


def age(*files: Path) -> None:
    """Set each file's access time to OLD (its modification time is left alone)."""
    for file in files:
        os.utime(file, (OLD, file.stat().st_mtime))


def atime_updates(folder: Path) -> bool:
    """Whether reading a file in `folder` changes its access time on this filesystem."""
    probe = folder / ".atime-probe"
    probe.write_text("probe")
    age(probe)
    probe.read_text()
    updated = probe.stat().st_atime != OLD
    probe.unlink()
    return updated


def read_since_aged(*files: Path) -> list[Path]:
    """The files whose access time moved since `age` (read by someone)."""
    return [f for f in files if f.stat().st_atime != OLD]


def listing(*folders: Path) -> set[str]:
    """Every path under the folders (recursively), to compare before and after."""
    return {str(Path(root, name)) for folder in folders for root, dirs, files in os.walk(folder)
            for name in dirs + files}
