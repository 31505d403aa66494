"""The C kernel for windowed heads (aah_core/attention/native.py, band_kernel.c) against the float64 reference.

banded.attend sends it the heads it takes (min(window + sinks, T) * D up to NATIVE_MAX_WORK) of a call without
dropout, float32 on CPU, with or without a gradient; these tests check the kernel's rows and gradients on their own
(every edge of a tile, of a window and of the sink keys, strided inputs, several threads, concurrent callers), that
banded routes exactly those calls to it, and that a machine without the kernel says why and keeps ATen.
"""

import threading

import pytest
import torch

from aah_core.attention import banded, native, reference, windowed_attention

pytestmark = pytest.mark.skipif(not native.available()[0], reason=f"no native kernel here: {native.available()[1]}")


def _strided_qkv(B, H, T, D, seed=0):
    """q, k, v as views of one fused [B, T, 3H, D] projection, the layout the model hands attention."""
    g = torch.Generator().manual_seed(seed)
    fused = torch.randn(B, T, 3 * H, D, generator=g).transpose(1, 2)  # (B, 3H, T, D): rows H*3*D apart
    return fused[:, :H], fused[:, H : 2 * H], fused[:, 2 * H :]


# (B, H, T, D, windows): tiles are 16 queries, so T around multiples of 16; a window >= T is causal attention,
# 0 a head the kernel leaves to its caller
CASES = {
    "T1": (2, 2, 1, 16, [1, 3]),
    "T15": (1, 3, 15, 16, [1, 2, 14]),
    "T16-D48": (2, 2, 16, 48, [5, 0]),
    "T17-D32": (1, 2, 17, 32, [16, 17]),
    "T37-mixed": (3, 4, 37, 32, [1, 37, 0, 100]),
    "T200-D32": (1, 4, 200, 32, [16, 17, 64, 199]),
    "T301-D64": (2, 3, 301, 64, [1, 100, 300]),
    "T1100-long": (1, 2, 1100, 32, [1100, 700]),
}


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_kernel_rows_match_the_float64_reference(case, threads):
    B, H, T, D, windows = CASES[case]
    q, k, v = _strided_qkv(B, H, T, D)
    out = torch.full((B, T, H, D), 7.0).transpose(1, 2)  # (B, H, T, D) laid out like the model's
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        native.band_attention(q, k, v, tuple(windows), None, out)
    finally:
        torch.set_num_threads(before)
    want = reference.attend(q.double(), k.double(), v.double(), tuple(w or 1 for w in windows), 0.0, None)
    for h, w in enumerate(windows):
        if w:
            torch.testing.assert_close(out[:, h].double(), want[:, h], rtol=1e-5, atol=1e-5)
        else:  # the caller's: left as it was
            assert bool((out[:, h] == 7.0).all())


def _grads_against_reference(B, H, T, D, windows, scale=None, threads=None, seed=0, atol=1e-5, sinks=0):
    """Output and gradients of one call through banded (the kernel's forward and backward) against the float64
    reference, q, k, v being views of one fused projection as in the model."""
    g = torch.Generator().manual_seed(seed)
    fused = torch.randn(B, T, 3 * H, D, generator=g, requires_grad=True)
    grad = torch.randn(B, H, T, D, generator=g)
    before = torch.get_num_threads()
    torch.set_num_threads(threads or before)
    try:
        heads = fused.transpose(1, 2)
        out = banded.attend(heads[:, :H], heads[:, H : 2 * H], heads[:, 2 * H :], tuple(windows), 0.0, scale, sinks)
        out.backward(grad)
    finally:
        torch.set_num_threads(before)
    exact = fused.detach().double().requires_grad_(True)
    heads = exact.transpose(1, 2)
    want = reference.attend(heads[:, :H], heads[:, H : 2 * H], heads[:, 2 * H :], tuple(windows), 0.0, scale, sinks)
    want.backward(grad.double())
    assert type(out.grad_fn).__name__ == "BandAttentionBackward"
    torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=atol)
    torch.testing.assert_close(fused.grad.double(), exact.grad, rtol=1e-4, atol=10 * atol)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_kernel_gradients_match_the_float64_reference(case, threads):
    """The backward (FlashAttention-2's equations per tile of 16 queries; each run's key gradients added to dk
    and dv under a lock, runs of two threads sharing keys) at every edge the forward is tested at."""
    B, H, T, D, windows = CASES[case]
    _grads_against_reference(B, H, T, D, [w or 1 for w in windows], threads=threads)


