"""The AAH-v3 window controller (aah_method §2): features -> EMA -> clustering -> hierarchy ->
frozen scorers -> argmax -> parent clamp -> per-head windows, on the §2.9 schedule.

The engine calls on_step_start(step) before each forward, so a decision at step s uses the
features recorded during the forward of an earlier step (the paper used the current
batch's q/k/v). Every piece of runtime state is in state_dict(), so a checkpoint's plan and
a resumed run's decisions match the uninterrupted run (the paper lost them, §8.6).
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from aah_core.config import RunConfig
from aah_core.controller import Controller
from aah_core.controller.clustering import churn, leader_cluster
from aah_core.controller.features import N_FEATURES, HeadStats, Standardizer, head_features, pooled_group_features
from aah_core.controller.hierarchy import (
    Level,
    aggregate,
    balanced_split,
    build_upper_levels,
    passthrough,
    relevel,
    topology_of,
)
from aah_core.controller.observer import FeatureObserver
from aah_core.controller.policy import ramp, resolution_ema, select, warmup_index, windows_of
from aah_core.controller.scorers import LayerScorers, base_inputs, enriched_inputs, input_dim
from aah_core.controller_config import AAHSettings
from aah_core.errors import InvalidConfig
from aah_core.model import WindowedGPT
from aah_core.windows import acr

logger = logging.getLogger(__name__)
STATE_VERSION = 1


@dataclass
class LayerState:
    """One layer's runtime control state (all of it goes into the checkpoint)."""

    ema: list[list[float]] | None = None  # EMA head features [H, 9]
    cached_groups: list[list[int]] | None = None  # frozen level-0 grouping (reuse / freeze paths)
    prev_groups: list[list[int]] | None = None  # the last level-0 grouping (churn penalty and churn metric)
    topology: list[list[list[int]]] | None = None  # stored hierarchy of freeze_learned (shallow freeze)
    win_idx: list[int] | None = None  # the last selection (bucket index per head)
    res_ema: list[float] | None = None  # resolution EMA state per head
    group_counts: list[int] = field(default_factory=list)
    joint_pairs: list[int] = field(default_factory=list)
    shadow_idx: list[int] | None = None  # control_off / warmup: chosen but not executed
    reassign: float = 0.0
    overlap: float = 1.0


