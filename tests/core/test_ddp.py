import subprocess
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file

from aah_core.checkpoint import load_checkpoint
from aah_core.config import apply_overrides
from aah_core.presets import get_preset
from aah_core.train import train


def test_two_gloo_processes_train_to_identical_weights(tmp_path):
    worker = Path(__file__).with_name("ddp_worker.py")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(worker), str(tmp_path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    r0, r1 = load_file(str(tmp_path / "rank0.safetensors")), load_file(str(tmp_path / "rank1.safetensors"))
    assert set(r0) == set(r1)
    for name in r0:
        assert torch.equal(r0[name], r1[name]), name
    # the ranks saw different data, so the result differs from a single-process run of the same steps
    single = train(apply_overrides(get_preset("tiny"), {"train.max_steps": 4, "train.eval_every": 2}), tmp_path / "single")
    assert load_checkpoint(tmp_path / "ckpt").meta["step"] == single.step == 4
    assert not torch.equal(r0["blocks.0.attn.qkv.weight"], load_checkpoint(tmp_path / "single").model.blocks[0].attn.qkv.weight)
