"""The error types: each domain error carries one HTTP status; ``backend.api.errors`` turns them into
responses. Store and services raise ``ServiceError`` subclasses (no HTTP imports here); engine errors
(``aah_core.errors``) map by type through ``ENGINE_STATUS``; passing store faults (locked, disk full,
server away) through ``store_fault``; a full disk through ``disk_fault``.
"""

from __future__ import annotations

import errno

from sqlalchemy.exc import OperationalError

from aah_core.errors import (
    AAHError,
    BackendUnavailable,
    CheckpointError,
    ExportRefused,
    InvalidConfig,
    InvalidWindowPlan,
)


class ServiceError(Exception):
    status_code = 500

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


class NotFound(ServiceError):
    status_code = 404


class Unauthorized(ServiceError):
    status_code = 401


class Forbidden(ServiceError):
    status_code = 403


class Conflict(ServiceError):
    status_code = 409


class InvalidInput(ServiceError):
    status_code = 422


class Unavailable(ServiceError):
    status_code = 503


class Busy(ServiceError):
    """Too much work queued already (429): ask again after ``retry_after`` seconds."""

    status_code = 429

    def __init__(self, detail: str, retry_after: int) -> None:
        super().__init__(detail)
        self.retry_after = retry_after


# Engine errors by type; the first match wins (subclasses before their bases).
ENGINE_STATUS: tuple[tuple[type[AAHError], int], ...] = (
    (InvalidWindowPlan, 422),
    (InvalidConfig, 422),
    (ExportRefused, 422),
    (CheckpointError, 503),
    (BackendUnavailable, 503),
    (AAHError, 422),
)


# Database errors that pass (lock released, space freed, server back): message fragment (SQLite's and
# PostgreSQL's, lower case) -> (what the user is told, seconds to wait before retrying).
STORE_FAULTS: tuple[tuple[str, str, int], ...] = (
    ("database is locked", "the run store is locked by another writer", 5),
    ("database table is locked", "the run store is locked by another writer", 5),
    ("database or disk is full", "the disk holding the run store is full", 60),
    ("no space left on device", "the disk holding the run store is full", 60),
    ("disk i/o error", "the run store could not be read or written (disk I/O error)", 30),
    ("unable to open database file", "the run store's file cannot be opened", 30),
    ("could not connect", "the database server cannot be reached", 10),
    ("connection refused", "the database server cannot be reached", 10),
    ("too many clients", "the database server has too many connections", 5),
    ("statement timeout", "the database server took too long to answer (AAH_DB_STATEMENT_TIMEOUT_S)", 10),
    ("timeout expired", "the database server did not answer in time (AAH_DB_CONNECT_TIMEOUT_S)", 10),
    ("server closed the connection", "the database server closed the connection", 10),
    ("terminating connection", "the database server closed the connection", 10),
    ("the database system is", "the database server is starting or stopping", 10),
)
# Files under the data dir that cannot be written for now: errno -> (what the user is told, seconds).
DISK_FAULTS: dict[int, tuple[str, int]] = {
    errno.ENOSPC: ("the disk holding the data dir is full", 60),
    errno.EDQUOT: ("the disk quota of the data dir is used up", 60),
    errno.EFBIG: ("a file under the data dir reached the size limit", 60),
    errno.EIO: ("a file under the data dir could not be written (disk I/O error)", 30),
}


def store_fault(exc: OperationalError) -> tuple[str, int] | None:
    """(reason, retry-after seconds) when `exc` is a passing store fault, else None (a bug)."""
    text = str(exc.orig if exc.orig is not None else exc).lower()
    return next(((reason, wait) for fragment, reason, wait in STORE_FAULTS if fragment in text), None)


def disk_fault(exc: OSError) -> tuple[str, int] | None:
    """(reason, retry-after seconds) when `exc` is a disk that cannot take a write for now, else None."""
    return DISK_FAULTS.get(exc.errno or 0)
