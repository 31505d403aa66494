"""Controller mode 'static_per_layer': one fixed window per layer (aah_method §8.16), a control the
paper lacked. Its preset, like every paper variant's, is data in aah_core/presets.py."""

from __future__ import annotations

from typing import Any

from aah_core.config import RunConfig
from aah_core.controller import Controller
from aah_core.controller_config import PerLayerSettings
from aah_core.model import WindowedGPT
from aah_core.windows import validate_plan


def default_layer_windows(buckets: list[int], n_layer: int) -> list[int]:
    """A ramp over the upper half of the buckets: small windows low in the stack, full at the top."""
    K = len(buckets)
    lo = K // 2
    if n_layer == 1:
        return [buckets[-1]]
    return [buckets[lo + round(layer * (K - 1 - lo) / (n_layer - 1))] for layer in range(n_layer)]


class PerLayerController(Controller):
    """Controller mode 'static_per_layer': one fixed window per layer (aah_method §8.16)."""

    def __init__(self, config: RunConfig, model: WindowedGPT) -> None:
        self.config, self.model = config, model
        s = config.controller_settings
        assert isinstance(s, PerLayerSettings), s
        m = config.model
        windows = s.layer_windows if s.layer_windows is not None else default_layer_windows(m.bucket_windows, m.n_layer)
        plan = validate_plan([[w] * m.n_head for w in windows], m.n_layer, m.n_head, m.seq_len)
        model.set_plan(plan.to(model.plan.device))

    def state_dict(self) -> dict[str, Any]:
        return {"mode": "static_per_layer"}