# (B, H, T, D, windows, sinks): sinks apart from every window, reaching into some, past T, and as many as a tile
SINK_CASES = {
    "apart": (2, 3, 150, 32, [1, 20, 33], 4),
    "window-reaches-them": (1, 3, 90, 16, [2, 30, 89], 40),
    "more-than-T": (1, 2, 20, 16, [3, 4], 100),
    "a-tile-of-sinks": (2, 2, 64, 16, [16, 17], 16),
    "long": (1, 2, 1100, 32, [1100, 300], 3),
}


@pytest.mark.parametrize("threads", [1, 2, 5])
@pytest.mark.parametrize("case", list(SINK_CASES), ids=list(SINK_CASES))
def test_kernel_with_sink_keys_matches_the_float64_reference(case, threads):
    """Every query also sees keys 0 .. sinks-1 (StreamingLLM's sinks): a tile reads the sinks, then its window
    (one range when the window reaches them); output and gradients, runs of threads sharing the sinks' rows."""
    B, H, T, D, windows, sinks = SINK_CASES[case]
    _grads_against_reference(B, H, T, D, windows, threads=threads, sinks=sinks)
    q, k, v = _strided_qkv(B, H, T, D)
    with torch.no_grad():
        out = banded.attend(q, k, v, tuple(windows), 0.0, None, sinks)
    want = reference.attend(q.double(), k.double(), v.double(), tuple(windows), 0.0, None, sinks)
    torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=1e-5)


def test_kernel_gradients_with_a_scale_large_scores_and_many_threads():
    _grads_against_reference(2, 3, 150, 32, [1, 40, 150], scale=2.5, atol=1e-4)  # scores in the tens
    _grads_against_reference(1, 5, 333, 16, [3, 17, 64, 100, 333], threads=7)  # runs cut inside heads


def test_kernel_gradients_are_the_same_bits_from_call_to_call():
    """Keys that several threads' runs read get their gradients summed in thread order, whichever thread ends
    first: with 6 threads, heads cut into several runs, every call gives the same bits."""
    q, k, v = (t.clone().requires_grad_(True) for t in _strided_qkv(2, 3, 250, 32))
    grad = torch.randn(2, 3, 250, 32, generator=torch.Generator().manual_seed(1))
    before = torch.get_num_threads()
    torch.set_num_threads(6)
    try:
        runs = [torch.autograd.grad(banded.attend(q, k, v, (250, 90, 33), 0.0, None), (q, k, v), grad)
                for _ in range(8)]
    finally:
        torch.set_num_threads(before)
    for got in runs[1:]:
        assert all(torch.equal(a, b) for a, b in zip(got, runs[0]))


def test_kernel_gradient_of_a_strided_output_gradient_and_of_some_inputs_only():
    q, k, v = _strided_qkv(1, 2, 70, 16)
    k = k.detach().clone().requires_grad_(True)
    out = banded.attend(q, k, v, (9, 70), 0.0, None)
    grad = torch.randn(1, 70, 16, 2).permute(0, 3, 1, 2)  # (B, H, T, D), last dimension strided
    (dk,) = torch.autograd.grad(out, k, grad)
    exact = k.detach().double().requires_grad_(True)
    want = reference.attend(q.double(), exact, v.double(), (9, 70), 0.0, None)
    (want_dk,) = torch.autograd.grad(want, exact, grad.double())
    torch.testing.assert_close(dk.double(), want_dk, rtol=1e-4, atol=1e-4)


