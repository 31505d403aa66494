"""Per-head KV-cache decoding: exact against full windowed forwards, ring buffers bounded by the window."""

import pytest
import torch

from aah_core.attention import windowed_attention
from aah_core.errors import AAHError
from aah_core.inference.generate import Sampling, forward_cached, generate, new_cache, sample
from aah_core.inference.kvcache import LayerKVCache, kv_head_windows
from aah_core.model import WindowedGPT
from aah_core.model_config import ModelConfig

T = 24


def _model(positions: str = "rope") -> WindowedGPT:
    """A tiny model with weights large enough that attention is sharp (so a wrong key shows in the logits)."""
    torch.manual_seed(0)
    cfg = ModelConfig(n_layer=2, n_head=4, d_model=32, seq_len=T, positions=positions, buckets=[3, 5, None])
    model = WindowedGPT(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.3)
    return model


PLANS = {
    "mixed": [[3, 5, T, 1], [8, 5, 3, T]],
    "all-windowed": [[2, 3, 4, 7], [5, 6, 7, 9]],
    "full": [[T] * 4, [T] * 4],
}


def _decode_logits(
    model: WindowedGPT, idx: torch.Tensor, plan: torch.Tensor, prompt_len: int, decode: str = "auto"
) -> list:
    """Logits at positions prompt_len-1 .. T-1 from cached decoding (prompt, then one token per call)."""
    cache = new_cache(model, plan, backend="banded", decode=decode)
    out = [forward_cached(model, idx[:, :prompt_len], cache, plan)]
    for t in range(prompt_len, idx.shape[1]):
        out.append(forward_cached(model, idx[:, t : t + 1], cache, plan))
    return out


@pytest.mark.parametrize("decode", ["flat", "buckets"])
@pytest.mark.parametrize("positions", ["rope", "learned"])
@pytest.mark.parametrize("plan_name", list(PLANS))
# batch 1 as well: a decode step of one row
@pytest.mark.parametrize("batch, prompt_len", [(2, 1), (2, 3), (2, 4), (2, 9), (1, 1), (1, 4)])
def test_cached_decoding_equals_a_full_windowed_forward_at_every_position(positions, plan_name,
                                                                          prompt_len, decode, batch):
    model = _model(positions)
    plan = torch.tensor(PLANS[plan_name])
    idx = torch.randint(0, 256, (batch, T), generator=torch.Generator().manual_seed(1))
    decoded = _decode_logits(model, idx, plan, prompt_len, decode)
    with torch.no_grad():
        for i, logits in enumerate(decoded):
            t = prompt_len - 1 + i  # every position: before, at and after each wrap
            ref = model(idx[:, : t + 1], plan=plan, backend="reference")[0][:, -1]
            torch.testing.assert_close(logits, ref, rtol=0, atol=1e-5, msg=f"position {t}")


def test_the_exactness_check_sees_a_window_off_by_one():
    """Guard on the test above: decoding under windows one larger differs clearly from the plan's forward."""
    model = _model()
    plan = torch.tensor(PLANS["mixed"])
    wider = (plan + 1).clamp(max=T)
    idx = torch.randint(0, 256, (1, T), generator=torch.Generator().manual_seed(2))
    decoded = _decode_logits(model, idx, wider, 2)
    with torch.no_grad():
        ref = model(idx, plan=plan, backend="reference")[0]
    gap = max(float((d - ref[:, 1 + i]).abs().max()) for i, d in enumerate(decoded))
    assert gap > 1e-3


def test_ring_buffers_never_hold_more_than_their_window():
    model = _model()
    plan = torch.tensor(PLANS["mixed"])
    cache = new_cache(model, plan)
    idx = torch.randint(0, 256, (1, T), generator=torch.Generator().manual_seed(3))
    forward_cached(model, idx[:, :2], cache, plan)
    for t in range(2, T + 1):
        for layer in cache.layers:
            sizes = layer.sizes()
            assert sorted(s.window for s in sizes) == sorted(set(layer.windows))
            for s in sizes:
                assert s.length == min(t, s.window)  # positions held: min(t, w)
                assert s.length <= s.capacity <= s.window  # the buffer itself never has more than w slots
        expected = sum(min(t, w) for w in plan.flatten().tolist())
        assert cache.entries() == expected
        assert cache.nbytes() == expected * 2 * 8 * 4  # k and v, head_dim 8, float32
        if t < T:
            forward_cached(model, idx[:, t : t + 1], cache, plan)


