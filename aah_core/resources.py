"""What a config costs this machine: parameter count, a training-memory estimate and the machine's
memory, so that a run which cannot fit is refused before it starts (not by the kernel's OOM killer
an hour later), and a checkpoint too large to load is listed as unavailable instead of loaded.

The estimate is deliberately simple and on the generous side (float32 everywhere):

- parameters, their gradients and AdamW's two moments: 16 bytes per parameter;
- activations kept for the backward pass, per layer: about (10 + 2 * mlp_ratio) tensors of
  [batch, seq_len, d_model] (layer norms, q/k/v, attention output, residuals, MLP hidden and its
  activation), plus the attention band: [batch, n_head, seq_len, w] with w = seq_len on the
  `reference` backend (it materialises every score) and the largest finite bucket otherwise (full
  heads go through fused SDPA, which keeps no score matrix);
- logits, their log-softmax and gradient: 3 x [batch, seq_len, vocab_size];
- a fixed allowance for the runtime (RUNTIME_BYTES).
"""

from __future__ import annotations

import os
from pathlib import Path

from aah_core.config import RunConfig
from aah_core.errors import InvalidConfig
from aah_core.model_config import ModelConfig

FLOAT_BYTES = 4
RUNTIME_BYTES = 512 << 20  # the interpreter, torch and its allocator's slack
CGROUP_LIMITS = (Path("/sys/fs/cgroup/memory.max"), Path("/sys/fs/cgroup/memory/memory.limit_in_bytes"))
GIB = 1 << 30


def param_count(m: ModelConfig) -> int:
    """Parameters of WindowedGPT(m), counted as a checkpoint stores them (the tied lm_head once)."""
    D, r = m.d_model, m.mlp_ratio
    block = (4 + 2 * r) * D * D + (5 + r) * D  # qkv 3D², proj D², fc and proj 2rD² (+ biases), 2 layer norms
    positions = m.seq_len * D if m.positions == "learned" else 0
    return m.vocab_size * D + positions + m.n_layer * block + 2 * D


def training_bytes(config: RunConfig) -> dict[str, int]:
    """The estimate above, by part: {"parameters", "activations", "logits", "runtime"} in bytes."""
    m, B = config.model, config.train.batch_size
    finite = [b for b in m.bucket_windows if b < m.seq_len]
    band = m.seq_len if config.train.backend == "reference" or not finite else max(finite)
    per_layer = (10 + 2 * m.mlp_ratio) * B * m.seq_len * m.d_model + B * m.n_head * m.seq_len * band
    return {
        "parameters": 4 * param_count(m) * FLOAT_BYTES,
        "activations": m.n_layer * per_layer * FLOAT_BYTES,
        "logits": 3 * B * m.seq_len * m.vocab_size * FLOAT_BYTES,
        "runtime": RUNTIME_BYTES,
    }


def machine_memory() -> int:
    """Bytes of memory this process may use: physical memory, or the cgroup's limit when lower."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for limit in CGROUP_LIMITS:
        try:
            text = limit.read_text().strip()
        except OSError:
            continue
        if text.isdigit():
            total = min(total, int(text))
    return total


def check_fits(config: RunConfig, memory: int | None = None) -> None:
    """InvalidConfig, naming the fields to change, when training `config` would need more memory than
    `memory` (default: machine_memory()) or more threads than this machine has CPUs."""
    cpus = os.cpu_count() or 1
    if config.train.threads > cpus:
        raise InvalidConfig(f"train.threads={config.train.threads}: this machine has {cpus} CPUs; use at most {cpus} "
                            "(0 = torch's default)")
    memory = machine_memory() if memory is None else memory
    parts = training_bytes(config)
    need = sum(parts.values())
    if need <= memory:
        return
    if parts["parameters"] >= parts["activations"] + parts["logits"]:
        fields = "model.d_model / model.n_layer / model.vocab_size"
    else:
        fields = "train.batch_size / model.seq_len"
    detail = ", ".join(f"{k} {v / GIB:.1f}" for k, v in parts.items())
    raise InvalidConfig(f"{fields}: training this config needs about {need / GIB:.1f} GiB ({detail} GiB) but this "
                        f"machine has {memory / GIB:.1f} GiB; make the model or the batch smaller")


def check_loadable(n_params: int, bytes_per_param: int = FLOAT_BYTES, memory: int | None = None) -> None:
    """InvalidConfig when a model of `n_params` parameters cannot be held in memory for evaluation."""
    memory = machine_memory() if memory is None else memory
    need = n_params * bytes_per_param + RUNTIME_BYTES
    if need > memory:
        raise InvalidConfig(f"{n_params:,} parameters need about {need / GIB:.1f} GiB to load; this machine has "
                            f"{memory / GIB:.1f} GiB")
