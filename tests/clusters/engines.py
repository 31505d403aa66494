"""Real cluster engines for the cluster-target tests: a one-node Ray head and a one-node Slurm, both on
loopback, each in a temp directory of its own, started once for the tests that use it and always stopped
when they end (conftest.py).

Ray comes from the pinned `ray[default]` (requirements-dev.txt); Slurm from Debian's `slurm-wlm` and
`munge` (`make slurm` installs them as root). ``ray_missing()`` / ``slurm_missing()`` say why an engine
cannot run here, for the skip message. The machine is shared: one head and one Slurm at a time, never
`ray stop` (it would stop every Ray of the machine's user): the head is stopped by its own processes.
The tests using them are in this folder, marked `cluster` (`pytest -m cluster` runs only them).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RAY = Path(sys.executable).with_name("ray")
SLURM_BINS = ("slurmctld", "slurmd", "munged", "sbatch", "squeue", "scontrol", "scancel")
SLURMSTEPD = ("/usr/sbin/slurmstepd-wlm", "/usr/sbin/slurmstepd", "/usr/lib/slurm/slurmstepd")
RAY_START_TIMEOUT_S = 10  # how long Ray lets a job's supervisor wait for resources before it fails it
MARK = "AAH_TEST_RAY_HEAD"  # in the environment of every process of a test head: how stop() finds them


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(check, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.2)
    raise RuntimeError(f"{what} did not come up within {timeout_s:.0f} s")


# ---- Ray ----------------------------------------------------------------------------------

def ray_missing() -> str | None:
    try:
        import ray.job_submission  # noqa: F401
    except ImportError:
        return "ray[default] is not installed (pip install -r requirements-dev.txt)"
    return None if RAY.is_file() else f"{RAY} not found"


class RayHead:
    """`ray start --head` on 127.0.0.1 with one CPU, no GPU, its own temp dir and ports."""

    def __init__(self, env: dict[str, str]) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="aahray-", dir="/tmp"))  # short: Ray's socket paths
        self.gcs_port, self.dashboard_port = free_port(), free_port()
        self.address = f"http://127.0.0.1:{self.dashboard_port}"
        self.env = {**env, "RAY_USAGE_STATS_ENABLED": "0", MARK: str(self.root),
                    "RAY_JOB_START_TIMEOUT_SECONDS": str(RAY_START_TIMEOUT_S)}
        self.start()

    def start(self) -> None:
        low = 20000 + (os.getpid() % 120) * 100  # below Linux's ephemeral ports (32768-): free_port() never gives these
        cmd = [str(RAY), "start", "--head", "--port", str(self.gcs_port), "--dashboard-port",
               str(self.dashboard_port), "--dashboard-host", "127.0.0.1", "--node-ip-address", "127.0.0.1",
               "--num-cpus", "1", "--num-gpus", "0", "--include-dashboard", "true", "--temp-dir", str(self.root),
               "--disable-usage-stats", "--ray-client-server-port", str(free_port()),
               "--dashboard-agent-listen-port", str(free_port()), "--min-worker-port", str(low),
               "--max-worker-port", str(low + 99)]
        # from its own temp dir: Ray's jobs start in the head's working directory and write their --out there
        done = subprocess.run(cmd, env=self.env, capture_output=True, text=True, timeout=120, cwd=self.root)
        if done.returncode != 0:
            self.stop()
            raise RuntimeError(f"ray start failed: {done.stderr[-2000:]}")

    def pids(self) -> list[int]:
        """Every process of this head: those whose environment carries its mark (Ray renames its processes,
        so their command lines do not tell)."""
        mark = f"{MARK}={self.root}".encode()
        found = []
        for proc in Path("/proc").iterdir():
            if proc.name.isdigit() and int(proc.name) != os.getpid():
                try:
                    if mark in (proc / "environ").read_bytes().split(b"\0"):
                        found.append(int(proc.name))
                except OSError:
                    continue
        return found

    def stop(self) -> None:
        """Stop this head's processes only (SIGTERM, then SIGKILL); remove its temp dir."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            pids = self.pids()
            for pid in pids:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + 3
            while self.pids() and time.monotonic() < deadline:
                time.sleep(0.2)
            if not self.pids():
                break
        shutil.rmtree(self.root, ignore_errors=True)


# ---- Slurm --------------------------------------------------------------------------------

def _stepd() -> str | None:
    return next((p for p in SLURMSTEPD if Path(p).is_file()), None)


def slurm_missing() -> str | None:
    absent = [b for b in SLURM_BINS if shutil.which(b) is None and not Path("/usr/sbin", b).is_file()]
    if absent:
        return f"Slurm is not installed ({', '.join(absent)} missing): `make slurm` installs slurm-wlm and munge as root"
    if _stepd() is None:
        return "slurmstepd not found"
    if os.geteuid() != 0:
        return "the test Slurm runs its daemons as root (SlurmUser=root); run the tests as root"
    return None


