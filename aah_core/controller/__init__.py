"""Window controllers: what sets the model's plan during training.

A controller is called at the start of every optimiser step and may change
``model.plan``; it can add a loss term, report metrics, and save/restore its state
(JSON-able) with the checkpoint so that evaluation reproduces the training-time plan.
"""

from __future__ import annotations

from typing import Any

import torch

from aah_core.config import RunConfig
from aah_core.errors import InvalidConfig
from aah_core.model import WindowedGPT
from aah_core.windows import uniform_plan, validate_plan


class Controller:
    """The static controller: a fixed plan (full by default), set once."""

    def __init__(self, config: RunConfig, model: WindowedGPT) -> None:
        self.config = config
        self.model = model
        settings = dict(config.controller)
        settings.pop("mode", None)
        m = config.model
        if "plan" in settings:
            plan = validate_plan(settings.pop("plan"), m.n_layer, m.n_head, m.seq_len)
        else:
            plan = uniform_plan(m.n_layer, m.n_head, m.seq_len, settings.pop("window", None))
        if settings:
            raise InvalidConfig(f"unknown controller key(s) {sorted(settings)} for the static controller")
        model.set_plan(plan)

    def on_step_start(self, step: int) -> None:
        """Called before each optimiser step's forward pass."""

    def extra_loss(self) -> torch.Tensor | None:
        return None

    def metrics(self) -> dict[str, float]:
        return {}

    def parameters(self) -> list[torch.nn.Parameter]:
        return []

    def state_dict(self) -> dict[str, Any]:
        return {"mode": "static"}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Static plans live in plan.json; nothing else to restore."""


def build_controller(config: RunConfig, model: WindowedGPT) -> Controller:
    mode = config.controller.get("mode", "static")
    if mode != "static":
        raise InvalidConfig(f"unknown controller.mode {mode!r}")
    return Controller(config, model)