def test_kernel_takes_a_scale():
    q, k, v = _strided_qkv(1, 2, 50, 16)
    out = torch.empty(1, 2, 50, 16)
    native.band_attention(q, k, v, (3, 20), 0.3, out)
    want = reference.attend(q.double(), k.double(), v.double(), (3, 20), 0.0, 0.3)
    torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=1e-5)


def test_large_scores_neither_overflow_nor_vanish():
    """Scores in the hundreds: the kernel subtracts each row's maximum before exponentiating."""
    q, k, v = (t * 30 for t in _strided_qkv(1, 2, 64, 16))
    out = torch.empty(1, 2, 64, 16)
    native.band_attention(q, k, v, (1, 10), None, out)
    want = reference.attend(q.double(), k.double(), v.double(), (1, 10), 0.0, None)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.double(), want, rtol=1e-4, atol=1e-4)


def test_concurrent_callers_get_their_own_rows():
    """The kernel's buffers are shared between calls through a locked pool: callers on several threads at once
    (a service's evaluations) each get exactly their answer."""
    shapes = [(1, 2, 300, 32, (7, 64)), (2, 3, 129, 16, (1, 33, 128)), (1, 1, 500, 64, (250,))] * 3
    results: dict[int, torch.Tensor] = {}

    def run(i, B, H, T, D, windows):
        q, k, v = _strided_qkv(B, H, T, D, seed=i)
        out = torch.empty(B, H, T, D)
        for _ in range(5):
            native.band_attention(q, k, v, windows, None, out)
        results[i] = out

    threads = [threading.Thread(target=run, args=(i, *shape)) for i, shape in enumerate(shapes)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i, (B, H, T, D, windows) in enumerate(shapes):
        q, k, v = _strided_qkv(B, H, T, D, seed=i)
        want = reference.attend(q.double(), k.double(), v.double(), windows, 0.0, None)
        torch.testing.assert_close(results[i].double(), want, rtol=1e-5, atol=1e-5)


@pytest.fixture
def kernel_calls(monkeypatch):
    calls = []
    real = native.band_attention

    def counted(q, k, v, windows, scale, out, lse=None, sinks=0):
        calls.append(windows)
        return real(q, k, v, windows, scale, out, lse, sinks)

    monkeypatch.setattr(native, "band_attention", counted)
    return calls


def test_banded_sends_the_kernel_the_heads_it_is_faster_for(kernel_calls, monkeypatch):
    """min(window, T) * D up to NATIVE_MAX_WORK (full heads included) to the kernel, the rest to ATen, a run of
    heads with one window at a time; every row against the reference."""
    monkeypatch.setattr(banded, "NATIVE_MAX_WORK", 64 * 32)
    T, D = 120, 32
    windows = [120, 16, 2000, 64, 65, 90, 90, 40]  # full (to ATen), kernel, full (ATen), kernel, ATen, ATen x2, kernel
    q, k, v = _strided_qkv(2, len(windows), T, D)
    with torch.no_grad():
        out = windowed_attention(q, k, v, windows, backend="banded")
    want = reference.attend(q.double(), k.double(), v.double(), tuple(windows), 0.0, None)
    torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=1e-5)
    assert kernel_calls == [(0, 16, 0, 64, 0, 0, 0, 40)]
    monkeypatch.setattr(banded, "NATIVE_MAX_WORK", 4096 * 32)
    with torch.no_grad():
        torch.testing.assert_close(windowed_attention(q, k, v, windows, backend="banded").double(), want,
                                   rtol=1e-5, atol=1e-5)
    assert kernel_calls[1] == tuple(windows)  # every head, full ones included


@pytest.mark.parametrize("windows", [(8, 32, 20), (8, 33, 20, 64, 5), (40, 3, 64, 7), (33, 40, 2, 64)],
                         ids=["all-kernel", "scattered", "kernel-last", "kernel-middle"])
