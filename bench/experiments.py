"""Each paper's headline comparison as data: its arms, what it holds equal, a learning rate per
arm chosen on the dev split, then the reported runs on the test split with fresh seeds. The entry
point: the code lives by job in design.py (the vocabulary), papers/*.py (each paper's settings),
protocol.py (sweep, choose, a setting's runs), runs.py (one run: made, reused, kept),
verdicts.py and curves.py (the rule and its numbers) and report.py (tables, plots, the headline);
each name is imported from the file that owns it.

    python bench/compare.py --experiment replay            # writes bench/results/replay/
    python bench/compare.py --experiment mu-grpo --jobs 2  # 2 runs at a time, 1 thread each
    python bench/compare.py --experiment pnpo --quick      # the same pipeline at toy sizes (tests)
    python bench/compare.py --list-experiments

The protocol, the same for every experiment and every arm:
1. **Sweep.** The arm at each learning rate of LR_GRID, seeds SWEEP_SEEDS, evaluated on the dev
   split only (`--dev-size`, `--eval-size 0`: the test split is never looked at). A sweep run may
   be shorter than a reported one (`Setting.sweep`, stated in the table).
2. **Choose.** The lr whose final `eval/dev_accuracy`, averaged over the sweep seeds, is highest;
   equal means go to the larger lr. When that is the grid's smallest or largest lr, the next one
   on the half-decade ladder past it is swept too (1e-5 below 3e-5, 1e-3 above 3e-4; EXTEND at
   most, past_edge), so that no choice is an artefact of where the grid stops. No other per-arm
   tuning: an arm's flags are its paper's (its preset) and what the experiment holds equal.
   Readings of one method (`Setting.readings`: arms that differ only in how the method is read)
   are then chosen among the same way: the one whose mean final dev accuracy at its own chosen lr
   is highest (ties: the first listed), among those that keep `Setting.band` (a metric's largest
   value over every step of those sweep runs under a stated bound) when there is one; only that
   one is reported (choose_reading), and beside it, without a headline row, the best on dev
   whatever the band where the band excluded it.
3. **Report.** Every reported arm at its chosen lr with the same fresh seeds (`Setting.seeds`:
   REPORT_SEEDS, 5, or replay's 10; fixed before any test result is seen; --quick: the first one),
   evaluated on the test split only, at least every 5 steps (`every`).
4. **Compare.** Each arm against the baseline (and each `Setting.claims` entry against its own
   reference): Δ of the final test accuracy (a run's final accuracy: the mean of its last two
   evaluations after step 0) with its standard error, degrees of freedom and 95% CI, paired over
   seeds where the two arms share the prompt stream (equal --prompts-per-step and --seed in the
   argv.json each run records), else Welch's (bench/stats.py); x to a target, censored at a run's
   budget where it is not reached (time_to_target); accuracy at fixed budgets (BUDGETS of the
   baseline's x-range); the verdict word, by code (verdict, VERDICT_RULE).

Outputs in OUT/<setting>/ (OUT = bench/results/NAME by default; one setting per task an
experiment runs on): results.md (the table: final test accuracy mean ± std over seeds, Δ to the
baseline with SE, df, 95% CI and the pairing, x and wall time to a target with reached k/n and the
ratio to the baseline (a bound where seeds are censored), accuracy at each budget with its Δ and
CI, the verdict, completion length at the start and the end, the diagnostics; then every claim's
verdict and VERDICT_RULE), sweep.md (every arm x lr: final dev accuracy per seed, the chosen one
marked), accuracy.png (test accuracy against the setting's x-axis and wall time: mean over seeds,
band min..max), sweep.png where there are sweep runs, seeds.png where the setting asks
(Setting.seed_curves: every seed's curve) and summary.json (the runs and every number of the
tables: analyse()); OUT/README.md collects the experiment's claim, what it holds equal, the
verdict rule and every setting's table. `python bench/experiments.py --headline` prints the
README's headline table from every bench/results/*/**/summary.json (headline_table), and `--look
SETTING_DIR` a group-sequential setting's claims at its look and a row per arm (look_tables: the
tables of docs/smollm2.md). The runs go
to RUNS/<setting>/{sweep,report}/ARM/lr-LR/seed-S/ (RUNS = runs/experiments/NAME by default,
OUT/runs with --out); a run keeps its run.log, argv.json, metrics.jsonl, updates.jsonl and
samples.jsonl (its checkpoints are deleted once it is done). Runs are `python train.py ...` in
subprocesses (in-process `train.main` under --quick); a finished run (its `done` file) is reused
when its recorded flags and its base model's sha256 are the same. OUT/runs.tar.gz keeps every
finished run's flags, hash and metrics.jsonl (pack_runs), and a fresh clone starts from them
(unpack_runs): the committed results are rebuilt from committed runs, and a long experiment can
be finished over several sessions (the archive is packed again after every finished run, so a
session stopped mid-setting keeps what it ran). `--setting LABEL` runs one setting of an experiment.
"""
import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))    # bench/: run as a script or imported

