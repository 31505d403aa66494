"""What `auto` may pick on a GPU machine, checked here with the GPU's answers faked: a backend that
cannot run a call must be passed over with its reason, never picked and then fail."""

from __future__ import annotations

import pytest
import torch

from aah_core import attention
from aah_core.attention import banded, flash, flex, resolve_backend, windowed_attention
from aah_core.errors import BackendUnavailable

CUDA = torch.device("cuda")


@pytest.fixture
def fake_gpu(monkeypatch):
    """A CUDA machine with an sm90 GPU and torch's windowed varlen kernel (as on the H200 box)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(flash, "_provider", lambda: ("varlen_attn", None, ""))
    flex._cuda_support.cache_clear()
    yield monkeypatch
    flex._cuda_support.cache_clear()


@pytest.mark.parametrize("head_dim, ok", [(64, True), (256, True), (8, True), (12, False), (264, False), (100, False)])
def test_flash_head_dim_guard(head_dim, ok):
    reason = flash.check_inputs(CUDA, torch.bfloat16, 0.0, head_dim)
    assert (reason == "") is ok
    if not ok:
        assert f"got {head_dim}" in reason and "multiple of 8" in reason


@pytest.fixture
def gpu_without_flex(fake_gpu):
    """The fake GPU where flex cannot compile, so that `auto` in bfloat16 reaches flash."""
    fake_gpu.setattr(flex, "_probe", lambda device: False)
    return fake_gpu


def test_auto_skips_flash_for_a_head_dim_it_cannot_take(gpu_without_flex):
    assert resolve_backend("auto", CUDA, True, torch.bfloat16, 0.0, head_dim=64) is flash
    assert resolve_backend("auto", CUDA, True, torch.bfloat16, 0.0, head_dim=12) is banded
    with pytest.raises(BackendUnavailable, match="multiple of 8"):
        resolve_backend("flash", CUDA, True, torch.bfloat16, 0.0, head_dim=12)


def test_auto_skips_flash_for_sink_tokens(gpu_without_flex):
    assert resolve_backend("auto", CUDA, True, torch.bfloat16, 0.0, head_dim=64, sinks=0) is flash
    assert resolve_backend("auto", CUDA, True, torch.bfloat16, 0.0, head_dim=64, sinks=4) is banded
    with pytest.raises(BackendUnavailable, match="no sink tokens"):
        resolve_backend("flash", CUDA, True, torch.bfloat16, 0.0, head_dim=64, sinks=4)


def test_flash_needs_sm80(fake_gpu):
    fake_gpu.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 5))
    ok, reason = flash.available(CUDA)
    assert not ok and "sm75" in reason


def test_flex_probe_failure_is_the_reason_and_auto_falls_back_to_banded(fake_gpu):
    calls = []

    def no_compiler(device):
        calls.append(device)
        raise RuntimeError("Failed to find C compiler. Please specify via CC environment variable.")

    fake_gpu.setattr(flex, "_probe", no_compiler)
    ok, reason = flex.available(CUDA)
    assert not ok and "C compiler" in reason and "cuda:0" in reason
    # bfloat16: flex cannot compile -> flash; float32 -> banded; and the probe ran once
    assert resolve_backend("auto", CUDA, True, torch.bfloat16, 0.0, head_dim=64) is flash
    assert resolve_backend("auto", CUDA, True, torch.float32, 0.0, head_dim=64) is banded
    flex.available(torch.device("cuda", 0))
    assert len(calls) == 1
    with pytest.raises(BackendUnavailable, match="C compiler"):
        resolve_backend("flex", CUDA, False, torch.float32, 0.0)


def test_flex_probe_that_runs_eagerly_is_refused(fake_gpu):
    fake_gpu.setattr(flex, "_probe", lambda device: False)
    ok, reason = flex.available(CUDA)
    assert not ok and "eagerly" in reason


def _hits_recompile_limit(*args, **kwargs):
    raise torch._dynamo.exc.FailOnRecompileLimitHit("recompile_limit reached")


def test_flex_recompile_limit_is_backend_unavailable(monkeypatch):
    monkeypatch.setattr(flex, "_compiled", lambda: _hits_recompile_limit)
    q = torch.randn(1, 2, 16, 8)
    with torch.no_grad(), pytest.raises(BackendUnavailable, match="recompile limit"):
        windowed_attention(q, q, q, [4, 16], backend="flex")


def test_auto_runs_banded_when_its_kernel_refuses_at_call_time(monkeypatch):
    monkeypatch.setattr(flex, "_compiled", lambda: _hits_recompile_limit)
    monkeypatch.setitem(attention.AUTO_ORDER, "cpu", {"half": ("flex",), "full": ("flex",), "small full": ("flex",)})
    q, k, v = (torch.randn(1, 2, 16, 8) for _ in range(3))
    with torch.no_grad():
        out = windowed_attention(q, k, v, [4, 16], backend="auto")
        want = windowed_attention(q, k, v, [4, 16], backend="reference")
    torch.testing.assert_close(out, want)


def test_auto_passes_the_calls_size(monkeypatch):
    """windowed_attention gives auto its call's B*H*T^2, which picks the float32 order (on CUDA: flex for a small
    call, banded for a large one; here the CPU stands in, with reference as its "small" choice)."""
    monkeypatch.setitem(attention.AUTO_ORDER, "cpu", {"half": ("banded",), "full": ("banded",),
                                                     "small full": ("reference",)})
    monkeypatch.setattr(attention, "SMALL_SCORES", 2 * 3 * 32 * 32 + 1)
    used = []
    for mod in (attention.reference, banded):
        monkeypatch.setattr(mod, "attend", lambda *a, real=mod.attend, name=mod.NAME: used.append(name) or real(*a))
    with torch.no_grad():
        for T in (32, 33):
            q = torch.randn(2, 3, T, 8)
            windowed_attention(q, q, q, [4, 8, 40], backend="auto")
    assert used == ["reference", "banded"]
