#!/usr/bin/env bash
# float32 on CUDA: up to which call size (B*H*T^2 scores) does flex beat banded? That sets auto's SMALL_SCORES
# (aah_core/attention). The mixed plan at T in {1024, 2048}, batch 1, 2 and 4 (H = 8, D = 64),
# flex and banded against causal SDPA; each row says what auto chose. About 3 minutes on the H200.
# Usage: PY=python3 bench/gpu_threshold.sh [--dry-run]   (results in $OUT, else bench/results/; --dry-run:
# batch 1, T = 128, banded only, on this machine's CPU, to check the commands before GPU time is spent)
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
results=${OUT:-bench/results}
mkdir -p "$results"
device=cuda T=(1024 2048) batches=(1 2 4) backends=(banded flex) args=(--runs 10 --warmup 2) suffix="" limit=110
if [ "${1:-}" = --dry-run ]; then
  # (banded only: flex compiles for seconds on a CPU and its arguments are the same)
  device=cpu T=(128) batches=(1) backends=(banded) args=(--runs 1 --warmup 0 --modes fwd) suffix=-dry-run limit=60
fi
run_all() {
  local batch rc=0
  for batch in "${batches[@]}"; do
    echo "== batch $batch ($(date -u +%H:%M:%S))"
    timeout $limit "$PY" -m bench.attention --device $device --dtype float32 --T "${T[@]}" --plans mix-cov0.32 \
      --backends "${backends[@]}" --batch $batch "${args[@]}" \
      --out "$results/attention-gpu-threshold-b$batch-float32$suffix.json" || { echo "== batch $batch FAILED"; rc=1; }
  done
  return $rc
}
run_all 2>&1 | tee "$results/gpu-threshold$suffix.log"
