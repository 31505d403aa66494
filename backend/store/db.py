"""Engine and sessions for the run store: a SQLite file (the default) or PostgreSQL.

SQLite gets WAL, foreign keys and a busy timeout on every connection: WAL lets one writer (a
training worker's metrics sink, or the API) and many readers work at once; ``busy_timeout``
makes a second writer wait for the lock instead of failing. PostgreSQL gets timeouts instead: a
connection that is not made within ``connect_timeout_s`` fails (a stalled or unreachable server), and
the service's statements are cancelled by the server after ``statement_timeout_s`` (a lock held by
another client, a runaway query); both reach the client as errors that answer 503 (backend/api/errors.py),
not as requests that wait for ever.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, TextClause, create_engine, event
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError
from sqlalchemy.orm import Session, sessionmaker

logger = logging.getLogger(__name__)

BUSY_TIMEOUT_MS = 30_000
CONNECT_TIMEOUT_S = 10  # libpq's connect_timeout: whole seconds, at least 2
SUPPORTED_DATABASES = ("sqlite", "postgresql")
POOL = {"pool_size": 20, "max_overflow": 40}


def sqlite_url(path: Path) -> str:
    return f"sqlite:///{path}"


def parse_database_url(url: str) -> URL:
    """A store URL, checked: SQLite or PostgreSQL (a bare ``postgresql://`` means psycopg 3)."""
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError):  # their messages repeat the URL, which may hold a password
        raise ValueError("not a SQLAlchemy URL (e.g. postgresql+psycopg://user:pass@host:5432/aah)") from None
    backend = parsed.get_backend_name()
    if backend not in SUPPORTED_DATABASES:
        raise ValueError(f"unsupported database {backend!r}: the store runs on {' or '.join(SUPPORTED_DATABASES)}")
    if parsed.drivername == "postgresql":
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed


def _pragmas(busy_timeout_ms: int):  # noqa: ANN202 - a connect-event listener
    def _on_connect(dbapi_conn, _record) -> None:  # noqa: ANN001 (DB-API objects)
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")
        # NORMAL is durable across application crashes in WAL mode (only an OS crash can lose
        # the last transactions), and much faster than FULL for the metrics sink.
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.close()
    return _on_connect
def _statement_timeout(timeout_s: float):  # noqa: ANN202 - a connect-event listener
    def _on_connect(dbapi_conn, _record) -> None:  # noqa: ANN001 (DB-API objects)
        with dbapi_conn.cursor() as cur:
            cur.execute(f"SET statement_timeout = {int(timeout_s * 1000)}")
        dbapi_conn.commit()  # a SET inside a transaction that is rolled back would be undone
    return _on_connect


BINARY_RESULTS = "aah_binary_results"
"""Execution option: on PostgreSQL the statement's rows come in binary, so that psycopg parses no text (a
zoom's few thousand rollup rows: its client CPU 2.4 -> 0.7 ms, and the server formats no floats)."""


def driver_rows(conn: Connection, statement: TextClause, params: Mapping[str, Any],
                binary: bool = False) -> Sequence[Any]:
    """The rows of a text statement, as the driver's plain tuples.

    On SQLite the statement goes straight to the driver's connection (sqlite3 takes its ``:name``
    parameters as they are): SQLAlchemy's execution context and result cost about as much as a zoom's
    small statements themselves (README.md, "Zooms, fourth round"). Listeners of ``before_cursor_execute``
    still see it (tests count the rows a read reads), and a driver error comes back as SQLAlchemy's, as
    from ``conn.execute``. Elsewhere it runs through SQLAlchemy (``binary``: BINARY_RESULTS).
    """
    if conn.dialect.name != "sqlite":
        result = conn.execute(statement, params, execution_options={BINARY_RESULTS: binary})
        try:
            return result.cursor.fetchall()
        finally:
            result.close()
    sql = statement.text
    try:
        driver = conn.connection.driver_connection
        assert driver is not None  # (a connection in use has one)
        cursor = driver.cursor()
        if conn.dispatch.before_cursor_execute:
            conn.dispatch.before_cursor_execute(conn, cursor, sql, params, None, False)
        return cursor.execute(sql, params).fetchall()
    except sqlite3.Error as exc:
        raise DBAPIError.instance(sql, params, exc, sqlite3.Error) from exc


def _binary_results():  # noqa: ANN202 - a before_cursor_execute listener (psycopg imported for PostgreSQL only)
    from psycopg.pq import Format

    def _before(conn, cursor, statement, parameters, context, executemany) -> None:  # noqa: ANN001 (SQLAlchemy event)
        if context is not None and context.execution_options.get(BINARY_RESULTS):
            cursor.format = Format.BINARY
    return _before


def make_engine(target: str | Path, busy_timeout_ms: int | None = None, connect_timeout_s: int = CONNECT_TIMEOUT_S,
                statement_timeout_s: float | None = None) -> Engine:
    """An engine on a store URL, or on a SQLite file path (created if missing, pragmas above). On
    PostgreSQL, connections time out after `connect_timeout_s` (unless the URL names its own) and, with
    `statement_timeout_s`, statements after that long (0 or None: never). SQLite waits `busy_timeout_ms`
    for a lock (None: BUSY_TIMEOUT_MS, read at call time so that a test can shorten it for a whole app)."""
    url = parse_database_url(sqlite_url(target) if isinstance(target, Path) else target)
    if url.get_backend_name() == "postgresql":
        connect = {} if "connect_timeout" in url.query else {"connect_timeout": max(2, int(connect_timeout_s))}
        engine = create_engine(url, pool_pre_ping=True, connect_args=connect, **POOL)
        event.listen(engine, "before_cursor_execute", _binary_results())
        if statement_timeout_s:
            event.listen(engine, "connect", _statement_timeout(statement_timeout_s))
        return engine
    if url.database and url.database != ":memory:":
        Path(url.database).parent.mkdir(parents=True, exist_ok=True)
    if busy_timeout_ms is None:
        busy_timeout_ms = BUSY_TIMEOUT_MS
    engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": busy_timeout_ms / 1000},
                           **POOL)
    event.listen(engine, "connect", _pragmas(busy_timeout_ms))
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


def upsert(s: Session):  # noqa: ANN201 - the dialect's insert(), which has on_conflict_do_update
    """INSERT ... ON CONFLICT for the session's database (SQLite and PostgreSQL spell it alike)."""
    return (postgresql if s.get_bind().dialect.name == "postgresql" else sqlite).insert
