"""Every controller preset trains on CPU and round-trips through a checkpoint; bad input fails early."""

import json

import pytest
import torch

from aah_core.checkpoint import load_checkpoint
from aah_core.config import RunConfig, apply_overrides
from aah_core.controller import build_controller
from aah_core.errors import InvalidConfig
from aah_core.model import WindowedGPT
from aah_core.presets import PRESETS, TINY, get_preset
from aah_core.train import Callback, train

PAPER = ["baseline", "identity", "grouping_off", "full_adaptive", "shallow_freeze", "deep_practical_reuse",
         "control_off", "fixed_random_grouping", "freeze_after_warmup", "independent_scoring",
         "no_parent_constraint", "no_feature_ema"]
OURS = ["fixed_window", "static_per_layer", "learned_budget", "sink_window", "local_global"]
# seq_len 32 with buckets [4, 16, full]; the controller starts after one warmup step and updates every step
SMALL = {**TINY, "model.seq_len": 32, "model.buckets": [4, 16, None], "data.copy_max_span": 16,
         "train.batch_size": 2, "train.max_steps": 4, "train.eval_every": 4}


def small(name, **extra):
    preset = get_preset(name)
    overrides = dict(SMALL)
    if preset.controller.get("mode") == "aah":
        overrides.update({"controller.warmup_steps": 1, "controller.control_interval": 1})
    if name == "fixed_window":
        overrides["controller.window"] = 16
    return apply_overrides(preset, {**overrides, **extra})


class Plans(Callback):
    def __init__(self):
        self.plans, self.started, self.metrics = [], False, []

    def on_start(self, info):
        self.started = True

    def on_plan(self, step, plan):
        self.plans.append(plan)

    def on_metrics(self, step, metrics):
        self.metrics.append(metrics)


@pytest.mark.parametrize("preset, overrides, window", [
    ("fixed_window", {"controller.window": "16"}, 16), ("fixed_window", {"controller.window": "null"}, 32),
    ("baseline", {"controller.plan": "[[4, null], [16, 4]]"}, None)])
def test_static_controller_takes_cli_strings(preset, overrides, window):
    # `aah train --set controller.window=N` (README, fixed_window's description) passes strings
    cfg = apply_overrides(get_preset(preset), {**SMALL, "model.n_layer": 2, "model.n_head": 2, **overrides})
    model = WindowedGPT(cfg.model)
    build_controller(cfg, model)
    expected = [[4, 32], [16, 4]] if window is None else [[window] * 2] * 2
    assert model.plan.tolist() == expected


@pytest.mark.parametrize("window", ["wide", 0, "2.5"])
def test_static_controller_refuses_a_bad_cli_window_when_the_config_is_built(window):
    with pytest.raises(InvalidConfig, match="controller.window"):
        apply_overrides(get_preset("fixed_window"), {**SMALL, "controller.window": window})


def test_a_static_plan_of_the_wrong_shape_is_refused_when_the_config_is_built():
    with pytest.raises(InvalidConfig, match="plan must be a list of 2 layers"):
        apply_overrides(get_preset("baseline"), {**SMALL, "controller.plan": "[[4, 4]]"})
    cfg = apply_overrides(get_preset("baseline"), {**SMALL, "controller.plan": "[[4, null], [16, 99]]"})
    assert cfg.controller["plan"] == [[4, None], [16, 99]]


def test_local_global_keeps_the_first_heads_full_and_refuses_bad_counts():
    cfg = apply_overrides(get_preset("local_global"), {**SMALL, "model.n_head": 4, "model.d_model": 32,
                                                        "controller.global_heads": 2, "controller.window": 4})
    model = WindowedGPT(cfg.model)
    build_controller(cfg, model)
    assert model.plan.tolist() == [[32, 32, 4, 4], [32, 32, 4, 4]]
    with pytest.raises(InvalidConfig, match="controller.global_heads"):
        apply_overrides(cfg, {"controller.global_heads": 5})
    with pytest.raises(InvalidConfig, match="controller.global_heads"):
        apply_overrides(get_preset("baseline"), {**SMALL, "controller.plan": "[[4, 4], [4, 4]]",
                                                 "controller.global_heads": 1})