from design import EXTEND, LR_GRID, QUICK_GRID, ROOT  # noqa: E402
from papers import EXPERIMENTS  # noqa: E402
from protocol import REUSE_STALE, Plan, Stopped, run_setting  # noqa: E402
from headline import headline_rows, headline_table  # noqa: E402
from report import look_tables, write_pooled, write_progress, write_setting  # noqa: E402
from runs import (MAKE_MODEL, missing_model, pack_runs, recorded_models,  # noqa: E402
                  slow_bf16, unpack_runs)
from verdicts import VERDICT_RULE  # noqa: E402


def run_experiment(name: str, out: Path, *, runs: Path, jobs: int = 1, threads: int = 1,
                   quick: bool = False, only: str = "", reuse_stale: str = "none",
                   train: bool = True) -> str:
    """Every setting of experiment `name` (only the one labelled `only` when given: the others'
    tables are taken from their results.md in OUT where they exist), its runs in RUNS (reused as
    Plan.reuse_stale says; with train False nothing runs: a setting that stops for runs not in
    the archive keeps its committed results, protocol.Stopped), then its pooled claims from the
    settings' summary.json files (write_pooled); writes OUT and returns OUT/README.md's text."""
    exp = EXPERIMENTS[name](quick)
    labels = [s.label for s in exp.settings]
    if only and only not in labels:
        raise SystemExit(f"experiment {name} has no setting {only!r}: choose one of "
                         f"{', '.join(labels)}")
    if reuse_stale not in REUSE_STALE:
        raise SystemExit(f"--reuse-stale must be one of {', '.join(REUSE_STALE)}")
    plan = Plan(runs, jobs, threads, quick, archive=None if quick else out / "runs.tar.gz",
                reuse_stale=reuse_stale, train=train)
    t0 = time.perf_counter()
    unpack_runs(out / "runs.tar.gz", runs)
    parts, kept = [], []
    for s in exp.settings:
        missing = missing_model(s)
        models = recorded_models(runs / s.label) if missing and not train else set()
        if len(models) == 1:        # analyse only: the archive's runs, all of one base model
            print(f"setting {s.label}: {missing} is not here; its archived runs all record one "
                  f"base model (sha256 {next(iter(models))[:12]}) and are read as recorded",
                  file=sys.stderr)
            missing = ""
        if missing and s.label == only:
            raise SystemExit(f"setting {s.label} trains {missing}, which is not here: "
                             f"{MAKE_MODEL.get(missing, 'make it first')}")
        slow = "" if missing or not train or (only and s.label != only) else slow_bf16(s)
        if slow and s.label == only:
            raise SystemExit(slow)
        stopped = ""
        if not missing and not slow and (not only or s.label == only):
            try:
                parts.append(write_setting(run_setting(s, plan), out / s.label, exp))
                continue
            except Stopped as why:
                stopped = str(why)
                if why.progress:                  # before a sequential setting's first look
                    print(why, file=sys.stderr)
                    parts.append(write_progress(why.progress, out / s.label, str(why)))
                    continue
                print(f"{why}; its committed results are kept", file=sys.stderr)
        if missing:
            print(f"setting {s.label} not run: {missing} is not here "
                  f"({MAKE_MODEL.get(missing, 'make it first')}); its committed results are kept",
                  file=sys.stderr)
        if slow:
            print(f"{slow}; not run, its committed results are kept", file=sys.stderr)
        kept += [d.parent for d in (runs / s.label).glob("**/done")]   # the other settings'
        if (out / s.label / "results.md").exists():
            text = (out / s.label / "results.md").read_text()
            parts.append(text.replace("\n" + VERDICT_RULE + "\n", ""))
        elif stopped:
            parts.append(f"## {s.label}\n\nStopped: {stopped}.\n")
        else:
            parts.append(f"## {s.label}\n\nNot run yet: `python bench/compare.py --experiment "
                         f"{name} --setting {s.label} --jobs 2 --threads 1`.\n")
    for p in exp.pooled:
        done = {label: out / label / "summary.json" for label in p.settings}
        if all(path.exists() for path in done.values()):
            parts.append(write_pooled(p, {label: json.loads(path.read_text())
                                          for label, path in done.items()},
                                      out / ("pooled-" + "-".join(p.settings)), exp))
    if train:
        pack_runs(plan.ran + kept, runs, out / "runs.tar.gz")
    took = sum(float((d / "done").read_text().split()[0]) for d in set(plan.ran))
    head = (f"# {exp.name}: {exp.paper}\n\n**Claim** (words in quotes are the paper's): "
            f"{exp.claim}\n\n**Held equal**: "
            f"{exp.held_equal}. {exp.notes}\n\n**Protocol**: bench/experiments.py's docstring "
            f"(lr grid {', '.join(f'{x:g}' for x in (QUICK_GRID if quick else LR_GRID))}, the "
            f"best mean final dev accuracy, ties to the larger lr, up to {EXTEND} more past an "
            f"edge; reported: every arm on the same fresh seeds "
            f"{', '.join(map(str, exp.settings[0].seeds[:1] if quick else exp.settings[0].seeds))}"
            f", test split)."
            f"\n\n{VERDICT_RULE}\n\n"
            f"`python bench/compare.py --experiment {name}"
            f"{' --quick' if quick else ''}{f' --setting {only}' if only else ''}"
            f"{f' --reuse-stale {reuse_stale}' if reuse_stale != 'none' else ''}"
            f"{'' if train else ' --analyse-only'} --jobs {jobs}`"
            f": {len(set(plan.ran))} runs, "
            f"{took:.0f} s of runs"
            + (" (in-process, one at a time)" if quick
               else "" if not train            # analyse only: this call's threads ran nothing
               else f" ({jobs} at a time, {threads} thread(s) each)")
            + ", "
            f"{time.perf_counter() - t0:.0f} s this call.\n\n")
    text = head + "\n".join(parts)
    (out / "README.md").write_text(text)
    return text


