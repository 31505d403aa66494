"""Faults around the requests, on a real uvicorn (issue 10 item 7): half-sent requests get 408 and
their connection closed; a full disk and a locked store answer 503 with Retry-After (and the service
recovers once the fault passes); training workers start without the API token in their environment."""

from __future__ import annotations

import os
import resource
import socket
import sqlite3
import subprocess
import time
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

from backend.app import create_app
from backend.services.worker_env import worker_env
from backend.store import db
from tests.backend.conftest import make_settings
from tests.frontend.stack import api_command, free_port, stop_process, wait_ready

API = "/api/v1"
TOKEN = "worker-must-not-see-this"
READ_TIMEOUT_S = 2.0
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    """(base url, server process, data dir) of a uvicorn run as the launchers run it, with a token."""
    base = tmp_path_factory.mktemp("faults")
    data, log = base / "data", base / "api.log"
    port = free_port()
    env = {**os.environ, "AAH_DATA_DIR": str(data), "AAH_API_TOKEN": TOKEN, "AAH_SEED_DEMO": "false",
           "AAH_SEED_PAPER": "false", "AAH_SEED_SUITE": "false", "AAH_REQUEST_TIMEOUT_S": str(READ_TIMEOUT_S),
           "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    proc = subprocess.Popen(api_command(port), env=env, stdout=log.open("w"), stderr=subprocess.STDOUT,
                            start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url + API + "/health", proc, log, 120)
        yield url, proc, data
    finally:
        stop_process(proc)


