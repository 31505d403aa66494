"""Tracking end to end: a real uvicorn on loopback that a test can kill and start again on the same
port and data dir, and real `aah train` / `aah import` / `aah sync` subprocesses."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from tests.backend.conftest import tiny_demo  # noqa: F401 (a trained tiny checkpoint, shared)
from tests.frontend.stack import ROOT, api_command, free_port, stop_process, wait_ready

TOKEN = "tracking-test-token"


class ApiServer:
    """The API as a subprocess on a fixed port; ``kill`` is a SIGKILL, ``start`` brings it back."""

    def __init__(self, data_dir: Path, log: Path, token: str | None = TOKEN) -> None:
        self.port, self.data_dir, self.log = free_port(), data_dir, log
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("AAH_")}
        self.env.update({"AAH_DATA_DIR": str(data_dir), "PYTHONPATH": str(ROOT), "AAH_PRELOAD_MODELS": "false",
                         "AAH_SEED_SUITE": "false", **({"AAH_API_TOKEN": token} if token else {})})
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(api_command(self.port), cwd=ROOT, env=self.env, stdout=self.log.open("a"),
                                     stderr=subprocess.STDOUT, start_new_session=True)
        wait_ready(f"{self.url}/api/v1/health", self.proc, self.log, 120)

    def kill(self) -> None:
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc)

    def get(self, path: str, **params: object) -> object:
        r = httpx.get(f"{self.url}/api/v1{path}", params=params, timeout=30)
        r.raise_for_status()
        return r.json()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiServer]:
    root = tmp_path_factory.mktemp("tracking-server")
    api = ApiServer(root / "data", root / "api.log")
    api.start()
    yield api
    api.stop()


def aah(*args: str, env: dict[str, str] | None = None, stderr: Path | None = None,
        module: str = "aah_launcher.cli") -> subprocess.Popen:
    """The `aah` command as a subprocess (stdout and stderr to files beside ``stderr``, or piped)."""
    full = {k: v for k, v in os.environ.items() if not k.startswith("AAH_")}
    full.update({"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", **(env or {})})
    out = subprocess.PIPE if stderr is None else stderr.with_suffix(".out").open("w")
    err = subprocess.PIPE if stderr is None else stderr.open("w")
    return subprocess.Popen([sys.executable, "-m", module, *args], cwd=ROOT, env=full, stdout=out, stderr=err,
                            text=True)


@pytest.fixture
def aah_here(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> Callable[..., tuple[int, str, str]]:
    """`aah sync` and `aah import` in this process (the installed command's main, with only ``env``'s AAH_
    variables set, as `aah` above): returns (exit code, stdout, stderr). A process each would cost a torch
    import (2-3 s of CPU); `aah train` stays a real process in every test, so the entry point is run too."""
    from aah_launcher.cli import main

    def run(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
        with monkeypatch.context() as patch:
            for name in [name for name in os.environ if name.startswith("AAH_")]:
                patch.delenv(name)
            for name, value in (env or {}).items():
                patch.setenv(name, value)
            capsys.readouterr()
            code = main(list(args))
            out, err = capsys.readouterr()
        return code, out, err

    return run


def tiny_train_args(out: Path, steps: int, *extra: str) -> list[str]:
    return ["train", "--preset", "tiny", "--set", f"train.max_steps={steps}", "--set", "train.eval_every=5",
            "--out", str(out), "--quiet", *extra]


def local_history(out: Path) -> tuple[dict[str, dict[int, float | None]], dict[int, list]]:
    """What `aah train` wrote beside ``out``: {key: {step: value}} and {step: windows}."""
    metrics: dict[str, dict[int, float | None]] = {}
    for line in out.with_name(f"{out.name}.metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        for key, value in row.items():
            if key not in ("step", "time"):
                assert row["step"] not in metrics.setdefault(key, {}), "the local history repeats a step"
                metrics[key][row["step"]] = value
    plans = {json.loads(line)["step"]: json.loads(line)["windows"]
             for line in out.with_name(f"{out.name}.plans.jsonl").read_text().splitlines()}
    return metrics, plans


def assert_run_matches(server: ApiServer, run_id: int, out: Path) -> None:
    """Every local metric point is on the server exactly once with its value, and every plan."""
    metrics, plans = local_history(out)
    series = server.get(f"/runs/{run_id}/metrics")["series"]
    assert set(series) == set(metrics)
    for key, points in metrics.items():
        got = series[key]
        assert got["step"] == sorted(points), key  # each step once
        for step, value in zip(got["step"], got["value"]):
            want = points[step]
            # a non-finite value comes back as its kind ("nan", "inf", "-inf")
            assert (isinstance(value, str) and (want is None or not math.isfinite(want))) or value == want, key
    stored = server.get(f"/runs/{run_id}/windows")
    assert stored["steps"] == sorted(plans)
    for step, windows in plans.items():
        assert server.get(f"/runs/{run_id}/windows", step=step)["windows"] == windows
