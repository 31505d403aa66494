import json

import pytest
import torch
from safetensors.torch import load_file

from aah_core.checkpoint import load_checkpoint, save_checkpoint
from aah_core.config import apply_overrides
from aah_core.errors import CheckpointError, InvalidConfig
from aah_core.train import Callback, JsonlSink, train


class Recorder(Callback):
    def __init__(self):
        self.metrics, self.events = [], []

    def on_start(self, info):
        self.events.append(("start", info["total_steps"]))

    def on_metrics(self, step, metrics):
        self.metrics.append((step, metrics))

    def on_end(self, status, error):
        self.events.append(("end", status))


def test_training_decreases_loss_and_writes_a_loadable_checkpoint(tiny_config, tmp_path):
    cfg = apply_overrides(tiny_config, {"train.max_steps": 30, "train.eval_every": 10, "train.lr": 3e-3})
    rec = Recorder()
    result = train(cfg, tmp_path / "ckpt", [rec, JsonlSink(tmp_path / "m.jsonl")])
    assert result.status == "FINISHED" and result.step == 30
    first = sum(m["train_loss"] for _, m in rec.metrics[:5]) / 5
    last = sum(m["train_loss"] for _, m in rec.metrics[-5:]) / 5
    assert last < first - 0.3
    assert rec.events == [("start", 30), ("end", "FINISHED")]
    evals = [m for _, m in rec.metrics if "val_loss" in m]
    assert len(evals) == 3 and {"acr", "causal_coverage", "tile_coverage", "window_frac/full"} <= set(evals[0])
    rows = [json.loads(line) for line in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, 31))
    ckpt = load_checkpoint(tmp_path / "ckpt")
    assert ckpt.meta["step"] == 30 and len(ckpt.meta["data_hash"]) == 16
    assert ckpt.config.to_dict() == cfg.to_dict()


def test_resume_continues_from_the_saved_step(tiny_config, tmp_path):
    cfg = apply_overrides(tiny_config, {"train.max_steps": 6})
    train(cfg, tmp_path / "a")
    more = apply_overrides(cfg, {"train.max_steps": 9})
    rec = Recorder()
    result = train(more, tmp_path / "b", [rec], resume=tmp_path / "a")
    assert result.step == 9 and [s for s, _ in rec.metrics] == [7, 8, 9]


class StopAfter(Recorder):
    """Asks the run to stop once `step` has been reported, as the service's kill does."""

    def __init__(self, step):
        super().__init__()
        self.step = step

    def should_stop(self):
        return bool(self.metrics) and self.metrics[-1][0] >= self.step


def losses(recorder):
    return [(step, m["train_loss"]) for step, m in recorder.metrics]


def test_a_resumed_run_computes_the_losses_of_the_uninterrupted_run(tiny_config, tmp_path):
    # dropout draws from the generator and AdamW's moments carry over: both must be restored
    cfg = apply_overrides(tiny_config, {"train.max_steps": 8, "train.eval_every": 3, "train.lr": 3e-3,
                                        "model.dropout": 0.2, "train.warmup_steps": 2})
    whole = Recorder()
    train(cfg, tmp_path / "whole", [whole])
    first = StopAfter(4)
    assert train(cfg, tmp_path / "part", [first]).status == "KILLED"
    assert (tmp_path / "part" / "trainer.safetensors").is_file()
    second = Recorder()
    result = train(cfg, tmp_path / "rest", [second], resume=tmp_path / "part")
    assert result.step == 8 and [s for s, _ in second.metrics] == [5, 6, 7, 8]
    for (step, want), (_, got) in zip(losses(whole)[4:], losses(second)):
        assert abs(want - got) <= 1e-6, (step, want, got)
    assert losses(first) == losses(whole)[:4]
    # the same resume without the trainer state (fresh moments, the generator left where seeding put it) drifts
    (tmp_path / "part" / "trainer.safetensors").unlink()
    fresh = Recorder()
    train(cfg, tmp_path / "fresh", [fresh], resume=tmp_path / "part")
    assert max(abs(a - b) for (_, a), (_, b) in zip(losses(whole)[4:], losses(fresh))) > 1e-3


