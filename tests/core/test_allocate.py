"""Budgeted allocation: respects the budget, never loses to the uniform plan, rejects bad budgets."""

import pytest
import torch

from aah_core.analysis.allocate import allocate
from aah_core.analysis.evaluate import make_eval_batch
from aah_core.checkpoint import load_checkpoint
from aah_core.config import apply_overrides
from aah_core.errors import InvalidConfig
from aah_core.inference.cost import ModelShape, plan_cost
from aah_core.presets import get_preset
from aah_core.train import train
from aah_core.windows import acr, causal_coverage


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny model trained here with five buckets: every rule below (budget, the uniform guard, one sweep)
    holds for any model, and this one's sweep and descent cost seconds where the demo's took minutes."""
    cfg = apply_overrides(get_preset("tiny"), {"model.buckets": [4, 8, 16, 32, None], "train.max_steps": 40})
    out = tmp_path_factory.mktemp("alloc") / "ckpt"
    train(cfg, out)
    ckpt = load_checkpoint(out)
    return ckpt.model, make_eval_batch(ckpt.config, "mixed", 8)


def uniform_loss_within(model, batch, budget, metric):
    """The best (largest) uniform plan whose coverage fits the budget, and its loss."""
    from aah_core.analysis.evaluate import evaluate_loss

    T = model.config.seq_len
    fits = [w for w in sorted({min(b, T) for b in model.buckets})
            if {"acr": acr, "causal_coverage": causal_coverage}[metric](torch.tensor([[w]]), T) <= budget]
    plan = torch.full_like(model.plan, fits[-1])
    return evaluate_loss(model, batch, plan)


@pytest.mark.parametrize("budget, metric", [(0.3, "causal_coverage"), (0.25, "acr")])
def test_allocation_respects_the_budget_and_beats_the_uniform_plan(trained, budget, metric):
    model, batch = trained
    own = model.plan.clone()
    result = allocate(model, batch, budget, metric=metric)
    T = model.config.seq_len
    measure = {"acr": acr, "causal_coverage": causal_coverage}[metric]
    assert measure(result.plan, T) <= budget + 1e-9 and result.coverage == pytest.approx(measure(result.plan, T))
    assert result.loss <= uniform_loss_within(model, batch, budget, metric) + 1e-6
    assert result.curve[0]["causal_coverage"] == 1.0 and result.curve[0]["loss"] == pytest.approx(result.full_loss)
    assert all(set(point) == {"acr", "causal_coverage", "kv_bytes", "loss"} for point in result.curve)
    assert result.curve[0]["kv_bytes"] == plan_cost(torch.full_like(own, T), T, ModelShape.of(model)).kv_bytes_full
    windows = {min(b, T) for b in model.buckets}
    assert set(result.plan.flatten().tolist()) <= windows
    assert torch.equal(model.plan, own)  # the model's own plan is untouched


@pytest.mark.parametrize("budget", [0, -0.1, 1.5, True, "0.3"])
def test_budget_outside_zero_one_is_refused(trained, budget):
    model, batch = trained
    with pytest.raises(InvalidConfig, match=r"budget must be a coverage in \(0, 1\]"):
        allocate(model, batch, budget)


def test_unreachable_budget_and_unknown_metric_are_refused(trained):
    model, batch = trained
    with pytest.raises(InvalidConfig, match="below the smallest causal_coverage"):
        allocate(model, batch, 0.001)
    with pytest.raises(InvalidConfig, match="metric must be one of"):
        allocate(model, batch, 0.5, metric="flops")


def test_full_budget_keeps_the_full_plan(trained):
    model, batch = trained
    result = allocate(model, batch, 1.0)
    assert result.plan.min() == model.config.seq_len and len(result.curve) == 1


def test_allocation_weighs_moves_by_the_diagnostics_sensitivity_sweep(trained, monkeypatch):
    """One sweep serves the allocator and GET /sensitivity (aah_core.analysis.diagnostics), so the table the
    dashboard shows is the one the allocator ranks moves by."""
    import aah_core.analysis.allocate as allocate_module
    from aah_core.analysis.diagnostics import sensitivity_sweep

    model, batch = trained
    seen = []

    def spy(loss, plan, windows):
        seen.append((plan.clone(), list(windows)))
        return sensitivity_sweep(loss, plan, windows)

    monkeypatch.setattr(allocate_module, "sensitivity_sweep", spy)
    result = allocate(model, batch, 0.3)
    T = model.config.seq_len
    windows = sorted({min(b, T) for b in model.buckets})
    assert len(seen) == 1 and seen[0][1] == windows
    assert torch.equal(seen[0][0], torch.full_like(model.plan, windows[-1]))  # each head alone, the rest full
    L, H = model.plan.shape
    assert result.evaluations > 1 + L * H * (len(windows) - 1)  # the sweep's, then the descent's and the guard's
