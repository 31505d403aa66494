"""Window controllers: what sets the model's plan during training.

A controller is called at the start of every optimiser step and may change
``model.plan``; it can add a loss term, report metrics, and save/restore its state
(JSON-able) with the checkpoint so that evaluation reproduces the training-time plan.
"""

from __future__ import annotations

from typing import Any

import torch

from aah_core.config import RunConfig
from aah_core.controller_config import MODES, StaticSettings
from aah_core.model import WindowedGPT
from aah_core.windows import uniform_plan, validate_plan


class Controller:
    """The static controller: a fixed plan (full by default), set once."""

    def __init__(self, config: RunConfig, model: WindowedGPT) -> None:
        self.config = config
        self.model = model
        s = config.controller_settings
        assert isinstance(s, StaticSettings), s
        m = config.model
        if s.plan is not None:
            plan = validate_plan(s.plan, m.n_layer, m.n_head, m.seq_len)
        else:
            plan = uniform_plan(m.n_layer, m.n_head, m.seq_len, s.window)
            plan[:, : s.global_heads] = m.seq_len  # local + global: the first heads of every layer stay full
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

    def close(self) -> None:
        """Detach whatever hooks the controller put on the model."""


def build_controller(config: RunConfig, model: WindowedGPT) -> Controller:
    """The controller named by controller.mode (its settings were validated when the config was built).

    static: a fixed plan (plan / window); static_per_layer: one window per layer (per_layer.py);
    aah: the paper's AAH-v3 control branch and its variants (aah.py); learned: a window policy
    trained under a coverage budget (learned.py).
    """
    mode = config.controller_settings.mode
    if mode == "static":
        return Controller(config, model)
    if mode == "static_per_layer":
        from aah_core.controller.per_layer import PerLayerController

        return PerLayerController(config, model)
    if mode == "aah":
        from aah_core.controller.aah import AAHController

        return AAHController(config, model)
    if mode == "learned":
        from aah_core.controller.learned import LearnedBudgetController

        return LearnedBudgetController(config, model)
    raise AssertionError(f"controller mode {mode!r} has settings but no controller; modes: {MODES}")