def test_every_paper_row_and_control_is_a_preset():
    assert set(PAPER + OURS) <= set(PRESETS)
    assert get_preset("full_adaptive").controller["mode"] == "aah"
    assert get_preset("shallow_freeze").controller["max_depth"] == 1


@pytest.mark.parametrize("name", PAPER + OURS)
def test_preset_trains_and_round_trips_through_a_checkpoint(name, tmp_path):
    cfg = small(name)
    rec = Plans()
    result = train(cfg, tmp_path / "ckpt", [rec])
    assert result.status == "FINISHED" and result.step == 4
    ckpt = load_checkpoint(tmp_path / "ckpt")
    assert torch.equal(ckpt.plan, rec.plans[-1])  # the plan evaluated at the end is the plan stored
    state = json.loads(json.dumps(ckpt.controller_state))  # JSON-able
    assert state == ckpt.controller_state
    controller = build_controller(ckpt.config, WindowedGPT(ckpt.config.model))
    controller.load_state_dict(state)
    assert controller.state_dict() == state  # every piece of state restores exactly
    if name == "identity" or name == "baseline":
        assert ckpt.plan.min() == 32
    if name == "learned_budget":
        assert state["phase"] == "hard"
    if name == "sink_window":  # a sliding window beside 4 sink tokens, kept by the checkpoint's config
        assert ckpt.config.model.sinks == 4 and ckpt.model.sinks == 4 and ckpt.plan.unique().tolist() == [32]
    if name == "local_global":  # head 0 of every layer global (full), the others at the window (32 = full at T=32)
        assert ckpt.plan[:, 0].tolist() == [32, 32]
    if name == "full_adaptive":  # the §5 diagnostics
        logged = set().union(*rec.metrics)
        assert {"acr", "causal_coverage", "window_frac/full", "ctrl/levels_used", "ctrl/groups_l0", "ctrl/head_reassign",
                "ctrl/group_overlap", "ctrl/entropy/L0H0", "ctrl/entropy_mean", "ctrl/overhead_ms"} <= logged


def test_resumed_control_decides_like_the_uninterrupted_run(tmp_path):
    constant_lr = {"train.min_lr_ratio": 1.0, "train.warmup_steps": 0, "train.eval_every": 100,
                   "controller.control_interval": 2, "controller.warmup_steps": 2}
    whole = Plans()
    train(small("full_adaptive", **constant_lr, **{"train.max_steps": 8}), tmp_path / "a", [whole])
    train(small("full_adaptive", **constant_lr, **{"train.max_steps": 6}), tmp_path / "b")
    resumed = Plans()
    train(small("full_adaptive", **constant_lr, **{"train.max_steps": 8}), tmp_path / "c", [resumed], resume=tmp_path / "b")
    # step 6 (the 7th) is a control step (warmup 2, interval 2); it decides from the saved EMA, grouping and
    # observations
    assert whole.metrics[6]["ctrl/control_step"] == resumed.metrics[0]["ctrl/control_step"] == 1.0
    assert torch.equal(whole.plans[-1], resumed.plans[-1])
    # the optimizer moments and generators resume too: the step after the first resumed update has the
    # uninterrupted run's loss
    assert resumed.metrics[1]["train_loss"] == pytest.approx(whole.metrics[7]["train_loss"], abs=1e-6)
    # the controller state at the end equals the uninterrupted one
    assert load_checkpoint(tmp_path / "a").controller_state == load_checkpoint(tmp_path / "c").controller_state


def test_cli_strings_are_coerced_and_recorded_typed(tiny_config):
    cfg = apply_overrides(get_preset("full_adaptive"), {
        **SMALL, "controller.ema_alpha": "0.5", "controller.parent_constraint": "false",
        "controller.fixes": "usage,w_min", "controller.seed": "null",
    })
    assert isinstance(cfg.controller_settings.ema_alpha, float)
    assert cfg.controller["ema_alpha"] == 0.5 and cfg.controller["parent_constraint"] is False
    assert cfg.controller["fixes"] == ["usage", "w_min"] and cfg.controller["seed"] is None


