"""Baselines matched to a target causal coverage: within ±0.02 for every target, the nearest integer
window, and the suite's matched rows built with those settings."""

import pytest
import torch

from aah_core.controller import build_controller
from aah_core.errors import InvalidConfig
from aah_core.matching import matched_local_global, matched_window, plan_coverage
from aah_core.model import WindowedGPT
from aah_core.suite import MATCHED_ROWS, run_config
from aah_core.windows import causal_coverage, coverage_metrics

TARGETS = [0.15, 0.3, 0.3907, 0.5, 0.62, 0.8, 0.95]


@pytest.mark.parametrize("T", [128, 256])
@pytest.mark.parametrize("sinks", [0, 4])
@pytest.mark.parametrize("target", TARGETS)
def test_the_matched_window_is_the_nearest_of_all_windows_and_within_0_02(target, sinks, T):
    w = matched_window(T, target, sinks)
    got = causal_coverage(torch.tensor([[w]]), T, sinks)
    assert abs(got - target) <= 0.02
    every = [abs(causal_coverage(torch.tensor([[x]]), T, sinks) - target) for x in range(1, T + 1)]
    assert abs(got - target) == min(every)  # no other window is closer


@pytest.mark.parametrize("n_head", [4, 12])
@pytest.mark.parametrize("target", TARGETS)
def test_local_global_keeps_one_global_head_and_matches_within_0_02(target, n_head):
    T = 128
    g, w = matched_local_global(T, n_head, target)
    plan = torch.tensor([[T] * g + [w] * (n_head - g)] * 3)  # three layers alike
    assert abs(causal_coverage(plan, T) - target) <= 0.02
    floor = plan_coverage(n_head, 1, 1, T)  # one global head, the others at window 1
    assert g == (1 if target >= floor else 0)  # one global head whenever it fits under the target


def test_targets_outside_0_1_are_refused():
    with pytest.raises(InvalidConfig, match="target coverage"):
        matched_window(128, 0.0)
    with pytest.raises(InvalidConfig, match="global_heads"):
        matched_local_global(128, 4, 0.5, global_heads=4)


@pytest.mark.parametrize("row", [r for r in MATCHED_ROWS if r != "learned_budget"])
@pytest.mark.parametrize("target", [0.3, 0.3907, 0.55, 0.7])
def test_the_suite_builds_each_matched_row_at_the_target_coverage(row, target):
    cfg = run_config(row, "mini", seed=0, impl="faithful", matched=target)
    model = WindowedGPT(cfg.model)
    build_controller(cfg, model)  # the static controller sets the plan the row trains under
    measured = coverage_metrics(model.plan, cfg.model.seq_len, cfg.model.sinks)["causal_coverage"]
    assert abs(measured - target) <= 0.02
    if row == "sink_window":
        assert cfg.model.sinks == 4
    if row == "local_global":
        assert cfg.controller["global_heads"] == 1 and model.plan[:, 0].eq(cfg.model.seq_len).all()
