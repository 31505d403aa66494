"""A window controller that learns (the arm the paper lacked, aah_method §8.2): preset `learned_budget`.

Each (layer, head) holds logits over the model's buckets. During the soft phase, attention
runs with a *soft window*: query i weighs key j by the probability that the head's window
covers distance d = i - j, m_h(d) = sum_k p_hk [d < w_k], i.e. an additive score bias
log m_h(d). A one-hot p is exactly the hard window, so annealing the softmax temperature
moves the model from the relaxation to the hard plan it will run. The LM loss trains the
logits through that bias; a hinge on the expected coverage keeps them under the budget.
After `harden_at` the plan is the argmax, repaired greedily to fit the budget, and frozen;
training continues on the hard plan so that the final weights match it.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn

from aah_core.config import RunConfig
from aah_core.controller import Controller
from aah_core.controller_config import LearnedSettings
from aah_core.errors import InvalidConfig
from aah_core.model import WindowedGPT
from aah_core.windows import pair_count

PHASES = ("full", "soft", "hard")


def bucket_costs(buckets: list[int], seq_len: int, metric: str, sinks: int = 0) -> torch.Tensor:
    """Coverage of one head at each bucket [K] (causal_coverage or acr, sink keys counted): the plan's is their mean."""
    full = seq_len * (seq_len + 1) / 2
    if metric == "acr":
        return torch.tensor([min(w + sinks, seq_len) / seq_len for w in buckets], dtype=torch.float64)
    return torch.tensor([pair_count(w, seq_len, sinks) / full for w in buckets], dtype=torch.float64)


def soft_window_bias(probs: torch.Tensor, buckets: list[int], T: int, sinks: int = 0) -> torch.Tensor:
    """probs: [H, K] over buckets -> additive score bias [H, T, T]: log m_h(i - j), -inf where j > i,
    and 0 (always seen) at the sink keys j < sinks."""
    d = torch.arange(T, device=probs.device)
    covers = (d.view(1, T) < torch.tensor(buckets, device=probs.device).clamp(max=T).view(-1, 1)).to(probs.dtype)  # (K, T)
    log_m = (probs @ covers).clamp(min=1e-12).log()  # (H, T): log P(window > d)
    dist = d.view(T, 1) - d.view(1, T)  # (T, T): i - j
    bias = log_m[:, dist.clamp(min=0)]  # (H, T, T)
    sink = (d.view(1, T) < sinks) & (dist >= 0)  # (T, T)
    return bias.masked_fill(sink, 0.0).masked_fill(dist < 0, float("-inf"))


def repair_to_budget(idx: torch.Tensor, logits: torch.Tensor, costs: torch.Tensor, budget: float) -> torch.Tensor:
    """Lower heads one bucket at a time until mean cost <= budget, each time giving up the least preference
    (logit drop) per unit of coverage saved. idx: [N] bucket indices; logits: [N, K]; costs: [K]."""
    idx = idx.clone()
    while float(costs[idx].mean()) > budget + 1e-12:
        can = (idx > 0).nonzero().flatten()
        if len(can) == 0:
            break
        drop = logits[can, idx[can]] - logits[can, idx[can] - 1]
        saved = (costs[idx[can]] - costs[idx[can] - 1]).clamp(min=1e-12)
        h = can[int(torch.argmin(drop / saved))]
        idx[h] -= 1
    return idx


