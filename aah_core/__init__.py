"""AAH Studio engine: per-head causal windows for Transformer attention (no web, no database)."""

from aah_core.attention import available_backends, windowed_attention
from aah_core.errors import AAHError, BackendUnavailable, CheckpointError, InvalidConfig, InvalidWindowPlan
from aah_core.windows import acr, causal_coverage, tile_coverage, validate_plan

__all__ = [
    "AAHError",
    "BackendUnavailable",
    "CheckpointError",
    "InvalidConfig",
    "InvalidWindowPlan",
    "acr",
    "available_backends",
    "causal_coverage",
    "tile_coverage",
    "validate_plan",
    "windowed_attention",
]
