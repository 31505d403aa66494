"""Golden values for the window rules and the three coverage metrics, worked out by hand."""

import pytest
import torch

from aah_core.errors import InvalidWindowPlan
from aah_core.windows import (
    acr,
    causal_coverage,
    check_head_windows,
    coverage_metrics,
    pair_count,
    plan_to_json,
    tile_coverage,
    validate_plan,
    window_fractions,
)


def test_validate_normalises_full_and_large_windows():
    plan = validate_plan([[None, 4], [300, 1]], n_layer=2, n_head=2, seq_len=256)
    assert plan.tolist() == [[256, 4], [256, 1]]
    assert plan_to_json(plan, 256) == [[None, 4], [None, 1]]


@pytest.mark.parametrize(
    "raw, message",
    [
        ([[0, 4], [4, 4]], "layer 0, head 0: window 0"),
        ([[4, 4], [4, -3]], "layer 1, head 1: window -3"),
        ([[4, 2.5], [4, 4]], "layer 0, head 1: got 2.5"),
        ([[4, "8"], [4, 4]], "layer 0, head 1: got '8'"),
        ([[4, True], [4, 4]], "layer 0, head 1: got True"),
        ([[4, 4]], "list of 2 layers"),
        ([[4, 4], [4]], "layer 1: expected 2 windows"),
        ("full", "list of 2 layers"),
    ],
)
def test_validate_refuses_bad_plans_naming_the_place(raw, message):
    with pytest.raises(InvalidWindowPlan, match=message):
        validate_plan(raw, n_layer=2, n_head=2, seq_len=256)


def test_pair_count_by_hand():
    # T=4: w=1 -> 4 pairs (the diagonal); w=2 -> 4 + 3 = 7; w=4 (full) -> 10 = T(T+1)/2
    assert [pair_count(w, 4) for w in (1, 2, 3, 4, 9)] == [4, 7, 9, 10, 10]


def test_acr_and_causal_coverage_by_hand():
    plan = torch.tensor([[1, 2], [4, 8]])  # T=4
    assert acr(plan, 4) == pytest.approx((1 / 4 + 2 / 4 + 1 + 1) / 4)
    assert causal_coverage(plan, 4) == pytest.approx((4 + 7 + 10 + 10) / 40)


def test_tile_coverage_by_hand():
    # T=512, b=128 -> 4 blocks, 10 causal tiles. w=1 touches the 4 diagonal tiles;
    # w=129 also touches the 3 first off-diagonal tiles (closest pair distance 1 <= 128);
    # w=130: distance of the 2nd off-diagonal's closest pair is 129 <= 129 -> 2 more.
    assert tile_coverage(torch.tensor([[1]]), 512) == pytest.approx(4 / 10)
    assert tile_coverage(torch.tensor([[2]]), 512) == pytest.approx(7 / 10)
    assert tile_coverage(torch.tensor([[129]]), 512) == pytest.approx(7 / 10)
    assert tile_coverage(torch.tensor([[130]]), 512) == pytest.approx(9 / 10)
    assert tile_coverage(torch.tensor([[512, 1]]), 512) == pytest.approx((10 + 4) / 20)
    # T not a multiple of b: T=200 -> 2 blocks, 3 tiles
    assert tile_coverage(torch.tensor([[1]]), 200) == pytest.approx(2 / 3)


def test_window_fractions():
    plan = torch.tensor([[4, 4], [256, 16]])
    assert window_fractions(plan, [4, 16, 64, 256], 256) == {"4": 0.5, "16": 0.25, "64": 0.0, "full": 0.25}


@pytest.mark.parametrize("windows, message", [([1, 2], "got 2 windows for 3 heads"), ([1, 0, 2], "head 1"),
                                              ([1, None, 2], "head 1: got None"), ("abc", "sequence")])
def test_head_windows_errors(windows, message):
    with pytest.raises(InvalidWindowPlan, match=message):
        check_head_windows(windows, 3)


def test_the_json_codec_writes_full_as_null_and_reads_null_as_full():
    from aah_core.windows import decode_window, encode_window, plan_to_json

    assert [encode_window(w, 16) for w in (None, 16, 99, 15, 1)] == [None, None, None, 15, 1]
    assert [decode_window(w, 16) for w in (None, 16, 99, 15)] == [16, 16, 16, 15]
    assert plan_to_json([[None, 32], [4, 16]], 16) == plan_to_json(torch.tensor([[16, 32], [4, 16]]), 16)
    assert plan_to_json([[None, 32], [4, 16]], 16) == [[None, None], [4, None]]
    with pytest.raises(InvalidWindowPlan, match="where: window 0"):
        decode_window(0, 16, "where")


def _rule(w: int, s: int, T: int) -> torch.Tensor:
    """[T, T] bool from the sink rule: j <= i and (j > i - w or j < s)."""
    i, j = torch.arange(T).view(T, 1), torch.arange(T).view(1, T)
    return (j <= i) & ((j > i - w) | (j < s))


@pytest.mark.parametrize("T", [1, 7, 64, 200])
@pytest.mark.parametrize("s", [0, 1, 4, 9, 300])
@pytest.mark.parametrize("w", [1, 3, 16, 63, 64, 500])
def test_sink_coverage_counts_every_sink_pair_exactly(w, s, T):
    pairs = int(_rule(w, s, T).sum())  # counted from the rule
    assert pair_count(w, T, s) == pairs
    plan = torch.tensor([[w, T]])
    assert causal_coverage(plan, T, s) == (pairs + T * (T + 1) // 2) / (T * (T + 1))
    # acr: keys the last query sees (its window and the sinks outside it) over T
    last_row = int(_rule(w, s, T)[-1].sum())
    assert acr(plan, T, s) == pytest.approx((last_row + T) / (2 * T), rel=1e-12)


@pytest.mark.parametrize("w, s, T, block", [(1, 4, 300, 128), (3, 130, 300, 128), (200, 2, 512, 128), (5, 0, 260, 64)])
def test_sink_tile_coverage_counts_the_touched_tiles(w, s, T, block):
    allowed = _rule(w, s, T)
    n = -(-T // block)
    touched = sum(bool(allowed[a * block:(a + 1) * block, b * block:(b + 1) * block].any())
                  for a in range(n) for b in range(a + 1))
    assert tile_coverage(torch.tensor([[w]]), T, block, sinks=s) == touched / (n * (n + 1) // 2)


def test_sinks_default_to_the_plain_window_metrics():
    plan = torch.tensor([[4, 16], [64, 1]])
    assert coverage_metrics(plan, 64) == coverage_metrics(plan, 64, 0)
    with_sinks = coverage_metrics(plan, 64, 4)
    assert all(with_sinks[k] > v for k, v in coverage_metrics(plan, 64).items() if k != "tile_coverage")
