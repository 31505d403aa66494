"""windowed_attention: every CPU backend against `reference`, gradients, dropout, bad input.

flex has its own file (test_attention_flex.py) because compiling it costs seconds per shape.
"""

import random

import pytest
import torch

from aah_core.attention import (
    BACKENDS,
    available_backends,
    backend_status,
    banded,
    flash,
    flex,
    resolve_backend,
    windowed_attention,
)
from aah_core.errors import BackendUnavailable, InvalidWindowPlan


def _random_windows(seed: int, H: int, T: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.choice([1, 2, rng.randint(1, T + 5), T - 1, T, 4 * T]) for _ in range(H)]


# (B, H, T, windows): T is never a multiple of the 32/64/128 block sizes
CASES = {
    "B1-H3-T37-w1,2,T-1": (1, 3, 37, [1, 2, 36]),
    "B3-H4-T37-wT,>T,5,1": (3, 4, 37, [37, 40, 5, 1]),
    "B3-H5-T200-mixed": (3, 5, 200, [1, 2, 199, 200, 1000]),
    "B1-H4-T301-blocks": (1, 4, 301, [64, 100, 300, 33]),
    "B3-H2-T77-same": (3, 2, 77, [9, 9]),
    "B1-H6-T131-random": (1, 6, 131, _random_windows(1, 6, 131)),
    "B3-H7-T95-random": (3, 7, 95, _random_windows(2, 7, 95)),
    "B1-H4-T1": (1, 4, 1, [1, 2, 1, 5]),
    # T - w a multiple of every block size: the blocks are views of q, k, v (no padding)
    "B2-H3-T160-aligned": (2, 3, 160, [32, 96, 160]),
}
EXACT_BACKENDS = [b for b in available_backends("cpu") if b not in ("reference", "flex")]  # float64-capable


def _qkv(B, H, T, D=16, dtype=torch.float64, seed=0, grad=False):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, T, D, generator=g, dtype=dtype).requires_grad_(grad) for _ in range(3)]


@pytest.mark.parametrize("backend", EXACT_BACKENDS)
@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_parity_float64(backend, case):
    B, H, T, windows = CASES[case]
    q, k, v = _qkv(B, H, T)
    ref = windowed_attention(q, k, v, windows, backend="reference")
    out = windowed_attention(q, k, v, windows, backend=backend)
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("backend", EXACT_BACKENDS)
@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_float32_matches_float64(backend, case):
    B, H, T, windows = CASES[case]
    q, k, v = _qkv(B, H, T)
    ref = windowed_attention(q, k, v, windows, backend="reference")
    out = windowed_attention(q.float(), k.float(), v.float(), windows, backend=backend)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_banded_gradients_match_reference(case):
    B, H, T, windows = CASES[case]
    grads = {}
    for backend in ("reference", "banded"):
        q, k, v = _qkv(B, H, T, grad=True)
        out = windowed_attention(q, k, v, windows, backend=backend)
        (out * torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out)).sum().backward()
        grads[backend] = (q.grad, k.grad, v.grad)
    for name, got, want in zip("qkv", grads["banded"], grads["reference"]):
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9, msg=lambda m, n=name: f"d{n}: {m}")


def test_banded_gradients_with_large_blocks_and_scale():
    # windows big enough for 64/128/256-query blocks when gradients are on, and a custom scale
    q, k, v = _qkv(1, 3, 700, D=8, grad=True)
    windows = [70, 150, 690]
    assert len({banded.block_size(w, True) for w in windows}) == 3
    outs = [windowed_attention(q, k, v, windows, backend=b, scale=0.3) for b in ("reference", "banded")]
    torch.testing.assert_close(outs[1], outs[0], rtol=1e-10, atol=1e-10)
    g_ref = torch.autograd.grad(outs[0].sum(), (q, k, v))
    g_band = torch.autograd.grad(outs[1].sum(), (q, k, v))
    for got, want in zip(g_band, g_ref):
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("backend", ["reference", *EXACT_BACKENDS])
def test_dropout_is_deterministic_under_a_seed(backend):
    q, k, v = _qkv(2, 3, 50, grad=True)
    windows = [1, 7, 50]
    outs = []
    for seed in (0, 0, 1):
        torch.manual_seed(seed)
        outs.append(windowed_attention(q, k, v, windows, backend=backend, dropout_p=0.3))
    assert torch.equal(outs[0], outs[1])
    assert not torch.equal(outs[0], outs[2])
    plain = windowed_attention(q, k, v, windows, backend=backend)
    assert not torch.allclose(outs[0], plain)
    outs[0].sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v))


