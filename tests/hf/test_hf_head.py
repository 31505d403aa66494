"""The Hugging Face adapter never runs the LM head it does not need: embed and layer capture stop
before it, the loss goes through the chunked head (aah_core.head_loss), generation runs it once per
token; a model with something after its head (soft-capping) falls back to its own logits."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from aah_core.analysis.evaluate import PrefixCachedEvaluator
from aah_core.data import EvalBatch
from aah_core.hf import open_hf_model
from aah_core.inference.generate import generate
from tests.hf.tiny import FAMILIES

T = 16


def _count_head_calls(model) -> list[int]:
    calls = [0]

    def hook(module, args, output):
        calls[0] += 1

    model._head.register_forward_hook(hook)
    return calls


def _batch(seed: int = 0) -> EvalBatch:
    idx = torch.randint(0, 300, (2, T + 1), generator=torch.Generator().manual_seed(seed))
    idx[1, -3:] = -1  # ignored targets
    return EvalBatch(idx[:, :-1].clamp(min=0), idx[:, 1:], ["text", "text"])


def _reference_losses(model, batch: EvalBatch, plan: torch.Tensor) -> torch.Tensor:
    logits = model.logits(model.run_layers(model.embed(batch.idx), plan))
    return F.cross_entropy(logits.flatten(0, 1), batch.targets.flatten(), ignore_index=-1,
                           reduction="none").view_as(batch.targets)


@pytest.mark.parametrize("family", FAMILIES)
def test_chunked_head_losses_equal_the_models_own_logits(hf_root, family):
    model = open_hf_model(hf_root / family, dtype="float32", seq_len=T)
    batch = _batch()
    plan = torch.randint(1, T + 1, (model.n_layer, model.n_head), generator=torch.Generator().manual_seed(1))
    ours = PrefixCachedEvaluator(model, batch).token_losses(plan)
    torch.testing.assert_close(ours, _reference_losses(model, batch, plan), rtol=1e-5, atol=1e-5)
    assert model._plain_head is True


def test_embed_and_the_loss_never_run_the_lm_head_and_generation_runs_it_once_per_token(hf_root):
    model = open_hf_model(hf_root / "qwen3", dtype="float32", seq_len=T)
    batch = _batch()
    evaluator = PrefixCachedEvaluator(model, batch)
    evaluator.loss(model.plan)  # the first loss checks the head once (two positions) ...
    calls = _count_head_calls(model)
    model.embed(batch.idx)
    edited = model.plan.clone()
    edited[0, 0] = 2
    evaluator.loss(edited)  # ... after that neither embed nor a loss calls the model's head
    assert calls[0] == 0
    result = generate(model, batch.idx[:1, :4], max_new_tokens=5)
    assert result.tokens.shape[1] == 5 and calls[0] == 5


def test_a_head_followed_by_soft_capping_falls_back_to_the_models_own_logits(hf_root):
    model = open_hf_model(hf_root / "gemma3", dtype="float32", seq_len=T)
    model.hf.config.final_logit_softcapping = 3.0  # gemma's forward caps the logits after its head
    batch = _batch(seed=2)
    ours = PrefixCachedEvaluator(model, batch).token_losses(model.plan)
    assert model._plain_head is False
    torch.testing.assert_close(ours, _reference_losses(model, batch, model.plan), rtol=1e-5, atol=1e-5)
