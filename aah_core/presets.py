"""Named run configurations, kept as data (litgpt's registry idea): name -> overrides on RunConfig."""

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

PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        Preset("demo", "The shipped demo model: 4L x 4H x 128, RoPE, T=256, text + copy task, full windows", "demo", DEMO),
        Preset("tiny", "A 2-layer model that trains in seconds (tests, smoke checks)", "demo", TINY),
    )
}


def register(preset: Preset) -> None:
    """Add a preset (the controller package registers the paper's variants this way)."""
    PRESETS[preset.name] = preset


def get_preset(name: str) -> RunConfig:
    """The RunConfig of a named preset; unknown names list the known ones."""
    if name not in PRESETS:
        raise InvalidConfig(f"unknown preset {name!r}; known presets: {', '.join(sorted(PRESETS))}")
    return apply_overrides(RunConfig(preset=name), PRESETS[name].overrides)


# The paper's variants and the controls register themselves (aah_core/controller/variants.py).
import aah_core.controller.variants  # noqa: E402,F401
