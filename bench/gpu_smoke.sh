#!/usr/bin/env bash
# The first run on a GPU machine: the trainer's CUDA path without vLLM (TorchEngine), one step
# after another, each under its own `timeout`; a failing step is recorded and the next one runs.
# About 5 minutes on one H200 (a hard cap of SMOKE_BUDGET seconds, default 520, over all steps).
#
#   bash bench/gpu_smoke.sh              # on the GPU machine; then read runs/gpu_smoke/summary.md
#   bash bench/gpu_smoke.sh --toy        # = SMOKE_TOY=1: CPU rehearsal at toy sizes (gloo)
#   ONLY=env,model_05b bash bench/gpu_smoke.sh      # only these steps (the others are listed SKIP)
#
# Steps (each records PASS / FAIL / SKIP, its wall time and its numbers):
#   env                nvidia-smi, python / torch / CUDA / transformers, the device, whether vllm
#                      imports (it need not)
#   one_process        python3 train.py, 3 steps, built-in tiny model and data: device placement,
#                      generation, the canary rollout/logprob_diff (and rollout/logprob_floor)
#   torchrun_one_rank  torchrun train.py, 1 rank (nccl, FSDP2 bf16): 3 steps with --max-grad-norm
#                      and --save-every 2, then the same with --resume auto --steps 4 (through the
#                      driver, which then loads both checkpoints with from_pretrained): the resumed
#                      run went on at step 3
#   fsdp_variants      torchrun, 1 rank, 2 steps each: --kl-coef 0.05, --tis-cap 2,
#                      --grad-checkpointing, --preset r2po --r2po-schedule 1,1 (one process runs
#                      the four in turn; SMOKE_SEPARATE=1: one torchrun each)
#   model_05b          a random-weight Qwen2.5-0.5B-shaped model made here (the tiny tokenizer,
#                      vocabulary 151936), 2 steps in one process and 2 under torchrun: precision,
#                      peak GPU memory, step time, generation and update tokens/s
#   suite_on_cuda      the engine-independent tests on this machine (SKIP in --toy)
#
# Environment: PYTHON (default python3), OUT (default runs/gpu_smoke), ONLY, SMOKE_TOY,
# SMOKE_BUDGET (seconds, default 520), SMOKE_WORK (the runs' directory, default $OUT/work: packed
# into $OUT/logs.tar.gz without weights and removed at the end unless SMOKE_KEEP=1), SMOKE_SEPARATE.
# What $OUT holds at the end: summary.md, summary.json, logs.tar.gz (rewritten after every step).
# Exit status: 0 when no step failed, 1 otherwise, 2 for bad arguments. The vLLM engine's checks
# are bench/gpu_check.sh (a machine with vLLM).
set -u
cd "$(dirname "$0")/.." || exit 2
ROOT=$(pwd)
PYTHON=${PYTHON:-python3}
TOY=${SMOKE_TOY:-0}
for arg in "$@"; do
    case "$arg" in
        --toy) TOY=1 ;;
        -h|--help) sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "gpu_smoke: unknown argument $arg (--toy, --help)" >&2; exit 2 ;;
    esac
done
[ "$TOY" = 1 ] || TOY=0
STEPS=(env one_process torchrun_one_rank fsdp_variants model_05b suite_on_cuda)
ONLY=${ONLY:-}
for name in ${ONLY//,/ }; do
    [[ " ${STEPS[*]} " == *" $name "* ]] ||
        { echo "gpu_smoke: ONLY: no step '$name' (steps: ${STEPS[*]})" >&2; exit 2; }
done
if ! command -v "$PYTHON" >/dev/null 2>&1; then
    echo "gpu_smoke: no $PYTHON (set PYTHON=...)" >&2
    exit 2
fi

OUT=${OUT:-runs/gpu_smoke}
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd) || exit 2
WORK=${SMOKE_WORK:-$OUT/work}
if [ -e "$WORK" ] && [ ! -e "$WORK/.gpu_smoke" ] && [ -n "$(ls -A "$WORK" 2>/dev/null)" ]; then
    echo "gpu_smoke: $WORK exists and is not this script's: choose another SMOKE_WORK" >&2
    exit 2
fi
rm -rf "$WORK" && mkdir -p "$WORK/_smoke" && touch "$WORK/.gpu_smoke" || exit 2
WORK=$(cd "$WORK" && pwd)
rm -f "$OUT/summary.md" "$OUT/summary.json" "$OUT/logs.tar.gz"
BUDGET=${SMOKE_BUDGET:-520}
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export SMOKE_ROOT=$ROOT SMOKE_TOY=$TOY SMOKE_WORK=$WORK
CHECK=$WORK/_smoke/check.py
DRIVER=$WORK/_smoke/driver.py
TORCHRUN=("$PYTHON" -m torch.distributed.run --standalone --nproc-per-node 1)