@pytest.mark.parametrize("backend", ["reference", *EXACT_BACKENDS])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
def test_single_key_rows_never_nan(backend, dtype):
    # w=1 everywhere (one key per row), T=1, and huge scores that would overflow a naive softmax
    for T, windows in ((64, [1, 1, 1]), (1, [1, 3, 1])):
        q, k, v = (t * 1e4 for t in _qkv(2, 3, T, dtype=dtype))
        q.requires_grad_(True)
        out = windowed_attention(q, k, v, windows, backend=backend)
        assert torch.isfinite(out).all()
        if T > 1:  # a single visible key: the output is that key's value
            torch.testing.assert_close(out, v)
        out.sum().backward()
        assert torch.isfinite(q.grad).all()


@pytest.mark.parametrize("P, n, L, c", [(20, 4, 8, 4), (19, 3, 10, 4), (9, 1, 9, 4), (12, 3, 6, 3)])
def test_band_view_gradient_is_unfolds(P, n, L, c):
    # BandView's own backward (shifted adds) against autograd through torch's unfold, L a multiple of c or not
    x = torch.randn(2, 3, P, 5, dtype=torch.float64, requires_grad=True)
    g = torch.randn(6, n, L, 5, dtype=torch.float64)
    view = banded.BandView.apply(x, n, L, c)
    plain = x.unfold(2, L, c)[:, :, :n].transpose(-1, -2).flatten(0, 1)
    assert torch.equal(view, plain)
    torch.testing.assert_close(torch.autograd.grad(view, x, g)[0], torch.autograd.grad(plain, x, g)[0],
                               rtol=0, atol=1e-12)


@pytest.mark.parametrize("B, H, T", [(1, 1, 64), (1, 3, 38), (2, 1, 2), (3, 5, 130)])
def test_balanced_causal_matches_reference(B, H, T):
    # the split of causal attention in halves of equal work (merged by log-sum-exp), with and without `out`
    q, k, v = _qkv(B, H, T)
    ref = windowed_attention(q, k, v, [T] * H, backend="reference", scale=0.3)
    with torch.inference_mode():
        torch.testing.assert_close(banded.balanced_causal(q, k, v, 0.3), ref, rtol=1e-12, atol=1e-12)
        out = torch.full_like(q, float("nan"))
        assert banded.balanced_causal(q, k, v, 0.3, out) is out
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)


def test_banded_splits_causal_calls_only_where_threads_idle(monkeypatch):
    assert banded.split_pays(1, 4096, 2) and banded.split_pays(3, 4096, 2) and banded.split_pays(2, 4096, 4)
    assert not banded.split_pays(2, 4096, 2) and not banded.split_pays(1, 4096, 1)
    assert not banded.split_pays(1, banded.BALANCE_MIN_T - 2, 2) and not banded.split_pays(1, 4097, 2)
    # through windowed_attention: the full-window head of a mixed plan takes the split without gradients only
    calls = []
    monkeypatch.setattr(banded, "BALANCE_MIN_T", 16)
    monkeypatch.setattr(banded, "balanced_causal", lambda *a: calls.append(1) or BALANCED(*a))
    monkeypatch.setattr(banded.torch, "get_num_threads", lambda: 2)
    q, k, v = _qkv(1, 2, 40, grad=True)
    ref = windowed_attention(q, k, v, [5, 40], backend="reference")
    torch.testing.assert_close(windowed_attention(q, k, v, [5, 40], backend="banded"), ref, rtol=1e-12, atol=1e-12)
    assert not calls
    with torch.no_grad():
        torch.testing.assert_close(windowed_attention(q, k, v, [5, 40], backend="banded"), ref, rtol=1e-12, atol=1e-12)
    assert calls == [1]


BALANCED = banded.balanced_causal


def test_banded_reorders_scattered_heads_once():
    assert banded.buckets((5, 100, 5, 1), 50) == (((5, 2), (50, 1), (1, 1)), (0, 2, 1, 3))
    assert banded.buckets((1, 1, 64, 64, 200), 128) == (((1, 2), (64, 2), (128, 1)), None)


# ---- backend choice -------------------------------------------------------------------


def test_cpu_backends_and_reasons():
    status = backend_status("cpu")
    assert set(status) == set(BACKENDS) == {"reference", "banded", "flex", "flash"}
    assert status["reference"] == status["banded"] == ""
    assert "CUDA" in status["flash"]
    assert "flash" not in available_backends("cpu")


@pytest.mark.parametrize("needs_grad", [False, True])
def test_auto_on_cpu_is_banded(needs_grad):
    mod = resolve_backend("auto", torch.device("cpu"), needs_grad, torch.float32, 0.0)
    assert mod is banded


