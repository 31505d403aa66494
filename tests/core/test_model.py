import pytest
import torch

from aah_core.analysis.evaluate import PrefixCachedEvaluator, evaluate_loss
from aah_core.attention import available_backends
from aah_core.data import EvalBatch
from aah_core.model import WindowedGPT, token_losses
from aah_core.model_config import ModelConfig

CPU_TRAIN_BACKENDS = [b for b in available_backends("cpu") if b not in ("flex",)]


def _model(positions: str, dtype=torch.float64) -> WindowedGPT:
    torch.manual_seed(0)
    cfg = ModelConfig(n_layer=2, n_head=3, d_model=24, seq_len=40, positions=positions, buckets=[2, 8, None])
    return WindowedGPT(cfg).to(dtype)


@pytest.mark.parametrize("positions", ["rope", "learned"])
def test_loss_and_grads_agree_on_every_cpu_backend(positions):
    model = _model(positions)
    plan = torch.tensor([[1, 7, 40], [3, 39, 2]])
    idx = torch.randint(0, 256, (2, 37))
    losses, grads = {}, {}
    for backend in CPU_TRAIN_BACKENDS:
        model.zero_grad()
        _, loss = model(idx, idx.roll(-1, 1), plan=plan, backend=backend)
        loss.backward()
        losses[backend] = loss.item()
        grads[backend] = model.blocks[0].attn.qkv.weight.grad.clone()
    for backend in CPU_TRAIN_BACKENDS:
        assert losses[backend] == pytest.approx(losses["reference"], rel=1e-9)
        torch.testing.assert_close(grads[backend], grads["reference"], rtol=1e-8, atol=1e-10)


def test_flex_forward_loss_matches_reference_when_available():
    if "flex" not in available_backends("cpu"):
        pytest.skip("flex backend not available on this machine")
    model = _model("rope", torch.float32)
    idx = torch.randint(0, 256, (1, 40))
    plan = torch.tensor([[1, 7, 40], [3, 39, 2]])
    with torch.no_grad():
        ref = model(idx, idx, plan=plan, backend="reference")[1].item()
        flex = model(idx, idx, plan=plan, backend="flex")[1].item()
    assert flex == pytest.approx(ref, rel=1e-5)


def test_windows_change_the_loss_and_full_windows_equal_causal():
    model = _model("rope")
    idx = torch.randint(0, 256, (2, 40))
    full = model(idx, idx, plan=torch.full((2, 3), 40))[1].item()
    huge = model(idx, idx, plan=torch.full((2, 3), 10_000))[1].item()
    narrow = model(idx, idx, plan=torch.full((2, 3), 1))[1].item()
    assert full == huge
    assert narrow != pytest.approx(full, rel=1e-6)


def test_prefix_cached_reevaluation_equals_full_evaluation_exactly():
    model = _model("rope").eval()
    idx = torch.randint(0, 256, (3, 40))
    batch = EvalBatch(idx, idx.roll(-1, 1), ["text"] * 3)
    evaluator = PrefixCachedEvaluator(model, batch)
    base = torch.full((2, 3), 40)
    assert evaluator.loss(base) == evaluate_loss(model, batch, base)
    assert evaluator.layers_recomputed == 2
    edit_last = base.clone()
    edit_last[1, 2] = 4
    assert evaluator.loss(edit_last) == evaluate_loss(model, batch, edit_last)
    assert evaluator.layers_recomputed == 1  # only the edited last layer ran again
    edit_first = edit_last.clone()
    edit_first[0, 0] = 2
    assert evaluator.loss(edit_first) == evaluate_loss(model, batch, edit_first)
    assert evaluator.layers_recomputed == 2
    assert evaluator.loss(edit_first) == evaluate_loss(model, batch, edit_first)
    assert evaluator.layers_recomputed == 0
    full_forward = model.run_layers(model.embed(idx), base)  # no prefix reused
    torch.testing.assert_close(evaluator.token_losses(base), model.token_losses(full_forward, batch.targets),
                               rtol=0, atol=0)
    # the chunked head loss against the whole logits tensor (float64 here): equal to rounding
    torch.testing.assert_close(evaluator.token_losses(base), token_losses(model(idx, plan=base)[0], batch.targets),
                               rtol=1e-12, atol=1e-12)


def test_attention_probs_rows_sum_to_one_inside_the_window():
    model = _model("rope").eval()
    idx = torch.randint(0, 256, (1, 40))
    plan = torch.tensor([[1, 7, 40], [3, 39, 2]])
    probs = model.attention_probs(idx, plan, layer=1)  # (1, 3, 40, 40)
    torch.testing.assert_close(probs.sum(-1), torch.ones(1, 3, 40, dtype=probs.dtype))
    i, j = torch.meshgrid(torch.arange(40), torch.arange(40), indexing="ij")
    assert probs[0, 0][(j <= i - 3) | (j > i)].abs().max() == 0  # head 0 of layer 1 has window 3
    # ... and it does see all of its 3 most recent keys i-2..i (none cut too early)
    assert (probs[0, 0][(j > i - 3) & (j <= i)] > 0).all()
    assert ((probs[0, 0] > 0).sum(-1) == torch.arange(40).clamp(max=2) + 1).all()


def test_init_starts_near_uniform_loss():
    torch.manual_seed(0)
    model = WindowedGPT(ModelConfig(n_layer=2, n_head=2, d_model=32, seq_len=32, buckets=[4, None]))
    idx = torch.randint(0, 256, (4, 32))
    loss = model(idx, idx.roll(-1, 1))[1].item()
    assert abs(loss - torch.log(torch.tensor(256.0)).item()) < 0.2  # not the paper's ~62