SLURM_CONF = """\
ClusterName=aahtest
SlurmctldHost={host}(127.0.0.1)
SlurmUser=root
SlurmctldPort={ctld_port}
SlurmdPort={d_port}
AuthType=auth/munge
AuthInfo=socket={munge_socket}
CredType=cred/munge
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd.log
ProctrackType=proctrack/pgid
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
MpiDefault=none
ReturnToService=2
MinJobAge=300
DefMemPerCPU=500
SlurmdTimeout=30
NodeName={host} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory=4000 State=UNKNOWN
NodeName=aahgpu NodeAddr=127.0.0.2 CPUs=1 RealMemory=1000 Gres=gpu:1 State=FUTURE
PartitionName=aah Nodes={host},aahgpu Default=YES MaxTime=INFINITE State=UP
"""
# aahgpu: a GPU node that never comes up, so that a job asking for a GPU waits (PENDING) on this
# CPU-only machine as it would on a cluster whose GPUs are busy, instead of being refused at submit.


def slurmrestd_missing() -> str | None:
    if shutil.which("slurmrestd") is None and not Path("/usr/sbin/slurmrestd").is_file():
        return "slurmrestd is not installed (Debian package `slurmrestd`, which `make slurm` installs as root)"
    return None


class SlurmCluster:
    """munged, slurmctld and slurmd -D in the foreground from a generated slurm.conf; ``env`` points
    Slurm's commands at it (SLURM_CONF)."""

    partition = "aah"

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="aahslurm-", dir="/tmp"))
        self.host = socket.gethostname().split(".")[0]
        self.procs: list[subprocess.Popen] = []
        self.conf = self.root / "slurm.conf"
        munge_socket = self.root / "munge.socket"
        for sub in ("state", "spool", "munge"):
            (self.root / sub).mkdir()
        (self.root / "gres.conf").write_text("NodeName=aahgpu Name=gpu Count=1\n")
        self.conf.write_text(SLURM_CONF.format(host=self.host, root=self.root, munge_socket=munge_socket,
                                               ctld_port=free_port(), d_port=free_port(),
                                               cpus=min(2, os.cpu_count() or 1)))
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        try:
            key = self.root / "munge" / "munge.key"
            key.write_bytes(os.urandom(1024))
            key.chmod(0o600)
            self._spawn(["munged", "--foreground", "--force", f"--key-file={key}", f"--socket={munge_socket}",
                         f"--seed-file={self.root}/munge/seed", f"--log-file={self.root}/munge/log",
                         f"--pid-file={self.root}/munge/pid"])
            _wait(munge_socket.exists, 20, "munged")
            self._spawn(["slurmctld", "-D", "-f", str(self.conf)])
            self._spawn(["slurmd", "-D", "-f", str(self.conf), "-d", _stepd() or "", "-N", self.host])
            _wait(self._node_idle, 60, "the Slurm node")
        except BaseException:
            self.stop()
            raise

    def _spawn(self, cmd: list[str]) -> None:
        log = (self.root / f"{Path(cmd[0]).name}.out").open("ab")
        self.procs.append(subprocess.Popen(cmd, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                           stdin=subprocess.DEVNULL, start_new_session=True))

    def start_slurmrestd(self) -> Path:
        """slurmrestd on a unix socket of this cluster (rest_auth/local); returns the socket's path."""
        sock = self.root / "slurmrestd.sock"
        # as root slurmrestd refuses to start unless told not to check the user (a test cluster only)
        env = {**self.env, "SLURMRESTD_SECURITY": "disable_user_check"}
        log = (self.root / "slurmrestd.out").open("ab")
        self.procs.append(subprocess.Popen(["slurmrestd", "-f", str(self.conf), "-a", "rest_auth/local", "-s",
                                            "openapi/v0.0.38", f"unix:{sock}"], env=env, stdout=log,
                                           stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True))
        _wait(sock.exists, 20, "slurmrestd")
        return sock

    def _node_idle(self) -> bool:
        done = subprocess.run(["sinfo", "-h", "-n", self.host, "-o", "%T"], env=self.env, capture_output=True,
                              text=True, timeout=10)
        return done.stdout.strip().startswith("idle")

    def stop(self) -> None:
        """scancel everything, stop the daemons (slurmd first), remove the temp dir."""
        subprocess.run(["scancel", "--partition", self.partition], env=self.env, capture_output=True, timeout=10)
        for proc in reversed(self.procs):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in reversed(self.procs):
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)
        shutil.rmtree(self.root, ignore_errors=True)