def _exchange(url: str, chunks: list[bytes], gap_s: float = 0.0) -> tuple[bytes, float]:
    """Send `chunks` (with `gap_s` between them) on a raw socket, then read until the server closes;
    returns what came back and the seconds until the close."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=READ_TIMEOUT_S + 10) as s:
        start = time.monotonic()
        for chunk in chunks:
            try:
                s.sendall(chunk)
            except OSError:  # the server already closed it
                break
            time.sleep(gap_s)
        reply = b""
        while chunk := s.recv(4096):
            reply += chunk
        return reply, time.monotonic() - start


HALF_SENT = {
    "nothing": [],
    "headers cut short": [b"GET /api/v1/health HTTP/1.1\r\nHost: localhost\r\n"],
    "body cut short": [b"POST /api/v1/views HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                       b"Authorization: Bearer " + TOKEN.encode() + b"\r\nContent-Length: 100\r\n\r\n{\"name\""],
    "headers dripped": [bytes([b]) for b in b"GET /api/v1/health HTTP/1.1\r\nHost: localhost\r\nX-Slow: "],
}


@pytest.mark.parametrize("chunks", HALF_SENT.values(), ids=HALF_SENT.keys())
def test_half_sent_requests_get_408_and_the_connection_is_closed(live, chunks):
    url, _, _ = live
    reply, seconds = _exchange(url, chunks, gap_s=0.05 if len(chunks) > 1 else 0.0)
    assert reply.startswith(b"HTTP/1.1 408 "), reply[:200]
    assert b"AAH_REQUEST_TIMEOUT_S" in reply
    # closed at the deadline, never before it; the upper bound only detects a connection left hanging
    assert READ_TIMEOUT_S - 0.5 <= seconds < READ_TIMEOUT_S + 60
    assert httpx.get(url + API + "/health", timeout=10).status_code == 200  # others are served meanwhile


def test_a_body_that_keeps_coming_may_take_longer_than_the_timeout(live):
    """Headers in time, then a body in pieces, each within the timeout of the last: an upload is not cut."""
    url, _, _ = live
    body = b'{"name": "slow", "page": "p", "state": {"k": "' + b"v" * 100 + b'"}}'
    head = (b"POST /api/v1/views HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nContent-Type: "
            b"application/json\r\nAuthorization: Bearer " + TOKEN.encode() + b"\r\nContent-Length: "
            + str(len(body)).encode() + b"\r\n\r\n")
    pieces = [head, body[:30], body[30:60], body[60:]]
    reply, seconds = _exchange(url, pieces, gap_s=READ_TIMEOUT_S * 0.6)
    assert reply.startswith(b"HTTP/1.1 201 "), reply[:300]
    assert seconds > READ_TIMEOUT_S  # longer than the timeout in all


def test_a_full_disk_answers_503_with_retry_after_and_recovers(live):
    """The closest real fault this machine allows without root: a file-size limit on the server process
    (writes past it fail with EFBIG, as on a full disk)."""
    url, proc, _ = live
    with httpx.Client(base_url=url + API, headers=AUTH, timeout=30) as client:
        before = len(client.get("/views").json())
        state = {"blob": "x" * 60_000}
        # no file of the server may grow past 64 KiB: the WAL is reused from its start after a checkpoint,
        # so a limit above its current size might never be reached; this one is, within a write or two
        resource.prlimit(proc.pid, resource.RLIMIT_FSIZE, (64 << 10, resource.RLIM_INFINITY))
        try:
            replies = [client.post("/views", json={"name": f"v{i}", "page": "p", "state": state}) for i in range(6)]
        finally:
            resource.prlimit(proc.pid, resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
        failed = [r for r in replies if r.status_code != 201]
        assert failed, "the file-size limit never made a write fail"
        for r in failed:
            assert r.status_code == 503, r.text
            assert int(r.headers["retry-after"]) > 0 and "retry in" in r.json()["detail"]
        kept = client.get("/views").json()
        assert len(kept) == before + len(replies) - len(failed)  # nothing half-written
        assert client.post("/views", json={"name": "after", "page": "p", "state": {}}).status_code == 201


def test_a_store_locked_past_the_busy_timeout_answers_503(tmp_path, monkeypatch):
    monkeypatch.setattr(db, "BUSY_TIMEOUT_MS", 200)
    settings = make_settings(tmp_path, None, seed_paper=False)
    with TestClient(create_app(settings)) as client:
        holder = sqlite3.connect(settings.db_path, isolation_level=None)
        holder.execute("BEGIN EXCLUSIVE")
        try:
            r = client.post(f"{API}/views", json={"name": "v", "page": "p", "state": {}})
        finally:
            holder.execute("ROLLBACK")
            holder.close()
        assert r.status_code == 503 and r.headers["retry-after"] == "5"
        assert "locked" in r.json()["detail"]
        assert client.post(f"{API}/views", json={"name": "v", "page": "p", "state": {}}).status_code == 201


def _worker_environ(run_id: int, data: Path) -> list[bytes]:
    """The environment the worker process of `run_id` was started with (Linux /proc)."""
    wanted = ["-m", "backend.jobs.worker", "--run-id", str(run_id), "--data-dir", str(data)]
    for proc in Path("/proc").iterdir():
        try:
            args = [a.decode() for a in (proc / "cmdline").read_bytes().split(b"\0")]
            if args[1:1 + len(wanted)] == wanted:
                return (proc / "environ").read_bytes().split(b"\0")
        except (OSError, ValueError):
            continue
    raise AssertionError(f"no worker process for run {run_id}")


def test_workers_start_without_the_api_token(live):
    url, _, data = live
    with httpx.Client(base_url=url + API, headers=AUTH, timeout=30) as client:
        r = client.post("/runs", json={"preset": "tiny", "overrides": {"train.max_steps": 10_000}})
        assert r.status_code == 202, r.text
        run_id = r.json()["id"]
        try:
            environ = _worker_environ(run_id, data)
        finally:
            client.post(f"/runs/{run_id}/cancel")
    names = {entry.partition(b"=")[0].decode() for entry in environ if entry}
    assert "AAH_API_TOKEN" not in names and "AAH_REQUEST_TIMEOUT_S" not in names
    assert {"AAH_DATABASE_URL", "PATH", "PYTHONPATH"} <= names


def test_the_worker_environment_is_an_allow_list(tmp_path):
    env = worker_env("sqlite:///x.db", tmp_path, {"PATH": "/bin", "AAH_API_TOKEN": "t", "AWS_SECRET_ACCESS_KEY": "k",
                                                  "OMP_NUM_THREADS": "2", "LC_ALL": "C", "PYTHONPATH": "/extra"})
    assert env == {"PATH": "/bin", "OMP_NUM_THREADS": "2", "LC_ALL": "C", "AAH_DATABASE_URL": "sqlite:///x.db",
                   "PYTHONPATH": os.pathsep.join([str(tmp_path), "/extra"])}
