"""Start-up checks that turn a storage fault into one line naming the path and the reason.

``check(settings)`` runs before the store is opened: the data dir must be a writable folder, and the
SQLite file with its ``-wal`` / ``-shm`` companions must be writable where they exist (an unwritable
``-shm`` would otherwise end the server with SIGBUS and no word). ``store_error`` words a failure to
open or migrate the store. ``OneLineStartupErrors`` makes the ASGI server print a ``StartupError``
as its message alone, with no traceback.
"""

from __future__ import annotations

import sys
import uuid
from collections.abc import Awaitable, Callable, MutableMapping
from pathlib import Path
from typing import Any

from sqlalchemy.engine import make_url

from backend.settings import Settings

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Callable[[], Awaitable[Message]], Send], Awaitable[None]]


class StartupError(RuntimeError):
    """The service cannot start; the message says which path and why, in one line."""


def _why(exc: OSError) -> str:
    return exc.strerror or type(exc).__name__


def check(settings: Settings) -> None:
    data = settings.data_dir
    try:
        data.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StartupError(f"data dir {data}: cannot create it ({_why(exc)}); set AAH_DATA_DIR to a writable "
                           "folder") from None
    probe = data / f".write-test-{uuid.uuid4().hex[:8]}"
    try:
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise StartupError(f"data dir {data} is not writable ({_why(exc)}); the store, checkpoints and job "
                           "outputs live there: set AAH_DATA_DIR to a writable folder") from None
    url = make_url(settings.db_url)
    if url.get_backend_name() != "sqlite" or not url.database or url.database == ":memory:":
        return
    db = Path(url.database)
    for path in (db, db.with_name(db.name + "-wal"), db.with_name(db.name + "-shm")):
        if not path.exists():
            continue
        try:
            with path.open("r+b"):
                pass
        except OSError as exc:
            raise StartupError(f"database file {path} is not writable ({_why(exc)})") from None


def store_error(settings: Settings, exc: Exception) -> StartupError:
    """The store could not be opened or migrated: where (no password) and the driver's reason."""
    url = make_url(settings.db_url)
    where = url.database if url.get_backend_name() == "sqlite" else url.render_as_string(hide_password=True)
    reason = str(getattr(exc, "orig", None) or exc).splitlines()[0]
    return StartupError(f"database {where}: cannot open or migrate it ({reason})")


class OneLineStartupErrors:
    """ASGI wrapper: a lifespan that failed with ``StartupError`` reports its message alone."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Callable[[], Awaitable[Message]], send: Send) -> None:
        if scope["type"] != "lifespan":
            return await self.app(scope, receive, send)

        async def _send(message: Message) -> None:
            # Starlette sends startup.failed from inside its except block, with the traceback as text
            failed = sys.exc_info()[1]
            if message.get("type") == "lifespan.startup.failed" and isinstance(failed, StartupError):
                message = {**message, "message": f"cannot start: {failed}"}
            await send(message)

        return await self.app(scope, receive, _send)

