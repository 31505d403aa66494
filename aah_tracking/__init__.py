"""Tracking from anywhere: a training process reports its run to an AAH Studio server over HTTP.

`TrackingCallback` plugs into the engine's callback interface (aah_core.train.Callback): it batches
metrics and plans, sends them from a background thread with retries, and spools to a local JSONL
file while the server is away or refuses; `aah sync` replays a spool and `aah import` registers a
finished run folder. Kept outside aah_core: the engine knows nothing of HTTP.
"""

from aah_tracking.callback import TrackingCallback
from aah_tracking.transport import Refused, Transport, Unreachable

__all__ = ["Refused", "TrackingCallback", "Transport", "Unreachable"]
