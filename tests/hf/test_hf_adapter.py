"""The Hugging Face adapter against transformers' own forward and an independent float64 reference."""

from __future__ import annotations

import pytest
import torch

from aah_core.analysis.evaluate import PrefixCachedEvaluator, evaluate_loss
from aah_core.attention.reference import attention_probs
from aah_core.data import EvalBatch
from aah_core.errors import CheckpointError
from aah_core.hf import describe_hf_model, open_hf_model
from aah_core.model_api import WindowedLM
from tests.hf.tiny import FAMILIES, MAX_POS, SLIDING, TEXTS, own_forward_model

T = 24  # > SLIDING, so native windows cut
WINDOWED = {"qwen3": [None, None, SLIDING, SLIDING], "mistral": [SLIDING, SLIDING],
            "gemma3": [SLIDING, None, SLIDING]}


def _ids(batch: int = 2, length: int = T, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 300, (batch, length), generator=torch.Generator().manual_seed(seed))


def test_transformers_sliding_window_w_is_our_window_w():
    """The installed transformers' own sliding-window mask with sliding_window=w keeps exactly our
    window w: keys i - w < j <= i."""
    from transformers.masking_utils import sdpa_mask, sliding_window_causal_mask_function

    n = 16
    i = torch.arange(n).view(n, 1)
    j = torch.arange(n).view(1, n)
    for w in (1, 2, 5, 15, 16, 40):
        theirs = sdpa_mask(batch_size=1, q_length=n, kv_length=n, mask_function=sliding_window_causal_mask_function(w),
                           allow_is_causal_skip=False)[0, 0]
        assert torch.equal(theirs, (j <= i) & (j > i - w)), w


@pytest.mark.parametrize("family", FAMILIES)
def test_own_plan_logits_equal_transformers_own_forward(hf_root, family):
    """fp32, T > the native window: Mistral's, Qwen3's and Gemma3's own sliding layers included."""
    model = open_hf_model(hf_root / family, dtype="float32")
    assert isinstance(model, WindowedLM)
    native = [None if int(row[0]) >= model.seq_len else int(row[0]) for row in model.plan]
    assert native == WINDOWED.get(family, [None] * model.n_layer)
    idx = _ids()
    ours = model.logits(model.run_layers(model.embed(idx), model.plan))
    with torch.no_grad():
        theirs = own_forward_model(hf_root / family, "eager")(idx).logits
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)


_REFERENCE_PLAN: dict[int, list[int]] = {}


def _reference_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """An explicit float64 per-head window mask, written here independently of windowed_attention."""
    H, n = query.shape[1], query.shape[2]
    groups = H // key.shape[1]
    kv_of = torch.arange(H) // groups  # query head h reads kv head h // groups
    key, value = key[:, kv_of], value[:, kv_of]
    scores = (query @ key.transpose(-1, -2)) * scaling  # (B, H, n, n)
    pos = torch.arange(n)
    windows = torch.tensor(_REFERENCE_PLAN[module.layer_idx]).view(H, 1, 1)
    keep = (pos.view(1, n, 1) >= pos.view(1, 1, n)) & (pos.view(1, n, 1) - pos.view(1, 1, n) < windows)
    probs = scores.masked_fill(~keep, float("-inf")).softmax(dim=-1)
    return (probs @ value).transpose(1, 2).contiguous(), probs


@pytest.mark.parametrize("family", FAMILIES)
def test_per_head_plans_equal_an_independent_float64_reference(hf_root, family):
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register("test_reference64", _reference_attention)
    AttentionMaskInterface.register("test_reference64", lambda *a, **k: None)
    model = open_hf_model(hf_root / family, dtype="float32").double()
    gen = torch.Generator().manual_seed(1)
    plan = torch.randint(1, T + 3, (model.n_layer, model.n_head), generator=gen)
    plan[0, 0], plan[-1, -1] = 1, 2  # heads of one kv group with different windows
    _REFERENCE_PLAN.clear()
    _REFERENCE_PLAN.update({layer: row for layer, row in enumerate(plan.tolist())})
    reference = own_forward_model(hf_root / family, "test_reference64", torch.float64)
    idx = _ids(seed=2)
    ours = model.logits(model.run_layers(model.embed(idx), plan))
    with torch.no_grad():
        theirs = reference(idx).logits
    torch.testing.assert_close(ours, theirs, rtol=1e-10, atol=1e-10)
    full = model.logits(model.run_layers(model.embed(idx), torch.full_like(plan, T)))
    assert not torch.allclose(full, ours, atol=1e-3)  # the plan matters


