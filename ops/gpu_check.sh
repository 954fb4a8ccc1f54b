#!/usr/bin/env bash
# The vLLM rollout engine on a machine with a GPU, in one short run
# (under 8 minutes on one H200-class GPU):
#   1. tests/test_vllm_engine.py on CUDA (log-probs = trainer's, pushed weights followed,
#      unchanged push and sleep keep greedy output, train.py --engine vllm);
#   2. sleep (level 1) -> wake -> push of unchanged weights leaves greedy output identical,
#      on a ~0.5B model;
#   3. throughput on a Qwen2-style ~0.5B model built from a config with random weights
#      (no download): generation tokens/s, weight-sync seconds per billion parameters, training
#      tokens/s, each for VLLMEngine next to TorchEngine on the same work. It prints a table and
#      one JSON line.
#
#   pip install 'vllm>=0.32,<0.33'                                   # vLLM 0.32.0, its CUDA torch
#   grep -v '^torch' requirements.txt | pip install -r /dev/stdin    # the rest (docs/gpus.md)
#   bash ops/gpu_check.sh                         # on the GPU machine, from anywhere
#   bash ops/gpu_check.sh --dry-run               # CPU, toy sizes: checks that the script itself
#                                                 # runs (needs vllm, e.g. the CPU build of .ci/run)
#   4. train.py --engine vllm for 2 steps with --kl-coef (the bf16 frozen reference, level-2
#      sleep before each push), and under torchrun on 2 GPUs (FSDP2) when the node has them.
# One compile cache (runs/gpu_check/cache, kept between runs) serves every step: a cold one
# compiles each model once (~1-2 min), within each step's timeout (GPU_CHECK_TIMEOUT, 300 s). A
# step that fails or runs out of time is reported and the next one still runs; the exit status
# is 1 when any failed.
set -uo pipefail
cd "$(dirname "$0")/.."
DRY=0
[ "${1:-}" = "--dry-run" ] && DRY=1
PYTHON="${PYTHON:-$(command -v python3 || command -v python)}"   # GPU images may have python3 only
export VLLM_NO_USAGE_STATS=1
export VLLM_CACHE_ROOT="${VLLM_CACHE_ROOT:-$PWD/runs/gpu_check/cache/vllm}"
export TORCHINDUCTOR_CACHE_DIR="${TORCHINDUCTOR_CACHE_DIR:-$PWD/runs/gpu_check/cache/inductor}"
mkdir -p "$VLLM_CACHE_ROOT" "$TORCHINDUCTOR_CACHE_DIR"
LIMIT="${GPU_CHECK_TIMEOUT:-300}"
FAILED=""
failed() { echo "gpu_check: step $1 failed or timed out (exit $2)"; FAILED="$FAILED $1"; }

"$PYTHON" - <<'EOF'
import torch
import vllm_engine
problem = vllm_engine.vllm_problem()
print("torch", torch.__version__, "| cuda", torch.version.cuda, "| GPUs", torch.cuda.device_count(),
      "|", problem or "vllm ok")
if problem:
    raise SystemExit(f"gpu_check: {problem}; pip install 'vllm{vllm_engine.VLLM_VERSIONS}', "
                     f"then the rest of requirements.txt without torch (docs/gpus.md; this "
                     f"script checks the vLLM engine; without vLLM, ops/gpu_smoke.sh checks the "
                     f"rest)")
EOF
[ $? = 0 ] || exit 1

if [ "$DRY" = 0 ]; then
    "$PYTHON" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available()
        else 'gpu_check: no CUDA device (use --dry-run on CPU)')" || exit 1
    echo "== 1. tests/test_vllm_engine.py on CUDA"
    REQUIRE_VLLM=1 timeout "$LIMIT" "$PYTHON" -m pytest -q -rs tests/test_vllm_engine.py \
        || failed 1 $?
fi

echo "== 2, 3. sleep/wake and throughput"
DRY=$DRY timeout "$LIMIT" "$PYTHON" - <<'EOF' || failed 2,3 $?
import copy, gc, json, os, statistics, sys, tempfile, time

import torch

sys.path.insert(0, os.getcwd())
import grpo  # noqa: E402
from data import Prompt  # noqa: E402
from engine import TorchEngine, logprob_diff  # noqa: E402
from rollout import Sampling, collate  # noqa: E402
from vllm_engine import start_vllm  # noqa: E402

