"""Fixtures of the cluster-target tests: one real engine per kind, stopped when its tests end
(tests/clusters/engines.py; an idle Ray head takes about 5 % of a core, which a session-wide one took from
every later test of its xdist worker), and an API server (real uvicorn, with an API token) pointed at it,
whose jobs report back over HTTP."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from tests.clusters.engines import RayHead, SlurmCluster, ray_missing, slurm_missing
from tests.frontend.stack import ROOT
from tests.tracking.conftest import TOKEN, ApiServer

ENGINES = ("ray", "slurm")
AUTH = {"Authorization": f"Bearer {TOKEN}"}
# the command the nodes run aah with: this checkout's code (this machine is the cluster's only node)
JOB_COMMAND = f"env PYTHONPATH={ROOT} OMP_NUM_THREADS=1 {sys.executable} -m aah_launcher.cli"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if Path(item.fspath).is_relative_to(here):
            item.add_marker(pytest.mark.cluster)


@pytest.fixture(scope="module")
def ray_head(engine: str) -> Iterator[RayHead]:
    """The Ray head of the module's Ray tests. It depends on the engine parameter, so pytest stops it when the
    parameter moves on to Slurm."""
    missing = ray_missing()
    if missing:
        pytest.skip(f"Ray tests skipped: {missing}")
    head = RayHead({k: v for k, v in os.environ.items() if not k.startswith("AAH_")})
    yield head
    head.stop()


@pytest.fixture(scope="package")
def slurm() -> Iterator[SlurmCluster]:
    """The Slurm of this folder's tests (test_cluster_jobs.py and test_slurmrestd.py)."""
    missing = slurm_missing()
    if missing:
        pytest.skip(f"Slurm tests skipped: {missing}")
    cluster = SlurmCluster()
    yield cluster
    cluster.stop()


def engine_env(request: pytest.FixtureRequest, engine: str) -> dict[str, str]:
    """The server's settings for the engine (starting the engine if it is not running yet)."""
    if engine == "ray":
        return {"AAH_RAY_ADDRESS": request.getfixturevalue("ray_head").address}
    cluster = request.getfixturevalue("slurm")
    return {"AAH_SLURM_PARTITION": cluster.partition, "SLURM_CONF": str(cluster.conf)}


@pytest.fixture(scope="module", params=ENGINES)
def engine(request: pytest.FixtureRequest) -> str:
    return request.param


class ClusterApi(ApiServer):
    """The API server with one cluster target; helpers to start jobs and wait for their runs."""

    def __init__(self, root: Path, target: str, env: dict[str, str]) -> None:
        super().__init__(root / "data", root / "api.log")
        self.target = target
        self.env.update(env)
        self.env.update({"AAH_API_PORT": str(self.port), "AAH_JOB_COMMAND": JOB_COMMAND, "AAH_CLUSTER_POLL_S": "0.5",
                         "AAH_SEED_PAPER": "false", "AAH_SEED_DEMO": "false"})

    def submit(self, steps: int, **resources: object) -> dict:
        body = {"preset": "tiny", "target": self.target, "overrides": {"train.max_steps": steps},
                "resources": resources}
        r = httpx.post(f"{self.url}/api/v1/runs", json=body, headers=AUTH, timeout=60)
        assert r.status_code == 202, r.text
        return r.json()

    def cancel(self, run_id: int) -> dict:
        r = httpx.post(f"{self.url}/api/v1/runs/{run_id}/cancel", headers=AUTH, timeout=60)
        assert r.status_code == 200, r.text
        return r.json()

    def wait_run(self, run_id: int, done: Callable[[dict], bool], timeout_s: float = 120) -> dict:
        """The run once ``done(run)`` holds (polled every 0.3 s), or fail with its last state and log."""
        deadline = time.monotonic() + timeout_s
        while True:
            run = self.get(f"/runs/{run_id}")
            if done(run):
                return run
            if time.monotonic() > deadline:
                logs = self.get(f"/runs/{run_id}/logs", tail=30)
                pytest.fail(f"run {run_id} did not get there in {timeout_s} s: {run}\nlog: {logs}")
            time.sleep(0.3)


@pytest.fixture(scope="module")
def api(request: pytest.FixtureRequest, engine: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterApi]:
    server = ClusterApi(tmp_path_factory.mktemp(f"cluster-{engine}"), engine, engine_env(request, engine))
    server.start()
    yield server
    server.stop()


def engine_processes(marker: str) -> list[int]:
    """Pids of processes whose command line holds ``marker`` (a job's own --out folder)."""
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if marker.encode() in (proc / "cmdline").read_bytes():
                    pids.append(int(proc.name))
            except OSError:
                continue
    return pids


def slurm_job_state(cluster: SlurmCluster, job_id: str) -> str:
    done = subprocess.run(["scontrol", "show", "job", "-o", job_id], env=cluster.env, capture_output=True,
                          text=True, timeout=20)
    return done.stdout.split("JobState=")[1].split()[0]
