#!/usr/bin/env bash
# The GPU check: the `gpu` tests, the argv checks and the GPU parts of stages 02 (GEMM)
# and 03 (NCCL, and vLLM's own all-reduce paths: PyNccl and the custom all-reduce, eager and
# CUDA graph) on whatever GPUs are present, then OUT/summary.md (device, timings, % of peak
# bandwidth, pass/fail per check). Meant to run unattended: every step has a timeout, a
# failed step does not stop the next, and the summary is written on any exit.
# About 2-4 minutes on one GPU; the timeouts below cap it at 10 minutes there.
#
#   bash benchmarks/gpu_check.sh [OUT_DIR]      (default outputs/gpu-check-<UTC time>)
#
# Exit status: 0 all passed, 1 a check failed, 3 no CUDA device (nothing was checked).
set -u -o pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
OUT=${1:-outputs/gpu-check-$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
PY=${PYTHON:-$ROOT/.venv/bin/python}
[ -x "$PY" ] || PY=$(command -v python3)
export PYTHONPATH="$ROOT/lib${PYTHONPATH:+:$PYTHONPATH}"
# A per-test limit where pytest-timeout is installed (the test extra has it).
PER_TEST=()
"$PY" -c "import pytest_timeout" 2>/dev/null && PER_TEST=(--timeout 200)
STEPS=$OUT/steps.tsv
: > "$STEPS"
STATUS=0

# Seconds per step on one GPU: device 30, tests 240, vLLM collectives 60, GEMM 90, NCCL 150,
# summary 30 (600 s at most); the tests get 30 s more per extra GPU (one NCCL test per GPU
# count), the vLLM collectives 60 s more (three implementations per GPU count).
step() {  # step NAME SECONDS LOGFILE COMMAND...
  local name=$1 secs=$2 log=$3; shift 3
  local t0=$SECONDS rc
  echo "[gpu-check] $name (at most ${secs} s; log: $log)"
  timeout -k 10 "$secs" "$@" > "$log" 2>&1
  rc=$?
  printf '%s\t%s\t%s\n' "$name" "$rc" "$((SECONDS - t0))" >> "$STEPS"
  tail -n 3 "$log" | sed 's/^/    /'
  return "$rc"
}

finish() {
  local rc=$?
  [ "$STATUS" -eq 0 ] && [ "$rc" -ne 0 ] && STATUS=$rc
  if ! timeout -k 5 30 "$PY" benchmarks/gpu_check.py summary "$OUT" > "$OUT/summary.log" 2>&1; then
    # The summary of last resort: the steps and their exit codes, in markdown.
    { echo "# stepscope GPU check (summary script failed; see summary.log)"; echo
      echo "| step | exit code | seconds |"; echo "|---|---|---|"
      sed 's/\t/ | /g; s/^/| /; s/$/ |/' "$STEPS"; } > "$OUT/summary.md"
  fi
  echo "[gpu-check] summary: $OUT/summary.md (exit $STATUS)"
  exit "$STATUS"
}
trap finish EXIT
trap 'STATUS=130; exit' INT TERM

step device 30 "$OUT/device.log" "$PY" benchmarks/gpu_check.py device "$OUT"
rc=$?
if [ "$rc" -eq 3 ]; then
  STATUS=3
  # No GPU: the tests still run, to show their skip reasons, then stop.
  step tests 240 "$OUT/pytest.log" "$PY" -m pytest -q -rs -p no:cacheprovider ${PER_TEST[@]+"${PER_TEST[@]}"} \
    --junitxml "$OUT/pytest.xml" tests/gpu tests/test_serve_argv_vllm.py tests/test_serve_argv_sglang.py
  exit 3
elif [ "$rc" -ne 0 ]; then
  STATUS=1
fi
NGPU=$("$PY" -c 'import json, sys; print(json.load(open(sys.argv[1]))["device_count"])' "$OUT/device.json" \
       2>/dev/null || echo 1)
VLLM_COLL=tests/gpu/test_gpu_vllm_collectives.py
step tests $((240 + 30 * (NGPU > 1 ? NGPU - 1 : 0))) "$OUT/pytest.log" "$PY" -m pytest -q -rs -p no:cacheprovider ${PER_TEST[@]+"${PER_TEST[@]}"} \
  --junitxml "$OUT/pytest.xml" --ignore "$VLLM_COLL" tests/gpu tests/test_serve_argv_vllm.py \
  tests/test_serve_argv_sglang.py || STATUS=1
# vLLM's own all-reduce paths on their own step and log: the reference campaign's question
# (vllm::all_reduce at ~1,125 µs per call against NCCL's 78 µs) is answered here first.
step vllm_collectives $((60 + 60 * (NGPU > 1 ? NGPU - 1 : 0))) "$OUT/vllm_collectives.log" "$PY" -m pytest -q -rs \
  -p no:cacheprovider ${PER_TEST[@]+"${PER_TEST[@]}"} --junitxml "$OUT/pytest_vllm_collectives.xml" "$VLLM_COLL" \
  || STATUS=1
step gemm 90 "$OUT/gemm.log" "$PY" benchmarks/gpu_check.py gemm "$OUT" || STATUS=1
step nccl 150 "$OUT/nccl.log" "$PY" benchmarks/gpu_check.py nccl "$OUT" || STATUS=1