DRY = os.environ["DRY"] == "1"
cuda = torch.cuda.is_available() and not DRY
device = "cuda" if cuda else "cpu"
if DRY:   # the same code at toy sizes (head_dim 32: the CPU build has no kernel for 16)
    shape = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=1024)
    P, N, PROMPT_LEN, NEW, MB = 4, 2, 16, 8, 4
else:     # Qwen2.5-0.5B's shape
    shape = dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                 num_attention_heads=14, num_key_value_heads=2, vocab_size=151936)
    P, N, PROMPT_LEN, NEW, MB = 64, 8, 64, 256, 16


def sync():
    if cuda:
        torch.cuda.synchronize()


def make_model(path):
    """Random weights from a config (no download) and a word-level tokenizer over the whole
    vocabulary."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM
    V = shape["vocab_size"]
    cfg = Qwen2Config(**shape, max_position_embeddings=4096, tie_word_embeddings=True,
                      eos_token_id=V - 2, pad_token_id=V - 1)
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen2ForCausalLM(cfg)
    vocab = {f"<t{i}>": i for i in range(V - 2)} | {"<eos>": V - 2, "<pad>": V - 1}
    tok = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="<pad>")),
        eos_token="<eos>", pad_token="<pad>")
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return model, tok


def gen_tokens_per_s(engine, prompts, s):
    engine.generate(prompts[:4], N, s)                                    # warm-up
    sync()
    t = time.perf_counter()
    rs = engine.generate(prompts, N, s)
    sync()
    dt = time.perf_counter() - t
    return sum(len(r.completion_ids) for r in rs) / dt, rs


def sync_s_per_billion(engine, model, repeats=3):
    times = []
    for _ in range(repeats):
        sync()
        t = time.perf_counter()
        engine.load_weights(model.named_parameters())
        sync()
        times.append(time.perf_counter() - t)
    return statistics.median(times) / (sum(p.numel() for p in model.parameters()) / 1e9)


def train_tokens_per_s(model, rollouts, steps=2):
    """Forward + backward + AdamW over the rollouts (bf16 autocast on CUDA), micro-batches of MB:
    the trainer's work next to a resident (or sleeping) engine."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-7)
    tokens = sum(len(r.prompt_ids) + len(r.completion_ids) for r in rollouts)
    times = []
    for _ in range(steps + 1):                                            # the first one warms up
        sync()
        t = time.perf_counter()
        for i in range(0, len(rollouts), MB):
            b = {k: v.to(device) for k, v in collate(rollouts[i:i + MB], tok.pad_token_id).items()}
            with torch.autocast(device, dtype=torch.bfloat16, enabled=cuda):
                logits = model(input_ids=b["input_ids"],
                               attention_mask=b["attention_mask"]).logits[:, :-1]
            logp = grpo.token_logprobs(logits, b["input_ids"][:, 1:])
            loss = -(logp * b["completion_mask"]).sum() / max(1, len(rollouts) * NEW)
            loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync()
        times.append(time.perf_counter() - t)
    del opt
    return tokens / statistics.median(times[1:])


tmp = tempfile.mkdtemp()
t0 = time.perf_counter()
model, tok = make_model(tmp)
n_params = sum(p.numel() for p in model.parameters())
print(f"model: {n_params / 1e6:.0f}M parameters, random weights, built and saved in "
      f"{time.perf_counter() - t0:.1f}s")
g = torch.Generator().manual_seed(0)
V = shape["vocab_size"]
prompts = [Prompt(i, torch.randint(0, V - 2, (PROMPT_LEN,), generator=g).tolist())
           for i in range(P)]
s = Sampling(temperature=1.0, max_new_tokens=NEW, seed=1)
res = {"device": torch.cuda.get_device_name() if cuda else "cpu (dry run)", "params": n_params,
       "work": f"{P} prompts x {N} completions x {NEW} new tokens, prompts of {PROMPT_LEN}"}

t = time.perf_counter()
engine = start_vllm(model, tok, tmp, device, seed=0, max_model_len=PROMPT_LEN + NEW + 16,
                    gpu_memory_utilization=0.3)
res["vllm_start_s"] = time.perf_counter() - t

# 2. sleep -> wake -> push unchanged weights: greedy output unchanged
greedy = Sampling(temperature=0.0, max_new_tokens=min(NEW, 32))
before = [r.completion_ids for r in engine.generate(prompts[:16], 1, greedy)]
engine.sleep(push_follows=True)                # level 2: the weights dropped, the push restores
if cuda:                                       # what vLLM keeps asleep (memory.VLLM_ASLEEP_SHARE):
    # free memory before it started less free now (memory_reserved() would read about -20 GiB)
    res["gpu_used_asleep_gib"] = engine.asleep_bytes() / 2 ** 30
    res["gpu_asleep_share"] = engine.asleep_bytes() / torch.cuda.mem_get_info()[1]
