"""Controller settings: the ``controller.*`` section of a run config, validated and coerced.

``apply_overrides`` passes ``controller.*`` keys through raw (strings from the CLI), so each
controller mode parses its section here and raises InvalidConfig before training starts.
Defaults are the paper's 4096-suite values (aah_method §7).
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from dataclasses import dataclass, field
from typing import Any

from aah_core.config import RunConfig
from aah_core.config import coerce_value
from aah_core.errors import InvalidConfig
from aah_core.windows import pair_count

# Each fix corrects one flaw of the paper's implementation (docs/controller.md lists them with aah_method §8).
FIXES = (
    "usage",            # rho = mean attention distance / T, not the mass on key T-1 (§2.2, §8.4)
    "standardize",      # z-score features per dimension across heads before clustering and scoring (§8.3)
    "warmup_fallback",  # warmup executes full attention even when T is not a bucket (§2.8, §8.8)
    "w_min",            # w_min clamps the executed windows, not only the accounting (§2.8, §8.9)
    "feature_lag",      # entropy / norm / usage from the same forward as the q, k, v statistics (§2.2, §8.13)
    "identity_levels",  # an upper level that merges nothing ends the hierarchy (no min-clamp chain, §8.5)
    "frozen_grouping",  # reuse / freeze-after-warmup freeze the grouping at the end of warmup, not at step 0 (§8.7)
    "control_off_cache",  # control_off keeps its cached grouping instead of re-clustering every step (§2.9)
)

TOPOLOGIES = ("adaptive", "reuse", "freeze_after_warmup", "freeze_learned", "fixed_deterministic", "fixed_random", "none")
CHOICES = {
    "impl": ("faithful", "fixed"),
    "topology": TOPOLOGIES,
    "upper_metric": ("cosine", "cosine_normdiff", "centered_cosine", "l2"),
    "group_feature_mode": ("mean", "mean_global_offset"),
    "input_mode": ("enriched", "base"),
    "arch": ("mlp", "deep_mlp"),
    "pairwise": ("joint_sibling", "none"),
    "budget_metric": ("causal_coverage", "acr"),
}


@dataclass
class AAHSettings:
    """The AAH-v3 control branch (mode 'aah'). Names follow aah_method §2 and §7."""

    impl: str = "faithful"  # faithful: reproduce the paper's bugs; fixed: every entry of FIXES on
    fixes: list[str] | None = None  # explicit subset of FIXES (overrides what impl implies)
    topology: str = "adaptive"  # §2.9 paths; "none" = no grouping (grouping_off / identity)
    apply_control: bool = True  # False: full attention executed (control_off, identity)
    max_depth: int = 4
    sim_threshold: float = 0.72
    super_threshold: float = 0.76
    upper_metric: str = "cosine_normdiff"
    normdiff_scale: float = 16.0
    upper_l2_threshold: float = 0.0
    group_feature_mode: str = "mean"
    min_group_size: int = 3
    churn_penalty: float = 0.02
    ema_alpha: float = 0.9
    warmup_steps: int = 100
    control_interval: int = 5
    resolution_ema: float = 0.15
    ramp_steps: int = 0
    w_min: int = 1
    input_mode: str = "enriched"
    arch: str = "mlp"
    control_dim: int = 16
    logit_scale: float = 1.0
    pairwise: str = "joint_sibling"
    joint_hidden_dim: int = 64  # 0 = control_dim
    joint_output_scale: float = 1.0
    parent_constraint: bool = True
    seed: int | None = None  # scorer init and fixed_random split; default train.seed
    feature_rows: int = 32  # query rows subsampled for entropy / usage (cheap features)
    feature_seqs: int = 4  # sequences of the batch used for entropy / usage

    def __post_init__(self) -> None:
        _check_choices(self)
        for name in ("max_depth", "control_interval", "w_min", "control_dim", "feature_rows", "feature_seqs"):
            _at_least(self, name, 1)
        for name in ("warmup_steps", "ramp_steps", "min_group_size", "joint_hidden_dim"):
            _at_least(self, name, 0)
        for name in ("ema_alpha", "resolution_ema"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise InvalidConfig(f"controller.{name} must be in [0, 1); got {getattr(self, name)}")
        if self.logit_scale <= 0:
            raise InvalidConfig(f"controller.logit_scale must be > 0; got {self.logit_scale}")
        if self.fixes is not None:
            bad = sorted(set(self.fixes) - set(FIXES))
            if bad:
                raise InvalidConfig(f"controller.fixes: unknown fix(es) {bad}; known: {list(FIXES)}")

    @property
    def active_fixes(self) -> frozenset[str]:
        if self.fixes is not None:
            return frozenset(self.fixes)
        return frozenset(FIXES) if self.impl == "fixed" else frozenset()

    def fixed(self, name: str) -> bool:
        return name in self.active_fixes


@dataclass
class LearnedSettings:
    """A trained window policy under a coverage budget (mode 'learned', controller/learned.py)."""

    budget: float = 0.3  # target coverage in (0, 1]
    budget_metric: str = "causal_coverage"
    penalty: float = 20.0  # weight of the squared hinge on expected coverage above the budget
    tau_start: float = 1.0  # softmax temperature over buckets, annealed geometrically
    tau_end: float = 0.1
    start: float = 0.1  # fraction of train.max_steps trained with full windows before the soft phase
    harden_at: float = 0.7  # fraction of train.max_steps after which the plan is hard and frozen
    param_scale: float = 20.0  # logits = param_scale * parameter (so AdamW at the model's lr moves them)

    def __post_init__(self) -> None:
        _check_choices(self)
        if isinstance(self.budget, bool) or not 0.0 < self.budget <= 1.0:
            raise InvalidConfig(f"controller.budget must be in (0, 1]; got {self.budget!r} (e.g. 0.3 for 30% coverage)")
        if not 0.0 < self.tau_end <= self.tau_start:
            raise InvalidConfig("controller.tau_end must be > 0 and <= controller.tau_start")
        if not 0.0 <= self.start < self.harden_at <= 1.0:
            raise InvalidConfig("controller.start and controller.harden_at must satisfy 0 <= start < harden_at <= 1")
        if self.penalty < 0 or self.param_scale <= 0:
            raise InvalidConfig("controller.penalty must be >= 0 and controller.param_scale > 0")


@dataclass
class PerLayerSettings:
    """A static plan with one window per layer (mode 'static_per_layer'); null = full."""

    layer_windows: list[int | None] | None = None  # default: a ramp over the upper half of the buckets
    fixes: list[str] = field(default_factory=list)  # unused; accepted so impl switches apply uniformly
    impl: str = "faithful"

    def __post_init__(self) -> None:
        _check_choices(self)


def parse_settings(cls: type, raw: dict[str, Any], mode: str) -> Any:
    """Build a settings dataclass from a raw controller section (CLI strings coerced by field type)."""
    names = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(raw) - set(names) - {"mode"})
    if unknown:
        raise InvalidConfig(
            f"unknown controller key(s) {[f'controller.{k}' for k in unknown]} for mode {mode!r}; known: {sorted(names)}"
        )
    hints = typing.get_type_hints(cls)
    kwargs = {k: coerce_setting(v, hints[k], f"controller.{k}") for k, v in raw.items() if k != "mode"}
    return cls(**kwargs)


def settings_from_config(cls: type, config: RunConfig, mode: str) -> Any:
    """Parse config.controller into `cls` and write the coerced values back, so config.json records typed values."""
    raw = dict(config.controller)
    settings = parse_settings(cls, raw, mode)
    config.controller.clear()
    config.controller.update({k: (raw[k] if k == "mode" else getattr(settings, k)) for k in raw})
    return settings


def min_reachable_coverage(config: RunConfig, metric: str) -> float:
    """Coverage of the plan with every head at the smallest bucket."""
    T, w = config.model.seq_len, min(config.model.bucket_windows[0], config.model.seq_len)
    if metric == "acr":
        return w / T
    return pair_count(w, T) / (T * (T + 1) // 2)


def _check_choices(obj: Any) -> None:
    for name, allowed in CHOICES.items():
        if hasattr(obj, name) and getattr(obj, name) not in allowed:
            raise InvalidConfig(f"controller.{name} must be one of {list(allowed)}; got {getattr(obj, name)!r}")


def _at_least(obj: Any, name: str, low: int) -> None:
    value = getattr(obj, name)
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise InvalidConfig(f"controller.{name} must be an integer >= {low}; got {value!r}")


SAMPLES = {bool: False, int: 0, float: 0.0, str: ""}


def coerce_setting(value: Any, hint: Any, key: str) -> Any:
    """Convert a raw value (maybe a CLI string) to the annotated type, or raise InvalidConfig.

    Scalars go through the engine's own override coercion (config.coerce_value); this adds
    optional values (null) and typed lists.
    """
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (typing.Union, types.UnionType) and type(None) in args:
        if value is None or (isinstance(value, str) and value.lower() in ("null", "none", "")):
            return None
        hint = next(a for a in args if a is not type(None))
    if hint in SAMPLES:
        if hint is str and not isinstance(value, str):
            raise InvalidConfig(f"{key} expects a string; got {value!r}")
        return coerce_value(value, SAMPLES[hint], key)
    if typing.get_origin(hint) is list:
        if isinstance(value, str):
            try:
                value = json.loads(value) if value.strip().startswith("[") else [v for v in value.split(",") if v]
            except json.JSONDecodeError:
                raise InvalidConfig(f"{key} expects a JSON list; got {value!r}") from None
        if not isinstance(value, list):
            raise InvalidConfig(f"{key} expects a list; got {value!r}")
        (item,) = typing.get_args(hint)
        return [coerce_setting(v, item, f"{key}[{i}]") for i, v in enumerate(value)]
    raise InvalidConfig(f"{key}: unsupported value {value!r}")
