"""The dashboard's only way to the backend: the `AAH_API_URL` setting (read here and nowhere else),
the shared `ApiClient`, cached reads (CACHEABLE) and the error line shown when a call fails.

A busy API (429, its queue of heavy jobs full) is never waited for inside a script run (a sleeping
script holds the session: clicks queue behind it): `guard` shows a "busy" line and the browser asks
again after the `Retry-After` it sent (BUSY_WAIT_MAX_S at most), rerunning the fragment or page
(frontend/rerun_timer.py).

Non-finite metric values arrive as their kind ("nan", "inf", "-inf": JSON has no NaN). In run
summaries and compare tables, numbers the pages compute and format with, they become floats here;
series keep their kinds and their `nonfinite` lists, which the charts mark (frontend/figures.py).

Tests replace `get_client` (monkeypatch) with a fake that has the same methods.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Iterator

import streamlit as st

from aah_client import ApiClient, ApiError, ServerBusy, ServiceUnavailable
from frontend import rerun_timer, user_text

logger = logging.getLogger(__name__)

API_URL = os.environ.get("AAH_API_URL", "http://127.0.0.1:8000").rstrip("/")
API_TOKEN = os.environ.get("AAH_API_TOKEN") or None
BUSY_WAIT_MAX_S = 5.0


@st.cache_resource(show_spinner=False)
def _shared_client(url: str, token: str | None) -> ApiClient:
    # busy_retries=0: a 429 comes back here at once (the client would sleep before asking again)
    return ApiClient(url, token=token, timeout=120.0, busy_retries=0)


def get_client() -> ApiClient:
    """The process-wide client (one connection pool for every session)."""
    return _shared_client(API_URL, API_TOKEN)


KINDS = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


def numbers(result: Any) -> Any:
    """A response with its runs' summaries and its compare-table values as numbers (a non-finite
    value's kind becomes the float); anything else unchanged."""
    if isinstance(result, list):
        return [numbers(item) for item in result]
    if not isinstance(result, dict):
        return result
    out = dict(result)
    for field in ("summary", "values"):
        if isinstance(out.get(field), dict):
            out[field] = {k: KINDS.get(v, v) if isinstance(v, str) else v for k, v in out[field].items()}
    for field in ("runs", "table", "run"):
        if isinstance(out.get(field), (list, dict)):
            out[field] = numbers(out[field])
    return out


def call(method: str, *args: Any, **kwargs: Any) -> Any:
    """`get_client().<method>(...)`, uncached. Raises ApiError / ServiceUnavailable."""
    return numbers(getattr(get_client(), method)(*args, **kwargs))


@st.cache_data(ttl=30, show_spinner=False, max_entries=512)
def _cached(url: str, method: str, args: tuple, kwargs: tuple) -> Any:
    return getattr(get_client(), method)(*args, **dict(kwargs))


# Reads that may be served from the cache: GETs of things that do not change under the user's hands,
# and the POSTs that only compute (evaluate, attention on a posted text, cost, round_plan), pure functions of their
# arguments. A call that changes something (create, cancel, update, save a view) is never cached.
CACHEABLE = frozenset({"models", "unavailable_models", "model", "model_windows", "model_texts", "presets", "runs",
                       "run_windows", "evaluate", "attention", "retained_mass", "retained_mass_of_text", "sensitivity", "cost",
                       "round_plan"})


def cached(method: str, *args: Any, **kwargs: Any) -> Any:
    """A read in CACHEABLE, served from a 30 s cache when the same call was made (undo/redo of a plan
    re-asks evaluate). Errors are never cached. Any other method raises ValueError: use `call`."""
    if method not in CACHEABLE:
        raise ValueError(f"api.cached({method!r}): not a cacheable read; use api.call for it")
    return numbers(_cached(API_URL, method, args, tuple(sorted(kwargs.items()))))


BACKGROUND_KEEP = 64  # finished background reads kept (a sweep's answer is small)


@st.cache_resource(show_spinner=False)
def _background() -> tuple[ThreadPoolExecutor, dict, threading.Lock]:
    return ThreadPoolExecutor(max_workers=2, thread_name_prefix="aah-background"), {}, threading.Lock()


def in_background(method: str, *args: Any, **kwargs: Any) -> Future:
    """A cacheable read (CACHEABLE) running in a worker thread of this process: started by the first
    ask, shared by later ones. A heavy panel (the editor's one-head sweep) asks with `ready` and draws
    its place meanwhile, so no script run waits for it (issue 23)."""
    if method not in CACHEABLE:
        raise ValueError(f"api.in_background({method!r}): not a cacheable read")
    pool, futures, lock = _background()
    client = get_client()  # here, in the script's thread: the worker has no Streamlit context
    key = (id(client), method, args, tuple(sorted(kwargs.items())))
    with lock:
        fut = futures.get(key)
        if fut is None:
            fut = futures[key] = pool.submit(getattr(client, method), *args, **kwargs)
            done = [k for k, f in futures.items() if f.done()]
            for k in done[: max(0, len(futures) - BACKGROUND_KEEP)]:
                del futures[k]
        return fut


def ready(method: str, *args: Any, **kwargs: Any) -> Any | None:
    """The answer of `in_background(method, ...)`, or None while it runs. A failed read raises its
    error (for `guard`) and is forgotten, so the next ask starts it again."""
    fut = in_background(method, *args, **kwargs)
    if not fut.done():
        return None
    exc = fut.exception()
    if exc is not None:
        pool, futures, lock = _background()
        with lock:
            for k in [k for k, f in futures.items() if f is fut]:
                del futures[k]
        raise exc
    return numbers(fut.result())


def busy_wait(exc: ServerBusy) -> float:
    """Seconds to wait before asking a busy API again: its Retry-After, at least 0.5, at most BUSY_WAIT_MAX_S."""
    return min(max(exc.retry_after, 0.5), BUSY_WAIT_MAX_S)


def error_text(exc: ApiError) -> str:
    """The line shown for a failed call (Markdown; the server's detail, which may quote user text, escaped)."""
    detail = user_text.md(exc.detail)
    if isinstance(exc, ServiceUnavailable):
        return (f"The AAH API is not reachable at {API_URL} ({detail}). Start it with `make demo` "
                "or `python -m uvicorn backend.app:app`, or point AAH_API_URL at it.")
    if isinstance(exc, ServerBusy):
        return (f"The API is busy ({detail}); asking again in {busy_wait(exc):.0f} s. "
                "What you changed is kept.")
    if exc.status == 401:
        return f"The API refused the request (401: {detail}). Set AAH_API_TOKEN for the dashboard."
    return f"The API refused the request ({exc.status}: {detail})"


@contextlib.contextmanager
def guard(what: str = "", stop: bool = False) -> Iterator[None]:
    """Run a block of API work; an ApiError ends the block and leaves one visible error line.
    With `stop`, the rest of the page (or fragment) is skipped too, for blocks later code depends on."""
    try:
        yield
    except ApiError as exc:
        logger.info("API call failed%s: %s", f" ({what})" if what else "", exc)
        line = (f"{user_text.md(what)}: " if what else "") + error_text(exc)
        if isinstance(exc, ServerBusy):
            st.warning(line, icon="⏳")
            rerun_timer.rerun_after(busy_wait(exc))
        else:
            st.error(line, icon="⚠️")
        if stop:
            st.stop()
