"""`aah serve`: run the API and the dashboard together, wait until both answer, stop both cleanly.

The two children are the documented entry points (ARCHITECTURE.md, "Entry points"):

    python -m uvicorn backend.app:app --host HOST --port API_PORT --http backend.api.protocol:TimedH11Protocol
    streamlit run frontend/app.py --server.headless true --server.address HOST --server.port UI_PORT

Each child runs in its own session, hence its own process group, so that a Ctrl-C in the terminal
reaches only this supervisor; the supervisor then stops the children in order (dashboard first, then
the API, whose lifespan ends its training workers) and kills whatever is left of their process groups
and of the descendants it saw while they ran. On Linux the children also get PR_SET_PDEATHSIG, so a
supervisor killed with SIGKILL does not leave them behind either.

This module only supervises processes: it imports neither torch, nor the backend, nor Streamlit. It lives
outside the engine (aah_core knows nothing of servers); `aah serve` reaches it through aah_launcher.cli.
"""

from __future__ import annotations

import ctypes
import ipaddress
import logging
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from aah_core.errors import AAHError
from aah_core.shipped import shipped_data_dir

logger = logging.getLogger(__name__)

API_HEALTH = "/api/v1/health"
UI_HEALTH = "/_stcore/health"
API_PROTOCOL = "backend.api.protocol:TimedH11Protocol"  # h11 with a read deadline per request (408)
DEFAULT_API_PORT = 8000
DEFAULT_UI_PORT = 8501
STOP_GRACE_S = 20.0  # the API gives its training workers AAH_JOB_GRACE_S (10 s) to checkpoint
# A direct opener: a proxy set in the environment must never see requests to our own loopback ports.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class _Stop(Exception):
    """Raised by the SIGINT/SIGTERM handler to unwind the supervisor."""


@dataclass
class Child:
    name: str
    cmd: list[str]
    env: dict[str, str]
    health_url: str
    log_path: Path | None
    process: subprocess.Popen | None = None
    seen: set[int] = field(default_factory=set)  # descendants observed while running
    ready: bool = False


def source_root() -> Path:
    """The folder holding the aah_core, backend and frontend packages (the repo root in a checkout)."""
    return Path(__file__).resolve().parents[1]