# ---- sizes: the GPU's and the toy rehearsal's ----------------------------------------------------
# every run: TorchEngine (no vLLM), the canary every step, built-in data only
# (nothing of ../shared).
# --max-logprob-diff 10 lets a run go on past a high canary: the checks hold it to 0.1 (the default)
COMMON=(--engine torch --check-every 1 --max-logprob-diff 10 --eval-benchmarks "")
if [ "$TOY" = 1 ]; then
    export CUDA_VISIBLE_DEVICES="" OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
    COMMON+=(--threads 1)
    TINY=(--prompts-per-step 8 --group-size 4)  # the tiny model's steps (the GPU's: the defaults)
    EVAL=8; EVAL_SMALL=4; DEVICE=cpu; SHAPE=toy
    BIG=(--prompts-per-step 4 --group-size 2 --max-new-tokens 8 --eval-size 4
         --micro-batch-tokens 4096)
else
    TINY=()
    EVAL=50; EVAL_SMALL=16; DEVICE=cuda; SHAPE=05b
    BIG=(--prompts-per-step 16 --group-size 4 --max-new-tokens 64 --eval-size 16
         --micro-batch-tokens 4096)
fi

# ---- machinery: time, commands under timeout, notes, the summary ---------------------------------
now_us() {
    local t=${EPOCHREALTIME:-}
    if [ -n "$t" ]; then echo "${t/[.,]/}"; else date +%s%6N; fi
}
T0_US=$(now_us)
left() { echo $(( BUDGET - ($(now_us) - T0_US) / 1000000 )); }
secs() { local d=$(( $(now_us) - $1 )); printf '%d.%d' $((d / 1000000)) $(((d / 100000) % 10)); }
note() { echo "$*" >> "$SDIR/notes.txt"; echo "   note: $*"; }
NCMD=0

# Kill what a timed-out command left behind, found by the tag in its environment (torchrun starts
# its workers in their own session, out of reach of timeout's process-group kill).
reap() {
    local p
    for p in /proc/[0-9]*; do
        if grep -qsxz "GPU_SMOKE_TAG=$1" "$p/environ" 2>/dev/null; then
            kill -9 "${p#/proc/}" 2>/dev/null
        fi
    done
}

# run LIMIT NAME COMMAND...: COMMAND under `timeout LIMIT` (less if the budget has less left), its
# output to $SDIR/NAME.log, its exit status and seconds to $SDIR/cmds.tsv.
run() {
    local limit=$1 name=$2 rest rc t0 tag
    shift 2
    rest=$(left)
    if (( rest < 20 )); then
        note "$name: not run, the budget (SMOKE_BUDGET=${BUDGET}s) is spent"
        printf '%s\t%s\t%s\n' "$name" "budget" "0.0" >> "$SDIR/cmds.tsv"
        return 125
    fi
    (( limit > rest - 10 )) && limit=$((rest - 10))
    NCMD=$((NCMD + 1))
    tag="gpu_smoke_$$_$NCMD"
    t0=$(now_us)
    printf '+ %s   (timeout %ss)\n' "$*" "$limit" > "$SDIR/$name.log"
    GPU_SMOKE_TAG=$tag timeout -k 10 "$limit" "$@" >> "$SDIR/$name.log" 2>&1 < /dev/null
    rc=$?
    if (( rc == 124 || rc == 137 )); then
        reap "$tag"
        echo "gpu_smoke: TIMEOUT after ${limit}s" >> "$SDIR/$name.log"
        note "$name: timed out after ${limit}s"
    fi
    printf '%s\t%s\t%s\n' "$name" "$rc" "$(secs "$t0")" >> "$SDIR/cmds.tsv"
    echo "   $name: exit $rc, $(secs "$t0") s"
    return $rc
}

check() { run 120 "check_$1" "$PYTHON" "$CHECK" "$@" "$SDIR"; }

