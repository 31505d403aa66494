"""uvicorn's h11 protocol with read deadlines: a client that opens a connection and sends half a request
(headers without the blank line, or a body that stops short of its Content-Length) gets 408 and the
connection is closed after AAH_REQUEST_TIMEOUT_S, instead of holding it open for ever.

uvicorn's own ``timeout_keep_alive`` only covers the idle time between requests; nothing in it times
out a request that has begun (slowloris). As nginx does (client_header_timeout / client_body_timeout):
the request line and headers must all arrive within the timeout of the first byte (or of the
connection's start), dripping bytes does not extend it; a body may take as long as it needs to
upload (a tracked run's checkpoint) but may not stall for the timeout between two reads. While
uvicorn itself has paused reading (the app is slow to consume the body), the client is not at fault
and the timer waits. Use it with
``python -m uvicorn backend.app:app --http backend.api.protocol:TimedH11Protocol`` (what ``aah serve``, the
Dockerfile and compose run).
"""

from __future__ import annotations

import asyncio
import functools
import json

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from backend.settings import Settings

# Their side is done with the request (or the connection): nothing is left to wait for.
READ_DONE = (h11.DONE, h11.MUST_CLOSE, h11.CLOSED, h11.ERROR)


@functools.cache
def request_timeout_s() -> float:
    return Settings().request_timeout_s


def _timeout_response(seconds: float) -> bytes:
    body = json.dumps({"detail": f"the request was not received completely within {seconds:g} s "
                                 "(AAH_REQUEST_TIMEOUT_S); the connection is closed"}).encode()
    head = (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\nconnection: close\r\n"
            b"content-length: " + str(len(body)).encode() + b"\r\n\r\n")
    return head + body


class TimedH11Protocol(H11Protocol):
    """H11Protocol plus a read deadline per request (see the module docstring)."""

    _read_deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        pending, _ = self.conn.trailing_data  # bytes of a request h11 has not turned into events yet
        if self.conn.their_state in READ_DONE or (self.conn.their_state is h11.IDLE and not pending):
            self._disarm()
        elif self.conn.their_state is h11.SEND_BODY:  # the body: a deadline between reads
            self._disarm()
            self._arm()
        else:  # the request line and headers: one deadline from their first byte
            self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        if self._read_deadline is None:
            self._read_deadline = self.loop.call_later(request_timeout_s(), self._read_timed_out)

    def _disarm(self) -> None:
        if self._read_deadline is not None:
            self._read_deadline.cancel()
            self._read_deadline = None

    def _read_timed_out(self) -> None:
        self._read_deadline = None
        if self.transport.is_closing() or self.conn.their_state in READ_DONE:
            return
        if self.flow.read_paused:  # we stopped reading, not the client: wait on
            self._arm()
            return
        cycle = self.cycle if self.cycle is not None and not self.cycle.response_complete else None
        if cycle is None or not cycle.response_started:  # no response begun: the client may be told why
            self.transport.write(_timeout_response(request_timeout_s()))
        if cycle is not None:  # the app waiting on the body hears a disconnect
            cycle.disconnected = True
            cycle.message_event.set()
        self.logger.info("%s: request not received within %g s; connection closed",
                         "%s:%d" % self.client if self.client else "client", request_timeout_s())
        self.transport.close()