def test_under_autograd_the_kernel_takes_its_heads_and_aten_the_others(kernel_calls, monkeypatch, windows):
    """Heads with min(window, T) * D up to NATIVE_MAX_WORK through the kernel's forward and backward, the others
    through ATen's, in one group each whatever their order; output and gradients against the reference."""
    monkeypatch.setattr(banded, "NATIVE_MAX_WORK", 32 * 16)
    q, k, v = (t.clone().requires_grad_(True) for t in _strided_qkv(2, len(windows), 64, 16))
    out = windowed_attention(q, k, v, windows, backend="banded")
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(3))
    got = torch.autograd.grad(out, (q, k, v), grad)
    exact = [t.detach().double().requires_grad_(True) for t in (q, k, v)]
    want = reference.attend(*exact, windows, 0.0, None)
    torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=1e-5)
    for a, b in zip(got, torch.autograd.grad(want, exact, grad.double())):
        torch.testing.assert_close(a.double(), b, rtol=1e-4, atol=1e-4)
    assert kernel_calls == [tuple(w for w in windows if w <= 32)]


@pytest.mark.parametrize("why", ["dropout", "float64", "too wide", "D not a multiple of 16"])
@pytest.mark.parametrize("grad", [False, True], ids=["inference", "grad"])
def test_banded_keeps_aten_for_what_the_kernel_does_not_do(kernel_calls, monkeypatch, why, grad):
    q, k, v = _strided_qkv(1, 2, 64, 16)
    windows, kwargs = [8, 64], {}
    if why == "dropout":
        kwargs["dropout_p"] = 0.1
    elif why == "float64":
        q, k, v = q.double(), k.double(), v.double()
    elif why == "D not a multiple of 16":
        q, k, v = _strided_qkv(1, 2, 64, 24)
    else:
        monkeypatch.setattr(banded, "NATIVE_MAX_WORK", 7 * 16)
    if grad:
        q = q.clone().requires_grad_(True)
    out = windowed_attention(q, k, v, windows, backend="banded", **kwargs)
    assert kernel_calls == [] and type(out.grad_fn).__name__ != "BandAttentionBackward"


def test_the_kernel_turned_off_or_unbuildable_says_why(monkeypatch, tmp_path):
    monkeypatch.setenv("AAH_NATIVE_ATTENTION", "0")
    assert native._build() == (None, "turned off (AAH_NATIVE_ATTENTION=0)")
    monkeypatch.delenv("AAH_NATIVE_ATTENTION")
    broken = tmp_path / "band_kernel.c"
    broken.write_text("this is not C\n")
    monkeypatch.setattr(native, "SOURCES", (broken,))
    lib, reason = native._build()
    assert lib is None and f"could not build {tmp_path.name}/*.c: " in reason
    monkeypatch.setattr(native, "SOURCES", (native.Path(__file__),))  # (any source: the build never starts)
    monkeypatch.setattr(native.tempfile, "tempdir", str(tmp_path / "gone"))  # no temporary folder (a full disk)
    lib, reason = native._build()
    assert lib is None and reason.startswith("could not build and load core/*.c with ")
    monkeypatch.setattr(native.shutil, "which", lambda name: None)
    assert native._build() == (None, "no C compiler (cc, gcc or clang; or $CC) on PATH")


def test_without_the_kernel_banded_runs_aten(monkeypatch, kernel_calls):
    monkeypatch.setattr(native, "_built", (None, "no C compiler (cc, gcc or clang; or $CC) on PATH"))
    assert native.available() == (False, "no C compiler (cc, gcc or clang; or $CC) on PATH")
    q, k, v = _strided_qkv(1, 2, 64, 16)
    with torch.no_grad():
        out = windowed_attention(q, k, v, [8, 64], backend="banded")
    assert kernel_calls == []
    want = reference.attend(q.double(), k.double(), v.double(), (8, 64), 0.0, None)
    torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("B, H, T", [(1, 1, 64), (1, 3, 38), (2, 1, 2), (3, 2, 130)])
