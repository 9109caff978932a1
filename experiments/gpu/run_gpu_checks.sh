#!/usr/bin/env bash
# Every GPU check of fedsim in one command (see experiments/gpu/README.md).
#
#   bash experiments/gpu/run_gpu_checks.sh            # on the GPU machine, from the repository root
#   bash experiments/gpu/run_gpu_checks.sh --smoke    # the same steps on CPU, tiny settings (or FEDSIM_GPU_CHECK_DEVICE=cpu)
#
# Steps, each under its own `timeout`, each logging into $OUT (default ./gpu_out), each run even when
# an earlier one failed: (0) pick a Python with torch (+CUDA), creating .venv-gpu only if none has it;
# (a) nvidia-smi (into summary.txt); (b) pytest tests/executor/test_gpu.py, which must not skip on a GPU;
# (c) lora_run.py: a federated LoRA run, float32 and with a bfloat16 base, gradient checkpointing and autocast;
# (d) bench_vmap.py; (e) bench_executors.py, one run per model. The whole script stays within
# FEDSIM_GPU_CHECK_BUDGET_S seconds (default 540 = 9 min): a step gets at most what is left. It writes at most 8
# files into $OUT (what the device tool brings back) and exits 0 only when every step passed.

set -u -o pipefail

SMOKE=0
for arg in "$@"; do
    case "$arg" in
        --smoke) SMOKE=1 ;;
        -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
        *) echo "unknown argument: $arg (use --smoke)" >&2; exit 2 ;;
    esac
done
DEVICE=${FEDSIM_GPU_CHECK_DEVICE:-cuda:0}
if [ "$SMOKE" = 1 ]; then DEVICE=cpu; fi
if [ "$DEVICE" = cpu ]; then SMOKE=1; fi
BUDGET_S=${FEDSIM_GPU_CHECK_BUDGET_S:-540}
START_S=$SECONDS

OUT=${OUT:-./gpu_out}
mkdir -p "$OUT" || exit 2
OUT=$(cd "$OUT" && pwd)
cd "$(dirname "$0")/../.." || exit 2 # the repository root
SUMMARY=$OUT/summary.txt
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" # fedsim from this checkout, installed or not
: >"$SUMMARY"

STEPS=() # "name|status|seconds|note"

note() { echo "$*" | tee -a "$SUMMARY"; }

elapsed() { echo $((SECONDS - START_S)); }

# the timeout a step may have: its own limit, or what is left of the budget (5 s kept for the summary)
allowance() {
    local want=$1 left=$((BUDGET_S - $(elapsed) - 5))
    if [ "$left" -lt "$want" ]; then echo "$left"; else echo "$want"; fi
}

record() { STEPS+=("$1|$2|$3|$4"); note "[$(elapsed)s] $1: $2 ($3 s)${4:+ - $4}"; }

