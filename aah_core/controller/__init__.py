"""Window controllers: what sets the model's plan during training.

A controller is called at the start of every optimiser step and may change
``model.plan``; it can add a loss term, report metrics, and save/restore its state
(JSON-able) with the checkpoint so that evaluation reproduces the training-time plan.
"""

from __future__ import annotations

from typing import Any

import torch

from aah_core.config import RunConfig
from aah_core.controller.settings import coerce_setting
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
        # `aah train --set controller.window=32` passes strings; JSON bodies pass typed values
        if "plan" in settings:
            raw = settings.pop("plan")
            if isinstance(raw, str):
                raw = coerce_setting(raw, list[list[int | None]], "controller.plan")
            plan = validate_plan(raw, m.n_layer, m.n_head, m.seq_len)
        else:
            window = settings.pop("window", None)
            if isinstance(window, str):
                window = coerce_setting(window, int | None, "controller.window")
            plan = uniform_plan(m.n_layer, m.n_head, m.seq_len, window)
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

    def close(self) -> None:
        """Detach whatever hooks the controller put on the model."""


MODES = ("static", "static_per_layer", "aah", "learned")


def build_controller(config: RunConfig, model: WindowedGPT) -> Controller:
    """The controller named by controller.mode; settings are validated here, before any training step.

    static: a fixed plan (plan / window); static_per_layer: one window per layer (variants.py);
    aah: the paper's AAH-v3 control branch and its variants (aah.py); learned: a window policy
    trained under a coverage budget (learned.py).
    """
    mode = config.controller.get("mode", "static")
    if mode == "static":
        return Controller(config, model)
    if mode == "static_per_layer":
        from aah_core.controller.variants import PerLayerController

        return PerLayerController(config, model)
    if mode == "aah":
        from aah_core.controller.aah import AAHController

        return AAHController(config, model)
    if mode == "learned":
        from aah_core.controller.learned import LearnedBudgetController

        return LearnedBudgetController(config, model)
    raise InvalidConfig(f"unknown controller.mode {mode!r}; choose one of {list(MODES)}")


def check_controller(config: RunConfig) -> None:
    """Validate a config's controller section without training (raises InvalidConfig), e.g. for a job API."""
    build_controller(config, WindowedGPT(config.model)).close()
