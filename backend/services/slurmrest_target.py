"""The `slurm` target through slurmrestd (AAH_SLURMRESTD_URL) instead of the Slurm commands: for a
server on a machine without the Slurm client. Imported only when both the partition and the URL are set.

The URL is ``http(s)://host:6820`` with a JWT (AAH_SLURMRESTD_TOKEN, for the user AAH_SLURMRESTD_USER), or
``unix:/path/of/slurmrestd.sock`` (slurmrestd's ``rest_auth/local``: the server's own user). OpenAPI
v0.0.38 (Slurm 22.05, Debian 12): POST job/submit, GET job/{id}, DELETE job/{id}, GET ping. States map as
for the commands (slurm_target.map_state); so do the job's command, environment and output file.
"""

from __future__ import annotations

from typing import Any

import httpx

from backend.schemas.runs import TargetPublic
from backend.services.slurm_target import COMMAND_TIMEOUT_S, SlurmTarget, gone, job_script, map_state
from backend.services.targets import EngineRefused, EngineState, JobSpec, unreachable
from backend.services.worker_env import passed_env
from backend.settings import Settings

API = "/slurm/v0.0.38"


class SlurmRestTarget(SlurmTarget):
    def __init__(self, settings: Settings) -> None:
        super().__init__(settings)
        url = settings.slurmrestd_url or ""
        self.url = url
        transport = httpx.HTTPTransport(uds=url.removeprefix("unix:")) if url.startswith("unix:") else None
        headers = {}
        if settings.slurmrestd_token is not None:
            headers = {"X-SLURM-USER-TOKEN": settings.slurmrestd_token.get_secret_value(),
                       "X-SLURM-USER-NAME": settings.slurmrestd_user or ""}
        self.http = httpx.Client(base_url="http://slurmrestd" if transport else url, transport=transport,
                                 headers=headers, timeout=COMMAND_TIMEOUT_S)

    def _request(self, method: str, path: str, **kwargs: Any) -> tuple[int, dict]:
        try:
            response = self.http.request(method, f"{API}{path}", **kwargs)
        except httpx.HTTPError as exc:
            raise unreachable(self.name, exc) from None
        try:
            body = response.json()
        except ValueError:
            body = {}
        return response.status_code, body if isinstance(body, dict) else {}

    def describe(self) -> TargetPublic:
        try:
            status, body = self._request("GET", f"/partition/{self.partition}")
        except Exception as exc:  # noqa: BLE001 - whatever it was, the target is unavailable and says why
            return TargetPublic(name=self.name, kind=self.kind, available=False, detail=str(exc))
        partitions = body.get("partitions") or []
        if status != 200 or not partitions:
            return TargetPublic(name=self.name, kind=self.kind, available=False,
                                detail=f"slurmrestd at {self.url}: {_errors(body) or f'partition {self.partition!r} not found'}")
        cpus = partitions[0].get("total_cpus")
        return TargetPublic(name=self.name, kind=self.kind, available=True,
                            detail=f"Slurm partition {self.partition} through slurmrestd: {cpus} CPUs in all")

    def submit(self, spec: JobSpec) -> str:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        r = spec.resources
        job: dict[str, Any] = {"name": spec.name, "partition": self.partition, "nodes": [r.nodes, r.nodes],
                               "current_working_directory": str(self.log_dir),
                               "standard_output": f"{self.log_dir}/job-%j.log",
                               # the job's whole environment: an allow-list plus the run's variables
                               "environment": {**passed_env(), **spec.env}}
        optional = {"account": self.account, "gres": f"gpu:{r.gpus}" if r.gpus else None, "cpus_per_task": r.cpus,
                    "memory_per_node": max(1, round(r.memory_gb * 1024)) if r.memory_gb else None,
                    "time_limit": r.time_limit_min}
        job.update({k: v for k, v in optional.items() if v is not None})
        status, body = self._request("POST", "/job/submit", json={"job": job, "script": f"#!/bin/sh\n{job_script(spec)}\n"})
        if status != 200 or body.get("job_id") is None:
            raise EngineRefused(f"target slurm refused the job: {_errors(body) or f'slurmrestd answered {status}'}")
        return str(body["job_id"])

    def state(self, job_id: str) -> EngineState:
        status, body = self._request("GET", f"/job/{job_id}")
        jobs = body.get("jobs") or []
        if status == 200 and jobs:
            job = jobs[0]
            return map_state(str(job.get("job_state", "UNKNOWN")), str(job.get("state_reason", "None")),
                             str(job.get("exit_code", "?")))
        if "unable to query jobid" in _errors(body).lower() or "invalid job id" in _errors(body).lower():
            return gone(job_id)
        raise unreachable(self.name, RuntimeError(_errors(body) or f"slurmrestd answered {status}"))

    def stop(self, job_id: str) -> None:
        status, body = self._request("DELETE", f"/job/{job_id}")
        if status != 200:
            raise EngineRefused(f"target slurm refused to cancel job {job_id}: {_errors(body) or status}")


def _errors(body: dict) -> str:
    return "; ".join(str(e.get("description") or e.get("error") or e) for e in body.get("errors") or [])
