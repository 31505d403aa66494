"""Sending tracking operations to the server (docs/api.md, "Tracking"), with retries and backoff.

An operation is a small JSON-able dict, the same in memory, in a spool file and in an import:
``{"op": "create", "run_key", "body"}``, ``{"op": "log", "run_key", "body"}``,
``{"op": "status", "run_key", "body"}`` and ``{"op": "checkpoint", "run_key", "path"}``. Every one is
idempotent on the server, so sending one again (a retry, a replayed spool) is always safe.

A create operation carries the run's write secret (``body.write_secret``, chosen by the client), so a
spool or a retried create holds what every later write needs: the secret goes with each of them in the
``X-AAH-Run-Secret`` header. A create without one (a spool of an older client) takes the secret the server
answers; if the run exists already, its writes cannot be made and Refused says so. A job the server submitted
to a cluster reports to the run the server made for it: ``{"op": "attach", "run_key", "run_id", "write_secret"}``
stands in for create (the server handed the job both, in its environment).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx

from aah_core.checkpoint import FILES

Op = dict[str, Any]
PREFIX = "/api/v1/tracking/runs"
RETRY_STATUSES = (500, 502, 503, 504)  # the server is there but not able to answer now
SECRET_HEADER = "X-AAH-Run-Secret"


class Unreachable(Exception):
    """The server could not be reached or kept failing (connection refused, timeout, 5xx)."""


class Refused(Exception):
    """The server answered with a 4xx: a bad or missing token, or a request it will not take."""

    def __init__(self, status: int | None, detail: str) -> None:
        super().__init__(f"{status}: {detail}" if status else detail)
        self.status = status
        self.detail = detail


def _detail(response: httpx.Response) -> str:
    try:
        detail = response.json().get("detail")
    except (ValueError, AttributeError):
        detail = None
    return str(detail) if detail else (response.text.strip()[:300] or response.reason_phrase)


class Transport:
    """One server; remembers the run id the server gave each run key, and the run's write secret."""

    def __init__(self, uri: str, token: str | None = None, timeout_s: float = 10.0, retries: int = 3,
                 backoff_s: float = 0.5, upload_timeout_s: float = 300.0) -> None:
        self.uri = uri.rstrip("/")
        self.retries = retries
        self.upload_timeout = httpx.Timeout(upload_timeout_s, connect=3.0)  # checkpoint files and their commit
        self.backoff_s = backoff_s
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.http = httpx.Client(base_url=self.uri, headers=headers, timeout=httpx.Timeout(timeout_s, connect=3.0))
        self.run_ids: dict[str, int] = {}
        self.secrets: dict[str, str] = {}

    def send(self, op: Op) -> dict[str, Any]:
        """Send one operation; raises Unreachable (try later) or Refused (will not be taken as it is)."""
        key = op["run_key"]
        if op["op"] == "attach":
            self.run_ids[key], self.secrets[key] = int(op["run_id"]), op["write_secret"]
            return {"run": {"id": self.run_ids[key]}, "created": False}
        if op["op"] == "create":
            answer = self._request("POST", PREFIX, json=op["body"])
            secret = op["body"].get("write_secret") or answer.get("write_secret")
            if secret is None:
                raise Refused(None, f"run {answer['run']['id']} (run key {key!r}) exists on {self.uri}, created "
                              "without a write secret this client holds (a spool written by an older aah, before "
                              "runs had write secrets): the server refuses writes to it; train or import the run "
                              "again")
            self.run_ids[key], self.secrets[key] = answer["run"]["id"], secret
            return answer
        if key not in self.run_ids:
            raise Refused(None, f"run key {key!r} has no run on {self.uri}: its create operation was not sent")
        url = f"{PREFIX}/{self.run_ids[key]}"
        auth = {SECRET_HEADER: self.secrets[key]}
        if op["op"] == "log":
            return self._request("POST", f"{url}/log", json=op["body"], headers=auth)
        if op["op"] == "status":
            return self._request("POST", f"{url}/status", json=op["body"], headers=auth)
        if op["op"] == "checkpoint":
            for name in FILES:
                self._request("PUT", f"{url}/checkpoint/{name}", file=Path(op["path"]) / name, headers=auth)
            return self._request("POST", f"{url}/checkpoint", slow=True, headers=auth)
        raise ValueError(f"unknown tracking operation {op['op']!r}")

    def alive(self) -> bool:
        """Whether the server answers its health check now. Two tries: after a restart of the server, the
        first may go out on a pooled connection to the old process and fail (the pool then drops it)."""
        for _ in range(2):
            try:
                return self.http.get("/api/v1/health").status_code == 200
            except httpx.HTTPError:
                continue
        return False

    def close(self) -> None:
        self.http.close()

    def _request(self, method: str, url: str, json: Any = None, file: Path | None = None,
                 slow: bool = False, headers: dict[str, str] | None = None) -> dict[str, Any]:
        timeout = self.upload_timeout if file is not None or slow else self.http.timeout
        problem = ""
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(self.backoff_s * 2 ** (attempt - 1))
            try:
                if file is not None:
                    with file.open("rb") as content:  # streamed; opened again on a retry
                        response = self.http.request(method, url, content=content, timeout=timeout,
                                                     headers=headers)
                else:
                    response = self.http.request(method, url, json=json, timeout=timeout, headers=headers)
            except httpx.HTTPError as exc:
                problem = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
                continue
            except OSError as exc:
                raise Refused(None, f"cannot read {file}: {exc}") from None
            if response.status_code in RETRY_STATUSES:
                problem = f"{response.status_code}: {_detail(response)}"
                continue
            if response.status_code >= 400:
                raise Refused(response.status_code, _detail(response))
            return response.json()
        raise Unreachable(f"{self.uri} did not answer ({problem})")
