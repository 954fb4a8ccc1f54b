#!/usr/bin/env bash
# The first lease of a GPU, no vLLM: under nine minutes on one GPU, each step under its own
# timeout (they sum to 535 s), one line a question in $OUT/probe.log, each beside the value that
# reading the code predicted (ops/gpu_first.py says what each line answers; docs/gpus.md, "The
# first lease"). Needs torch with CUDA and transformers; no vLLM, no downloads, no ../shared.
#
#   bash ops/gpu_first.sh             # on the GPU machine, from anywhere; then read $OUT/probe.log
#
#   Q0 versions                                                               20 s
#   Q1 GSPO's first-update clip against the fp32 TorchEngine, the tiny model    50 s
#   Q2 the canary's extra peak memory at 16 x 1,224 tokens, V 151,936           60 s
#   Q3 the memory estimate against the peak, a 0.5B shape, auto micro-batch   120 s
#   Q4 ops/gpu_smoke.sh's one_process, fsdp_variants and model_05b            280 s, read in 5 s
# $OUT (default runs/gpu_first) ends with probe.log, each step's stderr (NAME.err), smoke.log and
# smoke/ (summary.md, summary.json, logs.tar.gz); the runs' weights stay in a temporary folder.
cd "$(dirname "$0")/.." || exit 2
PYTHON=${PYTHON:-python3}
O=$(realpath -m "${OUT:-runs/gpu_first}")
W=$(mktemp -d)
mkdir -p "$O"
L="$O/probe.log"
: > "$L"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
FAILED=0

# probe SECONDS STEP [DIR]: one step of ops/gpu_first.py under its own timeout, its lines to
# probe.log; a failure or a timeout is a line too, and the next step runs
probe() {
    local limit=$1 name=$2
    shift 2
    timeout "$limit" "$PYTHON" ops/gpu_first.py "$name" "$@" 2> "$O/$name.err" | tee -a "$L"
    local rc=${PIPESTATUS[0]}
    if [ "$rc" != 0 ]; then
        echo "$name: failed or timed out (exit $rc, limit ${limit}s; $O/$name.err)" | tee -a "$L"
        FAILED=1
    fi
}

probe 20 versions
probe 50 gspo "$W/gspo"
probe 60 canary
probe 120 estimate "$W"
ONLY=env,one_process,fsdp_variants,model_05b SMOKE_BUDGET=260 OUT="$O/smoke" PYTHON="$PYTHON" \
    timeout 280 bash ops/gpu_smoke.sh > "$O/smoke.log" 2>&1
echo "smoke: exit $? (smoke.log, smoke/summary.md)" | tee -a "$L"
probe 5 smoke "$O/smoke"
rm -rf "$W"
exit $FAILED
