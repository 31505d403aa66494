#!/usr/bin/env bash
# The GPU check, in four steps (first run on an NVIDIA H200 on 2026-12-04: docs/performance.md):
#   1  capability report: torch, GPU, every backend's status (flex: one tiny compiled call)
#   2  the CUDA attention tests (parity with the float64 reference, gradients, auto's choice)
#   3  a short attention benchmark per dtype (float32, bfloat16) for the mixed plan of causal
#      coverage ~0.3 (mix-cov0.32) and the single window w=T/16, ratio to causal SDPA
#   4  (only with --step 4) bench/generate.py at T=4096: KV bytes, prefill and decode-step time of
#      the mixed plan vs full, batch 1 and 8 (about a minute on the H200)
# Usage: bench/gpu.sh [--quick] [--dry-run] [--budget S] [--batch B] [--T N...] [--step N]...
#   --quick    T in {1024, 4096}, 10 timed runs (steps 1-4: about 5 minutes on the H200)
#              instead of T in {1024, 4096, 16384}, 20 runs
#   --budget S all steps together end within S seconds: each step's timeout is cut to what is left,
#              and a step with under 20 s left is skipped (reported as failed)
#   --batch B  step 3's batch (default 1); --T N... its sequence lengths instead of --quick's or the full set
#   --step N   only step N (repeatable); default 1 2 3
#   --dry-run  every step on this machine's CPU at toy sizes: checks the commands, paths and
#              arguments, so that a GPU run can fail on nothing but the GPU
# Results go to $OUT when it is set (the device machine's output folder), else bench/results/:
#   gpu-report[-dry-run].json, gpu-tests[-dry-run].log, attention-gpu[-b<batch>]-<dtype>[-dry-run].json,
#   generate-gpu[-dry-run].json (step 4), and everything printed in gpu[-dry-run].log
# PY chooses the interpreter (default python3: the GPU machine has no `python`). A failing step is
# reported and the next one still runs; the exit status is 1 if any step failed.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}

quick=0 dry=0 budget=0 batch=1 lengths=() steps=()
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) quick=1 ;;
    --dry-run) dry=1 ;;
    --batch) shift; case "${1:-}" in ''|*[!0-9]*) echo "gpu.sh: --batch takes a whole number" >&2; exit 2 ;; esac; batch=$1 ;;
    --T) while [[ "${2:-}" =~ ^[0-9]+$ ]]; do lengths+=("$2"); shift; done
         [ ${#lengths[@]} -gt 0 ] || { echo "gpu.sh: --T takes sequence lengths" >&2; exit 2; } ;;
    --budget) shift; case "${1:-}" in ''|*[!0-9]*) echo "gpu.sh: --budget takes whole seconds" >&2; exit 2 ;; esac; budget=$1 ;;
    --step) shift; case "${1:-}" in 1|2|3|4) steps+=("$1") ;; *) echo "gpu.sh: --step takes 1, 2, 3 or 4" >&2; exit 2 ;; esac ;;
    -h|--help) sed -n '2,22p' "$0"; exit 0 ;;
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
  # a GPU run is milliseconds and compiling dominates, so runs are cheap: enough for a steady median
  if [ $quick = 1 ]; then T=(1024 4096) bench_args=(--runs 10 --warmup 2); else T=(1024 4096 16384) bench_args=(--runs 20 --warmup 3); fi
  bench_args+=(--backends banded flex flash)
  test_args=(-q -rs)
fi
bench_args+=(--batch $batch)  # (--batch and --T reach the dry run too: it checks the arguments)
[ ${#lengths[@]} -gt 0 ] && T=("${lengths[@]}")
batch_tag=""
[ $batch != 1 ] && batch_tag="-b$batch"

# seconds a step may take: its own limit, cut to what --budget leaves (0: too little left to start)
started=$SECONDS
allowed() {
  local want=$1 left
  [ $budget = 0 ] && { echo "$want"; return; }
  left=$((budget - (SECONDS - started) - 5))
  [ $left -lt 20 ] && { echo 0; return; }
  echo $((want < left ? want : left))
}
run_limited() {  # run_limited SECONDS COMMAND...: the command under timeout, or skipped when no time is left
  local t
  t=$(allowed "$1"); shift
  [ "$t" = 0 ] && { echo "== skipped: the --budget is spent"; return 1; }
  timeout "$t" "$@"
}

step1() {
  run_limited $limit "$PY" -m bench.gpu_report --device $device --out "$results/gpu-report$suffix.json"
}
step2() {
  run_limited $limit "$PY" -m pytest "${test_args[@]}" -p no:cacheprovider \
    tests/core/test_attention.py tests/core/test_attention_flex.py \
    tests/core/test_attention_capabilities.py tests/core/test_device_consistency.py \
    2>&1 | tee "$results/gpu-tests$suffix.log"
}
step3() {
  local dtype rc=0
  for dtype in float32 bfloat16; do
    run_limited $((limit / 3)) "$PY" -m bench.attention --device $device --dtype $dtype --T "${T[@]}" \
      --plans mix-cov0.32 w=T/16 "${bench_args[@]}" --out "$results/attention-gpu$batch_tag-$dtype$suffix.json" || rc=1
  done
  return $rc
}

step4() {
  local gen_T=4096
  [ $dry = 1 ] && gen_T=128
  run_limited $limit "$PY" -m bench.generate --device $device --T $gen_T --repeats 3 \
    --out "$results/generate-gpu$suffix.json"
}

all_steps() {
  local s failed=()
  for s in "${steps[@]}"; do
    echo "== step $s ($(date -u +%H:%M:%S), $((SECONDS - started)) s in)"
    "step$s" || { echo "== step $s FAILED"; failed+=("$s"); }
  done
  if [ ${#failed[@]} -gt 0 ]; then echo "gpu.sh: failed steps: ${failed[*]}"; return 1; fi
  echo "gpu.sh: all steps passed in $((SECONDS - started)) s; results in $results"
}
all_steps 2>&1 | tee "$results/gpu$suffix.log"
