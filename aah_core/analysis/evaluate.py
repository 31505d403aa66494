"""Loss evaluation under a window plan, and prefix-cached re-evaluation after an edit.

The residual stream entering layer l depends only on plan rows < l, so after an edit
whose first changed layer is L the evaluator reuses the cached residual entering L and
recomputes layers >= L only. The cache follows the latest plan evaluated.
"""

from __future__ import annotations

import torch

from aah_core.config import RunConfig
from aah_core.data import DataStream, EvalBatch
from aah_core.model_api import WindowedLM


def make_eval_batch(config: RunConfig, eval_set: str = "mixed", n_seq: int = 4) -> EvalBatch:
    """The fixed evaluation batch of a run config: the same sequences every call."""
    return DataStream(config.data, config.model.seq_len).eval_batch(eval_set, n_seq)


def model_device(model: WindowedLM) -> torch.device:
    """The device a model's weights live on (batches are moved there before a forward)."""
    return next(model.parameters()).device


def _mean_loss(losses: torch.Tensor, targets: torch.Tensor) -> float:
    """Mean of per-token losses over the target tokens (those not -1)."""
    return float(losses.sum() / (targets >= 0).sum())


@torch.no_grad()
def evaluate_loss(model: WindowedLM, batch: EvalBatch, plan: torch.Tensor | None = None, backend: str = "auto") -> float:
    """Mean cross-entropy over the batch's target tokens under `plan` (default: the model's own)."""
    plan = model.plan if plan is None else plan
    batch = batch.to(model_device(model))
    final = model.run_layers(model.embed(batch.idx), plan, backend=backend)
    return _mean_loss(model.token_losses(final, batch.targets), batch.targets)


class PrefixCachedEvaluator:
    """Evaluates many plans on one fixed batch, recomputing only from the first edited layer."""

    def __init__(self, model: WindowedLM, batch: EvalBatch, backend: str = "auto") -> None:
        self.model = model.eval()
        self.batch = batch.to(model_device(model))
        self.backend = backend
        self._plan: torch.Tensor | None = None
        self._sinks = model.sinks  # the sink tokens the cached residuals were computed with
        self._residuals: list[torch.Tensor] = []  # residual entering each layer under self._plan
        self._final: torch.Tensor | None = None
        self.layers_recomputed = 0  # of the last call, for tests and benchmarks

    def first_changed_layer(self, plan: torch.Tensor) -> int:
        """The first layer whose row differs from the cached plan (n_layer if none)."""
        if self._plan is None:
            return 0
        changed = (plan != self._plan).any(dim=1).nonzero()
        return int(changed[0]) if len(changed) else self.model.n_layer

    @torch.no_grad()
    def final_residual(self, plan: torch.Tensor, sinks: int | None = None) -> torch.Tensor:
        """The final residual under `plan` and `sinks` (None: the model's own); other sinks change every layer."""
        sinks = self.model.sinks if sinks is None else sinks
        start = self.first_changed_layer(plan) if sinks == self._sinks else 0
        if start == self.model.n_layer and self._final is not None:
            self.layers_recomputed = 0
            return self._final
        x = self.model.embed(self.batch.idx) if start == 0 else self._residuals[start]
        residuals = self._residuals[:start]
        self._final = self.model.run_layers(x, plan, start=start, backend=self.backend, residuals=residuals,
                                            sinks=sinks)
        self._residuals, self._plan, self._sinks = residuals, plan.clone(), sinks
        self.layers_recomputed = self.model.n_layer - start
        return self._final

    @torch.no_grad()
    def loss(self, plan: torch.Tensor, sinks: int | None = None) -> float:
        return _mean_loss(self.token_losses(plan, sinks), self.batch.targets)

    @torch.no_grad()
    def token_losses(self, plan: torch.Tensor, sinks: int | None = None) -> torch.Tensor:
        """Per-token losses [B, T] (0 where the target is ignored) under `plan` and `sinks` (None: the model's)."""
        return self.model.token_losses(self.final_residual(plan, sinks), self.batch.targets)
