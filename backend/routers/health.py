"""GET /health: liveness plus counts."""

from __future__ import annotations

from fastapi import APIRouter

from backend import __version__
from backend.catalog import count_checkpoints
from backend.deps import SessionDep
from backend.schemas import HealthResponse
from backend.store import count_runs

router = APIRouter(tags=["health"])


@router.get("/health")
def read_health(session: SessionDep) -> HealthResponse:
    """Service status, version, and how many models and runs the store holds."""
    return HealthResponse(status="ok", version=__version__, models=count_checkpoints(session),
                          runs=count_runs(session))