def test_trainer_state_that_does_not_fit_the_run_is_refused(tiny_config, tmp_path):
    cfg = apply_overrides(tiny_config, {"train.max_steps": 2})
    train(cfg, tmp_path / "a")
    wider = apply_overrides(cfg, {"model.d_model": 64, "train.max_steps": 3})
    train(wider, tmp_path / "b")
    (tmp_path / "b" / "trainer.safetensors").replace(tmp_path / "a" / "trainer.safetensors")
    with pytest.raises(CheckpointError, match="optimizer state for parameter"):
        train(apply_overrides(cfg, {"train.max_steps": 3}), tmp_path / "c", resume=tmp_path / "a")
    (tmp_path / "a" / "trainer.safetensors").write_bytes(b"\x00" * 16)
    with pytest.raises(CheckpointError, match="trainer.safetensors: unreadable"):
        train(apply_overrides(cfg, {"train.max_steps": 3}), tmp_path / "c", resume=tmp_path / "a")


def test_checkpoint_round_trip_is_bit_exact(tiny_model, tiny_config, tmp_path):
    plan = torch.tensor([[4, 64], [16, 1]])
    tiny_model.set_plan(plan)
    save_checkpoint(tmp_path / "c", tiny_model, tiny_config, controller_state={"ema": [1.5, 2.0]}, meta={"k": 1})
    ckpt = load_checkpoint(tmp_path / "c")
    for name, tensor in tiny_model.state_dict().items():
        assert torch.equal(tensor, ckpt.model.state_dict()[name]), name
    assert torch.equal(ckpt.plan, plan) and torch.equal(ckpt.model.plan, plan)
    assert ckpt.controller_state == {"ema": [1.5, 2.0]} and ckpt.meta == {"k": 1}
    assert ckpt.model.lm_head.weight.data_ptr() == ckpt.model.wte.weight.data_ptr()  # still tied
    # saving over an existing checkpoint replaces it whole and leaves no temp directories
    save_checkpoint(tmp_path / "c", tiny_model, tiny_config)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c"]


@pytest.mark.parametrize("damage, message", [
    (lambda d: (d / "model.safetensors").write_bytes(b"\x00" * 64), "model.safetensors: unreadable"),
    (lambda d: (d / "config.json").write_text("{not json"), "not valid JSON"),
    (lambda d: (d / "config.json").write_text('{"format": "other"}'), "not an AAH Studio checkpoint"),
    (lambda d: (d / "plan.json").unlink(), "missing plan.json"),
    (lambda d: (d / "plan.json").write_text('{"windows": [[0, 1], [1, 1]]}'), "layer 0, head 0"),
])
def test_corrupt_or_foreign_checkpoints_are_refused(tiny_model, tiny_config, tmp_path, damage, message):
    save_checkpoint(tmp_path / "c", tiny_model, tiny_config)
    damage(tmp_path / "c")
    with pytest.raises(CheckpointError, match=message):
        load_checkpoint(tmp_path / "c")


def test_weights_of_another_shape_are_refused(tiny_model, tiny_config, tmp_path):
    save_checkpoint(tmp_path / "c", tiny_model, tiny_config)
    header = json.loads((tmp_path / "c" / "config.json").read_text())
    header["config"]["model"]["n_layer"] = 3
    (tmp_path / "c" / "config.json").write_text(json.dumps(header))
    # refused from the safetensors header, before a model of the config's size is built
    with pytest.raises(CheckpointError, match="weights do not match"):
        load_checkpoint(tmp_path / "c")


def test_pickle_files_and_missing_dirs_are_refused(tmp_path):
    (tmp_path / "model.pt").write_bytes(b"\x80\x04K\x01.")
    with pytest.raises(CheckpointError, match="pickle checkpoints are refused"):
        load_checkpoint(tmp_path / "model.pt")
    with pytest.raises(CheckpointError, match="no such checkpoint"):
        load_checkpoint(tmp_path / "nothing")


def test_safetensors_file_holds_no_duplicate_tied_weight(tiny_model, tiny_config, tmp_path):
    save_checkpoint(tmp_path / "c", tiny_model, tiny_config)
    assert "lm_head.weight" not in load_file(str(tmp_path / "c" / "model.safetensors"))


@pytest.mark.parametrize("overrides, message", [
    ({"train.nope": 1}, "unknown config key 'train.nope'"),
    ({"model.buckets": [8, 4, None]}, "strictly increasing"),
    ({"model.buckets": [4, 999]}, "larger than model.seq_len"),
    ({"model.n_head": 3}, "divisible"),
    ({"train.lr": "fast"}, "train.lr expects a finite number"),
])
def test_bad_settings_fail_before_training(tiny_config, overrides, message):
    with pytest.raises(InvalidConfig, match=message):
        apply_overrides(tiny_config, overrides)
