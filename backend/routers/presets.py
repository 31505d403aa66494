"""GET /presets: the named training configurations a run can start from."""

from __future__ import annotations

from fastapi import APIRouter

from aah_core.presets import PRESETS
from backend.schemas.models import PresetInfo

router = APIRouter(tags=["presets"])


@router.get("/presets")
def read_presets() -> list[PresetInfo]:
    """Every preset with its description and group (demo, paper, control, ours)."""
    return [PresetInfo(name=p.name, description=p.description, group=p.group) for p in PRESETS.values()]