def _env_port(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        port = int(raw)
    except ValueError:
        raise AAHError(f"{name}={raw!r} is not a port number; use an integer in 1..65535") from None
    return port


def default_ports() -> tuple[int, int]:
    """(api_port, ui_port) from AAH_API_PORT and AAH_UI_PORT, else 8000 and 8501."""
    return _env_port("AAH_API_PORT", DEFAULT_API_PORT), _env_port("AAH_UI_PORT", DEFAULT_UI_PORT)


def _check_port(host: str, port: int, env_name: str) -> None:
    if not 1 <= port <= 65535:
        raise AAHError(f"port {port} is out of range; set {env_name} to an integer in 1..65535")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            raise AAHError(f"{host}:{port} is not free ({exc.strerror}); stop what uses it or choose another "
                           f"port with {env_name}=...") from None


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _url_host(host: str) -> str:
    """The address a client uses to reach a server bound to ``host``."""
    if host in ("0.0.0.0", "::", ""):
        return "127.0.0.1"
    return f"[{host}]" if ":" in host else host


def _children(data_dir: Path, host: str, api_port: int, ui_port: int, log_dir: Path | None) -> list[Child]:
    root = source_root()
    base = {**os.environ, "AAH_DATA_DIR": str(data_dir), "PYTHONUNBUFFERED": "1"}
    base["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))
    api_url = f"http://{_url_host(host)}:{api_port}"
    ui_url = f"http://{_url_host(host)}:{ui_port}"
    api_env = dict(base)
    # CORS: the dashboard's real origin, unless the operator chose the origins.
    api_env.setdefault("AAH_UI_ORIGIN", f"{ui_url},http://localhost:{ui_port}")
    # Host check: the API answers to loopback names, plus the address the dashboard uses to reach it.
    api_env.setdefault("AAH_ALLOWED_HOSTS", f"localhost,127.0.0.1,[::1],{_url_host(host)}")
    # the first visit right after the address is printed is served from the cache (issue 23): the API
    # answers /health only once its models are loaded and the editor's first numbers computed
    api_env.setdefault("AAH_WARM_UP", "true")
    ui_env = {**base, "AAH_API_URL": api_url}
    api = Child("API", [sys.executable, "-m", "uvicorn", "backend.app:app", "--host", host,
                        "--port", str(api_port), "--http", API_PROTOCOL], api_env, api_url + API_HEALTH,
                log_dir / "api.log" if log_dir else None)
    ui_cmd = [sys.executable, "-m", "streamlit", "run", str(root / "frontend" / "app.py"),
              "--server.headless", "true", "--server.address", host, "--server.port", str(ui_port),
              "--browser.gatherUsageStats", "false", "--server.fileWatcherType", "none"]
    ui = Child("dashboard", ui_cmd, ui_env, ui_url + UI_HEALTH, log_dir / "ui.log" if log_dir else None)
    return [api, ui]


def _die_with_parent() -> None:
    """Child side (Linux): get SIGTERM when the supervisor dies, even by SIGKILL."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _start(child: Child, cwd: Path) -> None:
    out = None
    if child.log_path is not None:
        child.log_path.parent.mkdir(parents=True, exist_ok=True)
        out = child.log_path.open("ab")
    try:
        child.process = subprocess.Popen(
            child.cmd, env=child.env, cwd=str(cwd), stdin=subprocess.DEVNULL, stdout=out,
            stderr=subprocess.STDOUT if out is not None else None, start_new_session=True,
            preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None)
    finally:
        if out is not None:
            out.close()
    logger.info("%s started (pid %d): %s", child.name, child.process.pid, " ".join(child.cmd))


def descendants(pid: int) -> set[int]:
    """Every live descendant of ``pid`` (Linux /proc; empty elsewhere)."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rpartition(")")[2].split()[1])
        parents.setdefault(ppid, []).append(int(entry.name))
    found: set[int] = set()
    todo = [pid]
    while todo:
        for kid in parents.get(todo.pop(), []):
            if kid not in found:
                found.add(kid)
                todo.append(kid)
    return found


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        try:
            os.kill(pid, 0)
        except (ProcessLookupError, PermissionError):
            return False
        return True
    return stat.rpartition(")")[2].split()[0] != "Z"  # a zombie has already exited


def _healthy(url: str, timeout: float = 2.0) -> bool:
    try:
        with _OPENER.open(url, timeout=timeout) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def _tail(path: Path | None, lines: int = 15) -> str:
    if path is None or not path.is_file():
        return ""
    text = path.read_text(errors="replace").splitlines()[-lines:]
    return "\n".join("    " + line for line in text)


class Supervisor:
    """Starts the children, waits for their health checks, watches them and stops them."""

    def __init__(self, children: list[Child], cwd: Path, out: TextIO = sys.stdout) -> None:
        self.children = children
        self.cwd = cwd
        self.out = out
        self.tty = out.isatty()

    def _say(self, text: str, transient: bool = False) -> None:
        if self.tty:
            self.out.write("\r\033[K" + text + ("" if transient else "\n"))
        elif not transient:
            self.out.write(text + "\n")
        self.out.flush()

    def _remember_descendants(self) -> None:
        for child in self.children:
            if child.process is not None and child.process.poll() is None:
                child.seen |= descendants(child.process.pid)

    def _failed(self) -> Child | None:
        exited = (c for c in self.children if c.process is not None and c.process.poll() is not None)
        return next(exited, None)

    def failure_message(self, child: Child, what: str) -> str:
        tail = _tail(child.log_path)
        where = f" (log: {child.log_path})" if child.log_path else ""
        return f"the {child.name} {what}{where}" + (f"\n  last lines:\n{tail}" if tail else "")

    def start(self, timeout: float) -> None:
        """Start every child and return once all answer their health check."""
        for child in self.children:
            _start(child, self.cwd)
        t0 = time.monotonic()
        last_state = ""
        while True:
            for child in self.children:
                child.ready = child.ready or _healthy(child.health_url)
            self._remember_descendants()
            elapsed = time.monotonic() - t0
            state = "  ".join(f"{c.name} {'ready' if c.ready else 'starting'}" for c in self.children)
            if all(c.ready for c in self.children):
                self._say(f"[{elapsed:4.0f} s] {state}")
                return
            dead = self._failed()
            if dead is not None:
                self._say("")
                raise AAHError(self.failure_message(dead, f"exited with code {dead.process.returncode} "
                                                           "before it was ready"))
            if elapsed > timeout:
                waiting = next(c for c in self.children if not c.ready)
                self._say("")
                raise AAHError(self.failure_message(
                    waiting, f"did not answer {waiting.health_url} within {timeout:.0f} s; "
                    "raise --timeout on a slow machine"))
            if self.tty or state != last_state:
                self._say(f"[{elapsed:4.0f} s] {state}", transient=self.tty)
                last_state = state
            time.sleep(0.5)

    def watch(self) -> Child:
        """Block until a child exits on its own; return it."""
        while True:
            dead = self._failed()
            if dead is not None:
                return dead
            self._remember_descendants()
            time.sleep(1.0)

    def stop(self, grace: float = STOP_GRACE_S) -> None:
        """SIGTERM each child (dashboard first), then SIGKILL what remains of its group and descendants."""
        self._remember_descendants()
        for child in reversed(self.children):
            proc = child.process
            if proc is None:
                continue
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(grace)
                except subprocess.TimeoutExpired:
                    logger.warning("%s did not stop within %.0f s; killing it", child.name, grace)
            self._kill_group(proc.pid)
            for pid in child.seen:
                if _alive(pid):
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except (ProcessLookupError, PermissionError):
                        pass
            proc.wait()

    @staticmethod
    def _kill_group(pgid: int) -> None:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _install_stop_handlers() -> Callable[[], None]:
    def _raise(signum: int, _frame: object) -> None:
        raise _Stop(signal.Signals(signum).name)

    previous = {sig: signal.signal(sig, _raise) for sig in (signal.SIGINT, signal.SIGTERM)}

    def restore() -> None:
        for sig, handler in previous.items():
            signal.signal(sig, handler)

    return restore


def serve(
    host: str = "127.0.0.1",
    api_port: int | None = None,
    ui_port: int | None = None,
    data_dir: str | os.PathLike[str] | None = None,
    timeout: float = 180.0,
    verbose: bool = False,
    out: TextIO = sys.stdout,
) -> int:
    """Run the API and the dashboard until Ctrl-C / SIGTERM; return the exit code.

    Args:
        host: bind address of both servers (127.0.0.1: only this machine can connect).
        api_port, ui_port: default AAH_API_PORT / AAH_UI_PORT, else 8000 / 8501.
        data_dir: the store; default AAH_DATA_DIR, else ./data.
        timeout: seconds both may take to answer their health checks.
        verbose: children write to this terminal instead of ``<data_dir>/logs/{api,ui}.log``.
    """
    env_api, env_ui = default_ports()
    api_port = env_api if api_port is None else api_port
    ui_port = env_ui if ui_port is None else ui_port
    if api_port == ui_port:
        raise AAHError(f"the API and the dashboard cannot share port {api_port}; "
                       "set AAH_UI_PORT to another one")
    data = Path(data_dir or os.environ.get("AAH_DATA_DIR") or "data").expanduser().resolve()
    data.mkdir(parents=True, exist_ok=True)
    _check_port(host, api_port, "AAH_API_PORT")
    _check_port(host, ui_port, "AAH_UI_PORT")
    if not _is_loopback(host) and not os.environ.get("AAH_API_TOKEN"):
        out.write(f"warning: binding {host} without AAH_API_TOKEN: anyone who can reach port {api_port} may "
                  "start training jobs. Set AAH_API_TOKEN (see README, 'Security').\n")
    demo = Path(os.environ.get("AAH_DEMO_DIR") or shipped_data_dir() / "demo")
    if not (data / "aah.db").exists() and not (demo / "model.safetensors").is_file():
        out.write(f"note: no demo checkpoint in {demo}; the dashboard lists only the models you train. "
                  "`make demo-model` trains it.\n")
    children = _children(data, host, api_port, ui_port, None if verbose else data / "logs")
    supervisor = Supervisor(children, source_root(), out)
    restore = _install_stop_handlers()
    code = 0
    try:
        out.write(f"AAH Studio: data dir {data}" + ("" if verbose else f" (logs in {data / 'logs'})") + "\n")
        supervisor.start(timeout)
        ui_url = children[1].health_url.removesuffix(UI_HEALTH)
        api_url = children[0].health_url.removesuffix(API_HEALTH)
        out.write(f"\n  Dashboard: {ui_url}\n  API:       {api_url}  (docs: {api_url}/docs)\n\n"
                  "Press Ctrl-C to stop.\n")
        out.flush()
        dead = supervisor.watch()
        code_text = f"exited unexpectedly with code {dead.process.returncode}"
        out.write(supervisor.failure_message(dead, code_text) + "\n")
        code = 1
    except _Stop as stop:
        out.write(f"\n{stop.args[0]}: stopping the dashboard and the API ...\n")
    except AAHError as exc:
        out.write(f"aah serve: error: {exc}\n")
        code = 2
    finally:
        # A second Ctrl-C during shutdown must not leave children behind: ignore it until we are done.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        supervisor.stop()
        restore()
    out.write("stopped.\n")
    out.flush()
    return code
