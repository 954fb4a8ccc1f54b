"""The first run on a GPU machine: the trainer's CUDA path without vLLM (TorchEngine), step after
step, each command under its own timeout; a failing step is recorded and the next one runs. About
5 minutes on one H200, capped at SMOKE_BUDGET seconds (default 520) for all steps together.

    bash ops/gpu_smoke.sh              # on the GPU machine; then read runs/gpu_smoke/summary.md
    bash ops/gpu_smoke.sh --toy        # = SMOKE_TOY=1: CPU rehearsal at toy sizes (gloo)
    ONLY=env,model_05b bash ops/gpu_smoke.sh      # only these steps (the others are listed SKIP)
    python3 ops/gpu_smoke.py --toy     # the same: gpu_smoke.sh only finds $PYTHON and runs this

The steps, a function each (PASS / FAIL / SKIP, wall time and numbers go into the summary):
  env                nvidia-smi's GPUs; python, torch, CUDA, transformers, the device and a matmul
                     on it; whether vllm is installed (it need not be)
  one_process        python train.py, 3 steps of the built-in tiny model and data
  torchrun_one_rank  torchrun train.py, 1 rank (nccl, FSDP2): 3 steps with --max-grad-norm and
                     --save-every 2 (checkpoint 2 complete), then --resume auto --steps 4: it says
                     it went on at step 3, metrics.jsonl holds steps 0-4, final is step 4, and
                     plain from_pretrained loads checkpoints 3 and 4, finite and apart
  fsdp_variants      torchrun, 2 steps each, in one process: --kl-coef 0.05 (the KL term above 0
                     at step 2), --tis-cap 2, --grad-checkpointing, --preset r2po
                     --r2po-schedule 1,1 (a head step, then a policy step)
  model_05b          a random-weight Qwen2.5-0.5B-shaped model made here (the tiny tokenizer,
                     vocabulary 151936), 2 steps in one process and 2 under torchrun: precision,
                     peak GPU memory, step time, tokens/s generated and trained on
  suite_on_cuda      the engine-independent tests (SUITE) on this machine (SKIP in the rehearsal)
Every train.py run is held by train_run() to: the world size and device its log prints,
metrics.jsonl's steps, generation in every step, finite losses and gradient norms, and a finite
canary rollout/logprob_diff below 0.1 (train.py's default --max-logprob-diff: the runs pass 10 so
that they go on past it; model_05b's random weights are not held to it).

Environment: PYTHON (every command's interpreter; default: the one running this), OUT (default
runs/gpu_smoke, under the repository unless absolute), ONLY, SMOKE_TOY=1, SMOKE_BUDGET (seconds).
The runs go to $OUT/work, removed at the end, so that $OUT holds summary.md, summary.json and
logs.tar.gz (every command's log, each run's metrics.jsonl, no weights), all three rewritten after
each step. Exit status: 0 when no step failed, 1 when one did, 2 for bad arguments.

This process imports only the standard library (and bench/same_metrics.py). The commands import
torch: train.py, and this file's `--probe` (env's numbers) and `--job JSON` (train.main once per
run in one process, so that its peak GPU memory can be read; make_model, compare), each result a
JSON line. The vLLM engine's checks are ops/gpu_check.sh.
"""
import argparse
import contextlib
import json
import math
import os
import platform
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
from same_metrics import rows  # noqa: E402  (bench/same_metrics.py: a run's metrics.jsonl)

ROOT = Path(__file__).resolve().parent.parent
SELF = str(Path(__file__).resolve())
TORCHRUN = ("-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1")
CANARY_MAX = 0.1                     # train.py's default --max-logprob-diff
RESULT = "gpu_smoke result: "        # how a --job result's line starts
# train.py's flags as JSON, then its sizes, each wrapped at 100 characters (run_setup.setup)
WORLD = re.compile(r'"out_dir": "([^"]*)"(?:.*\n)*?world size (\d+) \|(?:.*\n)*?.*?\bdevice (\S+) '
                   r'\| (\S+)')
