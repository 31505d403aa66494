"""Rounding a per-head plan to serving grains: hand-made plans (grouped-query attention: 4 query heads
on 2 KV heads), the `up` guarantees, and the `budget` choice checked by evaluating every candidate."""

import pytest
import torch

from aah_core.analysis.evaluate import evaluate_loss
from aah_core.data import EvalBatch
from aah_core.errors import AAHError
from aah_core.inference.cost import ModelShape, plan_cost
from aah_core.inference.serving import GRAINS, candidates, round_plan
from aah_core.model import WindowedGPT
from aah_core.model_config import ModelConfig

T = 16
GQA = ModelShape(n_layer=3, n_head=4, n_kv_head=2, head_dim=8, seq_len=T)
BUCKETS = [1, 2, 4, 8, T]
# heads (0, 1) share kv head 0, heads (2, 3) kv head 1
PLAN = torch.tensor([[2, 4, 8, 1],
                     [T, 2, 2, 2],
                     [4, 4, 4, 4]])


def _kv(plan: torch.Tensor, shape: ModelShape = GQA) -> int:
    return plan_cost(plan, shape.seq_len, shape).kv_bytes


def test_head_grain_is_the_plan_itself():
    for mode in ("up", "budget"):
        assert torch.equal(round_plan(PLAN, GQA, "head", mode, BUCKETS, loss_of=lambda p: 0.0).plan, PLAN)


def test_kv_group_up_gives_each_group_its_largest_window_and_keeps_the_kv_bytes():
    got = round_plan(PLAN, GQA, "kv_group", "up", BUCKETS).plan
    assert got.tolist() == [[4, 4, 8, 8], [T, T, 2, 2], [4, 4, 4, 4]]
    assert _kv(got) == _kv(PLAN)


def test_layer_up_gives_each_layer_its_largest_window():
    assert round_plan(PLAN, GQA, "layer", "up", BUCKETS).plan.tolist() == [[8] * 4, [T] * 4, [4] * 4]


def test_transformers_up_picks_the_shared_window_with_the_fewest_kv_bytes():
    """Layer maxima 8, full, 4. w=4: only layer 2 slides (2 kv heads x (16+16+4) = 72 entries);
    w=8: layers 0 and 2 slide (2 x (8+16+8) = 64); w=1, 2: none (96): w=8 wins."""
    rounding = round_plan(PLAN, GQA, "transformers", "up", BUCKETS)
    assert rounding.plan.tolist() == [[8] * 4, [T] * 4, [8] * 4]
    assert rounding.chosen.window == 8
    assert rounding.chosen.kv_bytes == 64 * 2 * 8 * 4
    assert "w=8" in rounding.note and "transformers" in rounding.note
    by_window = {c.window: c.kv_bytes for c in rounding.candidates}
    assert by_window == {None: 96 * 64, 4: 72 * 64, 8: 64 * 64}


@pytest.mark.parametrize("grain", GRAINS)
def test_up_never_shrinks_a_head_and_never_saves_kv_below_the_plan(grain):
    gen = torch.Generator().manual_seed(3)
    for _ in range(20):
        plan = torch.tensor(BUCKETS)[torch.randint(0, len(BUCKETS), (3, 4), generator=gen)]
        rounded = round_plan(plan, GQA, grain, "up", BUCKETS).plan
        assert (rounded >= plan).all(), (plan, rounded)
        assert _kv(rounded) >= _kv(plan)
        if grain in ("head", "kv_group"):
            assert _kv(rounded) == _kv(plan)


@pytest.mark.parametrize("grain", GRAINS)
def test_budget_candidates_never_exceed_the_plans_kv_bytes(grain):
    gen = torch.Generator().manual_seed(4)
    for _ in range(20):
        plan = torch.tensor(BUCKETS)[torch.randint(0, len(BUCKETS), (3, 4), generator=gen)]
        found = candidates(plan, GQA, grain, "budget", BUCKETS)
        assert found
        assert all(_kv(c.plan) <= _kv(plan) for c in found)


def test_transformers_budget_shrinks_layers_to_the_shared_window_then_gives_full_back_within_budget():
    """The plan's KV: (4+8) + (16+2) + (4+4) = 38 entries (2 kv heads per layer). A layer at w costs 2w, a
    full one 32. w=8: all sliding is 48 > 38, no candidate. w=4: 24; layer 1 full would be 48: stays.
    w=1: 6; layer 1 (the most KV) full: 36 <= 38, then layer 0 full: 66: stays."""
    assert _kv(PLAN) == 38 * (2 * 8 * 4)
    found = {c.window: c.plan.tolist() for c in candidates(PLAN, GQA, "transformers", "budget", BUCKETS)}
    assert set(found) == {1, 2, 4}
    assert found[4] == [[4] * 4, [4] * 4, [4] * 4]
    assert found[2] == [[2] * 4, [2] * 4, [2] * 4]
    assert found[1] == [[1] * 4, [T] * 4, [1] * 4]


def _tiny() -> tuple[WindowedGPT, EvalBatch]:
    torch.manual_seed(0)
    model = WindowedGPT(ModelConfig(n_layer=3, n_head=4, d_model=32, seq_len=T, buckets=[1, 2, 4, 8, None])).eval()
    gen = torch.Generator().manual_seed(0)
    idx = torch.randint(0, 256, (2, T), generator=gen)
    return model, EvalBatch(idx, torch.roll(idx, -1, dims=1), ["text", "text"])


@pytest.mark.parametrize("grain", GRAINS)
def test_budget_picks_the_lowest_loss_candidate(grain):
    model, batch = _tiny()
    shape = ModelShape.of(model)
    plan = torch.tensor([[1, 4, 8, 2], [T, 2, 4, 1], [2, 2, 8, 8]])
    rounding = round_plan(plan, shape, grain, "budget", BUCKETS, loss_of=lambda p: evaluate_loss(model, batch, p))
    losses = [evaluate_loss(model, batch, c.plan) for c in candidates(plan, shape, grain, "budget", BUCKETS)]
    assert evaluate_loss(model, batch, rounding.plan) == min(losses)
    assert rounding.chosen.kv_bytes <= _kv(plan, shape)
    if grain in ("layer", "transformers"):  # without GQA a kv group is one head: one candidate
        assert len(losses) > 1


def test_unknown_grain_or_mode_and_budget_without_losses_are_refused():
    with pytest.raises(AAHError, match="granularity 'vllm' is unknown"):
        round_plan(PLAN, GQA, "vllm")
    with pytest.raises(AAHError, match="mode 'down' is unknown"):
        round_plan(PLAN, GQA, "layer", "down")
    with pytest.raises(AAHError, match="pass loss_of"):
        round_plan(PLAN, GQA, "layer", "budget", BUCKETS)
