"""aah_core.checkpoint.read_checkpoint_info: what a service needs from a checkpoint, without its weights."""

from __future__ import annotations

import json
import re

import pytest
import torch
from safetensors.torch import load_file, save_file

from aah_core.checkpoint import load_checkpoint, read_checkpoint_info, save_checkpoint, verify_checkpoint
from aah_core.errors import CheckpointError


@pytest.fixture
def saved(tiny_model, tiny_config, tmp_path):
    tiny_model.set_plan(torch.tensor([[4, 64], [16, 1]]))
    return save_checkpoint(tmp_path / "c", tiny_model, tiny_config, controller_state={"ema": [1.0]},
                           meta={"step": 7})


def test_info_matches_what_loading_the_weights_gives(saved, tiny_model):
    info = read_checkpoint_info(saved)
    ckpt = load_checkpoint(saved)
    assert info.config.to_dict() == ckpt.config.to_dict()
    assert torch.equal(info.plan, ckpt.plan) and info.plan.tolist() == [[4, 64], [16, 1]]
    assert info.meta == {"step": 7} and info.controller_state == {"ema": [1.0]}
    # parameters() counts the tied embedding / lm_head once, as the file stores it
    assert info.n_params == sum(p.numel() for p in tiny_model.parameters())


@pytest.mark.parametrize("windows, where", [([[4, 0], [16, 1]], "layer 0, head 1"),
                                             ([[4, 64], [16, "x"]], "layer 1, head 1"),
                                             ([[4, 64]], "2 layers")], ids=["zero", "string", "shape"])
def test_a_bad_plan_is_refused_naming_the_file_and_the_head(saved, windows, where):
    doc = json.loads((saved / "plan.json").read_text())
    (saved / "plan.json").write_text(json.dumps({**doc, "windows": windows}))
    with pytest.raises(CheckpointError, match=rf"plan\.json: .*{where}"):
        read_checkpoint_info(saved)


def test_foreign_or_corrupt_files_are_refused(saved):
    header = json.loads((saved / "config.json").read_text())
    (saved / "config.json").write_text(json.dumps({**header, "format": "other"}))
    with pytest.raises(CheckpointError, match="not an AAH Studio checkpoint"):
        read_checkpoint_info(saved)
    (saved / "config.json").write_text(json.dumps(header))
    (saved / "model.safetensors").write_bytes(b"\x00" * 16)
    with pytest.raises(CheckpointError, match="model.safetensors: unreadable"):
        read_checkpoint_info(saved)
    (saved / "plan.json").unlink()
    with pytest.raises(CheckpointError, match="missing plan.json"):
        read_checkpoint_info(saved)


def test_verify_checks_every_tensor_against_the_config(saved):
    assert verify_checkpoint(saved).plan.tolist() == [[4, 64], [16, 1]]
    state = load_file(str(saved / "model.safetensors"))
    name = sorted(state)[0]
    state[name] = torch.zeros(3, 5)
    save_file(state, str(saved / "model.safetensors"))
    with pytest.raises(CheckpointError, match=rf"shapes do not match the config \({re.escape(name)}: \(3, 5\)"):
        verify_checkpoint(saved)
    del state[name]
    save_file(state, str(saved / "model.safetensors"))
    with pytest.raises(CheckpointError, match=rf"missing \['{re.escape(name)}'\]"):
        verify_checkpoint(saved)


def test_a_model_without_sinks_writes_its_config_as_before_and_one_with_sinks_round_trips(tiny_config, tmp_path):
    from aah_core.config import apply_overrides
    from aah_core.model import WindowedGPT

    plain = save_checkpoint(tmp_path / "plain", WindowedGPT(tiny_config.model), tiny_config)
    # sinks = 0 is not written at all: checkpoints from before sink tokens and after are the same bytes
    assert "sinks" not in json.loads((plain / "config.json").read_text())["config"]["model"]
    assert load_checkpoint(plain).config.model.sinks == 0
    sunk = apply_overrides(tiny_config, {"model.sinks": 4})
    path = save_checkpoint(tmp_path / "sunk", WindowedGPT(sunk.model), sunk)
    assert json.loads((path / "config.json").read_text())["config"]["model"]["sinks"] == 4
    ckpt = load_checkpoint(path)
    assert ckpt.config.model.sinks == 4 and ckpt.model.sinks == 4
