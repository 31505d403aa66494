"""SQLite engine and sessions: WAL, foreign keys and a busy timeout on every connection.

WAL lets one writer (a training worker's metrics sink, or the API) and many readers work
at once; ``busy_timeout`` makes a second writer wait for the lock instead of failing.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.orm import Session, sessionmaker

logger = logging.getLogger(__name__)

BUSY_TIMEOUT_MS = 30_000


def _on_connect(dbapi_conn, _record) -> None:  # noqa: ANN001 (DB-API objects)
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
    # NORMAL is durable across application crashes in WAL mode (only an OS crash can lose
    # the last transactions), and much faster than FULL for the metrics sink.
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.close()


def make_engine(db_path: Path) -> Engine:
    """An engine on ``db_path`` (created if missing) with the pragmas above."""
    db_path.parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(
        f"sqlite:///{db_path}",
        connect_args={"check_same_thread": False, "timeout": BUSY_TIMEOUT_MS / 1000},
        pool_size=20,
        max_overflow=40,
    )
    event.listen(engine, "connect", _on_connect)
    return engine


def make_session_factory(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)


@contextmanager
def transaction(factory: sessionmaker[Session]) -> Iterator[Session]:
    """One unit of work: commit on success, roll back and re-raise on error."""
    with factory() as session:
        try:
            yield session
            session.commit()
        except BaseException:
            session.rollback()
            raise
