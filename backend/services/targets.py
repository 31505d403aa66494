"""Where jobs may run: the targets the server knows, what each can be asked for, and the one small
interface a cluster engine implements (submit, state, logs, cancel).

``local`` (worker processes of this server, services/jobs.py) is always there; ``ray`` is enabled by
AAH_RAY_ADDRESS and ``slurm`` by AAH_SLURM_PARTITION. A target's module, and its engine's client
library, is imported only when the target is configured. The service maps each engine's states onto
its own and never schedules anything itself.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from backend.schemas.errors import InvalidInput, Unavailable
from backend.schemas.runs import Resources, TargetPublic
from backend.settings import Settings

EngineStateName = Literal["PENDING", "RUNNING", "FINISHED", "FAILED", "KILLED", "GONE"]
ENDED = ("FINISHED", "FAILED", "KILLED", "GONE")  # the engine is done with the job (GONE: it forgot it)


@dataclass(frozen=True)
class EngineState:
    """What the engine says of one job: its state mapped to ours, and why (pending reason, failure)."""

    state: EngineStateName
    reason: str | None = None


@dataclass(frozen=True)
class JobSpec:
    """One job as a target submits it: the command, the environment it adds, the resources."""

    run_id: int
    name: str
    argv: list[str]
    env: dict[str, str] = field(repr=False)  # holds the run's write secret: never logged
    resources: Resources


class EngineUnreachable(Unavailable):
    """The engine did not answer (503 naming the target)."""


class EngineRefused(InvalidInput):
    """The engine refused the job as asked (422 with the engine's reason)."""


class Target:
    """A place jobs run. Cluster targets override every method; ``local`` only describes itself."""

    name = "local"
    kind = "local"

    def describe(self) -> TargetPublic:
        raise NotImplementedError

    def check(self, resources: Resources) -> None:
        """Refuse (422 naming the field) what this target cannot be asked for."""
        raise NotImplementedError

    def submit(self, spec: JobSpec) -> str:
        """Queue the job; returns the engine's id of it."""
        raise NotImplementedError

    def state(self, job_id: str) -> EngineState:
        raise NotImplementedError

    def logs(self, job_id: str, tail: int) -> str:
        """The last ``tail`` lines of the job's output."""
        raise NotImplementedError

    def cancel(self, job_id: str, wait_s: float) -> EngineState:
        """Ask the engine to stop the job (queued or running); what it says after at most ``wait_s``."""
        raise NotImplementedError

    def forget(self, job_id: str) -> bool:
        """Clear a job cancelled while queued from the engine's list, once it has ended there."""
        return True

    def wait_for_end(self, job_id: str, state: EngineState, wait_s: float) -> EngineState:
        """Ask the engine again every 0.25 s until the job has ended or ``wait_s`` has passed; the last state."""
        deadline = time.monotonic() + wait_s
        while state.state not in ENDED and time.monotonic() < deadline:
            time.sleep(0.25)
            state = self.state(job_id)
        return state


def refuse(resources: Resources, allowed: dict[str, object], target: str) -> None:
    """422 for the first field of ``resources`` set beyond what ``allowed`` says (the field's reason)."""
    defaults = Resources()
    for name in Resources.model_fields:
        value = getattr(resources, name)
        if value != getattr(defaults, name) and name in allowed:
            raise InvalidInput(f"resources.{name}: {value!r} cannot be asked of the {target} target; {allowed[name]}")


class LocalTarget(Target):
    """Worker processes of this server (services/jobs.py runs them)."""

    def __init__(self, settings: Settings, gpus: int) -> None:
        self.settings, self.gpus = settings, gpus

    def describe(self) -> TargetPublic:
        return TargetPublic(name="local", kind="local", available=True, free_gpus=self.gpus,
                            detail=f"worker processes of this server (at most {self.settings.max_jobs} at once, "
                                   f"AAH_MAX_JOBS); {self.gpus} GPU(s) here")

    def check(self, resources: Resources) -> None:
        if resources.gpus > self.gpus:
            raise InvalidInput(f"resources.gpus: {resources.gpus} asked, this machine has {self.gpus}; "
                               "use a cluster target (ray, slurm) for more")
        why = "a local job is one worker process of this server: use a cluster target (ray, slurm)"
        refuse(resources, {"cpus": why, "memory_gb": why, "nodes": why, "time_limit_min": why}, "local")


def build_targets(settings: Settings) -> dict[str, Target]:
    """The configured targets by name; a cluster target's module is imported only when configured."""
    import torch

    targets: dict[str, Target] = {"local": LocalTarget(settings, torch.cuda.device_count())}
    if settings.ray_address:
        from backend.services.ray_target import RayTarget

        targets["ray"] = RayTarget(settings.ray_address)
    if settings.slurm_partition and settings.slurmrestd_url:
        from backend.services.slurmrest_target import SlurmRestTarget

        targets["slurm"] = SlurmRestTarget(settings)
    elif settings.slurm_partition:
        from backend.services.slurm_target import SlurmTarget

        targets["slurm"] = SlurmTarget(settings)
    return targets


def get_target(targets: dict[str, Target], name: str) -> Target:
    if name not in targets:
        hint = {"ray": " (set AAH_RAY_ADDRESS)", "slurm": " (set AAH_SLURM_PARTITION)"}.get(name, "")
        raise InvalidInput(f"target: {name!r} is not configured{hint}; configured targets: {', '.join(targets)}")
    return targets[name]


def unreachable(target: str, exc: BaseException) -> EngineUnreachable:
    text = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
    return EngineUnreachable(f"target {target}: the engine cannot be reached ({text}); try again when it is back")


def tail_lines(path: Path, n: int, max_bytes: int = 1 << 20) -> str:
    """The last ``n`` lines of a text file (its last MiB at most); empty when it cannot be read."""
    try:
        with path.open("rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - max_bytes))
            text = f.read().decode(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-n:])