# every run: TorchEngine (no vLLM), the canary every step, built-in data only (nothing of
# ../shared); --max-logprob-diff 10 lets a run go on past a high canary (the checks hold it to 0.1)
COMMON = ("--engine", "torch", "--check-every", "1", "--max-logprob-diff", "10",
          "--eval-benchmarks", "")
SUITE = ("tests/test_grpo.py", "tests/test_rollout.py", "tests/test_buffer.py",
         "tests/test_train_step.py")
VARIANTS = {"kl": ("--kl-coef", "0.05"), "tis": ("--tis-cap", "2"),
            "grad_ckpt": ("--grad-checkpointing",),
            "r2po": ("--preset", "r2po", "--r2po-schedule", "1,1")}
QWEN25_05B = dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                  num_attention_heads=14, num_key_value_heads=2, vocab_size=151936)
TOY_MODEL = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2)
OUTPUTS = ("summary.md", "summary.json", "logs.tar.gz")


@dataclass(frozen=True)
class Sizes:
    """The runs' sizes: the GPU's or the CPU rehearsal's."""
    device: str
    common: tuple               # every run's flags
    tiny: tuple                 # the tiny model's runs (the GPU's: train.py's defaults)
    eval: int                   # the tiny model's runs' --eval-size
    shape: str                  # model_05b's model: "05b" (Qwen2.5-0.5B's sizes) or "toy"
    big: tuple                  # model_05b's runs


GPU = Sizes("cuda", COMMON, (), 50, "05b",
            ("--prompts-per-step", "16", "--group-size", "4", "--max-new-tokens", "64",
             "--eval-size", "16", "--micro-batch-tokens", "4096"))
TOY = Sizes("cpu", COMMON + ("--threads", "1"), ("--prompts-per-step", "8", "--group-size", "4"),
            8, "toy", ("--prompts-per-step", "4", "--group-size", "2", "--max-new-tokens", "8",
                          "--eval-size", "4", "--micro-batch-tokens", "4096"))


@dataclass
class Config:
    """The run's settings, read once (configure), and env's answer for the steps after it."""
    toy: bool
    python: str
    out: Path                   # summary.md, summary.json, logs.tar.gz; the runs in out/work
    budget: int                 # seconds, for all steps together
    only: list                  # ONLY's steps ([]: every step)
    env: dict                   # every command's environment
    sizes: Sizes
    cuda: bool | None = None    # env's torch.cuda.is_available()
    t0: float = field(default_factory=time.monotonic)

    @property
    def work(self) -> Path:
        return self.out / "work"