def test_balanced_causal_halves_merge_in_c(monkeypatch, B, H, T):
    """banded.balanced_causal's float32 merge of its two halves (native.merge_halves) against the reference,
    into a fresh output and into a strided one laid out (B, T, H, D) like the model's."""
    merged = []
    real = native.merge_halves
    monkeypatch.setattr(native, "merge_halves", lambda *a: merged.append(1) or real(*a))
    q, k, v = _strided_qkv(B, H, T, 16)
    want = reference.attend(q.double(), k.double(), v.double(), (T,) * H, 0.0, 0.3)
    with torch.inference_mode():
        fresh = banded.balanced_causal(q, k, v, 0.3)
        out = torch.full((B, T, H, 16), float("nan")).transpose(1, 2)
        assert banded.balanced_causal(q, k, v, 0.3, out) is out
    assert merged == [1, 1]
    for got in (fresh, out):
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("B, group, D, pos, rings", [
    (1, 1, 16, 20, ((1, 1), (5, 5), (16, 16), (17, 17))),  # (capacity, window) a kv head
    (3, 2, 32, 2, ((40, 40), (3, 3))),  # rings not yet full
    (2, 3, 128, 7, ((8, 100),)),  # a ring not yet grown to its window
    (2, 1, 64, 299, ((7, 7), (300, 300), (33, 33), (1, 1), (64, 64))),
    (1, 2, 32, 2999, ((3000, 3000), (16, 16))),  # one long ring: cut into pieces on 2 and 3 threads
    (2, 1, 16, 4000, ((700, 700), (4096, 8192), (5, 5)))])
def test_decode_step_matches_the_float64_reference(threads, B, group, D, pos, rings):
    """A step (native.decode_step) writes its key and value into each kv head's ring, at position pos's slot, and
    each query head attends to every position its kv head's ring holds: rings at any offset of the buffer, full
    or filling, grouped query heads, q, k and v laid out as the model's fused projection, any number of threads
    (a ring longer than a thread's share cut into pieces, their results merged)."""
    g = torch.Generator().manual_seed(B * D + len(rings))
    n = len(rings)
    capacity, window = [c for c, _ in rings], [w for _, w in rings]
    first = [sum(capacity[:j]) + 3 * j for j in range(n)]  # rings apart, slots between them left alone
    slots = first[-1] + capacity[-1] + 2
    k, v = (torch.randn(B, slots, D, generator=g) for _ in range(2))
    before = k.clone(), v.clone()
    qkv = torch.randn(B, 1, n * group + 2 * n, D, generator=g).transpose(1, 2)  # (B, heads, 1, D), strided
    q, k_new, v_new = qkv[:, : n * group], qkv[:, n * group : n * group + n], qkv[:, n * group + n :]
    out = native.decode_step(q, k_new, v_new, k, v, native.Rings(first, capacity, window), pos, None, threads,
                             parallel_work=0)
    written = [first[j] + pos % window[j] for j in range(n)]
    for j in range(n):
        torch.testing.assert_close(k[:, written[j]], k_new[:, j, 0], rtol=0, atol=0)
        torch.testing.assert_close(v[:, written[j]], v_new[:, j, 0], rtol=0, atol=0)
        held = slice(first[j], first[j] + min(pos + 1, capacity[j]))
        keys, values = k[:, held].double(), v[:, held].double()
        heads = q[:, j * group : (j + 1) * group, 0].double()  # (B, g, D)
        probs = torch.softmax(heads @ keys.transpose(1, 2) / D**0.5, dim=-1)  # (B, g, L)
        torch.testing.assert_close(out[:, j * group : (j + 1) * group, 0].double(), probs @ values,
                                   rtol=1e-5, atol=1e-5)
    untouched = torch.ones(slots, dtype=torch.bool)
    untouched[written] = False
    assert torch.equal(k[:, untouched], before[0][:, untouched]) and torch.equal(v[:, untouched], before[1][:, untouched])


def test_a_decode_step_refuses_a_position_its_ring_has_no_slot_for():
    k, v = torch.zeros(1, 8, 16), torch.zeros(1, 8, 16)
    q = torch.zeros(1, 1, 1, 16)
    with pytest.raises(RuntimeError, match="decode_kernel.c returned -1"):  # ring of 8 not grown to its window of 64
        native.decode_step(q, q, q, k, v, native.Rings([0], [8], [64]), 8, None, 1, parallel_work=0)
