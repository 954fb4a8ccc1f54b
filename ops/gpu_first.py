"""The first lease of a GPU, without vLLM: the numbers that reading the code predicted, measured,
one line a question with the prediction beside it. ops/gpu_first.sh runs each step under its own
timeout (under nine minutes in all, on a machine with torch and CUDA, no vLLM, no downloads);
this file is its Python, a subcommand a step:

    python3 ops/gpu_first.py versions          # torch, CUDA, transformers: the image's
    python3 ops/gpu_first.py gspo DIR          # GSPO's first update against the fp32 TorchEngine
    python3 ops/gpu_first.py canary            # the canary's extra peak memory at 16 x 1,224 tokens
    python3 ops/gpu_first.py estimate DIR      # the memory estimate against the measured peak
    python3 ops/gpu_first.py smoke DIR         # ops/gpu_smoke.sh's summary, a line

Each prints `Q<n> <question>: <measured> | predicted: <value> (<what a miss means>)`. A prediction
is a static review's of the CUDA paths (from reading the code, before any GPU ran it) or, for the
estimate, what memory.py prints for that run; a miss either way means a reading was wrong.
Imports torch only inside the steps that need it.
"""
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
GiB = 2 ** 30

# Qwen2.5-0.5B's shape (ops/gpu_smoke.py's QWEN25_05B), Qwen's vocabulary
SHAPE_05B = dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                 num_attention_heads=14, num_key_value_heads=2, vocab_size=151936)
# the canary's rollouts in a real run: 16 of a step's, a 200-token prompt and 1,024 new tokens
CANARY = dict(rollouts=16, prompt=200, completion=1024)


def line(n: int, question: str, measured: str, predicted: str) -> str:
    return f"Q{n} {question}: {measured} | predicted: {predicted}"


def versions() -> list[str]:
    """Q0: the image's torch, CUDA, transformers and GPU (the requirements pin torch 2.13.0 and
    transformers 5.24-5.25: an import or API error further on is the gap, not the CUDA path)."""
    import torch
    import transformers
    gpu = "no CUDA"
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        gpu = f"{p.name}, {p.total_memory / GiB:.2f} GiB"
    measured = (f"torch {torch.__version__} (CUDA {torch.version.cuda}), transformers "
                f"{transformers.__version__}, {gpu}")
    return [line(0, "versions", measured,
                 "torch 2.11.0+cu130, transformers 5.17.0, H100 79.65 GiB (the image); "
                 "the pins: torch 2.13.0, transformers 5.24-5.25")]


def gspo_argv(out_dir: str) -> list[str]:
    """Q1's run: GSPO's preset for one step on the built-in tiny model, TorchEngine (fp32 on CUDA)
    against the bf16 trainer, the canary every step and not stopping the run."""
    return ["--preset", "gspo", "--precision", "bf16", "--steps", "1", "--engine", "torch",
            "--eval-size", "8", "--eval-benchmarks", "", "--check-every", "1",
            "--max-logprob-diff", "10", "--out-dir", out_dir, "--overwrite"]


def read_jsonl(path: Path) -> list[dict]:
    with open(path) as f:
        return [json.loads(row) for row in f if row.strip()]


def gspo_lines(out_dir: Path) -> list[str]:
    """Q1 from a finished run's logs: the first update's loss/clip_frac (updates.jsonl), the step's
    mean (metrics.jsonl), the canary and its bf16 floor."""
    first = read_jsonl(out_dir / "updates.jsonl")[0]
    step = [r for r in read_jsonl(out_dir / "metrics.jsonl") if r["step"] == 1][0]
    low, high = first.get("ratio/min", float("nan")), first.get("ratio/max", float("nan"))
    measured = (f"first update clip_frac {first['loss/clip_frac']:.3f} (ratio {low:.4f} to "
                f"{high:.4f}), the step's mean {step['loss/clip_frac']:.3f}")
    canary = (f"logprob_diff {step.get('rollout/logprob_diff', float('nan')):.2e}, "
              f"logprob_floor {step.get('rollout/logprob_floor', float('nan')):.2e}")
    return [line(1, "GSPO's first-update clip (TorchEngine fp32 pi_old, bf16 trainer)", measured,
                 "0.3-0.5 on CUDA while pi_old is the fp32 engine's (0 on the CPU, where "
                 "both are autocast): about 0 means the recompute covers TorchEngine"),
            line(1, "the canary on CUDA, TorchEngine fp32 vs the bf16 trainer", canary,
                 "5e-3 to 1e-2 each (bf16 rounding; the floor reads 4e-3 on the CPU; fp32 "
                 "engines agree to 1e-6)")]


def gspo(out_dir: str) -> list[str]:
    """Q1: train.py's GSPO step in a process of its own, then its logs read."""
    argv = [sys.executable, str(ROOT / "train.py"), *gspo_argv(out_dir)]
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True)
    if proc.returncode:
        sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-3000:])
        return [line(1, "GSPO's first-update clip", f"train.py exited {proc.returncode}",
                     "a run")]
    return gspo_lines(Path(out_dir))


def canary_rollouts(rollouts: int, prompt: int, completion: int) -> list:
    from rollout import Rollout
    return [Rollout(prompt_id=i, prompt_ids=list(range(1, prompt + 1)),
                    completion_ids=[7] * completion, logprobs=[0.0] * completion)
            for i in range(rollouts)]


