"""Config bounds, exact number coercion, corpus limits and the memory estimate (issue 10 item 5):
the engine refuses what no machine should run, naming the field, so the CLI and the API agree."""

from __future__ import annotations

import pytest

from aah_core.coerce import coerce
from aah_core.config import RunConfig, apply_overrides
from aah_core.data import corpus
from aah_core.errors import InvalidConfig
from aah_core.model import WindowedGPT
from aah_core.model_config import ModelConfig
from aah_core.presets import get_preset
from aah_core.resources import GIB, check_fits, check_loadable, param_count, training_bytes

# (override, the field the refusal must name): every shape the security review found accepted
OUT_OF_BOUNDS = [
    ({"model.n_layer": 1e19}, "model.n_layer"),
    ({"model.d_model": 65536}, "model.d_model"),
    ({"model.seq_len": 1e7}, "model.seq_len"),
    ({"model.vocab_size": 2**40}, "model.vocab_size"),
    ({"model.n_head": 0}, "model.n_head"),
    ({"model.rope_base": 0.0}, "model.rope_base"),
    ({"train.batch_size": 1e7}, "train.batch_size"),
    ({"train.threads": 1e5}, "train.threads"),
    ({"train.max_steps": 2**62}, "train.max_steps"),
    ({"train.max_steps": 1e30}, "train.max_steps"),
    ({"train.max_steps": 2.5}, "train.max_steps"),
    ({"train.lr": "nan"}, "train.lr"),
    ({"train.lr": float("inf")}, "train.lr"),
    ({"train.lr": 1e300}, "train.lr"),
    ({"train.seed": -1}, "train.seed"),
    ({"train.eval_batches": 10**6}, "train.eval_batches"),
    ({"data.copy_max_span": 10**9}, "data.copy_max_span"),
    ({"model.buckets": list(range(1, 200))}, "model.buckets"),
    ({"controller.mode": "aah", "controller.control_dim": 10**9}, "controller.control_dim"),
    ({"controller.mode": "aah", "controller.max_depth": 1e30}, "controller.max_depth"),
]


@pytest.mark.parametrize("overrides, field", OUT_OF_BOUNDS, ids=[f for _, f in OUT_OF_BOUNDS])
def test_out_of_bounds_settings_are_refused_naming_the_field(overrides, field):
    with pytest.raises(InvalidConfig, match=field.replace(".", r"\.")):
        apply_overrides(get_preset("tiny"), overrides)


def test_a_checkpoint_config_goes_through_the_same_bounds():
    raw = get_preset("tiny").to_dict()
    raw["model"]["d_model"] = 65536
    with pytest.raises(InvalidConfig, match=r"model\.d_model"):
        RunConfig.from_dict(raw)


def test_integers_stay_exact_and_floats_must_be_integral():
    assert coerce(2**53 + 1, int, "k") == 2**53 + 1  # not routed through a float
    assert coerce("9007199254740993", int, "k") == 2**53 + 1
    assert coerce(3.0, int, "k") == 3 and coerce("1e3", int, "k") == 1000
    for bad in (2.5, "2.5", "nan", float("inf"), 2**63, 1e19, "1" * 30, True, None):
        with pytest.raises(InvalidConfig, match="^k"):
            coerce(bad, int, "k")
    for bad in ("nan", float("-inf"), 1e300):
        with pytest.raises(InvalidConfig, match="^k"):
            coerce(bad, float, "k")


@pytest.mark.parametrize("kwargs", [{}, {"positions": "learned", "seq_len": 32, "buckets": [4, None]},
                                    {"n_layer": 3, "d_model": 48, "n_head": 3, "mlp_ratio": 2, "vocab_size": 300,
                                     "buckets": [4, None]}], ids=["default", "learned", "odd"])
def test_param_count_is_the_models(kwargs):
    m = ModelConfig(**kwargs)
    assert param_count(m) == WindowedGPT(m).num_params()


def test_the_memory_estimate_grows_with_the_model_and_the_batch():
    base = get_preset("tiny")
    wider = apply_overrides(base, {"model.d_model": 64})
    bigger_batch = apply_overrides(base, {"train.batch_size": 64})
    assert training_bytes(wider)["parameters"] > training_bytes(base)["parameters"]
    assert training_bytes(bigger_batch)["activations"] > training_bytes(base)["activations"]
    reference = apply_overrides(base, {"train.backend": "reference"})
    assert training_bytes(reference)["activations"] > training_bytes(base)["activations"]  # full score matrices


def test_a_config_that_cannot_fit_is_refused_naming_what_to_shrink():
    tiny = get_preset("tiny")
    check_fits(tiny, memory=4 * GIB)
    huge_model = apply_overrides(tiny, {"model.d_model": 16384, "model.n_layer": 64})
    with pytest.raises(InvalidConfig, match=r"^model\.d_model .*needs about .* GiB"):
        check_fits(huge_model, memory=64 * GIB)
    huge_batch = apply_overrides(tiny, {"train.batch_size": 65536, "model.seq_len": 4096})
    with pytest.raises(InvalidConfig, match=r"^train\.batch_size"):
        check_fits(huge_batch, memory=64 * GIB)
    check_loadable(10**6, memory=64 * GIB)
    with pytest.raises(InvalidConfig, match="parameters need about 3725.8 GiB to load"):
        check_loadable(10**12, memory=64 * GIB)


def test_more_threads_than_cpus_is_refused(monkeypatch):
    monkeypatch.setattr("os.cpu_count", lambda: 4)
    check_fits(apply_overrides(get_preset("tiny"), {"train.threads": 4}))
    with pytest.raises(InvalidConfig, match=r"train\.threads=5: this machine has 4 CPUs"):
        check_fits(apply_overrides(get_preset("tiny"), {"train.threads": 5}))


def test_a_folder_that_is_not_a_corpus_is_refused(tmp_path, monkeypatch):
    binaries = tmp_path / "bin"
    binaries.mkdir()
    (binaries / "a.so").write_bytes(b"\0" * 100)
    with pytest.raises(InvalidConfig, match="holds no .txt/.md/.py/.rst files"):
        corpus.check_corpus(str(binaries))
    many = tmp_path / "many"
    many.mkdir()
    for i in range(12):
        (many / f"{i}.txt").write_text("x")
    monkeypatch.setattr(corpus, "MAX_CORPUS_ENTRIES", 10)
    with pytest.raises(InvalidConfig, match="more than 10 entries; it is not a corpus"):
        corpus.check_corpus(str(many))
    monkeypatch.setattr(corpus, "MAX_CORPUS_ENTRIES", 100)
    monkeypatch.setattr(corpus, "MAX_CORPUS_BYTES", 5)
    with pytest.raises(InvalidConfig, match="MiB of text"):
        corpus.check_corpus(str(many))
    big = tmp_path / "big.txt"
    big.write_text("y" * 10)
    with pytest.raises(InvalidConfig, match="MiB of text"):
        corpus.check_corpus(str(big))
