#!/usr/bin/env bash
# The GPU check, in three steps; each fits well inside one 10-minute device command:
#   1  capability report: torch, GPU, every backend's status (flex: one tiny compiled call)
#   2  the CUDA attention tests (parity with the float64 reference, gradients, auto's choice)
#   3  a short attention benchmark per dtype (float32, bfloat16) for the mixed plan of causal
#      coverage ~0.3 (mix-cov0.32) and the single window w=T/16, ratio to causal SDPA
#   4  (only with --step 4) bench/generate.py at T=4096: KV bytes, prefill and decode-step time of
#      the mixed plan vs full, batch 1 and 8 (a few minutes; not yet run on a GPU)
# Usage: bench/gpu.sh [--quick] [--dry-run] [--step N]...
#   --quick    T in {1024, 4096}, 3 timed runs (about 6 minutes of GPU time for all three steps)
#              instead of T in {1024, 4096, 16384}, 7 runs
#   --step N   only step N (repeatable); default 1 2 3
#   --dry-run  every step on this machine's CPU at toy sizes: checks the commands, paths and
#              arguments, so that a GPU run can fail on nothing but the GPU
# Results go to $OUT when it is set (the device machine's output folder), else bench/results/:
#   gpu-report[-dry-run].json, gpu-tests[-dry-run].log, attention-gpu-<dtype>[-dry-run].json,
#   generate-gpu[-dry-run].json (step 4)
# PY chooses the interpreter (default python3: the GPU machine has no `python`). A failing step is
# reported and the next one still runs; the exit status is 1 if any step failed.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}

quick=0 dry=0 steps=()
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) quick=1 ;;
    --dry-run) dry=1 ;;
    --step) shift; case "${1:-}" in 1|2|3|4) steps+=("$1") ;; *) echo "gpu.sh: --step takes 1, 2, 3 or 4" >&2; exit 2 ;; esac ;;
    -h|--help) sed -n '2,19p' "$0"; exit 0 ;;
    *) echo "gpu.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done
[ ${#steps[@]} -gt 0 ] || steps=(1 2 3)

results=${OUT:-bench/results}
mkdir -p "$results"
if [ $dry = 1 ]; then
  device=cpu suffix=-dry-run limit=300
  T=(1024) bench_args=(--runs 1 --warmup 0 --backends banded --modes fwd)
  test_args=(--collect-only -q)
else
  device=cuda suffix="" limit=540
  if [ $quick = 1 ]; then T=(1024 4096) bench_args=(--runs 3 --warmup 1); else T=(1024 4096 16384) bench_args=(--runs 7 --warmup 2); fi
  bench_args+=(--backends banded flex flash)
  test_args=(-q -rs)
fi

step1() {
  timeout $limit "$PY" -m bench.gpu_report --device $device --out "$results/gpu-report$suffix.json"
}
step2() {
  timeout $limit "$PY" -m pytest "${test_args[@]}" -p no:cacheprovider \
    tests/core/test_attention.py tests/core/test_attention_flex.py \
    tests/core/test_attention_capabilities.py tests/core/test_device_consistency.py \
    2>&1 | tee "$results/gpu-tests$suffix.log"
}
step3() {
  local dtype rc=0
  for dtype in float32 bfloat16; do
    timeout $((limit / 2)) "$PY" -m bench.attention --device $device --dtype $dtype --T "${T[@]}" \
      --plans mix-cov0.32 w=T/16 "${bench_args[@]}" --out "$results/attention-gpu-$dtype$suffix.json" || rc=1
  done
  return $rc
}

step4() {
  local gen_T=4096
  [ $dry = 1 ] && gen_T=128
  timeout $limit "$PY" -m bench.generate --device $device --T $gen_T --repeats 3 \
    --out "$results/generate-gpu$suffix.json"
}

failed=()
for s in "${steps[@]}"; do
  echo "== step $s ($(date -u +%H:%M:%S))"
  "step$s" || { echo "== step $s FAILED"; failed+=("$s"); }
done
if [ ${#failed[@]} -gt 0 ]; then echo "gpu.sh: failed steps: ${failed[*]}"; exit 1; fi
echo "gpu.sh: all steps passed; results in $results"
