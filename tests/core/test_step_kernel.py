"""A decoding step of a block in one C call (step_kernel.c through inference/block_step.py and
LayerKVCache.step_block; model.py Block.cached): steps against the torch path in float64, whole decodes against
the torch path in float32, and the caches and models it must leave to torch."""

import pytest
import torch

from aah_core.attention import native
from aah_core.inference.block_step import BlockStep
from aah_core.inference.generate import forward_cached, new_cache
from aah_core.inference.kvcache import LayerKVCache
from aah_core.model import Block, WindowedGPT
from aah_core.model_config import ModelConfig

pytestmark = pytest.mark.skipif(not native.available()[0], reason=f"no native kernel here: {native.available()[1]}")


def _block(C: int, H: int, seed: int, seq_len: int = 64) -> Block:
    torch.manual_seed(seed)
    block = Block(ModelConfig(n_head=H, d_model=C, seq_len=seq_len, buckets=[8, None]), layer=0).eval()
    with torch.no_grad():
        for p in block.parameters():  # LayerNorm's and the biases off their defaults too; the GELU's tails reached
            p.normal_(0.0, 0.8)
    return block


@pytest.mark.parametrize("B, C, H, windows, prompt_len", [
    (1, 16, 1, (5,), 3),  # one head; its ring wraps
    (3, 64, 4, (4, 64, 7, 64), 2),  # full heads' rings grow by doubling; short ones wrap
    (8, 128, 4, (16, 40, 3, 64), 20),
    (2, 96, 2, (64, 9), 1)])
def test_block_steps_match_the_torch_path_in_float64(monkeypatch, B, C, H, windows, prompt_len):
    """Each step's output rows, through the cache's rings as they fill, wrap and grow: C in float32 against the
    block's own torch operations in float64 (layer norms, projection, rotary at each position, the cache's
    attention, MLP with the exact GELU)."""
    block = _block(C, H, seed=B + C)
    wide = _block(C, H, seed=B + C).double()
    calls = []
    real = BlockStep.__call__
    monkeypatch.setattr(BlockStep, "__call__", lambda *a: calls.append(1) or real(*a))
    g = torch.Generator().manual_seed(C)
    x = torch.randn(B, 64, C, generator=g) * 2
    caches = [LayerKVCache(windows, n_kv_head=H, max_len=64) for _ in range(2)]
    with torch.inference_mode():
        block.cached(x[:, :prompt_len], caches[0])
        wide.cached(x[:, :prompt_len].double(), caches[1])
        for t in range(prompt_len, 64):
            got = block.cached(x[:, t : t + 1], caches[0])
            want = wide.cached(x[:, t : t + 1].double(), caches[1])
            # float32's error grows with the values' scale: torch's own float32 block errs up to 2e-6 of it here
            torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5 * want.abs().max().item(),
                                       msg=f"position {t}")
    assert len(calls) == 64 - prompt_len


def test_a_step_past_the_rotary_table_is_refused():
    block = _block(32, 2, seed=0, seq_len=16)
    cache = LayerKVCache((16, 16), n_kv_head=2, max_len=64)  # a cache longer than the model's positions
    with torch.inference_mode():
        block.cached(torch.randn(1, 16, 32), cache)
        with pytest.raises(RuntimeError, match="step_kernel.c returned -1"):
            block.cached(torch.randn(1, 1, 32), cache)


@pytest.mark.parametrize("sinks", [0, 2])
def test_decoding_through_c_gives_the_torch_paths_logits(monkeypatch, sinks):
    """Greedy decoding of a small model: every step's logits with the blocks in C and with them in torch
    (BlockStep.takes refusing) agree, and C took every step's every block; a cache with sink tokens (masked)
    leaves every step to torch."""
    torch.manual_seed(3)
    cfg = ModelConfig(n_layer=2, n_head=4, d_model=64, seq_len=48, buckets=[4, 16, None], sinks=sinks)
    model = WindowedGPT(cfg).eval()
    plan = torch.tensor([[4, 16, 48, 48], [48, 4, 4, 16]])
    idx = torch.randint(0, cfg.vocab_size, (3, 48))
    calls = []
    real = BlockStep.__call__
    monkeypatch.setattr(BlockStep, "__call__", lambda *a: calls.append(1) or real(*a))

    def decode() -> list[torch.Tensor]:
        cache = new_cache(model, plan)
        with torch.inference_mode():
            return [forward_cached(model, idx[:, :8], cache, plan)] + [
                forward_cached(model, idx[:, t : t + 1], cache, plan) for t in range(8, 48)]

    in_c = decode()
    assert len(calls) == (0 if sinks else 40 * cfg.n_layer)
    monkeypatch.setattr(BlockStep, "takes", staticmethod(lambda block: False))
    in_torch = decode()
    assert len(calls) == (0 if sinks else 40 * cfg.n_layer)
    for t, (a, b) in enumerate(zip(in_c, in_torch)):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5, msg=f"step {t}")


def test_each_generation_reads_the_model_as_it_is_then():
    """A model cast to float64 between two generations decodes in torch, and in C again once cast back; a block
    with an observer stays in torch."""
    torch.manual_seed(4)
    cfg = ModelConfig(n_layer=1, n_head=2, d_model=32, seq_len=16, buckets=[4, None])
    model = WindowedGPT(cfg).eval()
    plan = torch.tensor([[4, 16]])
    idx = torch.randint(0, cfg.vocab_size, (1, 16))
    block = model.block(0)

    def steps_in_c() -> bool:
        cache = new_cache(model, plan)
        with torch.inference_mode():
            forward_cached(model, idx[:, :4], cache, plan)
            forward_cached(model, idx[:, 4:5], cache, plan)
        return block._c_step is not None and block._c_step[1] is not None

    assert steps_in_c()
    model.double()
    assert not steps_in_c()
    model.float()
    assert steps_in_c()
    block.attn.observer = lambda *args: None
    assert not steps_in_c()
