"""The flex backend (compiled FlexAttention) and its block mask; CUDA-only cases skip on CPU.

Compiling costs seconds per shape on a 2-core CPU, so every CPU call here shares one
(B, H, T, D) shape and only the window plans change (a new plan is not a recompile).
"""

import pytest
import torch

from aah_core.attention import available_backends, flex, windowed_attention
from aah_core.attention.masks import generate_window_mask, window_block_tables
from aah_core.errors import BackendUnavailable

B, H, T, D = 3, 5, 200, 16  # H odd, T not a multiple of the 128 block
PLANS = {
    "edges": [1, 2, T - 1, T, 1000],
    "mixed": [64, 3, 129, 128, 200],
    "same": [40] * 5,
}
needs_flex = pytest.mark.skipif("flex" not in available_backends("cpu"), reason="no compiled flex here")
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _qkv(dtype=torch.float64, device="cpu", shape=(B, H, T, D), grad=False):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(*shape, generator=g, dtype=dtype).to(device).requires_grad_(grad) for _ in range(3)]


def test_window_predicate_keeps_exactly_w_keys():
    mask_mod = generate_window_mask(torch.tensor([1, 3]))
    q_idx, kv_idx = torch.tensor(10), torch.arange(12)
    assert mask_mod(0, torch.tensor(0), q_idx, kv_idx).nonzero().flatten().tolist() == [10]
    assert mask_mod(0, torch.tensor(1), q_idx, kv_idx).nonzero().flatten().tolist() == [8, 9, 10]
    assert mask_mod.__name__ == "per_head_window_1_3"


@pytest.mark.parametrize(
    "windows, length",
    [([1, 2, 199, 200, 1000], 200), ([64, 127, 128, 129, 300], 300), ([5], 128), ([130, 7], 1)],
    ids=["edges-T200", "tile-edges-T300", "one-tile", "T1"],
)
def test_block_tables_match_dense_create_block_mask(windows, length):
    from torch.nn.attention.flex_attention import create_block_mask

    mine = flex.block_mask(tuple(windows), length, torch.device("cpu"))
    w = torch.tensor([min(x, length) for x in windows])
    dense = create_block_mask(generate_window_mask(w), None, len(windows), length, length, device="cpu")
    assert torch.equal(mine.to_dense(), dense.to_dense())


def test_full_tiles_are_inside_every_window():
    counts, _, full_counts, full_idx = window_block_tables((300,), 300, 128, torch.device("cpu"))
    # head 0, q block 1 (rows 128..255): key block 0 is entirely visible and whole
    assert full_counts[0, 0].tolist() == [0, 1, 0]  # last row block holds padding: never "full"
    assert full_idx[0, 0, 1, 0].item() == 0
    assert counts[0, 0].tolist() == [1, 1, 3]


@needs_flex
@pytest.mark.parametrize("plan", list(PLANS), ids=list(PLANS))
def test_flex_matches_reference(plan):
    q, k, v = _qkv()
    ref = windowed_attention(q, k, v, PLANS[plan], backend="reference")
    before = dict(flex.stats)  # process-wide counters: compare this call's change, whatever ran before
    with torch.no_grad():
        out = windowed_attention(q.float(), k.float(), v.float(), PLANS[plan], backend="flex")
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)
    assert flex.stats == {**before, "compiled_calls": before["compiled_calls"] + 1}  # compiled, not eager


@needs_flex
@pytest.mark.parametrize("length", [8, 40, 120, 127])
def test_flex_matches_reference_within_one_partial_block(length):
    # lengths 8 mod 16 inside one block gave wrong rows (some NaN) on CPU before the padding to whole
    # blocks; every length here runs at one padded shape (one compile)
    q, k, v = _qkv(shape=(1, 3, length, D))
    windows = [1, 7, length]
    ref = windowed_attention(q, k, v, windows, backend="reference", sinks=2)
    with torch.no_grad():
        out = windowed_attention(q.float(), k.float(), v.float(), windows, backend="flex", sinks=2)
    assert out.shape == (1, 3, length, D)
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)


@needs_flex
@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_flex_refuses_a_silent_eager_fallback(monkeypatch):
    # stand-in for Dynamo giving up (graph break, recompile limit): the uncompiled function
    monkeypatch.setattr(flex, "_compiled", lambda: flex._flex_and_flag)
    q, k, v = _qkv(torch.float32, shape=(1, 2, 20, 16))
    before = dict(flex.stats)
    with torch.no_grad(), pytest.raises(BackendUnavailable, match="fell back to eager"):
        windowed_attention(q, k, v, [3, 5], backend="flex")
    assert flex.stats == {**before, "eager_calls": before["eager_calls"] + 1}


@needs_cuda
@pytest.mark.parametrize("backend", ["banded", "flex", "flash"])
def test_cuda_backends_match_reference_with_gradients(backend):
    if backend not in available_backends("cuda"):
        pytest.skip(f"{backend} unavailable on this CUDA machine")
    dtype = torch.bfloat16 if backend == "flash" else torch.float32
    tol = 3e-2 if dtype == torch.bfloat16 else 2e-4
    shape = (2, 6, 300, 64)
    windows = [1, 64, 100, 299, 300, 1000]
    q, k, v = _qkv(torch.float64, "cuda", shape, grad=True)
    ref = windowed_attention(q, k, v, windows, backend="reference")
    ref_grads = torch.autograd.grad(ref.sum(), (q, k, v))
    qd, kd, vd = (t.detach().to(dtype).requires_grad_(True) for t in (q, k, v))
    out = windowed_attention(qd, kd, vd, windows, backend=backend)
    torch.testing.assert_close(out.double(), ref, rtol=tol, atol=tol)
    grads = torch.autograd.grad(out.float().sum(), (qd, kd, vd))
    for got, want in zip(grads, ref_grads):
        torch.testing.assert_close(got.double(), want, rtol=10 * tol, atol=10 * tol)


@needs_cuda
def test_auto_on_cuda_uses_a_windowed_kernel():
    from aah_core.attention import resolve_backend

    mod = resolve_backend("auto", torch.device("cuda"), True, torch.bfloat16, 0.0)
    assert mod.NAME in ("flash", "flex")
