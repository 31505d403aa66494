"""Sink tokens (StreamingLLM): query i attends key j iff j <= i and (j > i - w or j < s).

A brute-force float64 oracle written from that rule, checked against transformers' own mask
primitives and StreamingLLM's cache eviction, then every backend (and its gradients) against it.
"""

import math

import pytest
import torch

from aah_core.attention import available_backends, flex, windowed_attention
from aah_core.attention.masks import window_block_tables
from aah_core.errors import InvalidWindowPlan


def _allowed(i: int, j: int, w: int, s: int) -> bool:
    return j <= i and (j > i - w or j < s)


def sink_oracle(q, k, v, windows, sinks, scale=None):
    """Loops over every (batch, head, query): softmax over exactly the keys the rule allows."""
    B, H, T, D = q.shape
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    out = torch.zeros_like(q)
    for b in range(B):
        for h in range(H):
            for i in range(T):
                keys = [j for j in range(T) if _allowed(i, j, windows[h], sinks)]
                scores = torch.stack([(q[b, h, i] * k[b, h, j]).sum() * scale for j in keys])
                probs = torch.softmax(scores, dim=0)
                out[b, h, i] = sum(p * v[b, h, j] for p, j in zip(probs, keys))
    return out


@pytest.mark.parametrize("w, s, T", [(1, 1, 9), (3, 2, 12), (4, 4, 10), (2, 0, 7), (5, 9, 8)])
def test_rule_matches_transformers_masks_and_streaming_llm_cache(w, s, T):
    from transformers.masking_utils import and_masks, causal_mask_function, or_masks, sliding_window_overlay

    def sink_overlay(b, h, q_idx, kv_idx):
        return kv_idx < s

    hf = and_masks(causal_mask_function, or_masks(sliding_window_overlay(w), sink_overlay))
    for i in range(T):
        # StreamingLLM's cache (mit-han-lab/streaming-llm kv_cache.py) at step i: the first s keys
        # and the last w of the keys 0..i, nothing twice
        streaming = set(range(min(s, i + 1))) | set(range(max(0, i + 1 - w), i + 1))
        for j in range(T):
            ours = _allowed(i, j, w, s)
            assert ours == bool(hf(0, 0, torch.tensor(i), torch.tensor(j))), (i, j)
            assert ours == (j in streaming), (i, j)


# (B, H, T, windows, sinks): T never a multiple of the block sizes; windows below, at and above T
CASES = {
    "T37-s1": (1, 3, 37, [1, 2, 36], 1),
    "T37-s4-full": (2, 4, 37, [37, 40, 5, 1], 4),
    "T70-s4-blocks": (1, 3, 70, [3, 16, 64], 4),
    "T20-s30": (1, 2, 20, [2, 5], 30),
    "T40-s0": (1, 2, 40, [3, 9], 0),
    "T1-s2": (1, 2, 1, [1, 3], 2),
}
EXACT = [b for b in available_backends("cpu") if b != "flex"]  # float64-capable on CPU


def _qkv(B, H, T, D=8, dtype=torch.float64, grad=False):
    g = torch.Generator().manual_seed(T * 7 + H)
    return [torch.randn(B, H, T, D, generator=g, dtype=dtype).requires_grad_(grad) for _ in range(3)]


@pytest.mark.parametrize("backend", EXACT)
@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_float64_parity_and_gradients_against_the_oracle(backend, case):
    B, H, T, windows, sinks = CASES[case]
    grads = {}
    for name in ("oracle", backend):
        q, k, v = _qkv(B, H, T, grad=True)
        if name == "oracle":
            out = sink_oracle(q, k, v, windows, sinks)
        else:
            out = windowed_attention(q, k, v, windows, backend=backend, sinks=sinks)
        (out * torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out)).sum().backward()
        grads[name] = (out.detach(), q.grad, k.grad, v.grad)
    for what, got, want in zip(("out", "dq", "dk", "dv"), grads[backend], grads["oracle"]):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10, msg=lambda m, n=what: f"{n}: {m}")


