"""Checkpoint uploads under faults, on a real uvicorn (issue 21 item 5): a full disk answers 503 with
Retry-After and keeps no partial file; a PostgreSQL server that stops answering during an upload does not
stop the service (the upload's database check runs off the event loop, /health never waits for the
database); a client that disconnects mid-upload is not logged as an unhandled error."""

from __future__ import annotations

import json
import os
import resource
import signal
import socket
import statistics
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from backend.schemas.tracking import SECRET_HEADER
from tests.frontend.stack import running_api

API = "/api/v1"
QUIET = {"AAH_SEED_DEMO": "false", "AAH_SEED_PAPER": "false", "AAH_SEED_SUITE": "false", "AAH_PRELOAD_MODELS": "false",
         "AAH_REQUEST_TIMEOUT_S": "120"}
STALL_S = 8.0  # how long PostgreSQL stays stopped: a /health that waited on it would take about this long
HEALTH_EVERY_S = 0.1


@pytest.fixture(scope="module")
def sqlite_api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path, Path]]:
    base = tmp_path_factory.mktemp("upload-faults")
    with running_api(base / "data", base / "api.log", QUIET) as url:
        yield url, base / "data", base / "api.log"


def _server_pid(url: str) -> int:
    """The uvicorn process listening on `url`'s port (Linux /proc)."""
    port = int(url.rsplit(":", 1)[1])
    inodes = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if int(fields[1].split(":")[1], 16) == port and fields[3] == "0A":  # LISTEN
            inodes.add(fields[9])
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if any(os.readlink(fd).removeprefix("socket:[").rstrip("]") in inodes for fd in (proc / "fd").iterdir()):
                return int(proc.name)
        except OSError:
            continue
    raise AssertionError(f"no process listens on port {port}")


def _tracked_run(client: httpx.Client, tiny_demo: Path) -> int:
    """A new tracked run; its write secret goes into `client`'s headers."""
    config = json.loads((tiny_demo / "config.json").read_text())["config"]
    r = client.post("/tracking/runs", json={"run_key": uuid.uuid4().hex, "name": "upload", "preset": "tiny",
                                            "config": config})
    assert r.status_code == 201, r.text
    client.headers[SECRET_HEADER] = r.json()["write_secret"]
    return r.json()["run"]["id"]


def _leftovers(data: Path, run_id: int) -> list[str]:
    staging = data / "tracked" / f"run-{run_id}" / ".upload"
    return sorted(p.name for p in staging.glob(".*.part")) if staging.exists() else []


@pytest.mark.skipif(not Path("/proc/net/tcp").is_file(), reason="finds the server process through Linux /proc")
def test_a_full_disk_during_an_upload_answers_503_and_keeps_nothing(sqlite_api, tiny_demo):
    """RLIMIT_FSIZE on the server process makes its writes past 64 KiB fail with EFBIG, as on a full disk."""
    url, data, _ = sqlite_api
    weights = (tiny_demo / "model.safetensors").read_bytes()
    assert len(weights) > 64 << 10
    pid = _server_pid(url)
    with httpx.Client(base_url=url + API, timeout=60) as client:
        run_id = _tracked_run(client, tiny_demo)
        resource.prlimit(pid, resource.RLIMIT_FSIZE, (64 << 10, resource.RLIM_INFINITY))
        try:
            r = client.put(f"/tracking/runs/{run_id}/checkpoint/model.safetensors", content=weights)
        finally:
            resource.prlimit(pid, resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
        assert r.status_code == 503, r.text
        assert int(r.headers["retry-after"]) > 0 and "size limit" in r.json()["detail"]
        assert _leftovers(data, run_id) == []
        again = client.put(f"/tracking/runs/{run_id}/checkpoint/model.safetensors", content=weights)
        assert again.status_code == 200 and again.json()["bytes"] == len(weights), again.text


def test_a_client_that_disconnects_mid_upload_is_not_an_unhandled_error(sqlite_api, tiny_demo):
    url, data, log = sqlite_api
    with httpx.Client(base_url=url + API, timeout=60) as client:
        run_id = _tracked_run(client, tiny_demo)
        host, port = url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=30) as s:
            s.sendall(f"PUT {API}/tracking/runs/{run_id}/checkpoint/model.safetensors HTTP/1.1\r\nHost: localhost\r\n"
                      f"{SECRET_HEADER}: {client.headers[SECRET_HEADER]}\r\nContent-Length: {1 << 20}\r\n\r\n"
                      .encode() + b"\0" * (64 << 10))
            time.sleep(0.5)  # the server is reading the body
        # a request after the disconnect was handled: the server answers it once the aborted one is done
        assert client.get("/health").status_code == 200
        deadline = time.monotonic() + 30
        while _leftovers(data, run_id) and time.monotonic() < deadline:
            time.sleep(0.1)
    assert _leftovers(data, run_id) == []
    text = log.read_text()
    assert "unhandled error" not in text and "Traceback" not in text, text[-3000:]


def _server_processes(data_dir: Path) -> list[int]:
    """The PostgreSQL postmaster (first line of postmaster.pid) and all its children."""
    postmaster = int((data_dir / "postmaster.pid").read_text().split()[0])
    children = Path(f"/proc/{postmaster}/task/{postmaster}/children").read_text().split()
    return [postmaster, *map(int, children)]


def test_health_answers_while_postgresql_is_stopped_during_an_upload(postgres, tmp_path, tiny_demo):
    env = {**QUIET, "AAH_DATABASE_URL": postgres.new_database()}
    with running_api(tmp_path / "data", tmp_path / "api.log", env) as url, \
            httpx.Client(base_url=url + API, timeout=STALL_S * 4) as client:
        run_id = _tracked_run(client, tiny_demo)
        weights = (tiny_demo / "model.safetensors").read_bytes()
        upload: dict[str, httpx.Response] = {}
        stopped = _server_processes(postgres.data)
        for pid in stopped:
            os.kill(pid, signal.SIGSTOP)
        try:
            sender = threading.Thread(target=lambda: upload.setdefault("r", client.put(
                f"/tracking/runs/{run_id}/checkpoint/model.safetensors", content=weights)))
            sender.start()
            latencies = []
            end = time.monotonic() + STALL_S
            with httpx.Client(base_url=url + API, timeout=STALL_S) as health:
                while time.monotonic() < end:
                    t0 = time.perf_counter()
                    assert health.get("/health").status_code == 200
                    latencies.append(time.perf_counter() - t0)
                    time.sleep(HEALTH_EVERY_S)
            assert sender.is_alive(), "the upload finished while the database was stopped: it never asked it"
        finally:
            for pid in stopped:
                os.kill(pid, signal.SIGCONT)
        sender.join(STALL_S * 3)
        assert upload["r"].status_code == 200, upload["r"].text
    p95 = statistics.quantiles(latencies, n=20)[-1]
    print(f"/health while PostgreSQL was stopped: {len(latencies)} requests, p50 {statistics.median(latencies) * 1000:.1f} ms, "
          f"p95 {p95 * 1000:.1f} ms, max {max(latencies) * 1000:.1f} ms")
    # hang detectors, not speed: a /health that waited on the stopped database would take until it resumed
    assert max(latencies) < STALL_S / 2 and len(latencies) > STALL_S / (HEALTH_EVERY_S * 4), \
        (len(latencies), p95, max(latencies))
