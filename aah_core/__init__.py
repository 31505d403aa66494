"""AAH Studio engine: per-head causal windows for Transformer attention (no web, no database).

The public names below are imported on first use (PEP 562): a process that only needs a light module
(`aah serve`, `aah submit`, the errors) does not pay for importing torch (about 2 s of CPU).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from aah_core.attention import available_backends as available_backends
    from aah_core.attention import windowed_attention as windowed_attention
    from aah_core.errors import AAHError as AAHError
    from aah_core.errors import BackendUnavailable as BackendUnavailable
    from aah_core.errors import CheckpointError as CheckpointError
    from aah_core.errors import InvalidConfig as InvalidConfig
    from aah_core.errors import InvalidWindowPlan as InvalidWindowPlan
    from aah_core.windows import acr as acr
    from aah_core.windows import causal_coverage as causal_coverage
    from aah_core.windows import tile_coverage as tile_coverage
    from aah_core.windows import validate_plan as validate_plan

_HOME = {
    "AAHError": "aah_core.errors",
    "BackendUnavailable": "aah_core.errors",
    "CheckpointError": "aah_core.errors",
    "InvalidConfig": "aah_core.errors",
    "InvalidWindowPlan": "aah_core.errors",
    "acr": "aah_core.windows",
    "available_backends": "aah_core.attention",
    "causal_coverage": "aah_core.windows",
    "tile_coverage": "aah_core.windows",
    "validate_plan": "aah_core.windows",
    "windowed_attention": "aah_core.attention",
}
__all__ = sorted(_HOME)


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module 'aah_core' has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOME[name]), name)
    globals()[name] = value  # the next lookup is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_HOME))
