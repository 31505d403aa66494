"""Tracking from anywhere: a training process reports its run to an AAH Studio server over HTTP.

`TrackingCallback` plugs into the engine's callback interface (aah_core.train.Callback): it batches
metrics and plans, sends them from a background thread with retries, and spools to a local JSONL
file while the server is away or refuses; `aah sync` replays a spool and `aah import` registers a
finished run folder. Kept outside aah_core: the engine knows nothing of HTTP.

The names below are imported on first use (PEP 562), so the `aah` command's parser, which registers
tracking's options, does not import torch for `aah serve`, `aah submit` or `aah sync`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from aah_tracking.callback import TrackingCallback as TrackingCallback
    from aah_tracking.transport import Refused as Refused
    from aah_tracking.transport import Transport as Transport
    from aah_tracking.transport import Unreachable as Unreachable

_HOME = {"Refused": "aah_tracking.transport", "TrackingCallback": "aah_tracking.callback",
         "Transport": "aah_tracking.transport", "Unreachable": "aah_tracking.transport"}
__all__ = sorted(_HOME)


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module 'aah_tracking' has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOME[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_HOME))