summarize() {
    "$PYTHON" "$CHECK" summary "$WORK" "$OUT" "${STEPS[@]}" > "$WORK/_smoke/summary.log" 2>&1 ||
        { echo "gpu_smoke: the summary failed (see below); status lines only" >&2
          cat "$WORK/_smoke/summary.log" >&2
          cat "$WORK"/*/status > "$OUT/summary.md" 2>/dev/null; }
    tar -czf "$OUT/logs.tar.gz.tmp" -C "$WORK" --exclude='*.safetensors' --exclude='*.pt' \
        --exclude='*.distcp' --exclude='*.bin' --exclude=checkpoints \
        --exclude=final . 2>/dev/null &&
        mv "$OUT/logs.tar.gz.tmp" "$OUT/logs.tar.gz"
}

selected() { [ -z "$ONLY" ] || [[ ",$ONLY," == *",$1,"* ]]; }

run_step() {
    local name=$1 t0 rc status
    SDIR=$WORK/$name
    mkdir -p "$SDIR"
    echo "== $name"
    t0=$(now_us)
    if selected "$name"; then
        "step_$name"
        rc=$?
    else
        note "not selected (ONLY=$ONLY)"
        rc=77
    fi
    case $rc in 0) status=PASS ;; 77) status=SKIP ;; *) status=FAIL ;; esac
    printf '%s\t%s\t%s\n' "$name" "$status" "$(secs "$t0")" > "$SDIR/status"
    echo "   $status ($(secs "$t0") s)"
    summarize
}

cuda_ok() {   # GPU mode: the GPU steps need CUDA (env's answer, else one look)
    [ "$TOY" = 1 ] && return 0
    if [ ! -f "$WORK/_smoke/cuda" ]; then
        timeout 120 "$PYTHON" -c "import torch; print(int(torch.cuda.is_available()))" \
            > "$WORK/_smoke/cuda" 2>/dev/null || echo 0 > "$WORK/_smoke/cuda"
    fi
    [ "$(cat "$WORK/_smoke/cuda")" = 1 ] ||
        { note "no CUDA device: not run (SMOKE_TOY=1 rehearses on the CPU)"; return 1; }
}

cleanup() {   # no weights or checkpoints left behind ($OUT may be a folder with a file-count limit)
    if [ "${SMOKE_KEEP:-0}" != 1 ] && [ -e "$WORK/.gpu_smoke" ]; then rm -rf "$WORK"; fi
}

# ---- the steps -----------------------------------------------------------------------------------

step_env() {
    local rc=0
    if command -v nvidia-smi >/dev/null 2>&1; then
        run 30 nvidia_smi nvidia-smi
        run 30 nvidia_smi_query nvidia-smi --query-gpu=name,memory.total,driver_version \
            --format=csv,noheader
    else
        note "no nvidia-smi on PATH"
    fi
    check env || rc=1
    return $rc
}

step_one_process() {
    cuda_ok || return 1
    run 150 train "$PYTHON" train.py "${COMMON[@]}" ${TINY[@]+"${TINY[@]}"} --steps 3 \
        --eval-size "$EVAL" --out-dir "$SDIR/run"
    check one_process
}

step_torchrun_one_rank() {
    cuda_ok || return 1
    local args=("${COMMON[@]}" ${TINY[@]+"${TINY[@]}"} --max-grad-norm 0.5 --save-every 2
                --eval-size "$EVAL" --out-dir "$SDIR/run")
    run 150 train "${TORCHRUN[@]}" train.py "${args[@]}" --steps 3
    # the same command again (train.main in the driver), then from_pretrained of both checkpoints
    printf 'resume %s\n' "$(printf '%q ' "${args[@]}" --steps 4 --resume auto)" > "$SDIR/runs.txt"
    run 150 resume "${TORCHRUN[@]}" "$DRIVER" --results "$SDIR/results.jsonl" \
        --runs "$SDIR/runs.txt" \
        --load-check "$SDIR/run/checkpoints/step_000003" "$SDIR/run/checkpoints/step_000004"
    check torchrun_one_rank
    local rc=$?
    rm -rf "$SDIR/run/checkpoints"
    return $rc
}

step_fsdp_variants() {
    cuda_ok || return 1
    local name args
    : > "$SDIR/runs.txt"
    while read -r name args; do     # NAME FLAGS... (quoted as bash quotes: the driver splits them)
        printf '%s %s %s --out-dir %q\n' "$name" \
            "$(printf '%q ' "${COMMON[@]}" ${TINY[@]+"${TINY[@]}"})" \
            "$args --steps 2 --eval-size $EVAL_SMALL --save-every 0" "$SDIR/$name" \
            >> "$SDIR/runs.txt"
    done <<'EOF'
kl --kl-coef 0.05
tis --tis-cap 2
grad_ckpt --grad-checkpointing
r2po --preset r2po --r2po-schedule 1,1
EOF
    if [ "${SMOKE_SEPARATE:-0}" = 1 ]; then     # one torchrun per variant: slower, isolated
        while read -r name _; do
            grep "^$name " "$SDIR/runs.txt" > "$SDIR/runs_$name.txt"
            run 120 "train_$name" "${TORCHRUN[@]}" "$DRIVER" --results "$SDIR/results.jsonl" \
                --runs "$SDIR/runs_$name.txt"
        done < "$SDIR/runs.txt"
    else
        run 300 train "${TORCHRUN[@]}" "$DRIVER" --results "$SDIR/results.jsonl" \
            --runs "$SDIR/runs.txt"
    fi
    check fsdp_variants
    local rc=$?
    rm -rf "$SDIR"/*/checkpoints
    return $rc
}

step_model_05b() {
    cuda_ok || return 1
    local args
    args="$(printf '%q ' "${COMMON[@]}" "${BIG[@]}" --model "$SDIR/model")"
    args+=" --steps 2 --save-every 0"
    printf 'one %s --out-dir %q\n' "$args" "$SDIR/one" > "$SDIR/runs_one.txt"
    printf 'fsdp %s --out-dir %q\n' "$args" "$SDIR/fsdp" > "$SDIR/runs_fsdp.txt"
    # one process: fp32 weights (autocast-bf16 on CUDA where train.py does it); the model is
    # made first
    run 240 one "$PYTHON" "$DRIVER" --make-model "$SDIR/model" --shape "$SHAPE" \
        --results "$SDIR/results.jsonl" --runs "$SDIR/runs_one.txt"
    if [ -f "$SDIR/model/config.json" ]; then
        run 240 fsdp "${TORCHRUN[@]}" "$DRIVER" --results "$SDIR/results.jsonl" \
            --runs "$SDIR/runs_fsdp.txt"
    else
        note "no model was made: the torchrun run is not started"
    fi
    check model_05b
    local rc=$?
    rm -rf "$SDIR/model" "$SDIR"/one/checkpoints "$SDIR"/fsdp/checkpoints
    return $rc
}

step_suite_on_cuda() {
    if [ "$TOY" = 1 ]; then
        note "toy rehearsal: the suite runs on the GPU machine only"
        return 77
    fi
    cuda_ok || return 1
    run 240 suite "$PYTHON" -m pytest -q -x -p no:cacheprovider tests/test_grpo.py \
        tests/test_rollout.py tests/test_buffer.py tests/test_train_step.py
    check suite_on_cuda
}

# ---- the helpers the steps call: written here, so the script is one file -------------------------

cat > "$DRIVER" <<'PYEOF'
"""gpu_smoke's driver: train.main in this process, once per line of --runs ("NAME FLAGS..."), with
each run's peak GPU memory (torch.cuda.max_memory_allocated, which a subprocess cannot report) and
seconds appended to --results (JSON lines, rank 0). --make-model DIR --shape 05b|toy first makes a
random-weight Qwen2 model with the built-in tokenizer."""
import argparse
import gc
import json
import os
import resource
import shlex
import sys
import time
import traceback

ROOT = os.environ["SMOKE_ROOT"]
sys.path.insert(0, ROOT)
import torch  # noqa: E402

import train  # noqa: E402

QWEN25_05B = dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                  num_attention_heads=14, num_key_value_heads=2, vocab_size=151936)
TOY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
           num_key_value_heads=2)