def canary_peaks(shape: dict, device: str, **sizes) -> dict:
    """The extra peak memory (GiB; None off CUDA) and seconds of engine.logprob_diff and
    engine.logprob_floor on a random-weight Qwen2 model of `shape` (autocast bf16, as one process
    on CUDA runs the trainer), over `sizes`' rollouts (CANARY's by default)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    import engine
    from run_setup import autocast_bf16
    config = Qwen2Config(**shape, max_position_embeddings=4096, tie_word_embeddings=True)
    torch.manual_seed(0)
    with torch.device(device):
        model = autocast_bf16(Qwen2ForCausalLM(config).eval(), torch.device(device).type)
    rs = canary_rollouts(**{**CANARY, **sizes})
    cuda = torch.device(device).type == "cuda"
    out = {}
    for f in (engine.logprob_diff, engine.logprob_floor):
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
        t = time.perf_counter()
        f(model, rs, 1.0, 0)
        if cuda:
            torch.cuda.synchronize()
        extra = (torch.cuda.max_memory_allocated() - base) / GiB if cuda else None
        out[f.__name__] = {"extra_peak_gib": extra, "seconds": time.perf_counter() - t}
    return out


def canary() -> list[str]:
    """Q2: the canary's transient beside an awake vLLM at auto share, sized without vLLM: what
    memory.GPU_USABLE leaves of the GPU (vLLM's auto share and the trainer take the rest)."""
    import torch

    import memory
    total = torch.cuda.get_device_properties(0).total_memory
    room = (1 - memory.GPU_USABLE) * total / GiB
    peaks = canary_peaks(SHAPE_05B, "cuda")
    predicted = {"logprob_diff": "5.5-6 GiB (logits and one fp32 slab)",
                 "logprob_floor": "9.5-10 GiB (the fp32 logits too)"}
    return [line(2, f"the canary's extra peak, {name}, 16 x 1,224 tokens, V 151,936",
                 f"{p['extra_peak_gib']:.2f} GiB in {p['seconds']:.1f}s against the "
                 f"{room:.2f} GiB an awake auto-share vLLM leaves",
                 f"{predicted[name]}; above the room it runs out of memory beside vLLM")
            for name, p in peaks.items()]


def estimate_argv(model: str, out_dir: str) -> list[str]:
    """Q3's run: the 0.5B shape, one process, the auto micro-batch, 512-token completions."""
    return ["--engine", "torch", "--model", model, "--steps", "1", "--prompts-per-step", "16",
            "--group-size", "8", "--max-new-tokens", "512", "--eval-size", "8",
            "--eval-benchmarks", "", "--check-every", "1", "--max-logprob-diff", "10",
            "--out-dir", out_dir]


def estimate_lines(log: str) -> list[str]:
    """Q3 from the job's log: the micro-batch and the estimate train.py printed, the peak the job
    measured (ops/gpu_smoke.py's result line)."""
    tokens = re.search(r"micro-batches of at most (\d+) padded tokens", log)
    about = re.search(r"memory about ([\d.]+) GiB a rank", log)
    peaks = [json.loads(m) for m in re.findall(r"gpu_smoke result: (\{.*\})", log)]
    peak = [r["peak_allocated_gib"] for r in peaks if r.get("name") == "auto"
            and "peak_allocated_gib" in r]
    measured = (f"micro-batch {tokens.group(1) if tokens else '?'} tokens, estimate "
                f"{about.group(1) if about else '?'} GiB, measured peak "
                f"{f'{peak[0]:.2f}' if peak else '?'} GiB")
    return [line(3, "the estimate against the peak, 0.5B shape, one process, auto micro-batch",
                 measured, "7067 tokens (the 2^30 / V logits cap), estimate 40.7 GiB (35.0 before "
                 "the activation term followed the MLP width); the peak below it: conservative, at "
                 "or above it: a risk of running out")]


def estimate(work: str) -> list[str]:
    """Q3: ops/gpu_smoke.py's --job makes the 0.5B-shaped model (random weights, the tiny
    tokenizer) and runs train.main once in its process, reading its peak GPU memory."""
    model, out = os.path.join(work, "m05"), os.path.join(work, "auto")
    spec = {"make_model": [model, "05b"], "runs": [["auto", estimate_argv(model, out)]]}
    proc = subprocess.run([sys.executable, str(ROOT / "ops" / "gpu_smoke.py"), "--job",
                           json.dumps(spec)], cwd=ROOT, capture_output=True, text=True)
    if proc.returncode:
        sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-3000:])
    return estimate_lines(proc.stdout + proc.stderr)


def smoke_lines(out: Path) -> list[str]:
    """Q4 from ops/gpu_smoke.sh's summary.json: each step's status, seconds and failures."""
    doc = json.loads((out / "summary.json").read_text())
    parts = [f"{s['name']} {s['status']}" + (f" ({'; '.join(s['failed'])[:120]})"
                                             if s["failed"] else "")
             for s in doc["steps"] if s["status"] != "SKIP"]
    return [line(4, "ops/gpu_smoke.sh: one process, FSDP2 (KL, TIS, grad-ckpt, R2PO), 0.5B",
                 ", ".join(parts), "PASS each; the numbers in smoke/summary.md")]


def main(argv: list[str]) -> int:
    steps = {"versions": versions, "gspo": gspo, "canary": canary, "estimate": estimate,
             "smoke": lambda out: smoke_lines(Path(out))}
    if not argv or argv[0] not in steps:
        print(f"usage: gpu_first.py {{{','.join(steps)}}} [DIR]", file=sys.stderr)
        return 2
    for text in steps[argv[0]](*argv[1:]):
        print(text, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
