"""The decode step's flat per-layer buffer, attended in one call ('flat') or one call per kv window
('buckets'): exact in float64 against the reference at every position (mixed windows, grouped-query
heads seeing less than their kv head, equal windows, growth by doubling). 'flat' runs the same tensor
operations per step whatever the number of distinct windows; 'buckets' the same whatever the number
of heads (per-step work grows with the windows, never with the heads)."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from aah_core.attention import windowed_attention
from aah_core.inference.kvcache import LayerKVCache, choose_decode

N_STEPS = 40  # past two doublings (16 -> 32 -> 40) and past every window below


def _decode(windows: tuple[int, ...], n_kv_head: int, prompt_len: int, decode: str, seed: int = 0, sinks: int = 0):
    """(cached outputs at every position, the float64 reference over the whole sequence)."""
    gen = torch.Generator().manual_seed(seed)
    H, D = len(windows), 8
    q = torch.randn(2, H, N_STEPS, D, generator=gen, dtype=torch.float64)
    k = torch.randn(2, n_kv_head, N_STEPS, D, generator=gen, dtype=torch.float64)
    v = torch.randn(2, n_kv_head, N_STEPS, D, generator=gen, dtype=torch.float64)
    g = H // n_kv_head
    ref = windowed_attention(q, k.repeat_interleave(g, 1), v.repeat_interleave(g, 1), windows, backend="reference",
                             sinks=sinks)
    cache = LayerKVCache(windows, n_kv_head=n_kv_head, max_len=64, sinks=sinks, decode=decode)
    assert cache.decode == decode
    outs = [cache.attend(q[:, :, :prompt_len], k[:, :, :prompt_len], v[:, :, :prompt_len])]
    for t in range(prompt_len, N_STEPS):
        outs.append(cache.attend(q[:, :, t : t + 1], k[:, :, t : t + 1], v[:, :, t : t + 1]))
    return torch.cat(outs, dim=2), ref, cache


CASES = {
    "mixed windows": ((3, 17, 64, 1, 5, 33), 6),
    "grouped, query heads see less": ((3, 7, 5, 5, 2, 40, 64, 9), 4),
    "equal kv windows, masked query heads": ((4, 9, 2, 9), 2),
    "equal windows": ((12, 12, 12), 3),
    "all full": ((64, 64), 2),
}


@pytest.mark.parametrize("decode", ["flat", "buckets"])
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("prompt_len", [1, 20])
def test_cache_decoding_equals_the_float64_reference_at_every_position(case, prompt_len, decode):
    windows, n_kv_head = CASES[case]
    out, ref, cache = _decode(windows, n_kv_head, prompt_len, decode)
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    for s in cache.sizes():  # every ring holds min(t, w) positions in at most w slots
        assert s.length == min(N_STEPS, s.window) <= s.capacity <= s.window


@pytest.mark.parametrize("decode", ["flat", "buckets"])
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("prompt_len, sinks", [(1, 3), (2, 3), (20, 3), (5, 1), (1, 30)])
def test_sink_tokens_stay_in_the_cache_and_decoding_is_exact(case, prompt_len, sinks, decode):
    windows, n_kv_head = CASES[case]
    out, ref, cache = _decode(windows, n_kv_head, prompt_len, decode, sinks=sinks)
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    for s in cache.sizes():  # every ring holds its sinks and its window: min(t, w + s) positions
        span = min(s.window + sinks, 64)
        assert s.length == min(N_STEPS, span) <= s.capacity <= span
    entries = sum(s.length * s.n_kv_head for s in cache.sizes())
    itemsize = 8  # float64
    assert cache.nbytes() == 2 * 2 * 8 * itemsize * entries  # k and v, batch 2, D 8


class _CountOps(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


def _step_ops(windows: tuple[int, ...], decode: str) -> list[str]:
    gen = torch.Generator().manual_seed(1)
    H, D = len(windows), 4
    cache = LayerKVCache(windows, n_kv_head=H, max_len=64, decode=decode)
    cache.attend(*(torch.randn(1, H, 20, D, generator=gen) for _ in range(3)))
    cache.attend(*(torch.randn(1, H, 1, D, generator=gen) for _ in range(3)))  # past the first growth
    step = [torch.randn(1, H, 1, D, generator=gen) for _ in range(3)]
    with _CountOps() as counted:
        cache.attend(*step)
    return counted.ops


def test_a_flat_decode_step_runs_the_same_operations_whatever_the_number_of_windows():
    two = _step_ops((2, 30, 2, 30, 2, 30, 2, 30), "flat")
    eight = _step_ops((1, 2, 3, 5, 8, 13, 21, 30), "flat")
    assert two == eight
    # one attention call over the flat buffer: scores, softmax, weighted values
    assert [op.split(".")[1] for op in two if "bmm" in op or "softmax" in op] == ["baddbmm", "_softmax", "bmm"]
    assert not any("scaled_dot_product" in op for op in two)


def test_a_bucket_decode_step_runs_the_same_operations_whatever_the_number_of_heads():
    four = _step_ops((2, 30, 2, 30), "buckets")
    twelve = _step_ops((2, 30, 2, 30, 2, 30, 2, 30, 2, 30, 2, 30), "buckets")
    assert four == twelve
    assert sum("scaled_dot_product" in op for op in four) == 2  # one attention call per window
    three = _step_ops((2, 30, 7, 30), "buckets")
    assert sum("scaled_dot_product" in op for op in three) == 3


def test_auto_decode_is_chosen_by_the_layer_shape_when_the_prompt_arrives():
    # a small buffer: the flat call's wasted products cost less than three more calls
    assert choose_decode([16, 32, 64, 128], group=1, batch=1, head_dim=64) == "flat"
    # the demo's windows up to 4096: n_kv_head times the products outweigh the calls
    assert choose_decode([64, 128, 512, 4096], group=1, batch=1, head_dim=32) == "buckets"
    assert choose_decode([16, 32, 64, 128], group=1, batch=64, head_dim=64) == "buckets"  # grows with the batch
    assert choose_decode([40, 40], group=2, batch=1, head_dim=8) == "buckets"  # one window: one call anyway
    cache = LayerKVCache((16, 32, 64, 128), n_kv_head=4, max_len=256)
    assert cache.decode == "auto"
    cache.attend(*(torch.randn(1, 4, 5, 64) for _ in range(3)))
    assert cache.decode == "flat"


@pytest.mark.parametrize("windows, n_kv_head, sinks, native_steps", [
    ((3, 17, 64, 1, 5, 33), 6, 0, True),
    ((12, 12, 40, 40), 2, 0, True),  # grouped query heads that see all of their kv head
    ((64, 64), 2, 0, True),
    ((3, 7, 5, 5), 2, 0, False),  # a query head sees less than its kv head: masks, so SDPA
    ((3, 17), 2, 2, False),  # sinks: masks
])
@pytest.mark.parametrize("prompt_len", [1, 20])
def test_float32_decode_steps_run_in_c_where_no_head_needs_a_mask(monkeypatch, windows, n_kv_head, sinks,
                                                                     native_steps, prompt_len):
    """A float32 cache on CPU whose query heads each see all of their kv head's ring (no sinks) decodes in one call
    of native.decode_step (rings growing by doubling, then full); against the float64 reference."""
    from aah_core.attention import native

    if not native.available()[0]:
        pytest.skip(f"no native kernel here: {native.available()[1]}")
    calls = []
    real = native.decode_step
    monkeypatch.setattr(native, "decode_step", lambda *a: calls.append(1) or real(*a))
    gen = torch.Generator().manual_seed(7)
    H, D = len(windows), 16
    q, k, v = (torch.randn(2, h, N_STEPS, D, generator=gen) for h in (H, n_kv_head, n_kv_head))
    group = H // n_kv_head
    ref = windowed_attention(q.double(), k.double().repeat_interleave(group, 1), v.double().repeat_interleave(group, 1),
                             windows, backend="reference", sinks=sinks)
    cache = LayerKVCache(windows, n_kv_head=n_kv_head, max_len=64, sinks=sinks)
    outs = [cache.attend(q[:, :, :prompt_len], k[:, :, :prompt_len], v[:, :, :prompt_len])]
    for t in range(prompt_len, N_STEPS):
        outs.append(cache.attend(q[:, :, t : t + 1], k[:, :, t : t + 1], v[:, :, t : t + 1]))
    torch.testing.assert_close(torch.cat(outs, dim=2).double(), ref, rtol=1e-5, atol=1e-5)
    assert len(calls) == (N_STEPS - prompt_len if native_steps else 0)