# run_step NAME LIMIT_S LOG COMMAND...: run COMMAND under timeout, append its output to LOG, record the outcome
run_step() {
    local name=$1 limit=$2 log=$3
    shift 3
    local allowed
    allowed=$(allowance "$limit")
    if [ "$allowed" -lt 10 ]; then
        record "$name" SKIPPED 0 "out of time (budget ${BUDGET_S}s)"
        return 1
    fi
    printf '\n== %s: %s (timeout %ss)\n' "$name" "$*" "$allowed" >>"$log"
    local t0=$SECONDS rc
    timeout -k 10 "$allowed" "$@" >>"$log" 2>&1
    rc=$?
    local took=$((SECONDS - t0))
    if [ "$rc" = 0 ]; then
        record "$name" PASSED "$took" "log: $log"
    elif [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
        record "$name" TIMEOUT "$took" "killed after ${allowed}s; log: $log"
    else
        record "$name" FAILED "$took" "exit $rc; log: $log"
    fi
    return "$rc"
}

# does $1 import torch, numpy, tqdm and pytest (and see a GPU unless this is a smoke run)?
python_ok() {
    local need_cuda=$((1 - SMOKE))
    timeout 120 "$1" -c "
import sys, numpy, tqdm, pytest, torch
if $need_cuda and not torch.cuda.is_available():
    sys.exit('torch ' + torch.__version__ + ' sees no CUDA device')
print(sys.executable, 'python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda,
      'gpu', torch.cuda.get_device_name(0) if torch.cuda.is_available() else None)
" >>"$SUMMARY" 2>&1
}

# step 0: a Python with torch (+CUDA): FEDSIM_PYTHON, .venv, an earlier .venv-gpu, python3 (the GPU image's
# python3 holds PyTorch and nothing can be installed there); else create .venv-gpu and pip install
pick_python() {
    local candidate t0=$SECONDS
    for candidate in "${FEDSIM_PYTHON:-}" .venv/bin/python .venv-gpu/bin/python python3; do
        [ -n "$candidate" ] || continue
        [ -x "$candidate" ] || command -v "$candidate" >/dev/null 2>&1 || continue
        if python_ok "$candidate"; then
            PY=$candidate
            record environment PASSED $((SECONDS - t0)) "python: $PY"
            return 0
        fi
        note "  (not $candidate: see above)"
    done
    note "no Python with torch$([ "$SMOKE" = 0 ] && echo ' and CUDA') found: creating .venv-gpu (pip install -e '.[test]')"
    local allowed
    allowed=$(allowance 300)
    if timeout -k 10 "$allowed" bash -c "python3 -m venv --system-site-packages .venv-gpu && .venv-gpu/bin/pip install -q -e '.[test]'" \
        >>"$SUMMARY" 2>&1 && python_ok .venv-gpu/bin/python; then
        PY=.venv-gpu/bin/python
        record environment PASSED $((SECONDS - t0)) "created .venv-gpu"
        return 0
    fi
    PY=python3
    record environment FAILED $((SECONDS - t0)) "no usable Python; the steps below will fail (see $SUMMARY)"
    return 1
}

step_nvidia_smi() {
    local log=$SUMMARY
    if ! command -v nvidia-smi >/dev/null 2>&1; then
        if [ "$SMOKE" = 1 ]; then record nvidia-smi SKIPPED 0 "not installed (smoke run)"; else record nvidia-smi FAILED 0 "not installed"; fi
        return
    fi
    run_step nvidia-smi 30 "$log" bash -c "nvidia-smi; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit --format=csv"
}

step_pytest() {
    local log=$OUT/pytest_gpu.log
    if [ "$SMOKE" = 0 ] && ! "$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" >>"$log" 2>&1; then
        echo "!!! torch.cuda.is_available() is False: tests/executor/test_gpu.py would only skip" | tee -a "$log"
        record pytest FAILED 0 "NO CUDA: torch.cuda.is_available() is False; log: $log"
        return
    fi
    run_step pytest 150 "$log" "$PY" -m pytest -q -rsxX -p no:cacheprovider tests/executor/test_gpu.py
    if [ "$SMOKE" = 0 ] && grep -Eq '[0-9]+ skipped' "$log"; then
        echo "!!! tests were skipped on a GPU machine" | tee -a "$log"
        record pytest_no_skips FAILED 0 "tests skipped on a GPU machine; log: $log"
    fi
}

step_lora() {
    local rounds=()
    if [ "$SMOKE" = 1 ]; then rounds=(--rounds 3); fi
    run_step lora 120 "$OUT/lora_gpu.log" "$PY" experiments/gpu/lora_run.py --device "$DEVICE" "${rounds[@]}"
}

step_bench_vmap() {
    local sizes=()
    if [ "$SMOKE" = 1 ]; then sizes=(--clients 12 --per-round 12 --examples-per-client 20 --rounds 1 --warmup 1); fi
    run_step bench_vmap 180 "$OUT/bench_vmap.log" "$PY" experiments/bench/bench_vmap.py --device "$DEVICE" \
        --models mlr,2nn,cnn --contenders serial_t1,vmap_t1,central_t1,wide_t1 --quiet-wait 1 "${sizes[@]}" --out "$OUT/bench_vmap.json"
}

step_bench_executors() {
    local model limit sizes=()
    if [ "$SMOKE" = 1 ]; then
        sizes=(--contenders serial_t1,process_g1,process_g2,central_t1 --num-examples 2000 --clients 20 --per-round 4
            --examples-per-client 50 --rounds 1 --warmup 1)
    fi
    for model in 2nn cnn; do # the quick one first: each model's JSON is written on its own
        if [ "$model" = 2nn ]; then limit=120; else limit=180; fi
        run_step "bench_executors_$model" "$limit" "$OUT/bench_executors.log" "$PY" experiments/bench/bench_executors.py \
            --device "$DEVICE" --models "$model" --quiet-wait 1 "${sizes[@]}" --out "$OUT/bench_executors_$model.json"
    done
}

note "fedsim GPU checks: device $DEVICE$([ "$SMOKE" = 1 ] && echo ' (smoke run)'), budget ${BUDGET_S}s, out $OUT"
note "commit: $(git rev-parse HEAD 2>/dev/null || echo 'unknown (no .git here)'); host: $(uname -n); $(date -u +%FT%TZ)"
PY=python3
pick_python
step_nvidia_smi
step_pytest
step_lora
step_bench_vmap
step_bench_executors

failed=0
note ""
note "== summary ($(elapsed) s of ${BUDGET_S} s)"
for entry in "${STEPS[@]}"; do
    IFS='|' read -r name status took detail <<<"$entry"
    note "$(printf '  %-22s %-8s %5ss  %s' "$name" "$status" "$took" "$detail")"
    if [ "$status" != PASSED ] && ! { [ "$status" = SKIPPED ] && [ "$SMOKE" = 1 ]; }; then failed=1; fi
done
note "results: $(cd "$OUT" && ls -1 | tr '\n' ' ')(in $OUT)"
if [ "$failed" = 0 ]; then note "ALL PASSED"; else note "SOME STEPS DID NOT PASS"; fi
exit "$failed"
