"""Exact cost figures of a plan: the formula, an independent count, and the real cache's size."""

import pytest
import torch

from aah_core.errors import AAHError
from aah_core.inference.cost import ModelShape, check_context, measure_cost, plan_cost
from aah_core.inference.generate import forward_cached, new_cache
from aah_core.model import WindowedGPT
from aah_core.model_config import ModelConfig


def _model(sinks: int = 0) -> WindowedGPT:
    torch.manual_seed(0)
    cfg = ModelConfig(n_layer=2, n_head=4, d_model=32, seq_len=32, buckets=[4, 8, None], sinks=sinks)
    return WindowedGPT(cfg).eval()


@pytest.mark.parametrize("w, N", [(1, 1), (1, 10), (7, 3), (7, 7), (7, 20), (32, 32)])
def test_one_head_caches_min_w_n_positions(w, N):
    shape = ModelShape(n_layer=1, n_head=1, n_kv_head=1, head_dim=8, seq_len=32)
    cost = plan_cost(torch.tensor([[w]]), N, shape)
    assert cost.kv_entries == min(w, N)
    assert cost.kv_bytes == min(w, N) * 2 * 8 * 4
    assert (cost.kv_entries_full, cost.kv_bytes_full) == (N, N * 2 * 8 * 4)


def _count_pairs(w: int, N: int, s: int = 0) -> int:
    return sum(1 for i in range(N) for j in range(N) if j <= i and (i - w < j or j < s))


@pytest.mark.parametrize("sinks", [0, 1, 4, 32])
def test_attention_pairs_equal_a_count_of_the_allowed_query_key_pairs(sinks):
    plan = torch.tensor([[1, 3, 32, 9], [5, 32, 2, 17]])
    shape = ModelShape.of(_model(sinks))
    for N in (1, 4, 9, 20, 32):
        counted = sum(_count_pairs(w, N, sinks) for w in plan.flatten().tolist())
        cost = plan_cost(plan, N, shape)
        assert cost.attention_pairs == counted
        assert cost.attention_pairs_full == 8 * N * (N + 1) // 2


@pytest.mark.parametrize("w, s, N", [(1, 4, 3), (1, 4, 10), (7, 4, 20), (30, 4, 32), (7, 0, 20), (2, 40, 32)])
def test_one_head_caches_its_window_and_its_sinks(w, s, N):
    shape = ModelShape(n_layer=1, n_head=1, n_kv_head=1, head_dim=8, seq_len=32, sinks=s)
    cost = plan_cost(torch.tensor([[w]]), N, shape)
    # the distinct positions a decode step at N-1 may read: the first s and the last w of 0..N-1
    held = len(set(range(min(s, N))) | set(range(max(0, N - w), N)))
    assert cost.kv_entries == held
    assert cost.kv_bytes == held * 2 * 8 * 4


@pytest.mark.parametrize("sinks", [0, 3])
def test_exact_kv_bytes_equal_the_decoding_cache_at_every_context(sinks):
    model = _model(sinks)
    plan = torch.tensor([[1, 3, 32, 9], [5, 32, 2, 17]])
    shape = ModelShape.of(model)
    cache = new_cache(model, plan)
    idx = torch.randint(0, 256, (1, 32))
    forward_cached(model, idx[:, :2], cache, plan)
    for N in range(2, 33):
        assert cache.nbytes() == plan_cost(plan, N, shape).kv_bytes
        assert cache.entries() == plan_cost(plan, N, shape).kv_entries
        if N < 32:
            forward_cached(model, idx[:, N : N + 1], cache, plan)


def test_grouped_query_kv_heads_keep_the_largest_window_and_say_so():
    shape = ModelShape(n_layer=1, n_head=4, n_kv_head=2, head_dim=4, seq_len=64)
    cost = plan_cost(torch.tensor([[3, 7, 5, 64]]), 20, shape)
    assert cost.kv_windows == [[7, 20]]
    assert cost.kv_entries == 7 + 20
    assert cost.attention_pairs == sum(w * 20 - w * (w - 1) // 2 for w in (3, 7, 5, 20))


@pytest.mark.parametrize("bad", [0, -1, 33, 2.5, True, "8", None])
def test_a_context_outside_the_model_is_refused(bad):
    with pytest.raises(AAHError, match=r"context must be an integer in \[1, 32\]"):
        check_context(bad, 32)


def test_measured_cost_times_both_plans_and_gives_ratios():
    model = _model()
    plan = torch.full((2, 4), 4)
    m = measure_cost(model, plan, 32, repeats=1, decode_steps=2)
    assert m.prefill_ms > 0 and m.prefill_ms_full > 0
    assert m.decode_step_ms > 0 and m.decode_step_ms_full > 0
    ratios = m.ratios()
    assert ratios["prefill_ratio"] == m.prefill_ms / m.prefill_ms_full
    assert ratios["decode_step_ratio"] == m.decode_step_ms / m.decode_step_ms_full
    assert m.peak_memory_bytes is None  # CPU: not measured
    assert m.to_dict()["tokens_per_s"] == 1000.0 / m.decode_step_ms
    assert measure_cost(model, plan, 1, repeats=1).decode_step_ms is None  # no step fits in one position
