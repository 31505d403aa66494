"""ASGI middleware: refuse requests for a foreign Host (DNS rebinding) with a JSON 400, writes sent by
a page of another site (CSRF) with a JSON 403, and request bodies over the size limit with a JSON 413,
before any parsing.

(Starlette's TrustedHostMiddleware and FastAPI's ``max_body_size`` answer in plain text; the contract
wants ``{"detail": ...}``.)
"""

from __future__ import annotations

import json
import re
from urllib.parse import urlsplit

from starlette.types import ASGIApp, Message, Receive, Scope, Send


class BodySizeLimit:
    """Buffers the body (small by construction) and answers 413 once it passes ``max_bytes``.

    A declared Content-Length over the limit is refused without reading anything; a chunked
    body is counted as it arrives, so leaving out the length does not get around the limit.
    Paths matching ``streamed`` (file uploads) pass unbuffered: their endpoint streams the body to
    disk and enforces its own limit.
    """

    def __init__(self, app: ASGIApp, max_bytes: int, streamed: str | None = None) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.streamed = re.compile(streamed) if streamed else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS")
                or (self.streamed is not None and self.streamed.match(scope["path"]))):
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.max_bytes):
            await self._too_large(send)
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await self._too_large(send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _too_large(self, send: Send) -> None:
        await send_json(send, 413, f"request body is larger than the limit of {self.max_bytes} bytes "
                                   "(AAH_MAX_BODY_BYTES)")


async def send_json(send: Send, status: int, detail: str) -> None:
    """A complete ``{"detail": ...}`` response, sent straight from a middleware."""
    payload = json.dumps({"detail": detail}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(payload)).encode())]})
    await send({"type": "http.response.body", "body": payload})


def host_name(host: str) -> str:
    """'LocalHost:8000' -> 'localhost'; '[::1]:8000' -> '[::1]'; '::1' -> '[::1]' (ports never matter)."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[: host.find("]") + 1] if "]" in host else host
    if host.count(":") > 1:  # a bare IPv6 address (only ever in settings)
        return f"[{host}]"
    return host.partition(":")[0]


def host_allowed(host: str, allowed: list[str]) -> bool:
    """``allowed`` holds names ('localhost', '[::1]'), '*.example.com' for subdomains, or '*' for any."""
    name = host_name(host)
    if not name:
        return False
    for pattern in allowed:
        if pattern == "*" or name == host_name(pattern):
            return True
        if pattern.startswith("*.") and name.endswith(pattern[1:].lower()):
            return True
    return False


class HostCheck:
    """Answers only requests whose Host header names this server (``Settings.allowed_hosts``).

    A web page on another site can make the browser send requests to 127.0.0.1 under its own
    name (DNS rebinding); the Host header still carries that foreign name, so it is refused here,
    for reads as well as writes. The list is read from the app's settings on every request.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        allowed = scope["app"].state.settings.allowed_host_list
        host = dict(scope.get("headers") or []).get(b"host", b"").decode("latin-1")
        if host_allowed(host, allowed):
            await self.app(scope, receive, send)
            return
        await send_json(send, 400, "this API answers only to the host names in AAH_ALLOWED_HOSTS "
                                   f"({', '.join(allowed)}); the request's Host header is not one of them")


WRITE_METHODS = (b"POST", b"PUT", b"PATCH", b"DELETE")
OWN_FETCHES = ("same-origin", "none")  # Sec-Fetch-Site of the page's own requests, and of a typed URL or a tool
DEFAULT_PORTS = {"http": 80, "https": 443}


def _address(netloc: str, scheme: str) -> tuple[str, int | None]:
    """(host name, port) of 'host[:port]', the port defaulting to the scheme's; -1 for a malformed port."""
    parts = urlsplit(f"//{netloc.strip().lower()}")
    try:
        port = parts.port
    except ValueError:
        port = -1
    return parts.hostname or "", port or DEFAULT_PORTS.get(scheme)


def write_allowed(origin: str | None, fetch_site: str | None, host: str, trusted: list[str]) -> bool:
    """Whether a write comes from this server's own pages or from a program, not from another site's page.

    Browsers send ``Origin`` with every cross-origin request (a ``no-cors`` form POST too) and, today,
    ``Sec-Fetch-Site``; programs (the dashboard's server, ``aah``, curl) send neither. A write is allowed when
    its Origin is absent or names this server (the request's Host: name and port), and its Sec-Fetch-Site is
    absent, ``same-origin`` or ``none``; or when its Origin is one of ``trusted`` (AAH_UI_ORIGIN, the origins
    CORS lets call the API). The scheme is not compared: behind a TLS proxy the server itself sees http.
    """
    if origin is not None:
        origin = origin.strip().lower().rstrip("/")
        if origin in (t.strip().lower().rstrip("/") for t in trusted):
            return True
        parts = urlsplit(origin)
        if parts.scheme not in DEFAULT_PORTS or parts.path or parts.query or "@" in parts.netloc or \
                _address(parts.netloc, parts.scheme) != _address(host, parts.scheme):
            return False
    return fetch_site is None or fetch_site.strip().lower() in OWN_FETCHES


class OriginCheck:
    """Refuses writes (POST/PUT/PATCH/DELETE) that a page of another site made a browser send (403).

    A page on another origin, even another port of 127.0.0.1, can make the browser POST to the API (a
    form, or ``fetch`` with ``mode: "no-cors"``) without reading the answer; with no token set, that
    would start or cancel jobs. Reads stay open (CORS keeps their answers from foreign pages). Runs
    inside HostCheck, so the Host it compares the Origin with is one of this server's names.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"].encode() not in WRITE_METHODS:
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        origin, fetch_site = (headers.get(name) for name in (b"origin", b"sec-fetch-site"))
        trusted = scope["app"].state.settings.ui_origins
        if write_allowed(None if origin is None else origin.decode("latin-1"),
                         None if fetch_site is None else fetch_site.decode("latin-1"),
                         headers.get(b"host", b"").decode("latin-1"), trusted):
            await self.app(scope, receive, send)
            return
        await send_json(send, 403, "a write from a page of another site is refused (its Origin or Sec-Fetch-Site "
                                   "header names another origin); pages allowed to write are listed in "
                                   "AAH_UI_ORIGIN")
