"""aah_core.meta.shapes_only: a model built for its shapes is the model a real build gives, minus the values,
and neither reading a checkpoint's info (an API start, an upload check) nor training (aah_core.optim.AdamW)
imports torch._dynamo."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from aah_core.checkpoint import save_checkpoint
from aah_core.meta import shapes_only
from aah_core.model import WindowedGPT
from aah_core.presets import get_preset

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("preset", ["tiny", "demo", "static_per_layer", "learned_budget"])
def test_a_shapes_only_model_has_the_real_models_tensors_on_meta(preset: str) -> None:
    config = get_preset(preset).model
    real = WindowedGPT(config)
    with shapes_only():
        shaped = WindowedGPT(config)
    assert [(k, v.shape, v.dtype) for k, v in shaped.state_dict().items()] == \
        [(k, v.shape, v.dtype) for k, v in real.state_dict().items()]
    assert {t.device.type for t in [*shaped.parameters(), *shaped.buffers()]} == {"meta"}
    assert {t.device.type for t in [*real.parameters(), *real.buffers()]} == {"cpu"}


def test_initialisers_still_run_on_real_tensors_inside() -> None:
    with shapes_only():
        on_cpu = torch.zeros(1000, device="cpu")
        torch.nn.init.normal_(on_cpu)
        filled = torch.zeros(3, device="cpu").fill_(2.0)
        on_meta = torch.empty(4)
    assert on_cpu.std() > 0.5 and filled.tolist() == [2.0, 2.0, 2.0] and on_meta.is_meta
    assert torch.empty(1).device.type == "cpu"  # the default device is put back


def test_reading_a_checkpoint_and_training_import_no_dynamo(tmp_path: Path) -> None:
    """One process for both (importing torch is most of its cost): the checks run in turn, each reported."""
    config = get_preset("tiny")
    folder = save_checkpoint(tmp_path / "ckpt", WindowedGPT(config.model), config)
    code = ("import sys\nfrom aah_core.checkpoint import read_checkpoint_info, load_checkpoint\n"
            f"info = read_checkpoint_info({str(folder)!r})\nload_checkpoint({str(folder)!r})\n"
            "print(info.n_params, 'torch._dynamo' in sys.modules)\n"
            "from aah_core.config import apply_overrides\nfrom aah_core.presets import get_preset\n"
            "from aah_core.train import train\n"
            "cfg = apply_overrides(get_preset('tiny'), {'train.max_steps': 2, 'train.eval_every': 2})\n"
            f"result = train(cfg, {str(tmp_path / 'trained')!r})\n"
            "print(result.status, result.step, 'torch._dynamo' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    n_params = sum(p.numel() for p in WindowedGPT(config.model).parameters())
    # a training run: model, optimizer steps (AdamW: aah_core.optim), evaluation and checkpoints
    assert out.stdout.split("\n")[:2] == [f"{n_params} False", "FINISHED 2 False"]
