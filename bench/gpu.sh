#!/usr/bin/env bash
# Attention on a CUDA machine: the GPU attention tests, then the benchmark table with flex
# and flash added (float32: banded/flex; bfloat16: flash too, since flash kernels take
# fp16/bf16 only). Results land in bench/results/attention-<gpu>[-bfloat16].json.
# Usage: bench/gpu.sh [extra bench.attention args]   (PY=/path/to/python to choose the interpreter;
# it needs a CUDA build of torch, so not the CPU-only .venv of `make setup`)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python}
"$PY" - <<'PYEOF'
import torch
assert torch.cuda.is_available(), f"no CUDA device visible to torch {torch.__version__}"
print("device:", torch.cuda.get_device_name(), "torch", torch.__version__)
from aah_core.attention import backend_status
print("backends on cuda:", {k: v or "ok" for k, v in backend_status("cuda").items()})
PYEOF
"$PY" -m pytest -q tests/core/test_attention.py tests/core/test_attention_flex.py
T="1024 2048 4096 8192 16384"
"$PY" -m bench.attention --device cuda --dtype float32 --T $T --runs 15 --warmup 3 "$@"
"$PY" -m bench.attention --device cuda --dtype bfloat16 --T $T --runs 15 --warmup 3 "$@"
