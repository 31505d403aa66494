"""Dependencies: the session, settings, services and the token check, as Annotated aliases.

Only ``get_session`` touches the database; it is a plain generator, so FastAPI runs it in its
thread pool. The others only read ``app.state`` and are ``async`` so that they cost no thread hop
(every request passes ``require_token``, and ``/health`` must not queue for a thread behind it).
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Iterator
from typing import TYPE_CHECKING, Annotated

from fastapi import Depends, Request
from fastapi.exceptions import RequestValidationError
from sqlalchemy.orm import Session

from backend.schemas.base import text_problem
from backend.schemas.errors import Unauthorized
from backend.schemas.tracking import SECRET_HEADER
from backend.services.cache import LruCache
from backend.services.executor import BoundedExecutor
from backend.settings import Settings
from backend.store.db import transaction

if TYPE_CHECKING:
    from backend.services.registry import Registry
    from backend.services.target_jobs import TargetJobs


async def get_settings(request: Request) -> Settings:
    return request.app.state.settings


def get_session(request: Request) -> Iterator[Session]:
    """One transaction per request, committed before the response is sent (scope='function')."""
    with transaction(request.app.state.sessions) as session:
        yield session


async def get_registry(request: Request) -> Registry:
    return request.app.state.registry


async def get_target_jobs(request: Request) -> TargetJobs:
    return request.app.state.target_jobs


SAFE_METHODS = ("GET", "HEAD", "OPTIONS")
# the tracking writes to one run: with the run's write secret they need no bearer token (a cluster job
# started by this server has the secret and never the token; the tracking service checks the secret)
TRACKING_WRITE = re.compile(r"^/api/v1/tracking/runs/\d+/(log|status|checkpoint)(/[^/]+)?$")


async def get_metrics_cache(request: Request) -> LruCache:
    return request.app.state.metrics_cache


async def get_heavy(request: Request) -> BoundedExecutor:
    return request.app.state.heavy


async def get_reads(request: Request) -> BoundedExecutor:
    return request.app.state.reads


async def require_token(request: Request) -> None:
    """When AAH_API_TOKEN is set, mutating requests (POST/PUT/PATCH/DELETE) need 'Authorization: Bearer <token>'.

    Installed once for the whole app; it reads the header itself so that read-only operations do
    not advertise an auth requirement (backend/openapi.py documents it on the mutating ones).
    """
    token = request.app.state.settings.token()
    if token is None or request.method in SAFE_METHODS:
        return
    if request.headers.get(SECRET_HEADER) and TRACKING_WRITE.match(request.url.path):
        return  # a write to a tracked run (a cluster job's: it has no token): the tracking service checks its secret
    scheme, _, given = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not given.strip():
        raise Unauthorized("this endpoint needs 'Authorization: Bearer <AAH_API_TOKEN>'")
    if not secrets.compare_digest(given.strip().encode(), token.encode()):
        raise Unauthorized("the bearer token does not match AAH_API_TOKEN")


async def require_plain_params(request: Request) -> None:
    """Path and query parameters hold no control character and no lone surrogate (request bodies are
    checked by their schemas, backend/schemas/base.py): a 422 on every database, never a store error."""
    given = [("path", k, v) for k, v in request.path_params.items() if isinstance(v, str)]
    given += [("query", k, v) for k, v in request.query_params.multi_items()]
    errors = []
    for where, name, value in given:
        for text in (name, value):
            if (problem := text_problem(text)) is not None:
                errors.append({"type": "control_character", "loc": (where, name), "msg": problem, "input": value})
                break
    if errors:
        raise RequestValidationError(errors)


SettingsDep = Annotated[Settings, Depends(get_settings)]
SessionDep = Annotated[Session, Depends(get_session, scope="function")]
RegistryDep = Annotated["Registry", Depends(get_registry)]
TargetJobsDep = Annotated["TargetJobs", Depends(get_target_jobs)]
MetricsCacheDep = Annotated[LruCache, Depends(get_metrics_cache)]
HeavyDep = Annotated[BoundedExecutor, Depends(get_heavy)]
ReadsDep = Annotated[BoundedExecutor, Depends(get_reads)]
