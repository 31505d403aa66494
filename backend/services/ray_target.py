"""The `ray` target: Ray Jobs through ``ray.job_submission.JobSubmissionClient`` (AAH_RAY_ADDRESS, the
job server's URL, e.g. http://head:8265). Imported only when that is set.

Ray's states map one to one: PENDING (its message says why: waiting for resources), RUNNING,
SUCCEEDED -> FINISHED, FAILED (with its message), STOPPED -> KILLED. A job Ray no longer knows (deleted)
is GONE. A job asking for more than the cluster has stays PENDING; Ray cannot stop it then (its
supervisor actor is not placed, so the stop request waits in its queue) and answers 500 to a delete
of a job that has not ended: the cancel asks for the stop, tries the delete, and reports what Ray says;
the caller deletes the job once Ray has ended it (at the latest when Ray gives up starting it,
RAY_JOB_START_TIMEOUT_SECONDS on the head).
"""

from __future__ import annotations

import logging
import shlex
from collections.abc import Callable
from typing import TypeVar

import httpx
from ray.job_submission import JobStatus, JobSubmissionClient

from backend.schemas.runs import Resources, TargetPublic
from backend.services.targets import ENDED, EngineRefused, EngineState, JobSpec, Target, refuse, unreachable

logger = logging.getLogger(__name__)
T = TypeVar("T")
STATES = {JobStatus.PENDING: "PENDING", JobStatus.RUNNING: "RUNNING", JobStatus.SUCCEEDED: "FINISHED",
          JobStatus.FAILED: "FAILED", JobStatus.STOPPED: "KILLED"}
STATUS_TIMEOUT_S = 5.0
NOT_ON_RAY = "Ray Jobs run one entrypoint on one node (for several nodes use Ray Train or the slurm target)"


class RayTarget(Target):
    name = kind = "ray"

    def __init__(self, address: str) -> None:
        self.address = address.rstrip("/")
        self._client: JobSubmissionClient | None = None

    def _call(self, fn: Callable[[JobSubmissionClient], T]) -> T:
        """``fn`` with a client (made on first use: making one asks the server its version); an engine that
        does not answer is a 503 naming the target, and the next call makes a new client."""
        try:
            if self._client is None:
                self._client = JobSubmissionClient(self.address)
            return fn(self._client)
        except (ConnectionError, OSError) as exc:  # requests' errors are OSErrors too
            self._client = None
            raise unreachable(self.name, exc) from None

    def describe(self) -> TargetPublic:
        try:
            answer = httpx.get(f"{self.address}/api/cluster_status", timeout=STATUS_TIMEOUT_S).json()
            usage = answer["data"]["clusterStatus"]["loadMetricsReport"]["usage"]
        except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
            return TargetPublic(name=self.name, kind=self.kind, available=False,
                                detail=f"Ray at {self.address} does not answer ({type(exc).__name__}: {exc})")
        free = {key: usage[key][1] - usage[key][0] if key in usage else 0.0 for key in ("CPU", "GPU")}
        totals = {key: usage[key][1] if key in usage else 0.0 for key in ("CPU", "GPU")}
        return TargetPublic(name=self.name, kind=self.kind, available=True, free_cpus=free["CPU"],
                            free_gpus=free["GPU"],
                            detail=f"Ray at {self.address}: {free['CPU']:g} of {totals['CPU']:g} CPUs free, "
                                   f"{free['GPU']:g} of {totals['GPU']:g} GPUs free")

    def check(self, resources: Resources) -> None:
        refuse(resources, {"nodes": NOT_ON_RAY, "time_limit_min": "Ray Jobs have no time limit; use the slurm "
                           "target or train.max_steps"}, self.name)

    def submit(self, spec: JobSpec) -> str:
        r = spec.resources
        # the entrypoint is a shell command line; the secret travels in runtime_env, never in it
        entrypoint = shlex.join(spec.argv)
        try:
            return self._call(lambda c: c.submit_job(
                entrypoint=entrypoint, runtime_env={"env_vars": spec.env}, metadata={"aah_run": str(spec.run_id)},
                entrypoint_num_gpus=r.gpus or None, entrypoint_num_cpus=r.cpus,
                entrypoint_memory=None if r.memory_gb is None else int(r.memory_gb * 2**30)))
        except (RuntimeError, ValueError) as exc:
            raise EngineRefused(f"target ray refused the job: {str(exc)[:500]}") from None

    def state(self, job_id: str) -> EngineState:
        try:
            info = self._call(lambda c: c.get_job_info(job_id))
        except RuntimeError as exc:
            if "404" in str(exc) or "does not exist" in str(exc):
                return EngineState("GONE", f"Ray no longer knows job {job_id}")
            raise unreachable(self.name, exc) from None
        state = STATES[JobStatus(info.status)]
        reason = info.message if state in ("PENDING", "FAILED", "KILLED") else None
        return EngineState(state, reason)  # type: ignore[arg-type]

    def logs(self, job_id: str, tail: int) -> str:
        try:
            text = self._call(lambda c: c.get_job_logs(job_id))
        except RuntimeError as exc:
            return f"(no log: {str(exc)[:200]})"
        return "\n".join(text.splitlines()[-tail:])

    def cancel(self, job_id: str, wait_s: float) -> EngineState:
        state = self.state(job_id)
        if state.state in ENDED:
            return state
        try:
            self._call(lambda c: c.stop_job(job_id))
        except RuntimeError as exc:
            logger.warning("ray job %s: stop refused (%s)", job_id, str(exc)[:200])
        if state.state == "PENDING":  # a queued job is deleted too; Ray refuses that until the job has ended
            self.forget(job_id)
        return self.wait_for_end(job_id, state, wait_s)

    def forget(self, job_id: str) -> bool:
        """Delete a job cancelled while queued from Ray's list; False while Ray refuses (its 500: the job
        has not ended yet)."""
        try:
            return bool(self._call(lambda c: c.delete_job(job_id)))
        except RuntimeError as exc:
            logger.info("ray job %s: not deleted yet (%s)", job_id, str(exc).splitlines()[0][:200])
            return False


