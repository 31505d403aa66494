"""Error responses: every error body is ``{"detail": str}``; a validation error also carries ``errors``
(pydantic's list) for programs. A store that cannot be written or read for now (locked past the busy
timeout, disk full, I/O error, a database server that does not answer in time) and a full disk under the
data dir answer 503 with Retry-After: the request may succeed later (its transaction was rolled back, its
partial files removed). A client that leaves before its body arrived is noted, not logged as an error.
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.responses import Response

from aah_core.errors import AAHError
from backend.schemas.errors import ENGINE_STATUS, ServiceError, disk_fault, store_fault

logger = logging.getLogger(__name__)


def _json(status: int, detail: str, retry_after: int | None = None, **extra: object) -> JSONResponse:
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else {}
    if retry_after is not None:
        headers["Retry-After"] = str(retry_after)
    return JSONResponse({"detail": detail, **extra}, status_code=status, headers=headers or None)


def _where(loc: tuple) -> str:
    """('body', 'windows', 2, 5) -> 'windows: layer 2, head 5'; ('query', 'layer') -> 'layer'."""
    parts = [p for p in loc if p not in ("body", "query", "path", "header")]
    if len(parts) >= 3 and parts[-3] == "windows" and all(isinstance(p, int) for p in parts[-2:]):
        prefix = ".".join(str(p) for p in parts[:-2])
        return f"{prefix}: layer {parts[-2]}, head {parts[-1]}"
    return ".".join(str(p) for p in parts) or "request"


def validation_detail(errors: list[dict]) -> str:
    msgs = []
    for err in errors[:5]:
        where = _where(tuple(err.get("loc", ())))
        msg = str(err.get("msg", "invalid"))
        if err.get("type") == "greater_than_equal" and ", head " in where:
            msg = f"window {err.get('input')!r} is invalid; use an integer >= 1 or null (full)"
        msgs.append(f"{where}: {msg}")
    more = f" (+{len(errors) - 5} more)" if len(errors) > 5 else ""
    return "; ".join(msgs) + more


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ServiceError)
    async def _service(_: Request, exc: ServiceError) -> JSONResponse:
        return _json(exc.status_code, exc.detail, retry_after=getattr(exc, "retry_after", None))

    @app.exception_handler(AAHError)
    async def _engine(_: Request, exc: AAHError) -> JSONResponse:
        status = next(code for cls, code in ENGINE_STATUS if isinstance(exc, cls))
        return _json(status, str(exc))

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [{k: v for k, v in e.items() if k in ("loc", "msg", "type")} for e in exc.errors()]
        return _json(422, validation_detail(list(exc.errors())), errors=_jsonable(errors))

    async def _passing(request: Request, exc: Exception, fault: tuple[str, int] | None) -> JSONResponse:
        """503 with Retry-After for a fault that passes (`fault`: reason, seconds), else a bug."""
        if fault is None:
            return await _last_resort(request, exc)
        reason, wait = fault
        # a database error's driver message only: its SQL and parameters stay out of the log
        logger.warning("%s %s: unavailable for now (%s)", request.method, request.url.path,
                       getattr(exc, "orig", None) or exc)
        return _json(503, f"{reason}; retry in {wait} s", retry_after=wait)

    @app.exception_handler(OperationalError)
    async def _store(request: Request, exc: OperationalError) -> JSONResponse:
        return await _passing(request, exc, store_fault(exc))

    @app.exception_handler(PoolTimeout)
    async def _pool(request: Request, exc: PoolTimeout) -> JSONResponse:
        return await _passing(request, exc, ("every database connection is busy", 5))

    @app.exception_handler(OSError)
    async def _disk(request: Request, exc: OSError) -> JSONResponse:
        return await _passing(request, exc, disk_fault(exc))

    @app.exception_handler(ClientDisconnect)
    async def _gone(request: Request, _: ClientDisconnect) -> Response:
        # Nobody is left to read an answer; an upload cut short keeps no partial file.
        logger.info("%s %s: the client disconnected before its request body was complete", request.method,
                    request.url.path)
        return Response(status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        if isinstance(exc.__cause__, RecursionError):  # FastAPI's body parser met JSON nested too deeply
            return _json(422, "request body: JSON nested too deeply to read (keep it under 64 levels)")
        return JSONResponse({"detail": str(exc.detail)}, status_code=exc.status_code,
                            headers=getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def _last_resort(request: Request, exc: Exception) -> JSONResponse:
        # A bug, not a user error: log it with the traceback; tell the user where to look.
        logger.exception("unhandled error on %s %s", request.method, request.url.path)
        return _json(500, f"internal error ({type(exc).__name__}); the server log has the details")


def _jsonable(value: object) -> object:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if value is None or isinstance(value, (bool, int, str)):
        return value
    return str(value)
