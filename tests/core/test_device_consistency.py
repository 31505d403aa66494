"""The model may live on another device than the batches and plans handed to it (a GPU in
training and in the service). These tests put the model on `meta` and record every aten op:
an op that receives tensors from two devices is exactly the crash a CUDA run would hit."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from aah_core.analysis.evaluate import PrefixCachedEvaluator, evaluate_loss, make_eval_batch
from aah_core.controller.learned import soft_window_bias
from aah_core.model import Rotary, WindowedGPT
from aah_core.presets import get_preset
from aah_core.train import device_and_backend, model_and_controller
from aah_core.windows import full_plan


class DeviceMixRecorder(TorchDispatchMode):
    """Records ops whose (non-scalar) tensor arguments sit on more than one device; reads of a
    meta scalar (`.item()`, `float()`) answer 0.0 so a whole evaluation can run on meta."""

    def __init__(self) -> None:
        super().__init__()
        self.mixed: list[tuple[str, set[str]]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        tensors = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        devices = {str(t.device) for t in tensors if t.dim() > 0}
        if len(devices) > 1:
            self.mixed.append((str(func), devices))
        if func is torch.ops.aten._local_scalar_dense.default and tensors[0].device.type == "meta":
            return 0.0
        return func(*args, **kwargs)


@pytest.fixture(scope="module")
def tiny():
    config = get_preset("tiny")
    model = WindowedGPT(config.model).eval()
    batch = make_eval_batch(config, "text", 2)  # on the CPU, as DataStream makes it
    m = config.model
    plan = full_plan(m.n_layer, m.n_head, m.seq_len)  # a CPU plan, as the service sends it
    plan[0, 0] = 8
    return model.to("meta"), batch, plan


def test_evaluate_loss_moves_the_batch_to_the_model(tiny):
    model, batch, plan = tiny
    with DeviceMixRecorder() as rec:
        evaluate_loss(model, batch, plan)
    assert rec.mixed == []


def test_prefix_cached_evaluator_moves_the_batch_to_the_model(tiny):
    model, batch, plan = tiny
    with DeviceMixRecorder() as rec:
        evaluator = PrefixCachedEvaluator(model, batch)
        evaluator.loss(plan)
        edited = plan.clone()
        edited[1, 0] = 4
        evaluator.loss(edited)
        evaluator.token_losses(edited)
    assert rec.mixed == []
    assert evaluator.batch.idx.device.type == "meta"


def test_the_recorder_sees_a_mix():
    """The check above can fail: a CPU batch fed straight into a meta model is recorded."""
    model = WindowedGPT(get_preset("tiny").model).to("meta")
    with DeviceMixRecorder() as rec:
        model.embed(torch.zeros(1, 4, dtype=torch.long))
    assert [op for op, _ in rec.mixed] == ["aten.embedding.default"]


def test_rotary_computes_in_float32_and_casts_the_result():
    rotary = Rotary(head_dim=16, seq_len=256, base=10000.0)
    x = torch.randn(2, 3, 256, 16).to(torch.bfloat16)
    want = rotary(x.float()).to(torch.bfloat16)
    assert rotary(x).dtype == torch.bfloat16
    assert torch.equal(rotary(x), want)


def test_the_learned_controller_lives_on_the_models_device():
    """train() builds the controller after moving the model, so its logits and soft window bias
    are on the model's device (they were created on the CPU and handed to a CUDA SDPA)."""
    model, controller, step = model_and_controller(get_preset("learned_budget"), torch.device("meta"))
    assert step == 0 and next(model.parameters()).device.type == "meta"
    assert [p.device.type for p in controller.parameters()] == ["meta"]
    with DeviceMixRecorder() as rec:
        bias = soft_window_bias(controller.probs()[0], controller.buckets, model.config.seq_len)
        controller.expected_coverage()
    assert bias.device.type == "meta" and rec.mixed == []


@pytest.mark.parametrize(
    "gpus, local_rank, local_world, want",
    [
        (0, 0, 1, ("cpu", "gloo")),
        (1, 0, 1, ("cuda:0", "nccl")),
        (2, 1, 2, ("cuda:1", "nccl")),
        (1, 1, 2, ("cpu", "gloo")),  # two ranks, one GPU: NCCL would need a GPU per rank
        (1, 0, 2, ("cpu", "gloo")),  # ... and every rank must agree
    ],
)
def test_device_and_process_group_backend(monkeypatch, gpus, local_rank, local_world, want):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpus > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    monkeypatch.setenv("LOCAL_RANK", str(local_rank))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(local_world))
    device, backend = device_and_backend()
    assert (str(device), backend) == want