@pytest.mark.parametrize("prompt_len", [1, 5, 8, 11])
def test_grouped_query_cache_is_exact_and_keeps_the_largest_window(prompt_len):
    """4 query heads share 2 kv heads: kv head 0 serves windows (3, 7), kv head 1 serves (5, 5)."""
    torch.manual_seed(4)
    windows, n_steps = (3, 7, 5, 5), 20
    q = torch.randn(2, 4, n_steps, 8)
    k, v = torch.randn(2, 2, n_steps, 8), torch.randn(2, 2, n_steps, 8)
    assert kv_head_windows(windows, 2) == [7, 5]
    k_rep, v_rep = k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)  # (B, 4, T, D)
    ref = windowed_attention(q, k_rep, v_rep, windows, backend="reference")
    cache = LayerKVCache(windows, n_kv_head=2, max_len=64)
    out = cache.attend(q[:, :, :prompt_len], k[:, :, :prompt_len], v[:, :, :prompt_len])
    torch.testing.assert_close(out, ref[:, :, :prompt_len], rtol=0, atol=1e-5)
    for t in range(prompt_len, n_steps):
        out = cache.attend(q[:, :, t : t + 1], k[:, :, t : t + 1], v[:, :, t : t + 1])
        torch.testing.assert_close(out, ref[:, :, t : t + 1], rtol=0, atol=1e-5, msg=f"position {t}")
        assert {s.window: s.length for s in cache.sizes()} == {7: min(t + 1, 7), 5: min(t + 1, 5)}


def test_generation_stops_at_max_new_tokens_or_at_the_context_and_says_which():
    model = _model()
    prompt = torch.randint(0, 256, (1, 5))
    short = generate(model, prompt, max_new_tokens=4)
    assert (short.tokens.shape, short.stop_reason) == ((1, 4), "max_new_tokens")
    long = generate(model, prompt, max_new_tokens=100)
    assert (long.tokens.shape, long.stop_reason) == ((1, T - 5), "context")
    exact = generate(model, prompt, max_new_tokens=T - 5)
    assert exact.tokens.shape == (1, T - 5)
    full = generate(model, torch.randint(0, 256, (1, T)), max_new_tokens=3)
    assert (full.tokens.shape, full.stop_reason) == ((1, 0), "context")
    with pytest.raises(AAHError, match="context is 24"):
        generate(model, torch.randint(0, 256, (1, T + 1)))


def test_greedy_generation_equals_argmax_of_full_forwards_and_the_cache_grows_to_the_windows():
    model = _model()
    plan = torch.tensor(PLANS["mixed"])
    prompt = torch.randint(0, 256, (1, 3), generator=torch.Generator().manual_seed(5))
    result = generate(model, prompt, plan=plan, max_new_tokens=12)
    seq = prompt
    with torch.no_grad():
        for _ in range(12):
            nxt = model(seq, plan=plan, backend="reference")[0][:, -1].argmax(-1, keepdim=True)
            seq = torch.cat([seq, nxt], dim=1)
    assert torch.equal(result.tokens, seq[:, 3:])
    per_entry = 2 * 8 * 4
    held = [sum(min(t, w) for w in plan.flatten().tolist()) for t in range(3, 15)]
    assert result.cache_bytes == [n * per_entry for n in held]