def test_sinks_change_the_output_only_where_the_rule_adds_keys():
    q, k, v = _qkv(1, 1, 30)
    plain = windowed_attention(q, k, v, [4], backend="banded")
    sunk = windowed_attention(q, k, v, [4], backend="banded", sinks=2)
    changed = (plain - sunk).abs().amax(-1)[0, 0] > 0  # (T,)
    # row i gains a sink key only once key 0 has left its window: i - 4 >= 0
    assert changed.tolist() == [i >= 4 for i in range(30)]


@pytest.mark.parametrize("c, w, s", [(32, 8, 4), (32, 128, 4), (64, 100, 1), (32, 5, 40)])
def test_banded_body_blocks_see_the_sinks_once_and_their_band(c, w, s):
    # a block's keys are M chunks of (s sink copies, c band keys): one dense sink block, the band, nothing else
    from aah_core.attention.banded import band_mask

    mask = band_mask(c, w, torch.float64, torch.device("cpu"), s)
    M = -(-(c + w - 1) // c)
    assert mask.shape == (c, M * (s + c))  # cost: about c + w + M*s keys per row, not a copy per block
    assert torch.all(mask[:, :s] == 0)  # the dense sink block: every row sees every sink
    band = band_mask(c, w, torch.float64, torch.device("cpu"))  # (c, c+w-1) without sinks
    chunks = mask.view(c, M, s + c)
    assert torch.all(chunks[:, 1:, :s] == float("-inf"))  # the other chunks' sink copies: never seen
    assert torch.equal(chunks[:, :, s:].reshape(c, M * c)[:, : c + w - 1], band)
    assert torch.all(chunks[:, :, s:].reshape(c, M * c)[:, c + w - 1:] == float("-inf"))


@pytest.mark.parametrize("bad", [-1, 1.5, True, "4", None])
def test_bad_sink_counts_are_refused(bad):
    q, k, v = _qkv(1, 1, 5)
    with pytest.raises(InvalidWindowPlan, match="sink"):
        windowed_attention(q, k, v, [2], sinks=bad)


@pytest.mark.parametrize("windows, T, sinks", [((1, 5, 200), 300, 4), ((3,), 260, 130), ((64, 128), 256, 1)])
def test_flex_block_tables_match_the_dense_rule(windows, T, sinks):
    counts, idx, full_counts, full_idx = window_block_tables(windows, T, 128, torch.device("cpu"), sinks)
    n = -(-T // 128)
    i = torch.arange(T).view(T, 1)
    j = torch.arange(T).view(1, T)
    for h, w in enumerate(windows):
        allowed = (j <= i) & ((j > i - w) | (j < sinks))
        for qb in range(n):
            listed = set(idx[0, h, qb, : counts[0, h, qb]].tolist())
            full = set(full_idx[0, h, qb, : full_counts[0, h, qb]].tolist())
            for kb in range(n):
                tile = allowed[qb * 128:(qb + 1) * 128, kb * 128:(kb + 1) * 128]
                whole = tile.shape == (128, 128)
                if whole and tile.all():
                    assert kb in full and kb not in listed
                elif tile.any():
                    assert kb in listed or kb in full
                else:
                    assert kb not in listed and kb not in full


needs_flex = pytest.mark.skipif(not flex.available(torch.device("cpu"))[0], reason="compiled flex unavailable here")


@needs_flex
def test_flex_matches_the_oracle_with_sinks():
    B, H, T, windows, sinks = 1, 3, 150, [3, 40, 150], 4
    q, k, v = _qkv(B, H, T)
    with torch.no_grad():
        out = windowed_attention(q.float(), k.float(), v.float(), windows, backend="flex", sinks=sinks)
    want = windowed_attention(q, k, v, windows, backend="reference", sinks=sinks)
    torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=1e-5)
    want_small = sink_oracle(q[:, :, :20], k[:, :, :20], v[:, :, :20], windows, sinks)
    torch.testing.assert_close(want[:, :, :20], want_small, rtol=1e-10, atol=1e-10)
