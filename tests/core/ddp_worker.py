"""Run under torchrun by test_ddp.py: train the tiny preset, then dump this rank's weights."""

import os
import sys
from pathlib import Path

import torch.distributed as dist
from safetensors.torch import save_file

from aah_core.config import apply_overrides
from aah_core.model import WindowedGPT
from aah_core.presets import get_preset
from aah_core.train import train

out = Path(sys.argv[1])
config = apply_overrides(get_preset("tiny"), {"train.max_steps": 4, "train.eval_every": 2})
captured: dict[str, WindowedGPT] = {}
original_init = WindowedGPT.__init__


def capture(self, cfg):  # keep a handle on the model each rank trains
    original_init(self, cfg)
    captured.setdefault("model", self)


WindowedGPT.__init__ = capture
train(config, out / "ckpt")
rank = dist.get_rank()
state = {k: v.contiguous() for k, v in captured["model"].state_dict().items() if k != "lm_head.weight"}
save_file(state, str(out / f"rank{rank}.safetensors"))
save_file({"w": captured["model"].blocks[0].attn.qkv.weight.detach().clone()}, str(out / f"init-check{rank}.safetensors"))
print("world", os.environ["WORLD_SIZE"], "rank", rank)
dist.destroy_process_group()
