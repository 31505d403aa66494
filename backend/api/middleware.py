"""ASGI middleware: refuse requests for a foreign Host (DNS rebinding) with a JSON 400, and request
bodies over the size limit with a JSON 413, before any parsing.

(Starlette's TrustedHostMiddleware and FastAPI's ``max_body_size`` answer in plain text; the contract
wants ``{"detail": ...}``.)
"""

from __future__ import annotations

import json
import re

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