@pytest.mark.parametrize("overrides, message", [
    ({"controller.nope": 1}, r"unknown controller key\(s\) \['controller.nope'\]"),
    ({"controller.impl": "better"}, "controller.impl must be one of"),
    ({"controller.fixes": ["usage", "speed"]}, r"unknown fix\(es\) \['speed'\]"),
    ({"controller.topology": "tree"}, "controller.topology must be one of"),
    ({"controller.ema_alpha": 1.0}, r"controller.ema_alpha must be in \[0, 1\)"),
    ({"controller.control_interval": "abc"}, "controller.control_interval expects an integer"),
    ({"controller.max_depth": 2.5}, "controller.max_depth expects an integer"),
    ({"controller.control_interval": 0}, r"controller.control_interval must be an integer in \[1, "),
    ({"controller.parent_constraint": "maybe"}, "expects true/false"),
    ({"controller.mode": "magic"}, "unknown controller.mode 'magic'"),
])
def test_bad_controller_settings_fail_when_the_config_is_built(overrides, message):
    with pytest.raises(InvalidConfig, match=message):
        small("full_adaptive", **overrides)
    with pytest.raises(InvalidConfig, match=message):  # a checkpoint's config.json goes through the same check
        RunConfig.from_dict({**small("full_adaptive").to_dict(), "controller": {"mode": "aah", **{
            k.removeprefix("controller."): v for k, v in overrides.items()}}})


@pytest.mark.parametrize("budget, message", [
    (0, r"controller.budget must be in \(0, 1\]"),
    (1.5, r"controller.budget must be in \(0, 1\]"),
    (-0.2, r"controller.budget must be in \(0, 1\]"),
    ("lots", "controller.budget expects a finite number"),
    (0.1, "below the smallest causal_coverage these buckets reach"),
])
def test_bad_budgets_fail_when_the_config_is_built(budget, message):
    with pytest.raises(InvalidConfig, match=message):
        small("learned_budget", **{"controller.budget": budget})


@pytest.mark.parametrize("overrides, message", [
    ({"model.buckets": [16, 4, None]}, "strictly increasing"),
    ({"model.buckets": [4, 64]}, "larger than model.seq_len=32"),
    ({"controller.layer_windows": [4]}, "has 1 entries; the model has 2 layers"),
])
def test_impossible_model_or_plan_settings_fail_early(overrides, message):
    with pytest.raises(InvalidConfig, match=message):
        small("static_per_layer", **overrides)


def test_unknown_preset_lists_the_known_ones():
    with pytest.raises(InvalidConfig, match="unknown preset 'full_adaptiv'.*full_adaptive"):
        get_preset("full_adaptiv")


def test_static_per_layer_ramps_windows_up_the_stack():
    cfg = apply_overrides(get_preset("static_per_layer"), {"model.n_layer": 4})
    model = WindowedGPT(cfg.model)
    build_controller(cfg, model)
    assert model.plan[:, 0].tolist() == [32, 64, 128, 256] and bool((model.plan == model.plan[:, :1]).all())


@pytest.mark.parametrize("name", ["learned_budget", "full_adaptive", "fixed_window"])
def test_a_model_with_sinks_trains_under_each_controller_and_its_metrics_count_them(name, tmp_path):
    from aah_core.windows import coverage_metrics

    rec = Plans()
    # 2 sinks at T=32 lift the floor of reachable coverage (every head at window 4) to 0.34: the budget is above it
    extra = {"controller.budget": 0.5} if name == "learned_budget" else {}
    result = train(small(name, **{"model.sinks": 2, **extra}), tmp_path / "ckpt", [rec])
    assert result.status == "FINISHED"
    ckpt = load_checkpoint(tmp_path / "ckpt")
    assert ckpt.config.model.sinks == 2
    logged = [m for m in rec.metrics if "causal_coverage" in m][-1]
    assert logged["causal_coverage"] == coverage_metrics(ckpt.plan, 32, 2)["causal_coverage"]
