import pytest
import torch

from aah_core.checkpoint import load_checkpoint, save_checkpoint
from aah_core.data.tokenizers import ByteTokenizer
from aah_core.errors import AAHError
from aah_core.model import WindowedGPT
from aah_core.model_api import WindowedLM, power_of_two_buckets


def test_power_of_two_buckets_end_with_the_context():
    assert power_of_two_buckets(1024) == [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]
    assert power_of_two_buckets(40) == [1, 2, 4, 8, 16, 32, 40]
    assert power_of_two_buckets(1) == [1]


def test_a_loaded_demo_checkpoint_satisfies_the_model_interface(tiny_config, tmp_path):
    torch.manual_seed(0)
    save_checkpoint(tmp_path / "ck", WindowedGPT(tiny_config.model), tiny_config)
    model = load_checkpoint(tmp_path / "ck").model
    assert isinstance(model, WindowedLM)
    assert isinstance(model.tokenizer, ByteTokenizer)
    m = tiny_config.model
    assert (model.n_layer, model.n_head, model.seq_len, model.vocab_size) == (m.n_layer, m.n_head, m.seq_len, m.vocab_size)
    assert tuple(model.plan.shape) == (m.n_layer, m.n_head)


def test_queries_keys_reproduce_the_layer_output(tiny_model):
    """Attention built from queries_keys and the layer's own values equals the layer's attention."""
    model = tiny_model.double().eval()
    idx = torch.randint(0, 256, (2, 24))
    plan = torch.full((model.n_layer, model.n_head), model.seq_len)
    x = model.run_layers(model.embed(idx), plan, end=1)
    q, k = model.queries_keys(x, 1)
    seen = {}
    model.blocks[1].attn.observer = lambda layer, q_, k_, v_, y_: seen.update(q=q_, k=k_)
    model.run_layers(x, plan, start=1, end=2)
    torch.testing.assert_close(q, seen["q"])
    torch.testing.assert_close(k, seen["k"])


def test_a_model_built_without_a_tokenizer_says_how_to_get_one(tiny_config):
    model = WindowedGPT(tiny_config.model)
    with pytest.raises(AAHError, match="built without a tokenizer; load it with"):
        model.tokenizer.encode("x")
