"""The protocol: sweep, choose, run, reuse, archive. One setting's runs (run_setting): its arms
swept on the dev split, each arm's lr chosen (choose, past_edge, choose_reading; a stress
setting's shared lr: stress_lr), every reported arm run on the setting's seeds on the test split;
each run made or reused by bench/runs.py (run_train), the archive packed again after every run
that trained (Plan). The rules are bench/experiments.py's docstring.
"""
import json
import math
import shutil
import statistics
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from design import EXTEND, QUICK_EVAL, QUICK_GRID, STRESS_DROP, Setting
import sequential
from stats import p_value
from runs import (code_hash, cpu_kind, load, pack_runs, recorded_code, recorded_cpu,
                  run_train, same_code)
from verdicts import compare_runs, mechanism_acted, predicate_keys, stream



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


def remake_elsewhere(dirs: list, here: str) -> list:
    """Setting.one_machine: of one block's report runs (`dirs`, every arm of each seed), the
    finished ones to make again here because a run of the same seed is not finished or was made on
    another CPU kind than `here` (recorded_cpu): a seed whose every arm is done on one kind is
    kept; any other seed keeps only its runs made here, the rest removed so that run_all makes them
    here. Returns the removed."""
    removed = []
    by_seed: dict[str, list] = {}
    for d in dirs:
        by_seed.setdefault(d.name, []).append(d)
    for seed, ds in by_seed.items():
        kinds = {recorded_cpu(d) for d in ds if (d / "done").exists()}
        if all((d / "done").exists() for d in ds) and len(kinds) == 1:
            continue
        for d in ds:
            if (d / "done").exists() and recorded_cpu(d) != here:
                shutil.rmtree(d)
                removed.append(d)
    return removed


def primary_crosses(s: Setting, dirs: dict[str, list], look: int, keys: tuple) -> bool:
    """A group-sequential setting's stopping rule at look index `look` (bench/sequential.py): the
    primary claim (s.claims[0]) paired over the complete seeds, its mechanism acted, and its
    two-sided p below that look's O'Brien-Fleming nominal p."""
    c = s.claims[0]
    runs = {name: [{**load(d, "eval/accuracy", keys, s.final_at, s.x), "seed": int(d.name[5:]),
                    "stream": stream(json.loads((d / "argv.json").read_text()))} for d in ds]
            for name, ds in dirs.items()}
    ref = c.against or s.baseline
    acted = c.acted is None or mechanism_acted(runs[c.arm], *c.acted, runs[ref])
    comparison = compare_runs(s, runs, c.arm, ref, c.metric)
    p = p_value(comparison) if comparison is not None and acted else None
    return sequential.crosses(p, look, s.looks)


class Stopped(Exception):
    """A setting that stops before its report: its message says why (runs not in the archive in
    an analyse-only call; a pre-registered dev gate that did not hold, Setting.dev_gate; a
    group-sequential setting before its first look, with `progress`: its sweep, its choices and
    its finished report runs, whose accuracy nothing reads: report.write_progress)."""

    def __init__(self, message: str, progress: dict | None = None):
        super().__init__(message)
        self.progress = progress


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
    keys += tuple(k for c in s.claims for pred in (c.acted, c.post_hoc) if pred
                  for k in predicate_keys(*pred))
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

    # seed by seed, every arm of a seed before the next seed: a stopped call leaves pairs; a
    # group-sequential setting look by look, stopping at the look where its primary crosses
    looks = [n for n in s.looks if n <= len(report_seeds)] if s.looks else []
    blocks = [report_seeds[a:b] for a, b in zip([0, *looks], [*looks, len(report_seeds)]) if b > a]
    done: tuple[int, ...] = ()
    for i, block in enumerate(blocks):
        jobs = [(argv(a, chosen[a.name], sd, "test"), report_dir(a, sd))
                for sd in block for a in arms]
        if s.one_machine and plan.train:
            remake_elsewhere([d for _, d in jobs], cpu_kind())
        plan.run_all(jobs, "report")
        if any(d in plan.missing for _, d in jobs):     # analyse only: read the last full look
            break
        done += block
        if i == len(blocks) - 1:
            break
        if s.looks and primary_crosses(s, {a.name: [report_dir(a, sd) for sd in done]
                                           for a in arms}, i, keys):
            break
    withheld: list[str] = []     # arms not read at this look (Setting.interim_primary_only)
    if s.looks:                  # what the rule reads: every seed of the last complete look
        if not done:
            have = sum(all((report_dir(a, sd) / "done").exists() for a in arms)
                       for sd in report_seeds)
            made = {a.name: [{**load(report_dir(a, sd), "eval/accuracy", keys, s.final_at, s.x),
                              "seed": sd} for sd in report_seeds
                             if (report_dir(a, sd) / "done").exists()] for a in arms}
            raise Stopped(f"setting {s.label}: {have} of {looks[0]} seeds complete before its "
                          "first look; nothing is read before it (group-sequential)",
                          progress={"setting": s, "grid": grid, "sweep_seeds": sweep_seeds,
                                    "sweep": sweep, "chosen": chosen, "picked": picked,
                                    "also": also, "band": band, "runs": made, "complete": have,
                                    "waiting": sorted(waiting),
                                    "codes": code_counts([recorded_code(d)
                                                          for d in plan.ran_of(base)])})
        report_seeds = done
        look = s.looks.index(len(done)) if len(done) in s.looks else None
        if (s.interim_primary_only and look is not None and look < len(s.looks) - 1
                and not primary_crosses(s, {a.name: [report_dir(a, sd) for sd in done]
                                            for a in arms}, look, keys)):
            first = s.claims[0]          # the runs go on: the primary's two arms alone are read
            keep = (first.arm, first.against or s.baseline)
            withheld = [a.name for a in arms if a.name not in keep]
            arms = [a for a in arms if a.name in keep]
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
            "codes": code_counts(made_by), "waiting": sorted(waiting), "withheld": withheld,
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
    if not codes or not codes["runs"]:
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
