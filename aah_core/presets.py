"""Named run configurations, kept as data (litgpt's registry idea): name -> overrides on RunConfig.

The demo and test recipes, every variant of the paper (aah_method §3) and the controls it lacked.
Each variant is the demo recipe (without its early stop) plus a controller section; the paper rows
default to impl=faithful (its bugs reproduced): add ``--set controller.impl=fixed`` for the corrected
implementation (docs/controller.md). Only data: this module imports no controller code.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from aah_core.config import RunConfig, apply_overrides
from aah_core.errors import InvalidConfig


@dataclass(frozen=True)
class Preset:
    name: str
    description: str
    group: str  # "demo" | "paper" | "control" | "ours"
    overrides: dict[str, Any] = field(default_factory=dict)


# The shipped demo model (data/demo): the long run of shared/reference/demo_model_feasibility.md,
# with early stopping once the copy task is solved.
DEMO = {
    "model.n_layer": 4, "model.n_head": 4, "model.d_model": 128, "model.seq_len": 256, "model.positions": "rope",
    "data.synthetic": "copy", "data.synthetic_fraction": 0.5, "data.copy_min_span": 16, "data.copy_max_span": 128,
    "train.batch_size": 32, "train.lr": 2e-3, "train.warmup_steps": 100, "train.max_steps": 3000,
    "train.eval_every": 100, "train.eval_batches": 4, "train.checkpoint_every": 500,
    "train.stop_copy_below_chance": 3.8, "train.seed": 0,
}

# A few-second run for tests and smoke checks.
TINY = {
    "model.n_layer": 2, "model.n_head": 2, "model.d_model": 32, "model.seq_len": 64,
    "model.buckets": [4, 16, None], "train.batch_size": 4, "train.max_steps": 10, "train.warmup_steps": 2,
    "train.eval_every": 5, "train.eval_batches": 1, "data.copy_max_span": 32,
}

# The paper's table runs compare at a fixed step count, so the demo recipe's early stop is off.
BASE = {**DEMO, "train.stop_copy_below_chance": 0.0, "train.checkpoint_every": 0, "train.max_steps": 1000}


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
    Preset("sink_window", "Baseline: StreamingLLM, one sliding window for every head plus 4 sink tokens "
           "(default 60 + 4 keys; set controller.window)", "control",
           {**BASE, "controller.mode": "static", "controller.window": 60, "model.sinks": 4}),
    Preset("local_global", "Baseline: Longformer / Mistral style, controller.global_heads full heads per layer "
           "and the rest at controller.window (default 1 and 32)", "control",
           {**BASE, "controller.mode": "static", "controller.window": 32, "controller.global_heads": 1}),
    Preset("learned_budget", "Ours: windows trained with the LM loss under a coverage budget (controller.budget)",
           "ours", {**BASE, "controller.mode": "learned", "controller.budget": 0.3}),
)

PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        Preset("demo", "The shipped demo model: 4L x 4H x 128, RoPE, T=256, text + copy task, full windows", "demo", DEMO),
        Preset("tiny", "A 2-layer model that trains in seconds (tests, smoke checks)", "demo", TINY),
        *VARIANTS,
    )
}


def get_preset(name: str) -> RunConfig:
    """The RunConfig of a named preset; unknown names list the known ones."""
    if name not in PRESETS:
        raise InvalidConfig(f"unknown preset {name!r}; known presets: {', '.join(sorted(PRESETS))}")
    return apply_overrides(RunConfig(preset=name), PRESETS[name].overrides)