def main(argv=None) -> int:
    """`python bench/experiments.py --headline [RESULTS_DIR]`; the experiments themselves run
    through `python bench/compare.py --experiment NAME`."""
    p = argparse.ArgumentParser(description="The README's headline table from the experiments' "
                                "summary.json files (run them with bench/compare.py "
                                "--experiment NAME).")
    p.add_argument("--headline", nargs="?", const=str(ROOT / "bench" / "results"),
                   metavar="RESULTS_DIR", help="print the headline table (default bench/results)")
    p.add_argument("--every-claim", action="store_true",
                   help="a row per claim, not only the headline ones (docs/results.md's table)")
    p.add_argument("--look", metavar="SETTING_DIR",
                   help="print a group-sequential setting's claims at its look and a row per arm "
                        "from SETTING_DIR/summary.json (docs/smollm2.md's tables), e.g. "
                        "bench/results/replay/smollm2-draws")
    args = p.parse_args(argv)
    if args.look:
        path = Path(args.look) / "summary.json"
        if not path.exists():
            raise SystemExit(f"--look: {path} does not exist (bench/compare.py --experiment NAME "
                             "--setting LABEL writes it)")
        print(look_tables(json.loads(path.read_text())), end="")
        return 0
    if not args.headline:
        p.print_help()
        return 2
    _, skipped = headline_rows(Path(args.headline), args.every_claim)
    print(headline_table(Path(args.headline), args.every_claim), end="")
    for path in skipped:
        print(f"skipped {path}: no comparisons (written before verdicts; run it again)",
              file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
