"""The `slurm` target: sbatch, scontrol and scancel on this machine (AAH_SLURM_PARTITION, optional
AAH_SLURM_ACCOUNT and AAH_SLURM_EXTRA). Imported only when the partition is set.

Without slurmdbd there is no accounting (`sacct`), so a job's state is read from ``scontrol show job``,
which keeps an ended job for MinJobAge seconds; the run's own tracking records its end before that in
the normal case, and a job Slurm has forgotten is GONE. States: PENDING (Slurm's reason, e.g.
Resources, Priority, ReqNodeNotAvail), RUNNING (also CONFIGURING, COMPLETING, SUSPENDED), COMPLETED ->
FINISHED, CANCELLED -> KILLED, and FAILED, TIMEOUT, OUT_OF_MEMORY, NODE_FAIL, ... -> FAILED with the
state, reason and exit code. The job's output goes to a file in the data dir's ``cluster/slurm``
folder, which the nodes must reach at the same path (a shared file system) for log tails.
"""

from __future__ import annotations

import re
import shlex
import subprocess

from backend.schemas.runs import Resources, TargetPublic
from backend.services.targets import ENDED, EngineRefused, EngineState, JobSpec, Target, tail_lines, unreachable
from backend.services.worker_env import passed_env
from backend.settings import Settings

COMMAND_TIMEOUT_S = 20.0
RUNNING = ("RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED", "STAGE_OUT", "SIGNALING", "RESV_DEL_HOLD")
PENDING = ("PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESIZING")
UNREACHABLE = ("unable to contact slurm controller", "connection refused", "connect failure",
               "communications connection failure", "socket timed out", "zero bytes were transmitted")
RENDEZVOUS_PORT = 29500  # torchrun's default: where the nodes of a multi-node job meet
_FIELD = re.compile(r"(\w+)=(\S*)")


class SlurmTarget(Target):
    name = kind = "slurm"

    def __init__(self, settings: Settings) -> None:
        self.partition = settings.slurm_partition or ""
        self.account = settings.slurm_account
        self.extra = shlex.split(settings.slurm_extra)
        self.log_dir = settings.data_dir / "cluster" / "slurm"

    def _run(self, *cmd: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        """One Slurm command; a controller that does not answer is a 503 naming the target."""
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S, env=env,
                                  stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise unreachable(self.name, exc) from None
        if done.returncode != 0 and any(s in done.stderr.lower() for s in UNREACHABLE):
            raise unreachable(self.name, RuntimeError(done.stderr.strip()))
        return done

    def describe(self) -> TargetPublic:
        try:
            done = self._run("sinfo", "-h", "-p", self.partition, "-o", "%C")
        except Exception as exc:  # noqa: BLE001 - whatever it was, the target is unavailable and says why
            return TargetPublic(name=self.name, kind=self.kind, available=False, detail=str(exc))
        if done.returncode != 0 or not done.stdout.strip():
            why = done.stderr.strip() or f"partition {self.partition!r} not found"
            return TargetPublic(name=self.name, kind=self.kind, available=False, detail=f"Slurm: {why}")
        allocated, idle, _other, total = (float(x) for x in done.stdout.split()[0].split("/"))
        return TargetPublic(name=self.name, kind=self.kind, available=True, free_cpus=idle,
                            detail=f"Slurm partition {self.partition}: {idle:g} of {total:g} CPUs idle "
                                   f"({allocated:g} allocated)")

    def check(self, resources: Resources) -> None:
        return None  # Slurm takes every resource field; what the partition cannot give, it refuses at submit

    def sbatch_args(self, spec: JobSpec) -> list[str]:
        r = spec.resources
        args = ["sbatch", "--parsable", f"--job-name={spec.name}", f"--partition={self.partition}",
                f"--output={self.log_dir}/job-%j.log", f"--chdir={self.log_dir}", f"--nodes={r.nodes}",
                "--ntasks-per-node=1", "--export=ALL"]
        args += [f"--account={self.account}"] if self.account else []
        args += [f"--gres=gpu:{r.gpus}"] if r.gpus else []
        args += [f"--cpus-per-task={r.cpus}"] if r.cpus else []
        args += [f"--mem={max(1, round(r.memory_gb * 1024))}M"] if r.memory_gb else []
        args += [f"--time={r.time_limit_min}"] if r.time_limit_min else []
        return [*args, *self.extra, "--wrap", job_script(spec)]

    def submit(self, spec: JobSpec) -> str:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        # --export=ALL hands sbatch's own environment to the job: an allow-list plus the run's variables
        # (the secret travels there, never on a command line)
        done = self._run(*self.sbatch_args(spec), env={**passed_env(), **spec.env})
        if done.returncode != 0:
            raise EngineRefused(f"target slurm refused the job: {done.stderr.strip()[:500]}")
        return done.stdout.strip().split(";")[0]

    def state(self, job_id: str) -> EngineState:
        done = self._run("scontrol", "show", "job", "-o", job_id)
        if done.returncode != 0:
            if "invalid job id" in done.stderr.lower():
                return gone(job_id)
            raise unreachable(self.name, RuntimeError(done.stderr.strip() or f"scontrol exited {done.returncode}"))
        fields = dict(_FIELD.findall(done.stdout))
        return map_state(fields.get("JobState", "UNKNOWN"), fields.get("Reason", "None"), fields.get("ExitCode", "?"))

    def logs(self, job_id: str, tail: int) -> str:
        path = self.log_dir / f"job-{job_id}.log"
        return tail_lines(path, tail)

    def cancel(self, job_id: str, wait_s: float) -> EngineState:
        state = self.state(job_id)
        if state.state in ENDED:
            return state
        self.stop(job_id)
        return self.wait_for_end(job_id, state, wait_s)

    def stop(self, job_id: str) -> None:
        done = self._run("scancel", job_id)
        if done.returncode != 0:
            raise EngineRefused(f"target slurm refused to cancel job {job_id}: {done.stderr.strip()[:300]}")


def job_script(spec: JobSpec) -> str:
    """The job's shell command. On several nodes: one torchrun per node (``srun``), meeting at the first node."""
    r = spec.resources
    if r.nodes == 1:
        return shlex.join(spec.argv)
    torchrun = ["torchrun", f"--nnodes={r.nodes}", f"--nproc-per-node={max(1, r.gpus)}", "--rdzv-backend=c10d",
                "--no-python"]
    return ('head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1); '
            f'srun {shlex.join(torchrun)} --rdzv-id="$SLURM_JOB_ID" --rdzv-endpoint="$head:{RENDEZVOUS_PORT}" '
            f"{shlex.join(spec.argv)}")


def gone(job_id: str) -> EngineState:
    return EngineState("GONE", f"Slurm no longer knows job {job_id} (ended more than MinJobAge ago)")


def map_state(state: str, reason: str, exit_code: str) -> EngineState:
    """A Slurm job state (with its reason and exit code) as ours."""
    reason = reason.replace("_", " ")
    if state in PENDING:
        return EngineState("PENDING", reason if reason != "None" else "queued")
    if state in RUNNING:
        return EngineState("RUNNING")
    if state == "COMPLETED":
        return EngineState("FINISHED")
    if state == "CANCELLED":
        return EngineState("KILLED", "cancelled on Slurm")
    return EngineState("FAILED", f"Slurm job {state} (reason {reason}, exit code {exit_code})")
