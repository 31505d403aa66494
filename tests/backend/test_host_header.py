"""DNS rebinding: the API answers only to its own host names (AAH_ALLOWED_HOSTS; loopback names by
default), for reads and writes, on a real uvicorn (issue 10 item 2)."""

from __future__ import annotations

import socket
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from aah_launcher import serve
from backend.api.middleware import host_allowed
from tests.frontend.stack import running_api

API = "/api/v1"


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    base = tmp_path_factory.mktemp("hosts")
    env = {"AAH_SEED_DEMO": "false", "AAH_SEED_PAPER": "false", "AAH_SEED_SUITE": "false"}  # AAH_ALLOWED_HOSTS unset
    with running_api(base / "data", base / "api.log", env) as url:
        yield url


def _get(url: str, host: str) -> httpx.Response:
    return httpx.get(url + API + "/health", headers={"Host": host}, timeout=10)


def test_loopback_names_are_answered(live):
    port = urlsplit(live).port
    for host in ("localhost", f"localhost:{port}", f"127.0.0.1:{port}", f"[::1]:{port}", f"LOCALHOST:{port}"):
        assert _get(live, host).status_code == 200, host


def test_foreign_hosts_are_refused_for_reads_and_writes(live):
    port = urlsplit(live).port
    for host in (f"evil.example:{port}", "attacker.test", f"localhost.evil.example:{port}",
                 f"127.0.0.1.nip.io:{port}", f"127.0.0.2:{port}", "", "localhost@evil.example"):
        r = _get(live, host)
        assert r.status_code == 400, (host, r.text)
        assert "AAH_ALLOWED_HOSTS" in r.json()["detail"]
        assert "access-control-allow-origin" not in r.headers
    r = httpx.post(live + API + "/views", json={"name": "x", "page": "p", "state": {}},
                   headers={"Host": f"evil.example:{port}"}, timeout=10)
    assert r.status_code == 400
    assert httpx.get(live + API + "/views", timeout=10).json() == []  # nothing was written


def test_a_request_without_host_is_refused(live):
    """HTTP/1.0 needs no Host header; such a request is not for us either."""
    with socket.create_connection(("127.0.0.1", urlsplit(live).port), timeout=10) as s:
        s.sendall(b"GET /api/v1/health HTTP/1.0\r\n\r\n")
        reply = b""
        while chunk := s.recv(4096):
            reply += chunk
    assert reply.startswith(b"HTTP/1.1 400") and b"AAH_ALLOWED_HOSTS" in reply


def test_configured_names_and_subdomains():
    allowed = ["api", "*.example.org", "::1"]
    assert host_allowed("api:8000", allowed) and host_allowed("lab.example.org", allowed)
    assert host_allowed("[::1]:8000", allowed)
    assert not host_allowed("example.org.evil.test", allowed) and not host_allowed("localhost", allowed)
    assert not host_allowed("evilexample.org", allowed)
    assert host_allowed("anything:1", ["*"])


def test_aah_serve_allows_the_address_the_dashboard_uses(tmp_path: Path, monkeypatch):
    """`aah serve --host 10.1.2.3`: the dashboard calls the API at 10.1.2.3, so the API answers to it."""
    monkeypatch.delenv("AAH_ALLOWED_HOSTS", raising=False)
    api, ui = serve._children(tmp_path, "10.1.2.3", 8000, 8501, None)
    allowed = api.env["AAH_ALLOWED_HOSTS"].split(",")
    assert host_allowed(urlsplit(ui.env["AAH_API_URL"]).netloc, allowed)
    assert host_allowed("127.0.0.1:8000", allowed) and not host_allowed("evil.example", allowed)
