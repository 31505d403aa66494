"""The learned controller: the soft window is exact at one-hot, trains, and lands within its budget."""

import pytest
import torch

from aah_core.attention import windowed_attention
from aah_core.config import apply_overrides
from aah_core.controller import build_controller
from aah_core.controller.learned import bucket_costs, repair_to_budget, soft_window_bias
from aah_core.model import WindowedGPT
from aah_core.presets import TINY, get_preset
from aah_core.train import train
from aah_core.windows import causal_coverage


def test_one_hot_soft_window_is_the_hard_window():
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 16, 8, dtype=torch.float64) for _ in range(3))
    buckets = [2, 5, 16]
    probs = torch.eye(3, dtype=torch.float64)  # head h takes bucket h
    bias = soft_window_bias(probs, buckets, 16)
    soft = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=bias)
    hard = windowed_attention(q, k, v, buckets, backend="reference")
    torch.testing.assert_close(soft, hard)


def test_one_hot_soft_window_with_sinks_is_the_hard_window_with_sinks():
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 16, 8, dtype=torch.float64) for _ in range(3))
    buckets = [2, 5, 16]
    bias = soft_window_bias(torch.eye(3, dtype=torch.float64), buckets, 16, sinks=3)
    soft = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=bias)
    hard = windowed_attention(q, k, v, buckets, backend="reference", sinks=3)
    torch.testing.assert_close(soft, hard)
    assert torch.equal(bucket_costs(buckets, 16, "causal_coverage", 3),
                       torch.tensor([causal_coverage(torch.tensor([[w]]), 16, 3) for w in buckets], dtype=torch.float64))


def test_soft_window_weights_each_distance_by_the_probability_of_being_covered():
    probs = torch.tensor([[0.25, 0.75]])  # window 2 with 0.25, window 4 with 0.75
    bias = soft_window_bias(probs, [2, 4], 4)
    # query 3: distances 3, 2, 1, 0 for keys 0..3 -> covered with probability 0.75, 0.75, 1, 1
    torch.testing.assert_close(bias[0, 3].exp(), torch.tensor([0.75, 0.75, 1.0, 1.0]))
    assert bias[0, 0, 1] == float("-inf")  # causal


def test_repair_lowers_the_cheapest_preferences_until_the_budget_fits():
    costs = torch.tensor([0.1, 0.5, 1.0], dtype=torch.float64)
    logits = torch.tensor([[0.0, 0.0, 5.0], [0.0, 4.9, 5.0]], dtype=torch.float64)
    idx = logits.argmax(-1)  # both full: mean cost 1.0
    # head 1 gives up only 0.1 of logit for 0.5 of coverage; then head 0 has to go down (5 for 0.5)
    assert repair_to_budget(idx, logits, costs, 0.8).tolist() == [2, 1]
    assert repair_to_budget(idx, logits, costs, 0.5).tolist() == [1, 1]
    assert repair_to_budget(idx, logits, costs, 0.05).tolist() == [0, 0]  # as low as it goes


def test_bucket_costs_are_per_head_coverages():
    costs = bucket_costs([4, 16, 64], 64, "causal_coverage")
    assert costs.tolist() == pytest.approx([causal_coverage(torch.tensor([[w]]), 64) for w in (4, 16, 64)])
    assert bucket_costs([4, 16, 64], 64, "acr").tolist() == [4 / 64, 16 / 64, 1.0]


def test_the_lm_loss_reaches_the_window_logits():
    cfg = apply_overrides(get_preset("learned_budget"), {**TINY, "controller.start": 0.0})
    model = WindowedGPT(cfg.model).train()
    ctrl = build_controller(cfg, model)
    ctrl.on_step_start(0)
    x = torch.randint(0, 256, (2, cfg.model.seq_len))
    _, loss = model(x, x)
    loss.backward()
    assert ctrl.param.grad is not None and ctrl.param.grad.abs().sum() > 0
    model.eval()  # evaluation runs the hard argmax plan (model.plan), not the soft window
    with torch.no_grad():
        soft_installed, _ = model(x)
        ctrl.close()
        without, _ = model(x)
    torch.testing.assert_close(soft_installed, without, rtol=0, atol=0)


@pytest.mark.parametrize("budget", [0.3, 0.5])
def test_learned_budget_lands_within_its_budget(budget, tmp_path):
    cfg = apply_overrides(get_preset("learned_budget"), {
        **TINY, "model.buckets": [4, 8, 16, 32, None], "train.max_steps": 20, "train.eval_every": 20,
        "controller.budget": budget,
    })
    result = train(cfg, tmp_path / "ckpt")
    assert result.metrics["causal_coverage"] <= budget + 1e-9
    assert result.metrics["ctrl/phase"] == 2.0  # hard and frozen at the end
