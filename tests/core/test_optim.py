"""aah_core.optim.AdamW against torch.optim.AdamW: the same updates, state and state dicts. That training imports
no torch._dynamo (what the class is for) is checked in test_meta.py, in the process that checks a checkpoint read."""

import pytest
import torch

from aah_core.model import WindowedGPT
from aah_core.optim import AdamW
from aah_core.train import build_optimizer
from aah_core.train_state import capture_train_state, restore_train_state


def _groups(model):
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    return [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}]


def _twins(tiny_config, device="cpu"):
    torch.manual_seed(0)
    ours = WindowedGPT(tiny_config.model).to(device)
    theirs = WindowedGPT(tiny_config.model).to(device)
    theirs.load_state_dict(ours.state_dict())
    return ours, theirs


def _steps(model, optimizer, lrs, seed, uses_torch_api):
    """Train `model` for len(lrs) steps at those learning rates on seeded random tokens, as train.py steps."""
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)  # dropout draws the same masks in both runs
    for lr in lrs:
        for group in optimizer.param_groups:
            group["lr"] = lr
        x = torch.randint(0, model.config.vocab_size, (2, 16), generator=gen)
        _, loss = model(x, x)
        optimizer.zero_grad(set_to_none=True) if uses_torch_api else optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def _lockstep(ours, theirs, opt_ours, opt_theirs, lrs, seed):
    """Step both optimizers on the same gradients (one backward pass, copied), so only their updates can differ
    (a CUDA backward need not be bitwise repeatable)."""
    gen = torch.Generator().manual_seed(seed)
    for lr in lrs:
        for group in [*opt_ours.param_groups, *opt_theirs.param_groups]:
            group["lr"] = lr
        x = torch.randint(0, ours.config.vocab_size, (2, 16), generator=gen).to(next(ours.parameters()).device)
        opt_ours.zero_grad()
        opt_theirs.zero_grad(set_to_none=True)
        ours(x, x)[1].backward()
        for a, b in zip(ours.parameters(), theirs.parameters(), strict=True):
            b.grad = a.grad.clone()
        opt_ours.step()
        opt_theirs.step()


def _assert_same(ours, theirs, opt_ours, opt_theirs):
    for (name, a), b in zip(ours.named_parameters(), theirs.parameters(), strict=True):
        assert torch.equal(a, b), name
    sd_ours, sd_theirs = opt_ours.state_dict()["state"], opt_theirs.state_dict()["state"]
    assert sd_ours.keys() == sd_theirs.keys() and sd_ours
    for index, state in sd_ours.items():
        assert state.keys() == sd_theirs[index].keys()
        for key, value in state.items():
            assert value.dtype == sd_theirs[index][key].dtype and value.device == sd_theirs[index][key].device
            assert torch.equal(value, sd_theirs[index][key]), (index, key)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA device"))])
def test_updates_and_state_equal_torchs_adamw_step_for_step(tiny_config, device):
    """On CUDA torch picks its multi-tensor (foreach) kernels, on the CPU the single-tensor ones: both here."""
    ours, theirs = _twins(tiny_config, device)
    opt_ours = AdamW(_groups(ours), lr=1e-3, betas=(0.9, 0.95))
    opt_theirs = torch.optim.AdamW(_groups(theirs), lr=1e-3, betas=(0.9, 0.95))
    before = [p.detach().clone() for p in ours.parameters()]
    _lockstep(ours, theirs, opt_ours, opt_theirs, [1e-3, 3e-3, 2e-3, 5e-4], seed=1)
    assert not all(torch.equal(a, b) for a, b in zip(before, ours.parameters(), strict=True))
    _assert_same(ours, theirs, opt_ours, opt_theirs)
    assert [len(g["params"]) for g in opt_ours.state_dict()["param_groups"]] == \
           [len(g["params"]) for g in opt_theirs.state_dict()["param_groups"]]


def test_a_parameter_without_a_gradient_gets_no_state_as_in_torch(tiny_config):
    ours, theirs = _twins(tiny_config)
    for model in (ours, theirs):
        next(model.parameters()).requires_grad_(False)
    opt_ours, opt_theirs = AdamW(_groups(ours), lr=1e-3), torch.optim.AdamW(_groups(theirs), lr=1e-3)
    _steps(ours, opt_ours, [1e-3, 1e-3], seed=2, uses_torch_api=False)
    _steps(theirs, opt_theirs, [1e-3, 1e-3], seed=2, uses_torch_api=True)
    assert 0 not in opt_ours.state_dict()["state"]
    _assert_same(ours, theirs, opt_ours, opt_theirs)


@pytest.mark.parametrize("saved_by, resumed_by", [("ours", "torch"), ("torch", "ours")])
def test_trainer_state_moves_between_the_two_and_resumes_the_same(tiny_config, saved_by, resumed_by):
    """A checkpoint's trainer state from either optimizer resumes in the other with identical updates."""
    make = {"ours": AdamW, "torch": torch.optim.AdamW}
    first, reference = _twins(tiny_config)
    opt_first = make[saved_by](_groups(first), lr=1e-3)
    opt_reference = torch.optim.AdamW(_groups(reference), lr=1e-3)
    _steps(first, opt_first, [1e-3, 2e-3], seed=3, uses_torch_api=saved_by == "torch")
    _steps(reference, opt_reference, [1e-3, 2e-3], seed=3, uses_torch_api=True)
    saved = {k: v.clone() for k, v in capture_train_state(opt_first, torch.device("cpu"), good_evals=1).items()}

    resumed = WindowedGPT(tiny_config.model)
    resumed.load_state_dict(first.state_dict())
    opt_resumed = make[resumed_by](_groups(resumed), lr=1e-3)
    assert restore_train_state(saved, opt_resumed, torch.device("cpu")) == 1
    _steps(resumed, opt_resumed, [2e-3, 1e-3], seed=4, uses_torch_api=resumed_by == "torch")
    _steps(reference, opt_reference, [2e-3, 1e-3], seed=4, uses_torch_api=True)
    _assert_same(resumed, reference, opt_resumed, opt_reference)


def test_mismatched_groups_and_shared_parameters_are_refused(tiny_config):
    model = WindowedGPT(tiny_config.model)
    params = list(model.parameters())
    with pytest.raises(ValueError, match="more than one parameter group"):
        AdamW([{"params": params}, {"params": params[:1]}])
    opt = AdamW([{"params": params}])
    with pytest.raises(ValueError, match="parameter groups do not match"):
        opt.load_state_dict({"state": {}, "param_groups": [{"params": list(range(len(params) - 1))}]})
    with pytest.raises(ValueError, match=r"state for parameters \[999\]"):
        opt.load_state_dict({"state": {999: {}}, "param_groups": [{"params": list(range(len(params)))}]})


def test_build_optimizer_decays_matrices_only(tiny_config):
    from aah_core.controller import build_controller

    model = WindowedGPT(tiny_config.model)
    opt = build_optimizer(model, build_controller(tiny_config, model), tiny_config)
    decayed, plain = opt.param_groups[:2]
    assert decayed["weight_decay"] == tiny_config.train.weight_decay and plain["weight_decay"] == 0.0
    assert all(p.dim() >= 2 for p in decayed["params"]) and all(p.dim() < 2 for p in plain["params"])
    assert decayed["betas"] == (tiny_config.train.beta1, tiny_config.train.beta2)