class LearnedBudgetController(Controller):
    """Controller mode 'learned': trains per-head bucket logits with the LM loss under a coverage budget."""

    def __init__(self, config: RunConfig, model: WindowedGPT) -> None:
        self.config, self.model = config, model
        s = config.controller_settings
        assert isinstance(s, LearnedSettings), s
        self.s = s
        m = config.model
        self.T, self.buckets = m.seq_len, m.bucket_windows
        self.costs = bucket_costs(self.buckets, self.T, s.budget_metric, model.sinks)
        self.param = nn.Parameter(torch.zeros(m.n_layer, m.n_head, len(self.buckets), device=model.plan.device))
        steps = config.train.max_steps
        self.start_step = int(round(s.start * steps))
        self.harden_step = max(self.start_step + 1, int(round(s.harden_at * steps)))
        self.phase, self.step, self.tau = "full", -1, s.tau_start
        self.hard_idx: torch.Tensor | None = None
        self._metrics: dict[str, float] = {}
        self._set_bias(False)
        model.set_plan(torch.full_like(model.plan, self.T))

    # ---- policy --------------------------------------------------------------------------------
    def logits(self) -> torch.Tensor:
        return self.s.param_scale * self.param  # (L, H, K)

    def probs(self) -> torch.Tensor:
        return torch.softmax(self.logits() / self.tau, dim=-1)

    def expected_coverage(self) -> torch.Tensor:
        return (self.probs() * self.costs.to(self.param)).sum(-1).mean()

    def _temperature(self, step: int) -> float:
        span = max(1, self.harden_step - self.start_step)
        frac = min(max((step - self.start_step) / span, 0.0), 1.0)
        return self.s.tau_start * (self.s.tau_end / self.s.tau_start) ** frac

    def _set_bias(self, on: bool) -> None:
        for layer in range(self.model.n_layer):
            bias = lambda T, layer=layer: soft_window_bias(  # noqa: E731
                self.probs()[layer], self.buckets, T, self.model.sinks)
            self.model.block(layer).attn.window_bias = bias if on else None

    def _argmax_plan(self, idx: torch.Tensor) -> torch.Tensor:
        windows = torch.tensor(self.buckets, device=idx.device).clamp(max=self.T)
        return windows[idx].to(torch.long)

    def harden(self) -> None:
        """Freeze the plan: the argmax per head, lowered greedily until it fits the budget."""
        with torch.no_grad():
            logits = self.logits().detach().double().cpu()
            L, H, K = logits.shape
            flat = repair_to_budget(logits.argmax(-1).flatten(), logits.view(L * H, K), self.costs, self.s.budget)
        self.hard_idx = flat.view(L, H)
        self.phase = "hard"
        self.param.requires_grad_(False)
        self._set_bias(False)

    def on_step_start(self, step: int) -> None:
        self.step = step
        if self.phase != "hard" and step >= self.harden_step:
            self.harden()
        if self.phase == "hard":
            assert self.hard_idx is not None, "harden() (or a checkpoint of a hard phase) set it"
            plan = self._argmax_plan(self.hard_idx)
        elif step >= self.start_step:
            if self.phase == "full":
                self.phase = "soft"
                self._set_bias(True)
            self.tau = self._temperature(step)
            plan = self._argmax_plan(self.logits().detach().argmax(-1).cpu())
        else:
            plan = torch.full_like(self.model.plan, self.T)
        self.model.set_plan(plan.to(self.model.plan.device))
        self._metrics = {"ctrl/phase": float(PHASES.index(self.phase)), "ctrl/tau": self.tau}
        if self.phase == "soft":
            self._metrics["ctrl/expected_coverage"] = float(self.expected_coverage().detach())

    def extra_loss(self) -> torch.Tensor | None:
        if self.phase != "soft":
            return None
        excess = torch.relu(self.expected_coverage() - self.s.budget)
        self._metrics["ctrl/budget_penalty"] = float(self.s.penalty * excess.detach())
        return (self.s.penalty * excess).float()

    def metrics(self) -> dict[str, float]:
        return dict(self._metrics)

    def parameters(self) -> list[nn.Parameter]:
        return [self.param]

    def close(self) -> None:
        self._set_bias(False)

    # ---- checkpoint ----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "mode": "learned", "phase": self.phase, "step": self.step, "tau": self.tau,
            "param": self.param.detach().cpu().tolist(),
            "hard_idx": None if self.hard_idx is None else self.hard_idx.tolist(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("mode") != "learned":
            raise InvalidConfig(f"controller state is for mode {state.get('mode')!r}; this run uses mode 'learned'")
        param = torch.tensor(state["param"], dtype=self.param.dtype)
        if param.shape != self.param.shape:
            raise InvalidConfig(f"controller state has logits of shape {tuple(param.shape)}; expected {tuple(self.param.shape)}")
        with torch.no_grad():
            self.param.copy_(param)
        self.step, self.tau, self.phase = state["step"], state["tau"], state["phase"]
        self.hard_idx = None if state["hard_idx"] is None else torch.tensor(state["hard_idx"], dtype=torch.long)
        self.param.requires_grad_(self.phase != "hard")
        self._set_bias(self.phase == "soft")

