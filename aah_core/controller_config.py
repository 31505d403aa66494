"""The ``controller`` section of a run config, typed and validated when the config is built.

`parse_controller` turns the raw section (typed JSON from the API, strings from `aah train --set`) into
one settings dataclass per ``controller.mode``, checks it against the model (plan shape, layer count,
reachable budget) and raises InvalidConfig naming the key. RunConfig calls it on construction, so the
CLI and POST /runs refuse a bad ``controller.*`` setting before any job starts. Defaults are the
paper's 4096-suite values (aah_method §7).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from aah_core.coerce import SEQ_LEN_MAX, STEPS_MAX, Bounds, check_bounds, coerce, field_types
from aah_core.errors import InvalidConfig, InvalidWindowPlan
from aah_core.model_config import ModelConfig
from aah_core.windows import JsonPlan, decode_window, pair_count, validate_plan

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
AAH_BOUNDS: Bounds = {  # sizes bound the scorer's memory; steps bound schedules
    "max_depth": (1, 64), "control_interval": (1, STEPS_MAX), "w_min": (1, SEQ_LEN_MAX), "control_dim": (1, 4096),
    "feature_rows": (1, SEQ_LEN_MAX), "feature_seqs": (1, 1 << 16), "warmup_steps": (0, STEPS_MAX),
    "ramp_steps": (0, STEPS_MAX), "min_group_size": (0, 1 << 16), "joint_hidden_dim": (0, 4096),
    "ema_alpha": (0.0, 1.0), "resolution_ema": (0.0, 1.0),
}


@dataclass
class StaticSettings:
    """A fixed plan (mode 'static'): ``plan`` (per layer, per head) or one ``window`` for every head; full by default.

    ``global_heads`` g > 0 keeps the first g heads of every layer full and gives the others ``window``
    (local + global heads, Longformer / Mistral style)."""

    mode: ClassVar[str] = "static"
    window: int | None = None
    plan: JsonPlan | None = None
    global_heads: int = 0

    def check(self, model: ModelConfig) -> None:
        if self.window is not None and self.plan is not None:
            raise InvalidConfig("controller.plan and controller.window are exclusive; set one of them")
        if isinstance(self.global_heads, bool) or not 0 <= self.global_heads <= model.n_head:
            raise InvalidConfig(f"controller.global_heads must be an integer in [0, model.n_head={model.n_head}]; "
                                f"got {self.global_heads!r}")
        if self.global_heads and self.plan is not None:
            raise InvalidConfig("controller.global_heads goes with controller.window, not with controller.plan")
        if self.window is not None:
            decode_window(self.window, model.seq_len, "controller.window")
        if self.plan is not None:
            try:
                validate_plan(self.plan, model.n_layer, model.n_head, model.seq_len)
            except InvalidWindowPlan as exc:
                raise InvalidConfig(f"controller.plan: {exc}") from None


@dataclass
class AAHSettings:
    """The AAH-v3 control branch (mode 'aah'). Names follow aah_method §2 and §7."""

    mode: ClassVar[str] = "aah"

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
        check_bounds(self, "controller", AAH_BOUNDS)
        if self.seed is not None:
            check_bounds(self, "controller", {"seed": (0, 2**32 - 1)})
        for name in ("ema_alpha", "resolution_ema"):
            if getattr(self, name) >= 1.0:
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

    def check(self, model: ModelConfig) -> None:
        """Nothing of the model constrains these settings."""


@dataclass
class LearnedSettings:
    """A trained window policy under a coverage budget (mode 'learned', controller/learned.py)."""

    mode: ClassVar[str] = "learned"

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

    def check(self, model: ModelConfig) -> None:
        floor = min_reachable_coverage(model, self.budget_metric)
        if self.budget < floor - 1e-12:
            raise InvalidConfig(
                f"controller.budget={self.budget} is below the smallest {self.budget_metric} these buckets reach "
                f"({floor:.4f}, every head at window {model.bucket_windows[0]}); raise the budget or add a smaller bucket"
            )


@dataclass
class PerLayerSettings:
    """A static plan with one window per layer (mode 'static_per_layer'); null = full."""

    mode: ClassVar[str] = "static_per_layer"
    layer_windows: list[int | None] | None = None  # default: a ramp over the upper half of the buckets
    fixes: list[str] = field(default_factory=list)  # unused; accepted so impl switches apply uniformly
    impl: str = "faithful"

    def __post_init__(self) -> None:
        _check_choices(self)

    def check(self, model: ModelConfig) -> None:
        if self.layer_windows is None:
            return
        if len(self.layer_windows) != model.n_layer:
            raise InvalidConfig(f"controller.layer_windows has {len(self.layer_windows)} entries; "
                                f"the model has {model.n_layer} layers")
        for layer, w in enumerate(self.layer_windows):
            decode_window(w, model.seq_len, f"controller.layer_windows[{layer}]")


ControllerSettings = StaticSettings | AAHSettings | LearnedSettings | PerLayerSettings
SETTINGS: dict[str, type] = {cls.mode: cls for cls in (StaticSettings, PerLayerSettings, AAHSettings, LearnedSettings)}
MODES = tuple(SETTINGS)


def parse_controller(raw: Mapping[str, Any], model: ModelConfig) -> tuple[ControllerSettings, dict[str, Any]]:
    """(typed settings, the section as typed JSON: the keys given, with coerced values) or InvalidConfig."""
    if not isinstance(raw, Mapping):
        raise InvalidConfig(f"config section 'controller' must be an object; got {type(raw).__name__}")
    mode = raw.get("mode", "static")
    if mode not in SETTINGS:
        raise InvalidConfig(f"unknown controller.mode {mode!r}; choose one of {list(MODES)}")
    cls = SETTINGS[mode]
    hints = field_types(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(raw) - set(names) - {"mode"})
    if unknown:
        raise InvalidConfig(
            f"unknown controller key(s) {[f'controller.{k}' for k in unknown]} for mode {mode!r}; known: {sorted(names)}"
        )
    values = {k: coerce(v, hints[k], f"controller.{k}") for k, v in raw.items() if k != "mode"}
    settings = cls(**values)
    try:
        settings.check(model)
    except InvalidWindowPlan as exc:
        raise InvalidConfig(str(exc)) from None
    return settings, ({"mode": mode} if "mode" in raw else {}) | values


def min_reachable_coverage(model: ModelConfig, metric: str) -> float:
    """Coverage of the plan with every head at the smallest bucket (its sink keys counted)."""
    T, w = model.seq_len, min(model.bucket_windows[0], model.seq_len)
    if metric == "acr":
        return min(w + model.sinks, T) / T
    return pair_count(w, T, model.sinks) / (T * (T + 1) // 2)


def _check_choices(obj: Any) -> None:
    for name, allowed in CHOICES.items():
        if hasattr(obj, name) and getattr(obj, name) not in allowed:
            raise InvalidConfig(f"controller.{name} must be one of {list(allowed)}; got {getattr(obj, name)!r}")
