"""GET /targets: where jobs may run (local, and the cluster targets configured: ray, slurm)."""

from __future__ import annotations

from fastapi import APIRouter

from backend.api.deps import TargetJobsDep
from backend.schemas.runs import TargetPublic

router = APIRouter(tags=["runs"])


@router.get("/targets")
def read_targets(jobs: TargetJobsDep) -> list[TargetPublic]:
    """Each target with whether its engine answers now and what it has free (or why it is unavailable)."""
    return jobs.describe()
