"""A real model through the trainer's other paths: kill -9 mid-run then `--resume auto`, one update
on 2 ranks (torchrun, FSDP2, gloo) against 1, and the checkpoint in plain `transformers`.

    python bench/real_model_paths.py --model assets/smollm2-135m-instruct       # all three
    python bench/real_model_paths.py --model DIR --only resume --threads 2

- resume: `train.py` for STEPS steps with a checkpoint every step, straight; the same command
  killed with SIGKILL once step 1's checkpoint exists (mid step 2), then `--resume auto`. Printed:
  whether every metrics row (time/* aside) and every final weight are bitwise the same.
- torchrun: tests/dist_update.py on the model (its four update configurations on a fixed batch,
  2 ranks against 1), judged by tests/test_distributed.py's margins (float rounding of another
  summation order: gradients within 1e-4 of their scale, weights 1e-5).
- hf: the resumed run's final checkpoint loaded with AutoModelForCausalLM / AutoTokenizer alone,
  greedy on one chat prompt, against the project's loader: the same tokens.
Runs are small (4 prompts x 4 completions, 8 new tokens); each path prints one verdict line.
"""
import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import checkpoint  # noqa: E402

STEPS = 3
RUN = ("--train-data", "builtin", "--prompts-per-step", "4", "--group-size", "4",
       "--max-new-tokens", "8", "--eval-size", "0", "--lr", "1e-5", "--save-every", "1")


def cpu_env() -> dict:
    return {**os.environ, "CUDA_VISIBLE_DEVICES": "", "TOKENIZERS_PARALLELISM": "false"}


def train_cmd(model: str, out: Path, threads: int, *extra: str) -> list[str]:
    """train.py into `out`: a fresh run over what an earlier call left there (--overwrite), or
    with --resume in `extra` its continuation."""
    fresh = [] if "--resume" in extra else ["--overwrite"]
    return [sys.executable, str(ROOT / "train.py"), "--model", model, "--out-dir", str(out),
            "--steps", str(STEPS), "--threads", str(threads), *RUN, *fresh, *extra]


def metrics(out: Path) -> list[dict]:
    rows = [json.loads(line) for line in open(out / "metrics.jsonl")]
    return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rows]


def resume(model: str, work: Path, threads: int) -> bool:
    from safetensors.torch import load_file
    import torch
    straight, killed = work / "straight", work / "killed"
    t0 = time.time()
    subprocess.run(train_cmd(model, straight, threads), check=True, env=cpu_env(),
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    proc = subprocess.Popen(train_cmd(model, killed, threads), env=cpu_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    marker = killed / "checkpoints" / "step_000001" / checkpoint.MARKER
    while not marker.exists() and proc.poll() is None:
        time.sleep(0.05)
    alive = proc.poll() is None
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done = subprocess.run(train_cmd(model, killed, threads, "--resume", "auto"), env=cpu_env(),
                          capture_output=True, text=True)
    resumed = next((ln for ln in done.stdout.splitlines() if ln.startswith("resumed from")), "")
    final = f"checkpoints/step_{STEPS:06d}/model.safetensors"
    wa, wb = load_file(str(straight / final)), load_file(str(killed / final))
    same_weights = wa.keys() == wb.keys() and all(torch.equal(wa[n], wb[n]) for n in wa)
    same_rows = metrics(straight) == metrics(killed)
    ok = alive and done.returncode == 0 and same_weights and same_rows
    print(f"resume: killed (SIGKILL) mid step 2 {'yes' if alive else 'NO (finished first)'}; "
          f"{resumed or 'NOT resumed: ' + done.stderr[-300:]}; metrics rows "
          f"{'identical' if same_rows else 'DIFFERENT'} ({len(metrics(killed))} rows); "
          f"{len(wa)} weight tensors {'bitwise equal' if same_weights else 'DIFFERENT'}; "
          f"{time.time() - t0:.0f} s: {'PASS' if ok else 'FAIL'}", flush=True)
    return ok


def torchrun(model: str, work: Path) -> bool:
    out = work / "dist.json"
    t0 = time.time()
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc-per-node", "2", str(ROOT / "tests" / "dist_update.py"),
                           str(out), model], env=cpu_env(), capture_output=True, text=True)
    if proc.returncode != 0:
        print(f"torchrun: FAIL\n{proc.stderr[-2000:]}")
        return False
    r = json.loads(out.read_text())
    ok = True
    for name, c in r.items():
        if name == "nan-on-rank-1":
            good = c == {"moved": 0.0, "skipped": 2.0}
            print(f"torchrun {name}: both ranks skipped, neither moved: {good}")
        else:
            weights = c["param_diff_live"] if name.endswith("adamw") else c["param_diff"]
            good = (c["steps_1"] == c["steps_2"] and c["grad_diff"] <= 1e-4 and weights <= 1e-5
                    and c["engine_diff"] == 0.0 and c["tokens_1"] == c["tokens_2"] > 0)
            print(f"torchrun {name}: {c['steps_2']} optimizer step(s), gradients 2 vs 1 rank "
                  f"{c['grad_diff']:.1e} of their scale, weights {weights:.1e} (moved "
                  f"{c['moved']:.1e}), loss {c['loss_1']:+.6f} vs {c['loss_2']:+.6f}, engine "
                  f"sync exact: {c['engine_diff'] == 0.0}: {'PASS' if good else 'FAIL'}")
        ok &= good
    print(f"torchrun: {time.time() - t0:.0f} s: {'PASS' if ok else 'FAIL'}", flush=True)
    return ok


def hf(model: str, work: Path) -> bool:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    import data
    from checkpoint import load_model
    final = work / "killed" / "final"
    if not final.exists():
        subprocess.run(train_cmd(model, work / "killed", 2), check=True, env=cpu_env(),
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    plain = AutoModelForCausalLM.from_pretrained(final)
    tok = AutoTokenizer.from_pretrained(final)
    ours, _ = load_model(str(final), "cpu")
    (prompt,) = data.make_prompts([data.Example("3+4*2", "11")], "instruct", tok)
    ids = torch.tensor([prompt.ids])
    with torch.no_grad():
        a = plain.generate(ids, max_new_tokens=12, do_sample=False, pad_token_id=tok.eos_token_id)
        b = ours.generate(ids, max_new_tokens=12, do_sample=False, pad_token_id=tok.eos_token_id)
    ok = torch.equal(a, b) and type(plain).__name__ == type(ours).__name__
    print(f"hf: {final} loads with AutoModelForCausalLM ({type(plain).__name__}) and "
          f"AutoTokenizer (chat template: {bool(tok.chat_template)}); greedy reply "
          f"{tok.decode(a[0, ids.shape[1]:], skip_special_tokens=True)!r}, the same tokens as "
          f"the project's loader: {torch.equal(a, b)}: {'PASS' if ok else 'FAIL'}", flush=True)
    return ok


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="Hugging Face model directory")
    p.add_argument("--only", default="resume,torchrun,hf", help="comma-separated paths")
    p.add_argument("--threads", type=int, default=2, help="torch threads of the train.py runs")
    p.add_argument("--work", default="", help="where the runs go (default: a temporary folder)")
    args = p.parse_args(argv)
    if not os.path.isdir(args.model):
        sys.exit(f"error: --model: no such directory: {args.model}")
    work = Path(args.work or tempfile.mkdtemp(prefix="real-model-paths-"))
    paths = {"resume": lambda: resume(args.model, work, args.threads),
             "torchrun": lambda: torchrun(args.model, work), "hf": lambda: hf(args.model, work)}
    results = [paths[name]() for name in args.only.split(",")]
    print(f"runs in {work}")
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