def configure(argv: list[str]) -> Config:
    """The arguments and the environment; exit 2 when they are wrong."""
    ap = argparse.ArgumentParser(prog="gpu_smoke", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--toy", action="store_true", help="the CPU rehearsal (= SMOKE_TOY=1)")
    toy = ap.parse_args(argv).toy or os.environ.get("SMOKE_TOY") == "1"
    only = os.environ.get("ONLY", "").replace(",", " ").split()
    names = [s.__name__ for s in STEPS]
    for name in only:
        if name not in names:
            ap.error(f"ONLY: no step '{name}' (steps: {' '.join(names)})")
    python = os.environ.get("PYTHON") or sys.executable
    if shutil.which(python) is None:
        ap.error(f"no {python} (set PYTHON=...)")
    budget = os.environ.get("SMOKE_BUDGET", "520")
    if not budget.isdigit():
        ap.error(f"SMOKE_BUDGET={budget}: not a whole number of seconds")
    env = dict(os.environ, PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false",
               HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    if toy:
        env.update(CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")
    out = (ROOT / os.environ.get("OUT", "runs/gpu_smoke")).resolve()    # an absolute OUT stays
    return Config(toy=toy, python=python, out=out, budget=int(budget), only=only, env=env,
                  sizes=TOY if toy else GPU)


# ---- machinery: a step's record, its commands under a timeout ------------------------------------

def finite(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def metrics(out_dir: Path) -> list[dict]:
    """A run's metrics.jsonl, [] when it wrote none."""
    return rows(out_dir) if (out_dir / "metrics.jsonl").exists() else []


def stop(proc: subprocess.Popen) -> None:
    """End what is left of a command: TERM to its process group (torchrun passes it on to its
    workers, which sit in sessions of their own), KILL 10 s later."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)
            return


class Spent(Exception):
    """The budget has no time left for the next command: its step ends there, FAIL."""


class Step:
    """One step's record: its commands (each one's output in SDIR/NAME.log), its numbers (n), the
    checks that failed and its notes; status where it ends before its checks (SKIP, FAIL)."""

    def __init__(self, cfg: Config, name: str):
        self.cfg = cfg
        self.name = name
        self.sdir = cfg.work / name
        self.sdir.mkdir(parents=True)
        self.n = {}
        self.failed = []
        self.notes = []
        self.commands = []
        self.status = None

    def note(self, text: str) -> None:
        self.notes.append(text)
        print(f"   note: {text}")

    def check(self, ok, what: str) -> bool:
        if not ok:
            self.failed.append(what)
        return bool(ok)

    def run(self, limit: int, name: str, cmd: list[str]) -> tuple[int, str]:
        """cmd from the repository's root under a timeout of `limit` seconds (less when the budget
        has less left: Spent when it has none), its output to SDIR/name.log: (its exit status, 124
        when it timed out; the log)."""
        limit = min(limit, int(self.cfg.budget - (time.monotonic() - self.cfg.t0)) - 10)
        if limit < 10:
            raise Spent(f"{name}: not run, the budget (SMOKE_BUDGET={self.cfg.budget}s) is spent")
        path = self.sdir / f"{name}.log"
        t0 = time.monotonic()
        with open(path, "w") as log:
            log.write(f"+ {shlex.join(cmd)}   (timeout {limit}s)\n")
            log.flush()
            # a session of its own, so that stop() reaches all of it
            proc = subprocess.Popen(cmd, cwd=ROOT, env=self.cfg.env, stdin=subprocess.DEVNULL,
                                    stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            try:
                rc = proc.wait(timeout=limit)
            except subprocess.TimeoutExpired:
                rc = 124
                self.note(f"{name}: timed out after {limit}s")
            finally:                # what is left of it: all of it after a timeout or an interrupt
                stop(proc)
        seconds = round(time.monotonic() - t0, 1)
        self.commands.append({"log": f"{self.name}/{name}.log", "rc": rc, "seconds": seconds})
        print(f"   {name}: exit {rc}, {seconds} s")
        return rc, path.read_text(errors="replace")

    def job(self, limit: int, name: str, runs: list, *, torchrun=False, **job) -> tuple[dict, str]:
        """run() of `--job`: train.main once per (run name, argv) of runs in one process, under
        torchrun or not, and job's make_model or compare: (the results by name, the log)."""
        launcher = [self.cfg.python, *TORCHRUN] if torchrun else [self.cfg.python]
        spec = json.dumps(dict(job, runs=runs))
        _, log = self.run(limit, name, [*launcher, SELF, "--job", spec])
        found = [json.loads(x[len(RESULT):]) for x in log.splitlines() if x.startswith(RESULT)]
        return {r["name"]: r for r in found}, log


# ---- what every train.py run is checked for ------------------------------------------------------

def train_run(st: Step, key: str, out_dir: Path, log: str, steps: int, *, first: int = 1,
              canary: bool = True, job: dict | None = None) -> dict:
    """The checks every train.py run gets (out_dir's metrics.jsonl holds steps first..steps, 0
    being the evaluation before training); its numbers in st.n[key] (in st.n if key is ""), with
    those of job (a --job's results), where the run was one of its runs, under the same key."""
    n = st.n.setdefault(key, {}) if key else st.n
    what = key or "run"
    if job is not None:
        r = job.get(key, {"rc": "nothing (the job ended before it)"})
        st.check(r["rc"] == 0, f"{key}: train.main returned {r['rc']} {r.get('error', '')}".strip())
        n.update((k, v) for k, v in r.items() if k not in ("name", "rc"))
    printed = {m.group(1): m.groups()[1:] for m in WORLD.finditer(log)}
    if st.check(str(out_dir) in printed, f"{what}: no 'world size ... device' line in its log"):
        world, n["device"], n["precision"] = printed[str(out_dir)]
        n["world"] = int(world)
        st.check(n["world"] == 1, f"{what}: world size {world}, not 1")
        st.check(n["device"].startswith(st.cfg.sizes.device), f"{what}: device {n['device']}")
    by_step = {r["step"]: r for r in metrics(out_dir)}
    want = list(range(first, steps + 1))
    st.check(set(want) <= set(by_step), f"{what}: metrics.jsonl's steps {sorted(by_step)}")
    got = [by_step[s] for s in want if s in by_step and s > 0]      # the training steps
    if not got:
        return n
    n["eval_accuracy"] = [by_step.get(0, {}).get("eval/accuracy"), got[-1].get("eval/accuracy")]
    st.check(all(r.get("rollout/generated", 0) > 0 and r.get("response/len_mean", 0) > 0
                 for r in got), f"{what}: a step generated nothing")
    diff = [r.get("rollout/logprob_diff") for r in got]
    n["logprob_diff"] = diff
    st.check(all(finite(d) for d in diff), f"{what}: rollout/logprob_diff not finite: {diff}")
    high = [d for d in diff if canary and finite(d) and d > CANARY_MAX]
    st.check(not high, f"{what}: rollout/logprob_diff {high} above {CANARY_MAX}")
    for k in ("loss/policy", "loss/grad_norm"):
        n[k] = [r[k] for r in got if k in r]
        st.check(all(finite(v) for v in n[k]), f"{what}: {k} not finite: {n[k]}")
    n["reward_mean"] = [r.get("reward/mean") for r in got]
    for k in ("step", "generate", "update"):
        n[f"time_{k}_s"] = [r.get(f"time/{k}") for r in got]
    # the last step's tokens per second: generated, and trained on (fresh + replayed rollouts)
    last = got[-1]
    length = last.get("response/len_mean", 0)
    if last.get("time/generate"):
        n["gen_tok_s"] = length * last.get("rollout/generated", 0) / last["time/generate"]
    if last.get("time/update"):
        trained = last.get("batch/fresh", 0) + last.get("replay/sampled", 0)
        n["update_tok_s"] = length * trained / last["time/update"]
    return n


# ---- the steps -----------------------------------------------------------------------------------

def env(st: Step) -> None:
    """nvidia-smi's GPUs, then --probe (a process of its own: this one never imports torch)."""
    if shutil.which("nvidia-smi"):
        query = ["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv"]
        _, log = st.run(30, "nvidia_smi", query)
        st.n["nvidia_smi"] = "; ".join(log.splitlines()[2:])   # after "+ command" and the header
    else:
        st.note("no nvidia-smi on PATH")
    rc, log = st.run(120, "probe", [st.cfg.python, SELF, "--probe"])
    if not st.check(rc == 0, f"the probe exited {rc} (env/probe.log)"):
        return
    st.n.update(json.loads(log.splitlines()[-1]))
    st.cfg.cuda = st.n["cuda_available"]
    st.check(st.cfg.cuda or st.cfg.toy, "torch.cuda.is_available() is False")
    st.check(st.n.get("matmul_ok", True), "a 1024x1024 matmul on the GPU is not finite")


def one_process(st: Step) -> None:
    """python train.py, 3 steps of the tiny model."""
    sz, out = st.cfg.sizes, st.sdir / "run"
    rc, log = st.run(150, "train", [st.cfg.python, "train.py", *sz.common, *sz.tiny, "--steps", "3",
                                    "--eval-size", str(sz.eval), "--out-dir", str(out)])
    st.check(rc == 0, f"python train.py exited {rc}")
    train_run(st, "", out, log, 3, first=0)


def torchrun_one_rank(st: Step) -> None:
    """torchrun train.py, 3 steps with clipping and checkpoints; then --resume auto to step 4 and
    from_pretrained of checkpoints 3 and 4 (one --job)."""
    sz, out = st.cfg.sizes, st.sdir / "run"
    ckpt = out / "checkpoints"
    args = [*sz.common, *sz.tiny, "--max-grad-norm", "0.5", "--save-every", "2",
            "--eval-size", str(sz.eval), "--out-dir", str(out)]
    rc, log = st.run(150, "train", [st.cfg.python, *TORCHRUN, "train.py", *args, "--steps", "3"])
    st.check(rc == 0, f"torchrun train.py exited {rc}")
    train_run(st, "first", out, log, 3, first=0)
    st.check((ckpt / "step_000002" / "COMPLETE").exists(), "--save-every 2: no step_000002")
    res, log = st.job(150, "resume", [("resumed", [*args, "--steps", "4", "--resume", "auto"])],
                      torchrun=True, compare=[str(ckpt / "step_000003"), str(ckpt / "step_000004")])
    said = re.search(r"resumed from \S*step_000003 at step 3", log)
    st.n["resume_line"] = said.group(0) if said else None
    st.check(said, "the resumed run did not say 'resumed from .../step_000003 at step 3'")
    st.n["metrics_steps"] = [r["step"] for r in metrics(out)]
    st.check(st.n["metrics_steps"] == [0, 1, 2, 3, 4], "metrics.jsonl's steps are not 0-4")
    train_run(st, "resumed", out, log, 4, first=4, job=res)
    st.n["final"] = os.path.basename(os.path.realpath(out / "final"))
    st.check(st.n["final"] == "step_000004", f"final -> {st.n['final']}, not step_000004")
    load = res.get("from_pretrained")
    if st.check(load, "from_pretrained of checkpoints 3 and 4 failed (see resume.log)"):
        st.n["from_pretrained"] = load
        st.n["max_w_change_step3_to_4"] = load["max_abs_change"]
        st.check(load["finite"], "from_pretrained: a weight is not finite")
        st.check(load["max_abs_change"] > 0, "step 4's weights are step 3's: nothing trained")


def fsdp_variants(st: Step) -> None:
    """torchrun, 2 steps of each of VARIANTS, in one process (one --job)."""
    sz = st.cfg.sizes
    runs = [(name, [*sz.common, *sz.tiny, *flags, "--steps", "2", "--eval-size", str(sz.eval),
                    "--out-dir", str(st.sdir / name)]) for name, flags in VARIANTS.items()]
    res, log = st.job(300, "train", runs, torchrun=True)
    for name in VARIANTS:
        train_run(st, name, st.sdir / name, log, 2, job=res)
    # each variant's own term, where it has one: the KL penalty, above 0 once the policy moved;
    # R²PO's phase, 0 for the head's step and 1 for the policy's
    kl = [r.get("kl") for r in metrics(st.sdir / "kl")[1:]]
    st.n["kl"]["kl"] = kl
    st.check(kl and finite(kl[-1]) and kl[-1] > 0, f"kl: the KL term {kl}, not above 0 at the end")
    phase = [r.get("r2po/phase") for r in metrics(st.sdir / "r2po")[1:]]
    st.n["r2po"]["r2po/phase"] = phase
    st.check(phase == [0.0, 1.0], f"r2po: phases {phase}, not a head step then a policy step")


def model_05b(st: Step) -> None:
    """A random-weight model of Qwen2.5-0.5B's shape (the rehearsal's: a toy one), 2 steps in one
    process (the --job that makes it) and 2 under torchrun (FSDP2, another)."""
    sz, model = st.cfg.sizes, st.sdir / "model"

    def runs(name):
        return [(name, [*sz.common, *sz.big, "--model", str(model), "--steps", "2",
                        "--out-dir", str(st.sdir / name)])]
    res, log = st.job(240, "one", runs("one"), make_model=[str(model), sz.shape])
    made = res.get("make_model")
    if not st.check(made, "the model was not made (see one.log)"):
        return
    st.n["model"] = {k: v for k, v in made.items() if k != "name"}
    # random weights: the canary is recorded, not held to the tiny model's 0.1
    train_run(st, "one", st.sdir / "one", log, 2, first=0, canary=False, job=res)
    res, log = st.job(240, "fsdp", runs("fsdp"), torchrun=True)
    train_run(st, "fsdp", st.sdir / "fsdp", log, 2, first=0, canary=False, job=res)


def suite_on_cuda(st: Step) -> None:
    """The engine-independent tests (SUITE) on this machine's GPU."""
    if st.cfg.toy:
        st.note("toy rehearsal: the suite runs on the GPU machine only")
        st.status = "SKIP"
        return
    rc, log = st.run(240, "suite", [st.cfg.python, "-m", "pytest", "-q", "-x",
                                    "-p", "no:cacheprovider", *SUITE])
    st.n["pytest"] = log.strip().splitlines()[-1]
    st.check(rc == 0, f"pytest exited {rc}: {st.n['pytest']}")


STEPS = (env, one_process, torchrun_one_rank, fsdp_variants, model_05b, suite_on_cuda)


# ---- the summary: $OUT/summary.json, summary.md, logs.tar.gz -------------------------------------

def run_step(cfg: Config, step) -> dict:
    """One step, or its SKIP (not in ONLY) or FAIL (env found no CUDA); its record."""
    st = Step(cfg, step.__name__)
    print(f"== {st.name}")
    t0 = time.monotonic()
    if cfg.only and st.name not in cfg.only:
        st.note(f"not selected (ONLY={','.join(cfg.only)})")
        st.status = "SKIP"
    elif step is not env and cfg.cuda is False and not cfg.toy:
        st.note("env found no CUDA device: not run (SMOKE_TOY=1 rehearses on the CPU)")
        st.status = "FAIL"
    else:
        try:
            step(st)
        except Spent as e:
            st.note(str(e))
            st.status = "FAIL"
        except Exception as e:  # noqa: BLE001  (a step that breaks is a failed check, with why)
            traceback.print_exc()
            st.check(False, f"the step itself broke: {type(e).__name__}: {e}")
    status = st.status or ("FAIL" if st.failed else "PASS")
    seconds = round(time.monotonic() - t0, 1)
    print(f"   {status} ({seconds} s)")
    return {"name": st.name, "status": status, "seconds": seconds, "failed": st.failed,
            "numbers": st.n, "notes": st.notes, "commands": st.commands}


def fmt(v) -> str:
    """A number as summary.md shows it: floats to 4 digits, in lists too."""
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, list):
        return "[" + ", ".join(fmt(x) for x in v) + "]"
    return str(v)


def markdown(doc: dict) -> str:
    """summary.md: a table of the steps, then each step's failed checks, notes and numbers."""
    counts = doc["counts"]
    md = [f"# ops/gpu_smoke.py: {doc['mode']}, {doc['date']}, {doc['host']}", "",
          f"{counts['PASS']} PASS, {counts['FAIL']} FAIL, {counts['SKIP']} SKIP in "
          f"{doc['seconds']:.1f} s. Logs: logs.tar.gz (STEP/NAME.log, each run's metrics.jsonl).",
          "", "| step | status | seconds | failed checks / notes |", "|---|---|---|---|"]
    for s in doc["steps"]:
        why = "; ".join(s["failed"] + s["notes"]).replace("|", "/")
        md.append(f"| {s['name']} | {s['status']} | {s['seconds']} | {why} |")
    for s in doc["steps"]:
        md += ["", f"## {s['name']}: {s['status']}, {s['seconds']} s", ""]
        md += [f"- failed: {x}" for x in s["failed"]]
        md += [f"- note: {x}" for x in s["notes"]]
        for k, v in s["numbers"].items():
            if isinstance(v, dict):         # a run's numbers (or the model's), a line each
                md += [f"- {k}:"] + [f"  - {k2}: {fmt(v2)}" for k2, v2 in v.items()]
            else:
                md.append(f"- {k}: {fmt(v)}")
        md += [f"- command: {c['log']}, exit {c['rc']}, {c['seconds']} s" for c in s["commands"]]
    return "\n".join(md) + "\n"


def logs_only(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
    """logs.tar.gz's filter: no weights, no checkpoints."""
    name = os.path.basename(info.name)
    weights = name.endswith((".safetensors", ".pt", ".distcp", ".bin"))
    return None if weights or name in ("checkpoints", "final") else info


def write_summary(cfg: Config, done: dict) -> None:
    """summary.json and summary.md (the steps not run yet: NOT RUN), then logs.tar.gz ($OUT/work
    without weights), each replaced whole."""
    steps = [done.get(s.__name__) or {"name": s.__name__, "status": "NOT RUN", "seconds": None,
                                      "failed": [], "numbers": {}, "notes": [], "commands": []}
             for s in STEPS]
    doc = {"mode": "toy rehearsal (CPU)" if cfg.toy else "GPU",
           "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "host": platform.node(),
           "seconds": round(sum(s["seconds"] or 0 for s in steps), 1),
           "counts": {k: sum(s["status"] == k for s in steps) for k in ("PASS", "FAIL", "SKIP")},
           "steps": steps}
    (cfg.out / "summary.json.tmp").write_text(json.dumps(doc, indent=1))
    (cfg.out / "summary.md.tmp").write_text(markdown(doc))
    with tarfile.open(cfg.out / "logs.tar.gz.tmp", "w:gz") as tar:
        tar.add(cfg.work, arcname=".", filter=logs_only)
    for name in OUTPUTS:
        os.replace(cfg.out / f"{name}.tmp", cfg.out / name)


def main(argv: list[str]) -> int:
    cfg = configure(argv)
    sys.stdout.reconfigure(line_buffering=True)      # progress lines as they come, piped or not
    # TERM as Ctrl-C: the finally blocks stop the command and remove $OUT/work
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    shutil.rmtree(cfg.work, ignore_errors=True)
    cfg.work.mkdir(parents=True)
    for name in OUTPUTS:
        (cfg.out / name).unlink(missing_ok=True)
    mode = "toy rehearsal on the CPU" if cfg.toy else "GPU run"
    print(f"gpu_smoke: {mode}, results in {cfg.out}, budget {cfg.budget}s, python {cfg.python}")
    done = {}
    try:
        for step in STEPS:
            done[step.__name__] = run_step(cfg, step)
            write_summary(cfg, done)
    finally:        # no weights left in $OUT (a device machine sends back only a few files)
        shutil.rmtree(cfg.work, ignore_errors=True)
    print("\n" + (cfg.out / "summary.md").read_text())
    return 1 if any(s["status"] == "FAIL" for s in done.values()) else 0


# ---- the commands' side: env's probe, train.main in one process ----------------------------------

def probe() -> int:
    """--probe: python, torch, CUDA, the device and a matmul on it, transformers and vllm, as a
    JSON line."""
    from importlib.metadata import PackageNotFoundError, version

    import torch
    n = {"python": sys.version.split()[0], "torch": torch.__version__,
         "torch_cuda": torch.version.cuda, "transformers": version("transformers"),
         "cuda_available": torch.cuda.is_available(), "gpus": torch.cuda.device_count()}
    try:
        n["vllm"] = version("vllm")
    except PackageNotFoundError:
        n["vllm"] = "not installed (fine: the steps use TorchEngine)"
    if n["cuda_available"]:
        p = torch.cuda.get_device_properties(0)
        n["device"] = f"{p.name}, {p.total_memory / 2**30:.1f} GiB, capability {p.major}.{p.minor}"
        n["bf16"] = torch.cuda.is_bf16_supported()
        x = torch.randn(1024, 1024, device="cuda")
        n["matmul_ok"] = bool(torch.isfinite(x @ x).all())
    print(json.dumps(n))
    return 0


def job(spec: str) -> int:
    """--job JSON (one process, one rank): make_model [path, shape] if given, train.main once per
    [name, argv] of runs, then compare [dir, dir] if given; a result line each. A run's: its rc,
    seconds, peak GPU memory (which a process of its own would take with it) and max RSS. Exit 1
    when a run failed; make_model's or compare's error ends the job with its traceback."""
    import gc
    import resource

    import torch
    sys.path.insert(0, str(ROOT))
    import train
    spec = json.loads(spec)
    cuda = torch.cuda.is_available()
    if spec.get("make_model"):
        print(RESULT + json.dumps(make_model(*spec["make_model"])), flush=True)
    failed = 0
    for name, argv in spec["runs"]:
        gc.collect()                # the last run's model and optimizer, before the peak's reset
        if cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        row = {"name": name}
        t = time.perf_counter()
        try:
            row["rc"] = train.main(argv)
        except (Exception, SystemExit) as e:    # argparse's exit too: recorded, the next run goes
            traceback.print_exc()
            row.update(rc=1, error=f"{type(e).__name__}: {e}"[:300])
        row["seconds"] = round(time.perf_counter() - t, 2)
        if cuda:
            row["peak_allocated_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 3)
            row["peak_reserved_gib"] = round(torch.cuda.max_memory_reserved() / 2**30, 3)
        row["max_rss_mib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
        print(RESULT + json.dumps(row), flush=True)
        failed += row["rc"] != 0
    if spec.get("compare"):
        print(RESULT + json.dumps(compare(*spec["compare"])), flush=True)
    return 1 if failed else 0


def make_model(path: str, shape: str) -> dict:
    """Random weights (seed 0) of Qwen2.5-0.5B's shape, or a toy one, with the built-in tiny
    model's tokenizer (98 ids, all below the vocabulary size), saved as the trainer saves."""
    import torch
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    from checkpoint import save_hf
    tok = AutoTokenizer.from_pretrained(str(ROOT / "assets" / "tiny-arith"))
    sizes = QWEN25_05B if shape == "05b" else dict(TOY_MODEL, vocab_size=len(tok))
    config = Qwen2Config(**sizes, max_position_embeddings=4096, tie_word_embeddings=True)
    torch.manual_seed(0)
    t = time.perf_counter()
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = Qwen2ForCausalLM(config)
    save_hf(model, tok, path)
    return {"name": "make_model", "params": sum(p.numel() for p in model.parameters()),
            **sizes, "seconds": round(time.perf_counter() - t, 1)}


def compare(a: str, b: str) -> dict:
    """Two checkpoints through plain AutoModelForCausalLM.from_pretrained (not the trainer's
    loader): their dtype, whether every weight is finite, the largest change from a to b."""
    import torch
    from transformers import AutoModelForCausalLM
    sds = [AutoModelForCausalLM.from_pretrained(d, local_files_only=True).state_dict()
           for d in (a, b)]
    change = max((sds[1][k].float() - v.float()).abs().max().item() for k, v in sds[0].items())
    return {"name": "from_pretrained", "dtype": str(next(iter(sds[0].values())).dtype),
            "finite": all(bool(torch.isfinite(v).all()) for sd in sds for v in sd.values()),
            "max_abs_change": change}


if __name__ == "__main__":
    if sys.argv[1:2] == ["--probe"]:
        sys.exit(probe())
    if sys.argv[1:2] == ["--job"]:
        sys.exit(job(sys.argv[2]))
    sys.exit(main(sys.argv[1:]))
