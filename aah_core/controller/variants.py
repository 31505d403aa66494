"""Every variant of the paper (aah_method §3) and the controls it lacked, as presets.

Each preset is the demo model recipe (presets.DEMO, without its early stop) plus a
controller section. The paper rows default to impl=faithful (its bugs reproduced); add
``--set controller.impl=fixed`` for the corrected implementation (docs/controller.md).
"""

from __future__ import annotations

from typing import Any

from aah_core.config import RunConfig
from aah_core.controller import Controller
from aah_core.controller_config import PerLayerSettings
from aah_core.model import WindowedGPT
from aah_core.presets import DEMO, Preset, register
from aah_core.windows import validate_plan

# The paper's table runs compare at a fixed step count, so the demo recipe's early stop is off.
BASE = {**DEMO, "train.stop_copy_below_chance": 0.0, "train.checkpoint_every": 0, "train.max_steps": 1000}


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


def _aah(**settings: Any) -> dict[str, Any]:
    return {**BASE, "controller.mode": "aah", **{f"controller.{k}": v for k, v in settings.items()}}


VARIANTS = (
    Preset("baseline", "Paper: pure baseline, full causal attention in every head", "paper",
           {**BASE, "controller.mode": "static"}),
    Preset("grouping_off", "Paper: per-head MLP over raw batch features, independent windows, no grouping", "paper",
           _aah(topology="none", pairwise="none")),
    Preset("full_adaptive", "Paper: EMA features, re-cluster every 5 steps, hierarchy depth 4, joint scorer, clamp",
           "paper", _aah()),
    Preset("shallow_freeze", "Paper: depth 1, topology frozen at the first post-warmup update, windows re-chosen",
           "paper", _aah(max_depth=1, topology="freeze_learned")),
    Preset("deep_practical_reuse", "Paper: level-0 groups frozen at step 0, upper levels re-clustered, clamp",
           "paper", _aah(topology="reuse")),
    Preset("identity", "Paper (512 suite): AAH module with grouping and control off = full attention", "paper",
           _aah(topology="none", apply_control=False, pairwise="none")),
    Preset("control_off", "Paper appendix: full attention executed, hierarchy computed (overhead only)", "paper",
           _aah(apply_control=False)),
    Preset("fixed_random_grouping", "Paper appendix: seeded random balanced 2-way split, passthrough levels",
           "paper", _aah(topology="fixed_random")),
    Preset("freeze_after_warmup", "Paper appendix: step-0 grouping frozen, identity passthrough levels", "paper",
           _aah(topology="freeze_after_warmup")),
    Preset("independent_scoring", "Paper appendix: full adaptive without the joint sibling scorer", "paper",
           _aah(pairwise="none")),
    Preset("no_parent_constraint", "Paper appendix: full adaptive without the child <= parent clamp", "paper",
           _aah(parent_constraint=False)),
    Preset("no_feature_ema", "Paper appendix: full adaptive with ema_alpha 0 (features of the control batch)",
           "paper", _aah(ema_alpha=0.0)),
    Preset("fixed_window", "Control: one window for every head (default 64 = ACR 0.25; set controller.window)",
           "control", {**BASE, "controller.mode": "static", "controller.window": 64}),
    Preset("static_per_layer", "Control: one window per layer, small low in the stack (controller.layer_windows)",
           "control", {**BASE, "controller.mode": "static_per_layer"}),
    Preset("learned_budget", "Ours: windows trained with the LM loss under a coverage budget (controller.budget)",
           "ours", {**BASE, "controller.mode": "learned", "controller.budget": 0.3}),
)

for _preset in VARIANTS:
    register(_preset)

