"""`make demo` smoke test: `aah serve` on a temporary data dir and free ports, as `make demo` runs it
(minus the venv setup, which `make test` has just done): both health checks, the dashboard page, the
demo model through the API, then a stop signal or a crashed child, and no process left behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from aah_launcher.serve import API_HEALTH, UI_HEALTH, descendants
from tests.ship.conftest import ROOT, free_port

START_TIMEOUT_S = 150  # generous: CI shares 2 cores; this bounds a hang, it is not a speed check
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _get(url: str) -> tuple[int, bytes]:
    with _OPENER.open(url, timeout=30) as response:
        return response.status, response.read()


class Served:
    """`python -m aah_launcher.cli serve` in the background, its output collected line by line."""

    def __init__(self, data_dir: Path, demo_dir: Path | None, warm_up: bool) -> None:
        self.api_port, self.ui_port = free_port(), free_port()
        while self.ui_port == self.api_port:
            self.ui_port = free_port()
        env = {**os.environ, "AAH_DATA_DIR": str(data_dir), "AAH_API_PORT": str(self.api_port),
               "AAH_UI_PORT": str(self.ui_port), "AAH_TORCH_THREADS": "1"}
        env.pop("AAH_API_TOKEN", None)
        env.pop("AAH_WARM_UP", None)
        if not warm_up:
            env["AAH_WARM_UP"] = "false"
        if demo_dir is not None:
            env["AAH_DEMO_DIR"] = str(demo_dir)
        self.lines: list[str] = []
        self.ready = threading.Event()
        self.proc = subprocess.Popen([sys.executable, "-m", "aah_launcher.cli", "serve"], cwd=ROOT, env=env,
                                     stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, start_new_session=True)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))
            if "Press Ctrl-C" in line:
                self.ready.set()

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self.ready.wait(0.5):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"aah serve did not become ready (rc={self.proc.poll()}):\n{self.output}")

    def kill_all(self) -> None:
        """Teardown safety net: whatever the test did, leave nothing running."""
        for pid in descendants(self.proc.pid) | {self.proc.pid}:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait(10)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One data dir for the module's `aah serve` runs, as `make demo` keeps ./data: the first run seeds it
    (the store, the paper's and the suite's runs), the later ones start on what it left (about 5 s less each)."""
    return tmp_path_factory.mktemp("serve") / "data"


@pytest.fixture
def serve(data_dir: Path, demo_dir: Path | None):
    """Starts `aah serve`: with warm_up, exactly as `make demo` runs it; without, the API skips its warm-up (the
    editor's first numbers, ~4 s of CPU before /health, tested in tests/backend/test_warm_up.py), which
    stopping and supervising do not touch."""
    servers: list[Served] = []

    def start(warm_up: bool) -> Served:
        servers.append(Served(data_dir, demo_dir, warm_up))
        return servers[-1]

    try:
        yield start
    finally:
        for server in servers:
            server.kill_all()


def _check_running(server: Served) -> set[int]:
    """Both services answer; returns the process tree below `aah serve`."""
    api = f"http://127.0.0.1:{server.api_port}"
    ui = f"http://127.0.0.1:{server.ui_port}"
    assert f"Dashboard: {ui}" in server.output
    status, body = _get(api + API_HEALTH)
    assert status == 200 and json.loads(body)["status"] == "ok"
    status, body = _get(ui + UI_HEALTH)
    assert status == 200 and body.strip() == b"ok"
    status, body = _get(ui + "/")
    assert status == 200 and b'id="root"' in body, body[:300]
    status, body = _get(api + "/api/v1/models")
    assert status == 200
    assert "demo" in [m["id"] for m in json.loads(body)], body[:500]
    tree = descendants(server.proc.pid)
    assert len(tree) >= 2, f"expected the API and the dashboard below aah serve, got {tree}"
    return tree


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_serve_starts_answers_and_stops_cleanly(serve, sig: signal.Signals) -> None:
    served = serve(warm_up=sig == signal.SIGINT)  # Ctrl-C: the whole of `make demo`
    served.wait_ready()
    tree = _check_running(served)
    served.proc.send_signal(sig)
    assert served.proc.wait(60) == 0, served.output
    assert "stopped." in served.output
    left = [pid for pid in tree if _alive(pid)]
    assert not left, f"processes left after {sig.name}: {left}"


@pytest.mark.slow
def test_serve_stops_the_other_service_when_one_dies(serve) -> None:
    served = serve(warm_up=False)
    served.wait_ready()
    tree = _check_running(served)
    api_pid = next(pid for pid in tree if "uvicorn" in Path(f"/proc/{pid}/cmdline").read_bytes().decode())
    os.kill(api_pid, signal.SIGKILL)
    assert served.proc.wait(60) == 1, served.output
    assert "API exited unexpectedly" in served.output
    left = [pid for pid in tree if _alive(pid)]
    assert not left, f"processes left after the API died: {left}"


def test_serve_refuses_a_busy_port(tmp_path: Path) -> None:
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        env = {**os.environ, "AAH_DATA_DIR": str(tmp_path), "AAH_API_PORT": str(port),
               "AAH_UI_PORT": str(free_port())}
        result = subprocess.run([sys.executable, "-m", "aah_launcher.cli", "serve"], cwd=ROOT, env=env,
                                capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert f"127.0.0.1:{port} is not free" in result.stderr and "AAH_API_PORT" in result.stderr


def test_serve_rejects_a_bad_port_variable(tmp_path: Path) -> None:
    env = {**os.environ, "AAH_DATA_DIR": str(tmp_path), "AAH_UI_PORT": "eighty"}
    result = subprocess.run([sys.executable, "-m", "aah_launcher.cli", "serve"], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "AAH_UI_PORT='eighty' is not a port number" in result.stderr


def test_the_command_line_and_the_supervisor_import_no_torch() -> None:
    """`aah serve`, `aah submit` and `aah sync` start without importing torch (about 2 s of CPU each): the
    engine's and tracking's package names are imported on first use."""
    code = ("import sys\nimport aah_launcher.cli, aah_launcher.serve, aah_launcher.submit, aah_tracking.cli\n"
            "import aah_core, aah_tracking\nprint(sorted(m for m in ('torch', 'numpy') if m in sys.modules))\n"
            "print(aah_core.AAHError.__name__, 'TrackingCallback' in dir(aah_tracking))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split("\n")[:2] == ["[]", "AAHError True"]
