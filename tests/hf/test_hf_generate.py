"""Generation through the Hugging Face adapter: cached per-head decoding equals the adapter's own
windowed forward at every position, grouped-query kv heads keep their query heads' largest window."""

from __future__ import annotations

import pytest
import torch

from aah_core.hf import open_hf_model
from aah_core.inference.cost import ModelShape, plan_cost
from aah_core.inference.generate import forward_cached, generate, new_cache
from tests.hf.tiny import FAMILIES

T = 20


@pytest.mark.parametrize("family", FAMILIES)
def test_cached_decoding_equals_the_windowed_forward_at_every_position(hf_root, family):
    model = open_hf_model(hf_root / family, dtype="float32", seq_len=T)
    gen = torch.Generator().manual_seed(3)
    plan = torch.randint(1, 8, (model.n_layer, model.n_head), generator=gen)
    plan[0, 0], plan[-1, -1] = T, 1  # a full head and a one-key head
    idx = torch.randint(0, 300, (1, T), generator=gen)
    cache = new_cache(model, plan)
    prompt = 3
    decoded = [forward_cached(model, idx[:, :prompt], cache, plan)]
    for t in range(prompt, T):
        decoded.append(forward_cached(model, idx[:, t : t + 1], cache, plan))
        for layer, row in zip(cache.layers, plan.tolist()):
            g = model.n_head // model.n_kv_head
            kv = sorted(set(max(row[j * g : (j + 1) * g]) for j in range(model.n_kv_head)))
            assert sorted(s.window for s in layer.sizes()) == kv
            assert all(s.length == min(t + 1, s.window) <= s.capacity <= s.window for s in layer.sizes())
    assert cache.nbytes() == plan_cost(plan, T, ModelShape.of(model)).kv_bytes
    for i, logits in enumerate(decoded):
        t = prompt - 1 + i
        ref = model.logits(model.run_layers(model.embed(idx[:, : t + 1]), plan))[:, -1]
        torch.testing.assert_close(logits, ref, rtol=0, atol=1e-5, msg=f"{family}, position {t}")


def test_generate_runs_on_a_grouped_query_model(hf_root):
    model = open_hf_model(hf_root / "mistral", dtype="float32", seq_len=T)
    assert (model.n_head, model.n_kv_head) == (4, 1)
    result = generate(model, torch.tensor([model.tokenizer.encode("Every head")]), max_new_tokens=50)
    assert result.stop_reason == "context" and result.prompt_len + result.tokens.shape[1] == T
