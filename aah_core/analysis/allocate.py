"""Window allocation under a coverage budget, without retraining.

Given a trained model, a fixed evaluation batch and a budget (a coverage in (0, 1]), find a
per-head plan with coverage <= budget and low loss:

1. Sensitivity: the loss of shrinking each head alone to each smaller bucket (everything
   else full), measured with the prefix-cached evaluator (layers from the edited one only).
2. Greedy descent from the full plan: each step lowers one head to a smaller bucket. Candidates
   are ranked by predicted loss increase per unit of coverage saved (from the sensitivity
   table); the best few are measured for real and the best measured move is taken.
3. Guard: the best uniform plan (one bucket for all heads) within the budget is measured
   too. If it beats the greedy plan, heads are raised from it greedily while the budget
   allows and the measured loss falls. So the answer is never worse than that uniform plan.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from aah_core.analysis.diagnostics import sensitivity_sweep
from aah_core.analysis.evaluate import PrefixCachedEvaluator
from aah_core.data import EvalBatch
from aah_core.errors import InvalidConfig
from aah_core.inference.cost import ModelShape, plan_cost
from aah_core.model_api import WindowedLM
from aah_core.windows import acr, causal_coverage, tile_coverage

# each takes (plan, seq_len, sinks=...)
METRICS: dict[str, Callable[..., float]] = {"causal_coverage": causal_coverage, "acr": acr, "tile_coverage": tile_coverage}


@dataclass
class AllocationResult:
    plan: torch.Tensor  # [n_layer, n_head] windows (full written as seq_len)
    loss: float  # loss of `plan` on the batch
    curve: list[dict[str, float]]  # the greedy walk: {acr, causal_coverage, kv_bytes, loss} per step, from full
    metric: str = "causal_coverage"
    budget: float = 1.0
    coverage: float = 1.0  # of `plan`, in `metric`
    full_loss: float = 0.0  # loss of the full plan
    uniform: dict[str, float] = field(default_factory=dict)  # best uniform plan within budget: window, loss, coverage
    source: str = "greedy"  # "greedy" or "uniform+ascent"
    evaluations: int = 0


class _Search:
    """Plans as bucket indices [L, H]; losses through one prefix-cached evaluator."""

    def __init__(self, model: WindowedLM, batch: EvalBatch, metric: str, backend: str) -> None:
        self.model, self.metric = model, metric
        self.T, self.sinks = model.seq_len, model.sinks
        self.windows = torch.tensor(sorted({min(b, self.T) for b in model.buckets}), dtype=torch.long)
        self.K = len(self.windows)
        fn = METRICS[metric]
        self.cost = torch.tensor([fn(w.view(1, 1), self.T, sinks=self.sinks) for w in self.windows],
                                 dtype=torch.float64)  # (K,)
        self.ev = PrefixCachedEvaluator(model, batch, backend)
        self.evaluations = 0

    def plan(self, idx: torch.Tensor) -> torch.Tensor:
        return self.windows[idx]

    def coverage(self, idx: torch.Tensor) -> float:
        return float(self.cost[idx].mean())

    def measure(self, plan: torch.Tensor) -> float:
        """The loss of a plan of windows [L, H], counted."""
        self.evaluations += 1
        return self.ev.loss(plan)

    def loss(self, idx: torch.Tensor) -> float:
        return self.measure(self.plan(idx))

    def point(self, idx: torch.Tensor, loss: float) -> dict[str, float]:
        plan = self.plan(idx)
        kv_bytes = plan_cost(plan, self.T, ModelShape.of(self.model)).kv_bytes  # at context T
        return {"acr": acr(plan, self.T, self.sinks), "causal_coverage": causal_coverage(plan, self.T, self.sinks),
                "kv_bytes": kv_bytes, "loss": loss}


def _descend(search: _Search, delta: torch.Tensor, full_loss: float, budget: float, refine: int):
    """Greedy walk from the full plan down to the budget; returns (idx, loss, curve).

    A move lowers one head to any smaller bucket. Moves are ranked by predicted loss increase
    (from the single-head sensitivities) per unit of coverage saved; the best `refine` are
    measured and the best measured ratio is taken.
    """
    L, H, K = delta.shape
    idx = torch.full((L, H), K - 1, dtype=torch.long)
    loss = full_loss
    curve = [search.point(idx, loss)]
    while search.coverage(idx) > budget + 1e-12:
        scored = []
        for layer, h in (idx > 0).nonzero().tolist():
            k = int(idx[layer, h])
            for lower in range(k):
                saved = float(search.cost[k] - search.cost[lower]) / (L * H)
                predicted = max(float(delta[layer, h, lower] - delta[layer, h, k]), 0.0)
                scored.append((predicted / max(saved, 1e-12), layer, h, lower, saved))
        if not scored:
            break
        scored.sort()
        best: tuple[float, torch.Tensor, float] | None = None  # (measured ratio, idx, loss)
        for _, layer, h, lower, saved in scored[:refine]:
            trial = idx.clone()
            trial[layer, h] = lower
            trial_loss = search.loss(trial)
            ratio = (trial_loss - loss) / max(saved, 1e-12)
            if best is None or ratio < best[0]:
                best = (ratio, trial, trial_loss)
        assert best is not None, "refine >= 1 and scored is not empty, so one move was measured"
        _, idx, loss = best
        curve.append(search.point(idx, loss))
    return idx, loss, curve


def _ascend(search: _Search, idx: torch.Tensor, loss: float, budget: float, refine: int, delta: torch.Tensor):
    """Raise heads one bucket at a time while the budget allows and the measured loss falls."""
    L, H, K = delta.shape
    while True:
        options = []
        for layer, h in (idx < K - 1).nonzero().tolist():
            trial = idx.clone()
            trial[layer, h] += 1
            if search.coverage(trial) <= budget + 1e-12:
                k = int(idx[layer, h])
                options.append((float(delta[layer, h, k + 1] - delta[layer, h, k]), layer, h, trial))
        if not options:
            return idx, loss
        options.sort(key=lambda o: o[0])
        measured = [(search.loss(o[3]), o[3]) for o in options[:refine]]
        best_loss, best = min(measured, key=lambda m: m[0])
        if best_loss >= loss:
            return idx, loss
        idx, loss = best, best_loss


def allocate(
    model: WindowedLM,
    batch: EvalBatch,
    budget: float,
    metric: str = "causal_coverage",
    backend: str = "auto",
    refine: int = 3,
) -> AllocationResult:
    """A per-head plan with `metric` <= budget that keeps the loss on `batch` low (see the module docstring).

    Args:
        model: a trained WindowedLM (its buckets are the window choices).
        batch: a fixed evaluation batch (e.g. evaluate.make_eval_batch(config)).
        budget: the coverage allowed, in (0, 1].
        metric: "causal_coverage" (default), "acr" or "tile_coverage".
        refine: candidates measured per greedy step.
    """
    if metric not in METRICS:
        raise InvalidConfig(f"metric must be one of {sorted(METRICS)}; got {metric!r}")
    if isinstance(budget, bool) or not isinstance(budget, (int, float)) or not 0.0 < float(budget) <= 1.0:
        raise InvalidConfig(f"budget must be a coverage in (0, 1]; got {budget!r}")
    if refine < 1:
        raise InvalidConfig(f"refine must be >= 1; got {refine}")
    was_training = model.training
    search = _Search(model, batch, metric, backend)
    if float(search.cost[0]) > budget + 1e-12:
        raise InvalidConfig(
            f"budget {budget} is below the smallest {metric} this model's buckets reach "
            f"({float(search.cost[0]):.4f}, every head at window {int(search.windows[0])})"
        )
    L, H = model.n_layer, model.n_head
    full = torch.full((L, H), search.K - 1, dtype=torch.long)
    if float(search.cost[-1]) <= budget + 1e-12:  # the full plan fits: nothing to weigh
        full_loss, delta = search.loss(full), torch.zeros(L, H, search.K, dtype=torch.float64)
    else:  # delta[l, h, k]: each head alone at bucket k, the rest full (0 at the full bucket)
        full_loss, delta = sensitivity_sweep(search.measure, search.plan(full), search.windows.tolist())
    idx, loss, curve = _descend(search, delta, full_loss, budget, refine)
    # the guard: the largest uniform plan within the budget
    k_uniform = max(k for k in range(search.K) if float(search.cost[k]) <= budget + 1e-12)
    uniform_idx = torch.full((L, H), k_uniform, dtype=torch.long)
    uniform_loss = search.loss(uniform_idx)
    source = "greedy"
    if uniform_loss < loss:
        idx, loss = _ascend(search, uniform_idx, uniform_loss, budget, refine, delta)
        source = "uniform+ascent"
    model.train(was_training)
    return AllocationResult(
        plan=search.plan(idx), loss=loss, curve=curve, metric=metric, budget=float(budget),
        coverage=search.coverage(idx), full_loss=full_loss,
        uniform={"window": int(search.windows[k_uniform]), "loss": uniform_loss,
                 "coverage": float(search.cost[k_uniform])},
        source=source, evaluations=search.evaluations,
    )