def test_sampling_is_seeded_and_filters_apply():
    logits = torch.tensor([[2.0, 1.0, 0.5, -1.0, -3.0]]).repeat(200, 1)
    a = sample(logits, Sampling(temperature=1.0, seed=0), torch.Generator().manual_seed(7))
    b = sample(logits, Sampling(temperature=1.0, seed=0), torch.Generator().manual_seed(7))
    assert torch.equal(a, b) and len(set(a.tolist())) > 2
    top2 = sample(logits, Sampling(temperature=1.0, top_k=2), torch.Generator().manual_seed(7))
    assert set(top2.tolist()) == {0, 1}
    # p(0) = 0.61, p(1) = 0.22: top_p 0.7 keeps tokens 0 and 1 only
    nucleus = sample(logits, Sampling(temperature=1.0, top_p=0.7), torch.Generator().manual_seed(7))
    assert set(nucleus.tolist()) == {0, 1}
    assert set(sample(logits, Sampling(temperature=1.0, top_p=0.5)).tolist()) == {0}
    assert torch.equal(sample(logits, Sampling()), torch.zeros(200, dtype=torch.long))
    for bad in ({"temperature": -1.0}, {"top_k": -2}, {"top_p": 0.0}):
        with pytest.raises(AAHError):
            Sampling(**bad)


def test_seeded_generation_repeats():
    model = _model()
    prompt = torch.randint(0, 256, (1, 4))
    runs = [generate(model, prompt, max_new_tokens=8, sampling=Sampling(temperature=1.0, top_k=20, seed=s))
            for s in (3, 3, 4)]
    assert torch.equal(runs[0].tokens, runs[1].tokens)
    assert not torch.equal(runs[0].tokens, runs[2].tokens)


def test_a_model_with_sink_tokens_decodes_exactly_and_its_sinks_change_the_logits():
    torch.manual_seed(0)
    cfg = ModelConfig(n_layer=2, n_head=4, d_model=32, seq_len=T, buckets=[3, 5, None], sinks=2)
    model = WindowedGPT(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.3)
    plan = torch.tensor(PLANS["mixed"])
    idx = torch.randint(0, 256, (2, T), generator=torch.Generator().manual_seed(1))
    decoded = _decode_logits(model, idx, plan, 3)
    with torch.no_grad():
        for i, logits in enumerate(decoded):
            t = 2 + i
            ref = model(idx[:, : t + 1], plan=plan, backend="reference")[0][:, -1]
            torch.testing.assert_close(logits, ref, rtol=0, atol=1e-5, msg=f"position {t}")
        plain = WindowedGPT(ModelConfig(n_layer=2, n_head=4, d_model=32, seq_len=T, buckets=[3, 5, None])).eval()
        plain.load_state_dict(model.state_dict())  # the same weights without sinks see less at the last position
        assert not torch.allclose(plain(idx, plan=plan, backend="reference")[0][:, -1], ref)


def test_decoding_in_inference_mode_leaves_no_cached_tensor_that_training_cannot_save():
    """forward_cached runs in inference mode; the band masks and rotary tables it makes are cached for
    later calls, so a training step on the same model afterwards must still backpropagate through them."""
    from aah_core.attention import banded

    banded.band_mask.cache_clear()
    model = _model()
    plan = torch.tensor(PLANS["all-windowed"])
    idx = torch.randint(0, 256, (2, T), generator=torch.Generator().manual_seed(5))
    generate(model, idx[:, :12], plan, max_new_tokens=3, backend="banded")  # prompt of 12: banded body blocks
    model.train()
    _, loss = model(idx, targets=idx, plan=plan, backend="banded")
    assert loss is not None
    loss.backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(bool(torch.isfinite(g).all()) for g in grads)


def test_the_cached_path_stays_differentiable_with_gradients_on():
    # decode steps fuse the MLP's GELU into its addmm on CPU, an op without a backward: only without gradients
    model = _model()
    plan = torch.tensor(PLANS["mixed"])
    idx = torch.randint(0, 256, (2, 8), generator=torch.Generator().manual_seed(2))
    cache = new_cache(model, plan)
    logits = model.logits(model.run_layers(model.embed(idx), plan, cache=cache.layers))
    logits.sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.block(0).mlp.parameters())