class AAHController(Controller):
    """Controller mode 'aah': every §3 variant is a setting of this class (see aah_core/presets.py)."""

    def __init__(self, config: RunConfig, model: WindowedGPT) -> None:
        self.config, self.model = config, model
        s = config.controller_settings
        assert isinstance(s, AAHSettings), s
        self.s = s
        m = config.model
        self.T, self.buckets, self.n_head = m.seq_len, m.bucket_windows, m.n_head
        self.full_idx = len(self.buckets) - 1
        self.seed = config.train.seed if s.seed is None else s.seed
        self.identity = not s.apply_control and s.topology == "none"
        joint = s.pairwise == "joint_sibling" and s.topology != "none"
        hidden = (s.joint_hidden_dim or s.control_dim) if joint else None
        self.scorers = [
            LayerScorers(input_dim(N_FEATURES, s.input_mode), len(self.buckets), s.control_dim, hidden,
                         s.arch == "deep_mlp", seed=self.seed * 1009 + layer)
            for layer in range(m.n_layer)
        ]
        self.layers = [LayerState() for _ in range(m.n_layer)]
        self.observer = FeatureObserver(model, s.feature_rows, s.feature_seqs)
        if not self.identity:
            self.observer.attach()
        self.step, self.updates, self.first_done = -1, 0, False
        self.last_update: int | None = None  # the step of the last control update
        self._metrics: dict[str, float] = {}
        self._apply([[None] * self.n_head for _ in self.layers])  # full attention until the first decision

    # ---- the schedule (§2.9) ----------------------------------------------------------------
    def _warm(self, step: int) -> bool:
        return step < self.s.warmup_steps or not self.s.apply_control

    def _clears_every_step(self) -> bool:
        """The paper's trainer resets the control caches every step when control is off (§2.9 quirk)."""
        return not self.s.apply_control and not self.s.fixed("control_off_cache")

    def _needs_features(self, step: int) -> bool:
        """Will `step` consume features (so this step's forward must record them)?"""
        s = self.s
        if self.identity:
            return False
        if self._warm(step):
            grouped = s.topology != "none"
            return grouped and (not self.first_done or self._clears_every_step() or step % s.control_interval == 0)
        return self.last_update is None or step - self.last_update >= s.control_interval

    def on_step_start(self, step: int) -> None:
        t0 = time.perf_counter()
        self.step = step
        s, ready = self.s, self.observer.ready
        metrics: dict[str, float] = {"ctrl/control_step": 0.0}
        idx: list[Sequence[int | None]]  # bucket index per head, per layer; None is full attention
        if self.identity:
            idx = [[None] * self.n_head for _ in self.layers]
        elif self._warm(step):
            if s.topology != "none" and ready:
                if self._clears_every_step():
                    self._clear_caches()
                if not self.first_done:
                    self._first_call()
                elif step % s.control_interval == 0:
                    self._shadow(metrics)
            executed = None if not s.apply_control else warmup_index(self.buckets, self.T, s.fixed("warmup_fallback"))
            idx = [[executed] * self.n_head for _ in self.layers]
        else:
            due = self.last_update is None or step - self.last_update >= s.control_interval
            if due and ready:
                self._update()
                self.last_update, self.updates = step, self.updates + 1
                metrics["ctrl/control_step"] = 1.0
            idx = [self._postprocess(st, step) for st in self.layers]
        self._apply(idx)
        if self._needs_features(step + 1):
            self.observer.arm()
        metrics.update(self._diagnostics())
        metrics["ctrl/overhead_ms"] = 1e3 * (time.perf_counter() - t0 + self.observer.seconds)
        self.observer.seconds = 0.0
        self._metrics = metrics

    def _postprocess(self, st: LayerState, step: int) -> Sequence[int | None]:
        """Resolution EMA then ramp (§2.8) on the cached selection; full until the first selection."""
        if st.win_idx is None:
            return [None] * self.n_head
        st.res_ema, idx = resolution_ema(st.res_ema, st.win_idx, self.s.resolution_ema, len(self.buckets))
        return ramp(idx, step, self.s.warmup_steps, self.s.ramp_steps, self.full_idx)

    def _apply(self, idx: Sequence[Sequence[int | None]]) -> None:
        w_min = self.s.w_min if self.s.fixed("w_min") else 1
        plan = [windows_of(row, self.buckets, self.T, w_min) for row in idx]
        self.model.set_plan(torch.tensor(plan, dtype=torch.long, device=self.model.plan.device))
        accounting = [windows_of(row, self.buckets, self.T, self.s.w_min) for row in idx]  # §2.8 step 4
        self._accounting_acr = acr(torch.tensor(accounting), self.T)

    # ---- features ------------------------------------------------------------------------------
    def _stats(self, layer: int) -> tuple[HeadStats, HeadStats | None]:
        """The latest recorded q/k/v statistics of `layer`, and the ones its entropy / norm / usage come from
        (the 'feature_lag' fix: the same forward). Features are read only once the observer is ready."""
        qkv = self.observer.recorded(layer)
        return qkv, (qkv if self.s.fixed("feature_lag") else self.observer.previous[layer])

    def _features(self, layer: int) -> torch.Tensor:
        """Raw head features [H, 9] of the latest recorded forward."""
        return head_features(*self._stats(layer), self.s.fixed("usage"))

    def _standardizer(self, rows: torch.Tensor) -> Standardizer:
        return Standardizer(rows if self.s.fixed("standardize") else None)

    def _pooled(self, layer: int, groups: list[list[int]]) -> torch.Tensor:
        """Current-batch group rows (no EMA), standardised with the heads' statistics when fixed."""
        rows = pooled_group_features(groups, *self._stats(layer), self.s.fixed("usage"))
        return self._standardizer(self._features(layer))(rows)

    def _ema_update(self, st: LayerState, feats: torch.Tensor) -> torch.Tensor:
        a = self.s.ema_alpha
        ema = feats if st.ema is None else a * torch.tensor(st.ema, dtype=torch.float64) + (1 - a) * feats
        st.ema = ema.tolist()
        return ema

    def _level0(self, st: LayerState, rows: torch.Tensor) -> list[list[int]]:
        s = self.s
        return leader_cluster(rows, s.sim_threshold, "cosine", forced_bipartition=True, prev_groups=st.prev_groups,
                              churn_penalty=s.churn_penalty, min_group_size=s.min_group_size)

    # ---- control paths ------------------------------------------------------------------------
    def _clear_caches(self) -> None:
        self.first_done = False
        for st in self.layers:
            st.ema, st.cached_groups, st.prev_groups = None, None, None

    def _first_call(self) -> None:
        """First grouped call (during warmup): initialise the EMA and cluster heads once (§2.9)."""
        for layer, st in enumerate(self.layers):
            ema = self._ema_update(st, self._features(layer))
            groups = self._level0(st, self._standardizer(ema)(ema))
            st.prev_groups = groups
            st.cached_groups = None if self.s.fixed("frozen_grouping") else groups
            st.group_counts = [len(groups)]
        self.first_done = True

    def _upper_threshold(self) -> float:
        return self.s.upper_l2_threshold if self.s.upper_metric == "l2" else self.s.super_threshold

    def _grow(self, level0: Level) -> list[Level]:
        s = self.s
        return build_upper_levels(level0, s.max_depth, self._upper_threshold(), s.upper_metric, s.normdiff_scale,
                                  s.group_feature_mode, s.min_group_size, stop_on_identity=s.fixed("identity_levels"))

    def _passthrough(self, level0: Level) -> list[Level]:
        return passthrough(level0, 1 if self.s.fixed("identity_levels") else self.s.max_depth)

    def _adaptive(self, layer: int, st: LayerState) -> list[Level]:
        """EMA update -> level-0 clustering with forced split -> upper levels."""
        ema = self._ema_update(st, self._features(layer))
        rows = self._standardizer(ema)(ema)
        groups = self._level0(st, rows)
        return self._grow(Level(groups, aggregate(groups, rows, self.s.group_feature_mode)))

    def _frozen_groups(self, layer: int, st: LayerState) -> list[list[int]]:
        if st.cached_groups is None:  # 'frozen_grouping' fix: freeze at the first post-warmup update
            ema = self._ema_update(st, self._features(layer))
            st.cached_groups = self._level0(st, self._standardizer(ema)(ema))
        return st.cached_groups

    def _levels(self, layer: int, st: LayerState) -> list[Level]:
        topo = self.s.topology
        if topo == "none":  # grouping_off: every head its own item, raw current features (no EMA)
            feats = self._features(layer)
            return [Level([[h] for h in range(self.n_head)], self._standardizer(feats)(feats))]
        if topo == "freeze_learned" and st.topology is not None:
            return relevel(st.topology, self._pooled(layer, st.topology[0]), self.s.group_feature_mode)
        if topo in ("adaptive", "freeze_learned"):
            levels = self._adaptive(layer, st)
            if topo == "freeze_learned":
                st.topology = topology_of(levels)
            return levels
        if topo in ("reuse", "freeze_after_warmup"):
            groups = self._frozen_groups(layer, st)
            level0 = Level(groups, self._pooled(layer, groups))
            return self._grow(level0) if topo == "reuse" else self._passthrough(level0)
        groups = balanced_split(self.n_head, None if topo == "fixed_deterministic" else self.seed)
        return self._passthrough(Level(groups, self._pooled(layer, groups)))

    def _select(self, layer: int, levels: list[Level]):
        s = self.s
        inputs = enriched_inputs(levels) if s.input_mode == "enriched" else base_inputs(levels)
        return select(levels, inputs, self.scorers[layer], self.n_head, s.parent_constraint and len(levels) > 1,
                      s.logit_scale, s.joint_output_scale)

    def _record(self, st: LayerState, levels: list[Level], selection) -> None:
        if self.s.topology != "none":
            st.reassign, st.overlap = churn(st.prev_groups, levels[0].groups, self.n_head)
            st.prev_groups = [list(g) for g in levels[0].groups]
        st.group_counts = [len(level.groups) for level in levels]
        st.joint_pairs = selection.joint_pairs

    def _update(self) -> None:
        for layer, st in enumerate(self.layers):
            levels = self._levels(layer, st)
            selection = self._select(layer, levels)
            self._record(st, levels, selection)
            st.win_idx = selection.head_idx

    def _shadow(self, metrics: dict[str, float]) -> None:
        """Warmup / control_off: upper levels rebuilt from group q/k/v stats on the cached grouping; not executed."""
        shadow = []
        for layer, st in enumerate(self.layers):
            groups = st.prev_groups
            assert groups is not None, "the first grouped call clustered every layer"
            levels = self._grow(Level(groups, self._pooled(layer, groups)))
            selection = self._select(layer, levels)
            st.group_counts, st.joint_pairs = [len(level.groups) for level in levels], selection.joint_pairs
            st.shadow_idx = selection.head_idx
            shadow.append(windows_of(selection.head_idx, self.buckets, self.T))
        metrics["ctrl/shadow_acr"] = acr(torch.tensor(shadow), self.T)

    # ---- diagnostics (§5) ---------------------------------------------------------------------
    def _diagnostics(self) -> dict[str, float]:
        out = {"ctrl/updates": float(self.updates), "ctrl/acr_accounting": self._accounting_acr}
        counts = [st.group_counts for st in self.layers if st.group_counts]
        if counts and self.s.topology != "none":
            out["ctrl/levels_used"] = sum(map(len, counts)) / len(counts)
            for lvl in range(max(map(len, counts))):
                have = [c[lvl] for c in counts if len(c) > lvl]
                out[f"ctrl/groups_l{lvl}"] = sum(have) / len(have)
            out["ctrl/head_reassign"] = sum(st.reassign for st in self.layers) / len(self.layers)
            out["ctrl/group_overlap"] = sum(st.overlap for st in self.layers) / len(self.layers)
            out["ctrl/joint_pairs"] = float(sum(sum(st.joint_pairs) for st in self.layers))
        fresh = sorted(self.observer.fresh)
        for layer in fresh:
            entropy = self.observer.recorded(layer).to_cpu().entropy.tolist()
            out.update({f"ctrl/entropy/L{layer}H{h}": e for h, e in enumerate(entropy)})
        if fresh:
            values = [v for k, v in out.items() if k.startswith("ctrl/entropy/")]
            out["ctrl/entropy_mean"] = sum(values) / len(values)
        self.observer.fresh = set()
        return out

    def metrics(self) -> dict[str, float]:
        return dict(self._metrics)

    def close(self) -> None:
        self.observer.detach()

    # ---- checkpoint ---------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "mode": "aah", "version": STATE_VERSION, "step": self.step, "last_update": self.last_update,
            "updates": self.updates, "first_done": self.first_done, "seed": self.seed,
            "layers": [copy.deepcopy(vars(st)) for st in self.layers], "observations": self.observer.to_json(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("mode") != "aah" or state.get("version") != STATE_VERSION:
            raise InvalidConfig(f"controller state is for mode {state.get('mode')!r} "
                                f"(version {state.get('version')}); this run uses mode 'aah' v{STATE_VERSION}")
        if len(state["layers"]) != len(self.layers) or state["seed"] != self.seed:
            raise InvalidConfig("controller state does not match this model (layer count or scorer seed differ)")
        self.step, self.last_update = state["step"], state["last_update"]
        self.updates, self.first_done = state["updates"], state["first_done"]
        self.layers = [LayerState(**doc) for doc in state["layers"]]
        self.observer.load_json(state["observations"])