def test_auto_on_cuda_prefers_flex_then_flash_in_half_precision_and_banded_in_float32(monkeypatch):
    monkeypatch.setattr(flash, "available", lambda device: (True, ""))
    monkeypatch.setattr(flash, "_provider", lambda: ("varlen_attn", None, ""))
    monkeypatch.setattr(flex, "available", lambda device: (True, ""))
    cuda = torch.device("cuda")
    assert resolve_backend("auto", cuda, True, torch.bfloat16, 0.0) is flex
    assert resolve_backend("auto", cuda, True, torch.float16, 0.0) is flex
    assert resolve_backend("auto", cuda, True, torch.bfloat16, 0.1) is banded  # neither has dropout here
    assert resolve_backend("auto", cuda, True, torch.float32, 0.0) is banded  # faster than flex in float32
    assert resolve_backend("auto", cuda, True, None, 0.0) is banded
    small, large = 1 * 8 * 1024**2, 1 * 8 * 4096**2  # B*H*T^2 of the measured sizes on either side
    assert resolve_backend("auto", cuda, True, torch.float32, 0.0, scores=small) is flex
    assert resolve_backend("auto", cuda, True, torch.float32, 0.0, scores=large) is banded
    assert resolve_backend("auto", cuda, True, torch.bfloat16, 0.0, scores=large) is flex
    monkeypatch.setattr(flex, "available", lambda device: (False, "no C compiler"))
    assert resolve_backend("auto", cuda, True, torch.bfloat16, 0.0) is flash
    assert resolve_backend("auto", torch.device("cpu"), False, torch.bfloat16, 0.0) is banded


# ---- bad input ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "windows, match",
    [
        ([4, 4], "got 2 windows for 3 heads"),
        ([4, 4, 4, 4], "got 4 windows for 3 heads"),
        ([4, 0, 4], "head 1: window 0 is invalid"),
        ([4, 4, -3], "head 2: window -3 is invalid"),
        ([4, 2.5, 4], r"head 1: got 2\.5"),
        (["8", 4, 4], "head 0: got '8'"),
        ([True, 4, 4], "head 0: got True"),
        ([None, 4, 4], "head 0: got None"),
        (torch.tensor([4.0, 4.0, 4.0]), "1-D integer tensor"),
        (torch.tensor([[4, 4, 4]]), "1-D integer tensor"),
        ("abc", "sequence of 3 integers"),
        (7, "sequence of 3 integers"),
    ],
    ids=["too-few", "too-many", "zero", "negative", "float", "string", "bool", "none",
         "float-tensor", "2d", "str", "int"],
)
def test_bad_windows_are_refused(windows, match):
    q, k, v = _qkv(1, 3, 10)
    with pytest.raises(InvalidWindowPlan, match=match):
        windowed_attention(q, k, v, windows, backend="banded")


def test_windows_tensor_is_accepted():
    q, k, v = _qkv(1, 3, 10)
    out = windowed_attention(q, k, v, torch.tensor([1, 4, 10]), backend="banded")
    torch.testing.assert_close(out, windowed_attention(q, k, v, [1, 4, 10], backend="reference"))


def _bad_tensors():
    q, k, v = _qkv(1, 3, 10)
    return {
        "shape-mismatch": ((q, k[:, :, :9], v), "shapes differ"),
        "head-mismatch": ((q, k[:, :2], v), "shapes differ"),
        "3-d": ((q[0], k[0], v[0]), "4-D tensor"),
        "integer": ((q.long(), k.long(), v.long()), "floating point"),
        "dtype-mix": ((q, k.float(), v), "one dtype"),
        "not-a-tensor": ((q.tolist(), k, v), "4-D tensor"),
    }


@pytest.mark.parametrize("name", list(_bad_tensors()))
def test_bad_qkv_are_refused(name):
    (q, k, v), match = _bad_tensors()[name]
    with pytest.raises(ValueError, match=match):
        windowed_attention(q, k, v, [1, 2, 3], backend="banded")


@pytest.mark.parametrize(
    "kwargs, dtype, grad, match",
    [
        ({"backend": "magic"}, torch.float64, False, "unknown backend 'magic'"),
        ({"backend": "flash"}, torch.float16, False, "flash.*CUDA only"),
        ({"backend": "flex"}, torch.float32, True, "flex.*forward-only on cpu"),
        ({"backend": "flex"}, torch.float64, False, "flex.*float32/bfloat16/float16, not torch.float64"),
        ({"backend": "flex", "dropout_p": 0.1}, torch.float32, False, "flex.*no attention dropout"),
    ],
    ids=["unknown", "flash-on-cpu", "flex-grad-on-cpu", "flex-float64-on-cpu", "flex-dropout"],
)
def test_unusable_backend_is_refused(kwargs, dtype, grad, match):
    q, k, v = _qkv(1, 3, 10, dtype=dtype, grad=grad)
    with pytest.raises(BackendUnavailable, match=match):
        windowed_attention(q, k, v, [1, 2, 3], **kwargs)


@pytest.mark.parametrize("p", [-0.1, 1.0, 1.5])
def test_bad_dropout_is_refused(p):
    q, k, v = _qkv(1, 3, 10)
    with pytest.raises(ValueError, match="dropout_p must be in"):
        windowed_attention(q, k, v, [1, 2, 3], dropout_p=p)