engine.load_weights(model.named_parameters())  # wakes the weights, pushes, wakes the KV cache
after_push = [r.completion_ids for r in engine.generate(prompts[:16], 1, greedy)]
engine.sleep()
engine.wake_up()
after_wake = [r.completion_ids for r in engine.generate(prompts[:16], 1, greedy)]
res["sleep_wake_greedy_identical"] = before == after_push == after_wake
print("sleep -> push unchanged weights -> greedy identical:", before == after_push,
      "| sleep -> wake -> greedy identical:", before == after_wake)

# 3. throughput
res["gen_tok_s"] = {}
res["gen_tok_s"]["vllm"], rs = gen_tokens_per_s(engine, prompts, s)
with torch.no_grad():
    res["canary_fp32_trainer"] = logprob_diff(model, rs[:16], 1.0, tok.pad_token_id)
    with torch.autocast(device, dtype=torch.bfloat16, enabled=cuda):
        res["canary_bf16_trainer"] = logprob_diff(model, rs[:16], 1.0, tok.pad_token_id)
res["sync_s_per_1B"] = {"vllm": sync_s_per_billion(engine, model)}
engine.sleep(push_follows=True)
sync()
t = time.perf_counter()
engine.load_weights(model.named_parameters())
sync()
res["sync_s_per_1B"]["vllm_from_sleep"] = (time.perf_counter() - t) / (n_params / 1e9)
engine.sleep()                                 # the trainer's phase: the engine's GPU memory freed
res["train_tok_s"] = {"vllm_asleep": train_tokens_per_s(model, rs)}
engine.close()
del engine
gc.collect()
if cuda:
    torch.cuda.empty_cache()

te = TorchEngine(model, tok)
res["gen_tok_s"]["torch"], _ = gen_tokens_per_s(te, prompts, s)
res["sync_s_per_1B"]["torch"] = sync_s_per_billion(te, model)
res["train_tok_s"]["torch_resident"] = train_tokens_per_s(model, rs)

print(f"\n{'':34} {'VLLMEngine':>14} {'TorchEngine':>14}")
print(f"{'generation tokens/s':34} {res['gen_tok_s']['vllm']:14.0f} "
      f"{res['gen_tok_s']['torch']:14.0f}")
print(f"{'weight sync s per 1B parameters':34} {res['sync_s_per_1B']['vllm']:14.3f} "
      f"{res['sync_s_per_1B']['torch']:14.3f}")
print(f"{'  (vLLM: waking from sleep)':34} {res['sync_s_per_1B']['vllm_from_sleep']:14.3f}")
print(f"{'training tokens/s':34} {res['train_tok_s']['vllm_asleep']:14.0f} "
      f"{res['train_tok_s']['torch_resident']:14.0f}")
print(f"vLLM start {res['vllm_start_s']:.1f}s | canary logprob_diff: "
      f"fp32 trainer {res['canary_fp32_trainer']:.2e}, "
      f"bf16 trainer {res['canary_bf16_trainer']:.2e} | {res['work']} | {res['device']}")
print(json.dumps(res))
if not res["sleep_wake_greedy_identical"]:
    raise SystemExit("gpu_check: greedy output changed across sleep / wake / unchanged push")
EOF

if [ "$DRY" = 0 ]; then
    echo "== 4. train.py --engine vllm, 2 steps, --kl-coef (bf16 reference, level-2 sleep)"
    RUN=(train.py --engine vllm --steps 2 --eval-size 8 --prompts-per-step 8 --kl-coef 0.01
         --check-every 1 --save-every 0 --overwrite)
    timeout "$LIMIT" "$PYTHON" "${RUN[@]}" --out-dir runs/gpu_check/one || failed 4 $?
    if [ "$("$PYTHON" -c 'import torch; print(torch.cuda.device_count())')" -ge 2 ]; then
        echo "== 4b. the same under torchrun on 2 GPUs (FSDP2, nccl)"
        timeout "$LIMIT" "$PYTHON" -m torch.distributed.run --standalone --nproc-per-node 2 \
            "${RUN[@]}" --out-dir runs/gpu_check/two || failed 4b $?
    fi
fi
[ -z "$FAILED" ] || { echo "gpu_check: failed:$FAILED"; exit 1; }
