"""The dashboard's only way to the backend: the `AAH_API_URL` setting (read here and nowhere else),
the shared `ApiClient`, cached GETs and the error line shown when a call fails.

Tests replace `get_client` (monkeypatch) with a fake that has the same methods.
"""

from __future__ import annotations

import contextlib
import logging
import os
from typing import Any, Iterator

import streamlit as st

from aah_client import ApiClient, ApiError, ServiceUnavailable

logger = logging.getLogger(__name__)

API_URL = os.environ.get("AAH_API_URL", "http://127.0.0.1:8000").rstrip("/")
API_TOKEN = os.environ.get("AAH_API_TOKEN") or None


@st.cache_resource(show_spinner=False)
def _shared_client(url: str, token: str | None) -> ApiClient:
    return ApiClient(url, token=token, timeout=120.0)


def get_client() -> ApiClient:
    """The process-wide client (one connection pool for every session)."""
    return _shared_client(API_URL, API_TOKEN)


def call(method: str, *args: Any, **kwargs: Any) -> Any:
    """`get_client().<method>(...)`, uncached. Raises ApiError / ServiceUnavailable."""
    return getattr(get_client(), method)(*args, **kwargs)


@st.cache_data(ttl=30, show_spinner=False, max_entries=512)
def _cached(url: str, method: str, args: tuple, kwargs: tuple) -> Any:
    return call(method, *args, **dict(kwargs))


def cached(method: str, *args: Any, **kwargs: Any) -> Any:
    """A GET that may be served from a 30 s cache (models, texts, maps: things that do not change
    under the user's hands). Errors are never cached."""
    return _cached(API_URL, method, args, tuple(sorted(kwargs.items())))


def error_text(exc: ApiError) -> str:
    if isinstance(exc, ServiceUnavailable):
        return (f"The AAH API is not reachable at {API_URL} ({exc.detail}). Start it with `make demo` "
                "or `python -m uvicorn backend.app:app`, or point AAH_API_URL at it.")
    if exc.status == 401:
        return f"The API refused the request (401: {exc.detail}). Set AAH_API_TOKEN for the dashboard."
    return f"The API refused the request ({exc.status}: {exc.detail})"


@contextlib.contextmanager
def guard(what: str = "", stop: bool = False) -> Iterator[None]:
    """Run a block of API work; an ApiError ends the block and leaves one visible error line.
    With `stop`, the rest of the page (or fragment) is skipped too, for blocks later code depends on."""
    try:
        yield
    except ApiError as exc:
        logger.info("API call failed%s: %s", f" ({what})" if what else "", exc)
        st.error((f"{what}: " if what else "") + error_text(exc), icon="⚠️")
        if stop:
            st.stop()
