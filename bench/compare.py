"""Methods x seeds on one task through train.py itself, then a plot and a table
with error bars over seeds.

    python bench/compare.py                   # grpo, naive-replay, rollout-replay x seeds 0,1,2
    python bench/compare.py --quick --jobs 2  # a few minutes on 2 cores: fewer steps and prompts
    python bench/compare.py --methods grpo,gspo,pnpo --seeds 0,1,2,3,4 --out runs/compare-seq -- \\
        --model assets/tiny-steps --train-data builtin_steps_train \\
        --max-new-tokens 48                   # flags after -- go to every run

`--experiment NAME` runs one paper's headline comparison instead (bench/experiments.py: its arms,
what it holds equal, a learning rate per arm chosen on the dev split, fresh seeds on the test
split), into bench/results/NAME/ (its runs in runs/experiments/NAME/) unless --out is given;
`--list-experiments` names them.

Each run is `python train.py --preset METHOD --seed S --out-dir OUT/METHOD/seed-S [flags after --]`
in a subprocess (the real training code path; its stdout goes to run.log next to its metrics.jsonl,
which is kept). A method is a preset of train.py (flags.PRESETS); where train.py has no presets yet,
METHODS maps the three base ones to flags. Every method runs with the same base model, data, steps,
prompts per step and group size: the same fresh-rollout budget, and no per-method tuning beyond what
its preset sets.

Outputs in OUT: compare.png (held-out accuracy against fresh rollouts generated, and against
training wall time; mean over seeds, band = min..max), results.md (the table below), and the table
on stdout:
- final accuracy: the last eval of --metric (default eval/accuracy), mean ± sample std over seeds;
- target = start + --target-frac (0.9) x (the baseline's (--baseline, grpo) final mean
  accuracy - start), start = the base model's accuracy (step 0, mean over every run): 90% of the
  baseline's gain, so that a target is never met by the base model itself; fresh rollouts and wall
  time to target: the first eval after step 0 at or above it, per seed, averaged over the seeds that
  reach it (n/N shown). No target when the baseline did not gain;
- ratios of those to the baseline's (below 1 = fewer rollouts / less time than the baseline);
- AES (eval.aes, O1-Pruner's accuracy-efficiency score) of the final mean accuracy and mean response
  length (response/len_mean, last step) against the baseline's;
- zero-std groups and distinct answers: means over the training steps (and seeds) of
  reward/zero_std_frac (groups with nothing to learn: VIGOR's target) and rollout/distinct_answers
  (rollout diversity: R²PO's target).
Fresh rollouts at step s = the sum of rollout/generated over steps 1..s (every completion generated,
extra DAPO or VIGOR rounds included); for a run that does not log it,
s x prompts_per_step x group_size from its flags line. Wall time = the sum of time/step up to that
step (training only: the periodic evaluation is not counted).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from stats import mean_std  # noqa: E402  (bench/stats.py, shared with experiments.py)

# Used only where train.py has no --preset: the three base methods as explicit flags.
METHODS = {"grpo": ["--replay", "none", "--eps-high", "0.2", "--agg", "seq-mean-token-mean"],
           "naive-replay": ["--replay", "uniform"], "rollout-replay": []}
QUICK = ["--steps", "20", "--prompts-per-step", "16", "--eval-every", "5", "--eval-size", "200"]


def method_flags(method: str) -> list[str]:
    """A method is a preset, optionally followed by flags of its own: "mu-grpo --steps 12" (a
    variant row)."""
    import flags
    name, *own = method.split()
    if name in getattr(flags, "PRESETS", {}):
        return ["--preset", name, *own]
    if name in METHODS:
        return METHODS[name] + own
    raise SystemExit(f"unknown method {method!r}: use a train.py preset "
                     f"({', '.join(getattr(flags, 'PRESETS', {}))})"
                     f" or one of {', '.join(METHODS)}")


def run_one(method: str, seed: int, out: Path, extra: list[str], threads: int, rerun: bool) -> Path:
    """train.py for one method and seed; returns its run directory (skipped when its metrics are
    complete)."""
    run_dir = out / method.replace(" --", "_").replace(" ", "=") / f"seed-{seed}"
    if not rerun and (run_dir / "done").exists():
        return run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, str(ROOT / "train.py"), *method_flags(method), "--seed", str(seed),
           "--out-dir", str(run_dir), "--threads", str(threads), "--save-every", "0",
           "--overwrite", *extra]          # a rerun, or a run cut off before its done file
    t0 = time.perf_counter()
    with open(run_dir / "run.log", "w") as log:
        rc = subprocess.run(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                            check=False).returncode
    if rc != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {rc}; see {run_dir / 'run.log'}")
    (run_dir / "done").write_text(f"{time.perf_counter() - t0:.1f} s\n")
    return run_dir


def run_flags(run_dir: Path) -> dict:
    """Every flag of a finished run: its final checkpoint's args.json (a run made before train.py
    printed only the changed flags has them as the first JSON line of its run.log)."""
    saved = run_dir / "final" / "args.json"
    if saved.exists():
        return json.loads(saved.read_text())
    with open(run_dir / "run.log") as f:
        return next(json.loads(line) for line in f if line.startswith("{"))


def load_run(run_dir: Path, metric: str) -> dict:
    """{evals: [(step, fresh rollouts, wall seconds, accuracy)], length: last response/len_mean,
    zero_std and distinct: the means over training steps of reward/zero_std_frac and
    rollout/distinct_answers (None if absent)}."""
    flags_line = run_flags(run_dir)
    per_step = flags_line["prompts_per_step"] * flags_line["group_size"]
    # VIGOR spends exactly its budget per step (--vigor-budget; older runs: rollout_budget)
    budget = flags_line.get("vigor_budget", flags_line.get("rollout_budget"))
    if flags_line.get("allocation", "fixed") != "fixed" and budget:
        per_step = budget
    rows = [json.loads(line) for line in open(run_dir / "metrics.jsonl") if line.strip()]
    wall, fresh, evals = 0.0, 0, []
    for r in rows:
        wall += r.get("time/step", 0.0)
        if r["step"] > 0:
            # every generated rollout, all rounds, all ranks
            fresh += r.get("rollout/generated", per_step)
        if metric in r:
            evals.append((r["step"], fresh, wall, r[metric]))
    if not evals:
        raise ValueError(f"{run_dir}: no {metric} in metrics.jsonl")
    over_steps = lambda key: (statistics.mean([r[key] for r in rows if key in r])  # noqa: E731
                              if any(key in r for r in rows) else None)
    return {"evals": evals, "length": rows[-1].get("response/len_mean", 0.0),
            "zero_std": over_steps("reward/zero_std_frac"),
            "distinct": over_steps("rollout/distinct_answers")}


def to_target(runs: list[dict], target: float) -> tuple[float | None, float | None, int]:
    """(mean fresh rollouts, mean wall seconds, seeds reaching) to the first eval with
    accuracy >= target."""
    hits = [next(((f, w) for s, f, w, a in r["evals"] if s > 0 and a >= target), None)
            for r in runs]
    hits = [h for h in hits if h is not None]
    if not hits:
        return None, None, 0
    return statistics.mean(f for f, _ in hits), statistics.mean(w for _, w in hits), len(hits)


def ratio(x: float | None, base: float | None) -> float | None:
    return x / base if x is not None and base else None


def summarize(results: dict[str, list[dict]], baseline: str,
              target_frac: float) -> tuple[list[dict], float]:
    import eval as eval_lib
    base_acc = statistics.mean(r["evals"][-1][3] for r in results[baseline])
    base_len = statistics.mean(r["length"] for r in results[baseline])
    start = statistics.mean(r["evals"][0][3] for runs in results.values() for r in runs
                            if r["evals"][0][0] == 0)
    target = start + target_frac * (base_acc - start) if base_acc > start else None
    b_fresh, b_wall, _ = (to_target(results[baseline], target) if target is not None
                          else (None, None, 0))
    rows = []
    for method, runs in results.items():
        acc, std = mean_std([r["evals"][-1][3] for r in runs])
        length = statistics.mean(r["length"] for r in runs)
        fresh, wall, n = to_target(runs, target) if target is not None else (None, None, 0)
        aes = (eval_lib.aes(acc, length, base_acc, base_len) if base_acc > 0 and base_len > 0
               else float("nan"))
        both = lambda key: (statistics.mean(r[key] for r in runs)  # noqa: E731
                            if all(r.get(key) is not None for r in runs) else None)
        rows.append({"method": method, "seeds": len(runs), "acc": acc, "std": std,
                     "fresh": fresh, "wall": wall, "reached": n,
                     "fresh_ratio": ratio(fresh, b_fresh), "wall_ratio": ratio(wall, b_wall),
                     "length": length, "aes": aes,
                     "zero_std": both("zero_std"), "distinct": both("distinct")})
    return rows, (start, base_acc, target)


def markdown(rows: list[dict], targets: tuple, baseline: str, target_frac: float) -> str:
    f = lambda x, fmt: "—" if x is None else format(x, fmt)     # noqa: E731
    start, base_acc, target = targets
    head = (f"target accuracy = start + {target_frac:g} x ({baseline}'s final mean - start) = "
            f"{100 * start:.1f} + {target_frac:g} x ({100 * base_acc:.1f} - {100 * start:.1f}) "
            f"= {100 * target:.1f}%" if target is not None
            else f"no target: {baseline}'s final mean {100 * base_acc:.1f}% is not above the start "
                 f"{100 * start:.1f}%")
    out = [head + "\n",
           "| method | seeds | final accuracy | fresh rollouts to target | wall s to target "
           f"| reached | rollouts / {baseline} | wall / {baseline} | mean length "
           f"| AES vs {baseline} | zero-std groups | distinct answers |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['method']} | {r['seeds']} "
                   f"| {100 * r['acc']:.1f} ± {100 * r['std']:.1f}% "
                   f"| {f(r['fresh'], ',.0f')} | {f(r['wall'], '.1f')} "
                   f"| {r['reached']}/{r['seeds']} "
                   f"| {f(r['fresh_ratio'], '.2f')} | {f(r['wall_ratio'], '.2f')} "
                   f"| {r['length']:.1f} | {r['aes']:+.3f} "
                   f"| {f(r['zero_std'], '.2f')} | {f(r['distinct'], '.2f')} |")
    return "\n".join(out) + "\n"


def plot(results: dict[str, list[dict]], path: Path, title: str) -> bool:
    """compare.png; False (and nothing written) without matplotlib."""
    try:
        import matplotlib
    except ImportError:
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(14, 5.6), constrained_layout=True)
    colors = plt.get_cmap("tab10").colors   # 10 colours; past 10 methods, dashed lines
    for i, (method, runs) in enumerate(results.items()):
        n = min(len(r["evals"]) for r in runs)
        fresh = [runs[0]["evals"][i][1] for i in range(n)]
        wall = [statistics.mean(r["evals"][i][2] for r in runs) for i in range(n)]
        accs = [[r["evals"][i][3] for r in runs] for i in range(n)]
        mean = [100 * statistics.mean(a) for a in accs]
        lo, hi = [100 * min(a) for a in accs], [100 * max(a) for a in accs]
        for ax, x in zip(axes, (fresh, wall)):
            line, = ax.plot(x, mean, marker="o", markersize=3, color=colors[i % 10],
                            linestyle=("-", "--", ":")[i // 10 % 3],
                            label=f"{method} ({len(runs)} seeds)")
            ax.fill_between(x, lo, hi, color=line.get_color(), alpha=0.15)
    axes[0].set(xlabel="fresh rollouts generated", ylabel="held-out accuracy (%)",
                title="accuracy vs rollouts")
    axes[1].set(xlabel="training wall time (s, eval excluded)", ylabel="held-out accuracy (%)",
                title="accuracy vs wall time")
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.legend(*axes[0].get_legend_handles_labels(), loc="outside lower center", ncol=5,
               fontsize=8, frameon=False)
    fig.suptitle(title + " (line: mean over seeds; band: min..max)", fontsize=10)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return True


def experiment_main(args, ours: list[str], extra: list[str]) -> int:
    """--experiment NAME / --list-experiments."""
    import experiments
    if args.list_experiments:
        for name, make in experiments.EXPERIMENTS.items():
            exp = make(False)
            print(f"{name:10s} {exp.paper}: {', '.join(s.label for s in exp.settings)}")
        return 0
    if args.experiment not in experiments.EXPERIMENTS:
        raise SystemExit(f"unknown experiment {args.experiment!r}: choose one of "
                         f"{', '.join(experiments.EXPERIMENTS)}")
    if extra:
        raise SystemExit("--experiment takes no train.py flags after --: an experiment's flags are "
                         "its definition (bench/experiments.py)")
    custom = "--out" in ours
    out = Path(args.out if custom else ROOT / "bench" / "results" / args.experiment)
    runs = out / "runs" if custom else ROOT / "runs" / "experiments" / args.experiment
    threads = args.threads or max(1, (os.cpu_count() or 1) // max(1, args.jobs))
    text = experiments.run_experiment(args.experiment, out, runs=runs, jobs=args.jobs,
                                      threads=threads, quick=args.quick, only=args.setting,
                                      reuse_stale=args.reuse_stale,
                                      train=not args.analyse_only)
    print(text + f"\nwrote {out}")
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="train.py flags after -- go to every run")
    p.add_argument("--methods", default="grpo,naive-replay,rollout-replay",
                   help="comma-separated presets; one may carry its own flags, "
                        "e.g. 'mu-grpo --steps 12'")
    p.add_argument("--seeds", default="0,1,2", help="comma-separated seeds")
    p.add_argument("--more-seeds", default="", metavar="METHODS=SEEDS",
                   help="extra seeds for some methods (where they are within the noise), e.g. "
                        "'grpo,naive-replay,rollout-replay=3,4'")
    p.add_argument("--out", default="runs/compare",
                   help="output directory (a run already done there is reused)")
    p.add_argument("--quick", action="store_true",
                   help=f"train.py {' '.join(QUICK)}, seeds 0,1 (a few minutes)")
    p.add_argument("--jobs", type=int, default=1,
                   help="runs in parallel (each gets cores // jobs threads)")
    p.add_argument("--threads", type=int, default=0,
                   help="torch threads per run (0 = cores // jobs)")
    p.add_argument("--baseline", default="grpo",
                   help="the method the target and the ratios refer to")
    p.add_argument("--target-frac", type=float, default=0.9,
                   help="target = this x the baseline's final accuracy")
    p.add_argument("--metric", default="eval/accuracy",
                   help="metrics.jsonl key of the held-out accuracy")
    p.add_argument("--rerun", action="store_true",
                   help="run again even where a finished run exists")
    p.add_argument("--experiment", default="", metavar="NAME",
                   help="one paper's headline comparison (bench/experiments.py) into --out "
                        "(default bench/results/NAME); --quick: toy sizes, in-process runs")
    p.add_argument("--setting", default="", metavar="LABEL",
                   help="with --experiment: run only this setting (e.g. arith); the README "
                        "keeps the other settings' tables from their results.md")
    p.add_argument("--analyse-only", action="store_true",
                   help="with --experiment: train nothing; reanalyse the finished runs (the "
                        "archive's); a setting whose baseline's runs are missing keeps its "
                        "committed results, an arm whose runs are missing is listed as in "
                        "progress")
    p.add_argument("--reuse-stale", default="none", choices=("none", "sweep", "all"),
                   help="with --experiment: reuse finished runs made by other code (its hash, "
                        "code.sha256): none (run them again), sweep (keep the sweep's, so the "
                        "choices stand), all; the results say which code made each run")
    p.add_argument("--list-experiments", action="store_true", help="the experiments, a line each")
    argv = sys.argv[1:] if argv is None else list(argv)
    ours, extra = ((argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv
                   else (argv, []))
    args = p.parse_args(ours)
    if args.list_experiments or args.experiment:
        return experiment_main(args, ours, extra)
    methods = [m for m in args.methods.split(",") if m]
    seeds = [int(s) for s in
             (args.seeds if not args.quick or "--seeds" in ours else "0,1").split(",")]
    extra = (QUICK if args.quick else []) + extra  # later flags win in argparse
    if args.baseline not in methods:
        raise SystemExit(f"--baseline {args.baseline} is not among --methods {args.methods}")
    for m in methods:
        method_flags(m)                            # unknown names fail before anything runs
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    threads = args.threads or max(1, (os.cpu_count() or 1) // max(1, args.jobs))
    more_methods, _, more = args.more_seeds.partition("=")
    seeds_of = {m: seeds + ([int(s) for s in more.split(",")]
                            if m in more_methods.split(",") else [])
                for m in methods}
    jobs = [(m, s) for s in sorted({s for ss in seeds_of.values() for s in ss})
            for m in methods if s in seeds_of[m]]
    print(f"{len(jobs)} runs ({len(methods)} methods x {len(seeds)} seeds"
          f"{', + ' + args.more_seeds if more else ''}), "
          f"{args.jobs} at a time, {threads} "
          f"threads each; train.py flags: {' '.join(extra) or '(defaults)'}", flush=True)
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        dirs = dict(zip(jobs, pool.map(
            lambda j: run_one(*j, out, extra, threads, args.rerun), jobs)))
    results = {m: [load_run(dirs[m, s], args.metric) for s in seeds_of[m]] for m in methods}
    rows, targets = summarize(results, args.baseline, args.target_frac)
    table = markdown(rows, targets, args.baseline, args.target_frac)
    wall = time.perf_counter() - t0
    ran = sum(float((dirs[j] / "done").read_text().split()[0]) for j in jobs)
    header = (f"`python bench/compare.py {' '.join(argv)}`: {len(jobs)} runs, {ran:.0f} s of runs "
              f"in all (done files), {args.jobs} at a time, {threads} threads each\n\n")
    (out / "results.md").write_text(header + table)
    drew = plot(results, out / "compare.png", f"{args.metric}, {len(methods)} methods")
    print(table + f"wrote {out / 'results.md'}"
          + (f" and {out / 'compare.png'}" if drew
             else " (no compare.png: matplotlib is not installed, "
                  "pip install -r requirements-bench.txt)")
          + f"; {wall:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