@pytest.mark.parametrize("family", ["gemma3", "gpt2", "llama"])
def test_queries_keys_give_transformers_own_attention_maps(hf_root, family):
    """softmax(q k^T / sqrt(D)) from queries_keys, windowed by the own plan == transformers' eager
    attention weights (Gemma3's query_pre_attn_scalar and GQA included)."""
    model = open_hf_model(hf_root / family, dtype="float32")
    idx = _ids(batch=1)
    with torch.no_grad():
        eager = own_forward_model(hf_root / family, "eager")(idx, output_attentions=True).attentions
    x = model.embed(idx)
    for layer in range(model.n_layer):
        q, k = model.queries_keys(x, layer)
        ours = attention_probs(q, k, tuple(model.plan[layer].tolist()))
        torch.testing.assert_close(ours, eager[layer], rtol=1e-5, atol=1e-6)
        x = model.run_layers(x, model.plan, start=layer, end=layer + 1)


def test_prefix_cached_evaluation_equals_full_evaluation(hf_root):
    model = open_hf_model(hf_root / "qwen3", dtype="float32")
    idx = _ids(batch=2, length=T + 1, seed=3)
    batch = EvalBatch(idx[:, :-1], idx[:, 1:], ["text", "text"])
    evaluator = PrefixCachedEvaluator(model, batch)
    evaluator.loss(model.plan)
    edited = model.plan.clone()
    edited[2, 1] = 3
    assert evaluator.loss(edited) == pytest.approx(evaluate_loss(model, batch, edited), abs=1e-6)
    assert evaluator.layers_recomputed == 2
    assert evaluate_loss(model, batch, edited) != pytest.approx(evaluate_loss(model, batch), abs=1e-6)


def test_sink_tokens_per_call_reach_every_layer_and_the_evaluator_recomputes_for_them(hf_root):
    model = open_hf_model(hf_root / "qwen3", dtype="float32")
    idx = _ids(batch=2, length=T + 1, seed=3)
    batch = EvalBatch(idx[:, :-1], idx[:, 1:], ["text", "text"])
    ones = torch.ones_like(model.plan)
    with torch.no_grad():  # window 1 beside T sinks sees every earlier key: full attention
        x = model.embed(batch.idx)
        full = model.run_layers(x, torch.full_like(model.plan, model.seq_len))
        torch.testing.assert_close(model.run_layers(x, ones, sinks=model.seq_len), full, rtol=1e-5, atol=1e-5)
    evaluator = PrefixCachedEvaluator(model, batch)
    plain = evaluator.loss(ones)
    sunk = evaluator.loss(ones, sinks=2)
    assert evaluator.layers_recomputed == model.n_layer and sunk != pytest.approx(plain, abs=1e-6)
    assert evaluator.loss(ones) == plain and evaluator.layers_recomputed == model.n_layer


def test_tokenizer_and_description_come_from_the_folder(hf_root):
    model = open_hf_model(hf_root / "llama")
    ids = model.tokenizer.encode(TEXTS[0])
    assert model.tokenizer.decode(ids) == TEXTS[0]
    assert "".join(model.tokenizer.decode_token(i) for i in ids) == TEXTS[0]
    info = describe_hf_model(hf_root / "gpt2")
    assert (info.family, info.n_layer, info.n_head, info.max_seq_len, info.seq_len) == ("gpt2", 2, 4, MAX_POS, MAX_POS)
    assert info.n_params == sum(p.numel() for p in own_forward_model(hf_root / "gpt2").parameters())
    assert describe_hf_model(hf_root / "mistral", seq_len=32).seq_len == 32
    with pytest.raises(CheckpointError, match="seq_len"):
        describe_hf_model(hf_root / "mistral", seq_len=MAX_POS + 1)


def test_a_pickle_only_folder_is_refused_without_unpickling(hf_root, tmp_path):
    folder = tmp_path / "pickled"
    folder.mkdir()
    (folder / "config.json").write_text((hf_root / "llama" / "config.json").read_text())
    (folder / "tokenizer.json").write_text((hf_root / "llama" / "tokenizer.json").read_text())
    (folder / "pytorch_model.bin").write_bytes(b"not a pickle: unpickling this would raise UnpicklingError")
    for call in (open_hf_model, describe_hf_model):
        with pytest.raises(CheckpointError, match="only pickle weights"):
            call(folder)


def test_bfloat16_runs_and_stays_close_to_float32(hf_root):
    f32 = open_hf_model(hf_root / "mistral", dtype="float32")
    bf16 = open_hf_model(hf_root / "mistral", dtype="bfloat16")
    idx = _ids(batch=1)
    a = f32.logits(f32.run_layers(f32.embed(idx), f32.plan))
    b = bf16.logits(bf16.run_layers(bf16.embed(idx), bf16.plan))
    assert b.dtype == torch.bfloat16
    torch.testing.assert_close(b.float(), a, rtol=0.1, atol=0.15)