def make_model(path, shape):
    """Random weights (seed 0) from Qwen2.5-0.5B's config, or a toy one, and the built-in tiny
    model's tokenizer (98 ids, all below the vocabulary size): saved as the repository saves."""
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    from checkpoint import save_hf
    tok = AutoTokenizer.from_pretrained(os.path.join(ROOT, "assets", "tiny-arith"))
    sizes = QWEN25_05B if shape == "05b" else dict(TOY, vocab_size=len(tok))
    assert len(tok) <= sizes["vocab_size"]
    cfg = Qwen2Config(**sizes, max_position_embeddings=4096, tie_word_embeddings=True)
    torch.manual_seed(0)
    t = time.perf_counter()
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = Qwen2ForCausalLM(cfg)
    save_hf(model, tok, path)
    n = sum(p.numel() for p in model.parameters())
    del model
    gc.collect()
    return {"name": "make_model", "rc": 0, "params": n, "shape": shape, **sizes,
            "seconds": time.perf_counter() - t}


def load_check(dirs):
    """Each checkpoint through plain AutoModelForCausalLM.from_pretrained (not the trainer's
    loader): the tiny model's parameter count, finite weights and logits, moved from the tiny
    model's weights; and how far the last moved from the first."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tiny = os.path.join(ROOT, "assets", "tiny-arith")
    row = {"name": "from_pretrained", "rc": 0}
    try:
        tiny_model = AutoModelForCausalLM.from_pretrained(tiny, local_files_only=True)
        base = tiny_model.state_dict()
        row["tiny_params"] = sum(p.numel() for p in tiny_model.parameters())
        ids = torch.tensor([AutoTokenizer.from_pretrained(tiny).encode("1+2=")])
        sds = []
        for d in dirs:
            m = AutoModelForCausalLM.from_pretrained(d, local_files_only=True)
            sd = {k: v.float() for k, v in m.state_dict().items()}
            sds.append(sd)
            with torch.no_grad():
                logits_ok = bool(torch.isfinite(m(input_ids=ids).logits).all())
            row[os.path.basename(d)] = {
                "params": sum(p.numel() for p in m.parameters()),
                "dtype": str(next(m.parameters()).dtype),
                "finite": logits_ok and all(bool(torch.isfinite(v).all()) for v in sd.values()),
                "max_abs_from_tiny": max((sd[k] - v.float()).abs().max().item()
                                         for k, v in base.items())}
        row["max_abs_first_to_last"] = max((sds[-1][k] - v).abs().max().item()
                                           for k, v in sds[0].items())
    except Exception as e:  # noqa: BLE001
        traceback.print_exc()
        row.update(rc=1, error=f"{type(e).__name__}: {e}"[:300])
    return row


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--results", required=True)
    ap.add_argument("--runs", required=True)
    ap.add_argument("--make-model", default="")
    ap.add_argument("--shape", default="toy")
    ap.add_argument("--load-check", nargs="*", default=[])
    a = ap.parse_args()
    rank0 = int(os.environ.get("RANK", "0")) == 0
    cuda = torch.cuda.is_available()

    def record(row):
        print(f"gpu_smoke driver: {json.dumps(row)}", flush=True)
        if rank0:
            with open(a.results, "a") as f:
                f.write(json.dumps(row) + "\n")

    if a.make_model:
        try:
            record(make_model(a.make_model, a.shape))
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            record({"name": "make_model", "rc": 1, "error": f"{type(e).__name__}: {e}"[:300]})
            return 1
    failed = 0
    with open(a.runs) as f:
        runs = [shlex.split(line) for line in f if line.strip()]
    for name, *argv in runs:
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        t, row = time.perf_counter(), {"name": name}
        try:
            row["rc"] = train.main(argv)
        except BaseException as e:   # argparse's SystemExit too: record it and go on
            traceback.print_exc()
            row["rc"] = e.code if isinstance(e, SystemExit) and isinstance(e.code, int) else 1
            row["error"] = f"{type(e).__name__}: {e}"[:300]
        row["seconds"] = time.perf_counter() - t
        if cuda:
            row["peak_allocated_gib"] = torch.cuda.max_memory_allocated() / 2**30
            row["peak_reserved_gib"] = torch.cuda.max_memory_reserved() / 2**30
            row["device_total_gib"] = torch.cuda.get_device_properties(0).total_memory / 2**30
        row["max_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        record(row)
        failed += row["rc"] != 0
    if a.load_check and rank0:
        row = load_check(a.load_check)
        record(row)
        failed += row["rc"] != 0
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
PYEOF

cat > "$CHECK" <<'PYEOF'
"""gpu_smoke's checks: `check.py STEP ... STEP_DIR` reads what the step's commands left in STEP_DIR
and writes STEP_DIR/numbers.json (the step's numbers, "failed": the checks that did not hold);
exit 1 when one failed. `check.py summary WORK OUT STEP...` writes OUT/summary.json and .md."""
import json
import math
import os
import platform
import re
import subprocess
import sys
import time

ROOT = os.environ.get("SMOKE_ROOT", ".")
TOY = os.environ.get("SMOKE_TOY") == "1"
DEVICE = "cpu" if TOY else "cuda"
CANARY_MAX = 0.1        # train.py's default --max-logprob-diff (the runs pass 10 to go on past it)
WORLD_LINE = re.compile(r"world size (\d+) \|.*\| device (\S+)(?: \| (\S+))?")


def finite(x):
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def read(path, default=""):
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return default


def jsonl(path):
    out = []
    for line in read(path).splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            pass
    return out


class Step:
    def __init__(self, sdir):
        self.sdir, self.n, self.failed = sdir, {}, []

    def check(self, ok, what):
        if not ok:
            self.failed.append(what)
        return bool(ok)

    def rc(self, log):
        """The exit status of command `log` (cmds.tsv), None if it did not run."""
        for line in read(os.path.join(self.sdir, "cmds.tsv")).splitlines():
            name, rc, _ = (line.split("\t") + ["", ""])[:3]
            if name == log:
                return int(rc) if rc.lstrip("-").isdigit() else None
        return None

    def log(self, name):
        return read(os.path.join(self.sdir, name + ".log"))

    def done(self):
        self.n["failed"] = self.failed
        with open(os.path.join(self.sdir, "numbers.json"), "w") as f:
            json.dump(self.n, f, indent=1, default=str)
        print(json.dumps(self.n, default=str))
        sys.exit(1 if self.failed else 0)


def run_lines(log):
    """out_dir -> (world, device, precision, args) of each train.main in a log."""
    out, args = {}, None
    for line in log.splitlines():
        if line.startswith('{"preset"'):
            try:
                args = json.loads(line)
            except ValueError:
                args = None
        m = WORLD_LINE.search(line)
        if m and args:
            out[os.path.realpath(args["out_dir"])] = (int(m.group(1)), m.group(2),
                                                      m.group(3) or "", args)
    return out


def train_run(st, key, out_dir, log, steps, first=1, canary_max=CANARY_MAX, world=1):
    """The checks and numbers every train.py run gets; its numbers under st.n[key]."""
    n = st.n.setdefault(key, {}) if key else st.n
    info = run_lines(log).get(os.path.realpath(out_dir))
    st.check(info, f"{key or 'run'}: no 'world size ... device' line in the log")
    if info:
        n["world"], n["device"], n["precision"], args = info
        n["precision"] = n["precision"] or "(not printed)"
        st.check(n["world"] == world, f"{key or 'run'}: world size {n['world']}, not {world}")
        st.check(n["device"].split(":")[0] == DEVICE,
                 f"{key or 'run'}: device {n['device']}, not {DEVICE}")
        if args.get("micro_batch_tokens") is not None:
            n["micro_batch_tokens"] = args["micro_batch_tokens"]
    warnings = sorted({line.strip()[:160] for line in log.splitlines()
                       if line.startswith("warning")})
    if warnings:
        n["log_warnings"] = warnings[:5]
    rows = {r["step"]: r for r in jsonl(os.path.join(out_dir, "metrics.jsonl")) if "step" in r}
    want = list(range(first, steps + 1))
    st.check(all(s in rows for s in want),
             f"{key or 'run'}: metrics.jsonl has steps {sorted(rows)}, not {want}")
    got = [rows[s] for s in want if s in rows and s > 0]  # the training steps (0: the eval before)
    if not got:
        return n
    last = got[-1]
    if 0 in rows:
        n["eval_accuracy_step0"] = rows[0].get("eval/accuracy")
    n["eval_accuracy_end"] = last.get("eval/accuracy")
    st.check(all(r.get("rollout/generated", 0) > 0 and r.get("response/len_mean", 0) > 0
                 for r in got),
             f"{key or 'run'}: a step generated nothing")
    diff = [r.get("rollout/logprob_diff") for r in got]
    n["logprob_diff"] = diff
    floor = {k: [r.get(k) for r in got]
             for k in sorted({k for r in got for k in r if "logprob_floor" in k})}
    if floor:
        n["logprob_floor"] = floor
    st.check(all(finite(d) for d in diff),
             f"{key or 'run'}: rollout/logprob_diff missing or not finite")
    if canary_max is not None:
        high = [d for d in diff if finite(d) and d > canary_max]
        st.check(not high, f"{key or 'run'}: rollout/logprob_diff {high} above {canary_max} (the "
                 "default --max-logprob-diff; the runs pass 10 to go on)")
    for k in ("loss/policy", "loss/grad_norm"):
        vals = [r[k] for r in got if k in r]
        if vals:
            n[k] = vals
        st.check(all(finite(v) for v in vals), f"{key or 'run'}: {k} not finite: {vals}")
    n["reward_mean"] = [r.get("reward/mean") for r in got]
    n["time_step_s"] = [r.get("time/step") for r in got]
    n["time_generate_s"] = [r.get("time/generate") for r in got]
    n["time_update_s"] = [r.get("time/update") for r in got]
    L, gen = last.get("response/len_mean", 0), last.get("rollout/generated", 0)
    upd = last.get("batch/fresh", 0) + last.get("replay/sampled", 0)
    n["response_len_mean"] = L
    n["rollouts_generated"], n["rollouts_updated"] = gen, upd
    if last.get("time/generate"):
        n["gen_tok_s"] = L * gen / last["time/generate"]
    if last.get("time/update"):
        n["update_tok_s"] = L * upd / last["time/update"]
    samples = jsonl(os.path.join(out_dir, "samples.jsonl"))
    if samples:
        n["sample"] = (f"{samples[-1].get('prompt', '')!r} -> "
                       f"{samples[-1].get('completion', '')[:40]!r}")
    return n


# ---- the steps -----------------------------------------------------------------------------------

def probe(n, key, fn):
    """n[key] = fn(), or the error as text: a probe that breaks is a number, not a failure."""
    try:
        n[key] = fn()
    except Exception as e:  # noqa: BLE001
        n[key] = f"({type(e).__name__}: {e})"[:200]


def env(st):
    n = st.n
    q = st.log("nvidia_smi_query").splitlines()[1:]
    if q:
        n["nvidia_smi"] = "; ".join(q)
    n["python"] = sys.version.split()[0] + f" ({sys.executable})"
    n["platform"] = platform.platform()
    n["cpus"] = os.cpu_count()
    smoke = os.path.join(os.environ["SMOKE_WORK"], "_smoke")
    try:
        import torch
    except Exception as e:  # noqa: BLE001
        st.check(False, f"import torch: {type(e).__name__}: {e}")
        return
    n["torch"], n["torch_cuda"] = torch.__version__, torch.version.cuda
    import importlib.metadata
    probe(n, "transformers", lambda: importlib.metadata.version("transformers"))
    n["cuda_available"] = torch.cuda.is_available()
    n["gpus"] = torch.cuda.device_count()
    with open(os.path.join(smoke, "cuda"), "w") as f:
        f.write("1" if n["cuda_available"] else "0")
    if n["cuda_available"]:
        p = torch.cuda.get_device_properties(0)
        n["device"] = f"{p.name}, {p.total_memory / 2**30:.1f} GiB, capability {p.major}.{p.minor}"
        probe(n, "free_gib", lambda: round(torch.cuda.mem_get_info()[0] / 2**30, 1))
        probe(n, "bf16", torch.cuda.is_bf16_supported)
        probe(n, "nccl", lambda: str(torch.cuda.nccl.version()))
        x = torch.randn(1024, 1024, device="cuda")
        n["matmul_ok"] = bool(torch.isfinite(x @ x).all())
        st.check(n["matmul_ok"], "a 1024x1024 matmul on the GPU is not finite")
    elif not TOY:
        st.check(False, "torch.cuda.is_available() is False")
    import importlib.util
    if importlib.util.find_spec("vllm") is None:
        n["vllm"] = "not installed (fine: this script uses TorchEngine)"
    else:
        def vllm():
            p = subprocess.run([sys.executable, "-c", "import vllm; print(vllm.__version__)"],
                               capture_output=True, text=True, timeout=90)
            err = (p.stderr.strip().splitlines() or ["?"])[-1][:200]
            return p.stdout.strip() if p.returncode == 0 else f"installed, import fails: {err}"
        probe(n, "vllm", vllm)

    def git():
        head = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, timeout=20)
        dirty = subprocess.run(["git", "-C", ROOT, "status", "--porcelain"], capture_output=True,
                               text=True, timeout=20).stdout.splitlines()
        return (head.stdout.strip() + (f" + {len(dirty)} changed files" if dirty else "")
                or "(no git)")
    probe(n, "git", git)


def one_process(st):
    st.check(st.rc("train") == 0, f"python3 train.py exited {st.rc('train')}")
    train_run(st, "", os.path.join(st.sdir, "run"), st.log("train"), 3, first=0)


def torchrun_one_rank(st):
    out = os.path.join(st.sdir, "run")
    st.check(st.rc("train") == 0, f"torchrun train.py exited {st.rc('train')}")
    st.check(st.rc("resume") == 0, f"torchrun (driver) --resume auto exited {st.rc('resume')}")
    first = train_run(st, "first", out, st.log("train"), 3, first=0)
    for step in (2, 3):
        st.check(os.path.exists(os.path.join(out, "checkpoints", f"step_{step:06d}", "COMPLETE")),
                 f"no complete checkpoint step_{step:06d}")
    norms = first.get("loss/grad_norm", [])
    first["clipped_steps"] = f"{sum(g > 0.5 for g in norms)} of {len(norms)} (pre-clip norm > 0.5)"
    log = st.log("resume")
    m = re.search(r"resumed from (\S+) at step (\d+)", log)
    st.n["resume_line"] = m.group(0) if m else None
    st.check(m and m.group(2) == "3" and m.group(1).rstrip("/").endswith("step_000003"),
             "the resumed run did not say 'resumed from .../step_000003 at step 3'")
    # the resumed run: the log continued at step 4 (steps 0..3 kept), its own step 4
    steps = [r.get("step") for r in jsonl(os.path.join(out, "metrics.jsonl"))]
    st.n["metrics_steps"] = steps
    st.check(steps == [0, 1, 2, 3, 4], f"metrics.jsonl steps {steps}, not [0, 1, 2, 3, 4]")
    train_run(st, "resumed", out, log, 4, first=4)
    final = os.path.realpath(os.path.join(out, "final"))
    st.n["final"] = os.path.basename(final)
    st.check(os.path.basename(final) == "step_000004", f"final -> {final}, not step_000004")
    res = results(st)
    st.check(res.get("resume", {}).get("rc") == 0,
             f"the resumed run: train.main returned {res.get('resume', {}).get('rc')} "
             f"{res.get('resume', {}).get('error', '')}")
    load = res.get("from_pretrained")
    if st.check(load and load["rc"] == 0,
                f"from_pretrained: {(load or {}).get('error', 'not run')}"):
        for name in ("step_000003", "step_000004"):
            m = load.get(name, {})
            st.n[f"from_pretrained_{name}"] = m
            st.check(m.get("finite") and m.get("params") == load["tiny_params"],
                     f"{name}: from_pretrained gave a wrong or non-finite model")
            st.check(m.get("max_abs_from_tiny", 0) > 0,
                     f"{name}: the tiny model's weights: nothing trained")
        st.n["max_w_change_step3_to_4"] = load["max_abs_first_to_last"]
        st.check(load["max_abs_first_to_last"] > 0,
                 "step 4's weights are step 3's: the resume did not train")


VARIANT_KEYS = {"kl": "kl", "r2po": "r2po/phase"}


def results(st):
    return {r["name"]: r for r in jsonl(os.path.join(st.sdir, "results.jsonl"))}


def fsdp_variants(st):
    res = results(st)
    log = "\n".join(st.log(f[:-4]) for f in sorted(os.listdir(st.sdir))
                    if f.startswith("train") and f.endswith(".log"))
    for name in ("kl", "tis", "grad_ckpt", "r2po"):
        r = res.get(name)
        if not st.check(r is not None, f"{name}: did not finish (no result)"):
            continue
        st.check(r["rc"] == 0, f"{name}: train.main returned {r['rc']} {r.get('error', '')}")
        n = train_run(st, name, os.path.join(st.sdir, name), log, 2)
        n["seconds"] = round(r["seconds"], 2)
        if "peak_allocated_gib" in r:
            n["peak_allocated_gib"] = round(r["peak_allocated_gib"], 3)
        key = VARIANT_KEYS.get(name)
        if key:
            rows = [x for x in jsonl(os.path.join(st.sdir, name, "metrics.jsonl"))
                    if x.get("step", 0) > 0]
            n[key] = [x.get(key) for x in rows]
            st.check(all(x is not None for x in n[key]) and n[key],
                     f"{name}: no {key} in metrics.jsonl")
        if r["rc"] != 0 and name != "kl" and res.get("kl", {}).get("rc") == 0 and \
                os.environ.get("SMOKE_SEPARATE") != "1":
            st.n.setdefault("hint", "a variant after the first failed in the shared process: "
                            "ONLY=fsdp_variants SMOKE_SEPARATE=1 runs each in its own torchrun")
        if name == "r2po":
            st.check(n.get("r2po/phase") == [0.0, 1.0],   # 0 = the head's step, 1 = the policy's
                     f"r2po: phases {n.get('r2po/phase')}, not a head step then a policy step")


def model_05b(st):
    res = results(st)
    made = res.get("make_model")
    if st.check(made and made.get("rc") == 0, "the model was not made"):
        st.n["model"] = {k: made[k]
                         for k in ("params", "hidden_size", "num_hidden_layers", "vocab_size")}
        st.n["model"]["made_s"] = round(made["seconds"], 1)
    for name, world in (("one", 1), ("fsdp", 1)):
        r = res.get(name)
        if not st.check(r is not None, f"{name}: did not finish (no result)"):
            continue
        st.check(r["rc"] == 0, f"{name}: train.main returned {r['rc']} {r.get('error', '')}")
        # random weights: the canary is recorded, not held to the tiny model's 0.1
        n = train_run(st, name, os.path.join(st.sdir, name), st.log(name), 2, first=0,
                      canary_max=None, world=world)
        n["seconds"] = round(r["seconds"], 1)
        for k in ("peak_allocated_gib", "peak_reserved_gib", "device_total_gib", "max_rss_mib"):
            if k in r:
                n[k] = round(r[k], 2)
        if not TOY:
            st.check("peak_allocated_gib" in r, f"{name}: no peak memory")


def suite_on_cuda(st):
    log = st.log("suite")
    tail = log.strip().splitlines()[-1] if log.strip() else ""
    st.n["pytest"] = tail
    for word in ("passed", "failed", "skipped", "error"):
        m = re.search(rf"(\d+) {word}", tail)
        st.n[f"tests_{word}"] = int(m.group(1)) if m else 0
    st.check(st.rc("suite") == 0, f"pytest exited {st.rc('suite')}: {tail}")


# ---- the summary ---------------------------------------------------------------------------------

def fmt(v):
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, list):
        return "[" + ", ".join(fmt(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k}: {fmt(x)}" for k, x in v.items()) + "}"
    return str(v)


def summary(work, out, names):
    steps = []
    for name in names:
        d = os.path.join(work, name)
        status = read(os.path.join(d, "status")).strip().split("\t")
        numbers = {}
        try:
            numbers = json.loads(read(os.path.join(d, "numbers.json"), "{}"))
        except ValueError:
            pass
        cmds = [line.split("\t") for line in read(os.path.join(d, "cmds.tsv")).splitlines() if line]
        steps.append({"name": name, "status": status[1] if len(status) > 1 else "NOT RUN",
                      "seconds": float(status[2]) if len(status) > 2 else None,
                      "failed": numbers.pop("failed", []), "numbers": numbers,
                      "notes": read(os.path.join(d, "notes.txt")).splitlines(),
                      "commands": [{"log": f"{name}/{c[0]}.log", "rc": c[1], "seconds": float(c[2])}
                                   for c in cmds if len(c) == 3]})
    mode = "toy rehearsal (CPU)" if TOY else "GPU"
    total = sum(s["seconds"] or 0 for s in steps)
    counts = {k: sum(s["status"] == k for s in steps) for k in ("PASS", "FAIL", "SKIP")}
    doc = {"mode": mode, "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "host": platform.node(),
           "seconds": round(total, 1), "counts": counts, "steps": steps}
    with open(os.path.join(out, "summary.json.tmp"), "w") as f:
        json.dump(doc, f, indent=1, default=str)
    os.replace(os.path.join(out, "summary.json.tmp"), os.path.join(out, "summary.json"))
    md = [f"# bench/gpu_smoke.sh: {mode}, {doc['date']}, {doc['host']}", "",
          f"{counts['PASS']} PASS, {counts['FAIL']} FAIL, {counts['SKIP']} SKIP in {total:.1f} s. "
          "Logs: logs.tar.gz (STEP/NAME.log, each run's metrics.jsonl).", "",
          "| step | status | seconds | failed checks / notes |", "|---|---|---|---|"]
    for s in steps:
        why = "; ".join(s["failed"] + s["notes"]).replace("|", "/")
        md.append(f"| {s['name']} | {s['status']} | {fmt(s['seconds'])} | {why} |")
    for s in steps:
        md += ["", f"## {s['name']}: {s['status']}, {fmt(s['seconds'])} s", ""]
        md += [f"- failed: {x}" for x in s["failed"]]
        md += [f"- note: {x}" for x in s["notes"]]
        for k, v in s["numbers"].items():
            if (isinstance(v, dict) and v and all(not isinstance(x, dict) for x in v.values())
                    and len(v) > 3):
                md.append(f"- {k}:")
                md += [f"  - {k2}: {fmt(v2)}" for k2, v2 in v.items()]
            else:
                md.append(f"- {k}: {fmt(v)}")
        if s["commands"]:
            md.append("- commands: " + ", ".join(f"{c['log']} exit {c['rc']} {c['seconds']:.1f} s"
                                                for c in s["commands"]))
    with open(os.path.join(out, "summary.md.tmp"), "w") as f:
        f.write("\n".join(md) + "\n")
    os.replace(os.path.join(out, "summary.md.tmp"), os.path.join(out, "summary.md"))


if __name__ == "__main__":
    if sys.argv[1] == "summary":
        summary(sys.argv[2], sys.argv[3], sys.argv[4:])
        sys.exit(0)
    step = Step(sys.argv[-1])
    try:
        globals()[sys.argv[1]](step)
    except Exception as e:  # noqa: BLE001  (a check that breaks is a failed check, with its reason)
        import traceback
        traceback.print_exc()
        step.check(False, f"the check itself broke: {type(e).__name__}: {e}")
    step.done()
PYEOF

# ---- the run -------------------------------------------------------------------------------------
trap 'echo "gpu_smoke: interrupted" >&2; summarize; cleanup; exit 130' INT TERM
echo "gpu_smoke: $([ "$TOY" = 1 ] && echo "toy rehearsal on the CPU" || echo "GPU run")," \
     "results in $OUT, budget ${BUDGET}s, python $(command -v "$PYTHON")"
for step in "${STEPS[@]}"; do
    run_step "$step"
done
summarize
cleanup
echo
cat "$OUT/summary.md"
grep -q '| FAIL |' "$OUT/summary.md" && exit 1
exit 0
