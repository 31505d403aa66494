"""The evaluation dtype of a Hugging Face model: bfloat16 where it measures faster (or when asked),
with the float32 and bfloat16 losses measured on the same sample; the service shows the choice."""

from __future__ import annotations

import pytest
import torch

from aah_core.analysis.evaluate import evaluate_loss
from aah_core.data import EvalBatch
from aah_core.hf import open_hf_model
from aah_core.hf.precision import MIN_SPEEDUP, bf16_speedup, settle_precision
from aah_core.model_files import open_model
from tests.hf.tiny import TEXTS

T = 24


def _sample(model) -> EvalBatch:
    ids = torch.tensor([model.tokenizer.encode(" ".join(TEXTS))[: T + 1]])
    return EvalBatch(ids[:, :-1], ids[:, 1:], ["text"])


def test_bfloat16_when_requested_with_both_losses_measured(hf_root):
    model = open_hf_model(hf_root / "llama", dtype="float32", seq_len=T)
    sample = _sample(model)
    f32 = evaluate_loss(model, sample)
    p = settle_precision(model, sample, requested="bfloat16")
    assert model.dtype == torch.bfloat16 and (p.dtype, p.choice, p.tokens) == ("bfloat16", "requested", T)
    assert p.loss_float32 == f32
    assert p.loss_bfloat16 == evaluate_loss(model, sample)  # the model now evaluates in bfloat16
    assert p.loss_delta == pytest.approx(p.loss_bfloat16 - f32) and p.loss_delta != 0.0
    assert abs(p.loss_delta) < 0.1


def test_float32_when_requested_leaves_the_model_and_measures_no_loss(hf_root):
    model = open_hf_model(hf_root / "qwen3", dtype="float32", seq_len=T)
    p = settle_precision(model, _sample(model), requested="float32")
    assert model.dtype == torch.float32 and p.dtype == "float32" and p.loss_delta is None


def test_the_service_opens_a_model_in_the_dtype_measured_faster_here(hf_root):
    opened = open_model(hf_root / "gpt2", seq_len=T)
    p = opened.precision
    faster = bf16_speedup(512) >= MIN_SPEEDUP  # the same (cached) measurement the choice used
    assert (p.choice, p.dtype) == ("measured", "bfloat16" if faster else "float32")
    assert opened.model.dtype == (torch.bfloat16 if faster else torch.float32)
    assert (p.loss_delta is not None) == faster


def test_only_a_float32_model_is_settled(hf_root):
    model = open_hf_model(hf_root / "llama", dtype="bfloat16", seq_len=T)
    with pytest.raises(ValueError, match="float32"):
        settle_precision(model, _sample(model))
