"""AdamW as torch computes it, without `torch.optim.Optimizer`'s start-up cost.

`torch.optim.Optimizer` hides `add_param_group`, `step`, `zero_grad` and its state-dict methods from
`torch.compile`, and the first of them to run imports `torch._dynamo`: about 800 modules, 1.5 s of CPU
(4 s cold) in every training process, none of which compiles anything. This class does what
`torch.optim.AdamW(groups, lr=..., betas=...)` does with its defaults (no amsgrad, no maximize,
foreach/fused chosen by torch) by calling the same function its `step` calls, `torch.optim.adam.adam`
with decoupled weight decay, on the same per-parameter state (`step`, `exp_avg`, `exp_avg_sq`), so a
checkpoint's trainer state moves between the two. `tests/core/test_optim.py` checks it step for step,
save and resume included, against `torch.optim.AdamW`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch.optim.adam import adam


class AdamW:
    """AdamW over parameter groups, each a dict with "params" and optional "lr", "weight_decay",
    "betas", "eps" overriding the defaults; `param_groups` and the state dict have torch's layout."""

    def __init__(self, groups: Iterable[dict[str, Any]], lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 1e-2) -> None:
        self.defaults: dict[str, Any] = {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay}
        self.param_groups = [{**self.defaults, **group, "params": list(group["params"])} for group in groups]
        params = [p for group in self.param_groups for p in group["params"]]
        if len({id(p) for p in params}) != len(params):
            raise ValueError("some parameters appear in more than one parameter group")
        self.state: dict[torch.Tensor, dict[str, torch.Tensor]] = {}

    def zero_grad(self) -> None:
        """Drop every gradient (torch's default, `set_to_none=True`)."""
        for group in self.param_groups:
            for p in group["params"]:
                p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        """One update of every parameter that has a gradient."""
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            states = [self._state(p) for p in params]
            beta1, beta2 = group["betas"]
            adam(params, [p.grad for p in params], [s["exp_avg"] for s in states], [s["exp_avg_sq"] for s in states],
                 [], [s["step"] for s in states], foreach=None, capturable=False, differentiable=False, fused=None,
                 grad_scale=None, found_inf=None, has_complex=any(torch.is_complex(p) for p in params),
                 decoupled_weight_decay=True, amsgrad=False, beta1=beta1, beta2=beta2, lr=group["lr"],
                 weight_decay=group["weight_decay"], eps=group["eps"], maximize=False)

    def _state(self, p: torch.Tensor) -> dict[str, torch.Tensor]:
        if p not in self.state:  # as torch: the step count on the CPU, the moments beside the parameter
            self.state[p] = {"step": torch.tensor(0.0, dtype=torch.float32),
                             "exp_avg": torch.zeros_like(p, memory_format=torch.preserve_format),
                             "exp_avg_sq": torch.zeros_like(p, memory_format=torch.preserve_format)}
        return self.state[p]

    def _params(self) -> list[torch.Tensor]:
        return [p for group in self.param_groups for p in group["params"]]

    def state_dict(self) -> dict[str, Any]:
        """{"state": {parameter index: its state}, "param_groups": [groups with indices for "params"]},
        numbered across the groups in order, as torch does; the tensors are the live ones."""
        index = {id(p): i for i, p in enumerate(self._params())}
        groups, start = [], 0
        for group in self.param_groups:
            groups.append({**group, "params": list(range(start, start + len(group["params"])))})
            start += len(group["params"])
        return {"state": {index[id(p)]: s for p, s in self.state.items()}, "param_groups": groups}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Take the state (and the groups' settings) of `state_dict`, which must have this optimizer's group
        sizes; the moments move to their parameter's device and dtype, the step count stays as saved."""
        saved = state_dict["param_groups"]
        if [len(g["params"]) for g in saved] != [len(g["params"]) for g in self.param_groups]:
            raise ValueError("the loaded state dict's parameter groups do not match this optimizer's")
        ids = [i for g in saved for i in g["params"]]
        by_id = dict(zip(ids, self._params(), strict=True))
        unknown = set(state_dict["state"]) - set(by_id)
        if unknown:
            raise ValueError(f"the loaded state dict has state for parameters {sorted(unknown)} outside its groups")
        self.state = {
            by_id[i]: {k: v if k == "step" else v.to(device=by_id[i].device, dtype=by_id[i].dtype) for k, v in s.items()}
            for i, s in state_dict["state"].items()
        }
        self.param_groups = [{**g, "params": mine["params"]} for g, mine in zip(saved, self.param_groups, strict=True)]
