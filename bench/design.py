"""What an experiment is, as data: an arm (a preset plus what the experiment sets), a claim (what
the paper says of an arm against another, and the diagnostic that says its mechanism acted), a
setting (one task and size: common flags, arms, baseline, seeds, the lr rule), an experiment (a
paper's settings), a pooled claim (one claim read over the paired seeds of several settings);
the protocol's constants and the task flags every paper's settings share. No running, no
statistics: bench/protocol.py runs a setting, bench/verdicts.py judges it, bench/report.py writes
it, bench/papers/*.py define each paper's settings, bench/experiments.py is the entry point."""
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]      # the repository: train.py's modules importable
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

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
    baseline). metric: "final" (final test accuracy), "peak" (the best test evaluation),
    "at 25%" / "at 50%" / "at 75%" / "at 100%" (accuracy at that budget, BUDGETS) or a metrics
    key of Setting.finals (its last value per run). acted: (metrics key, "AGG OP RHS" or "AGG /
    KEY2 OP RHS"), e.g. ("loss/veto_frac", "max > 0"), on the arm's reported runs
    (mechanism_acted); false: "not testable here". headline: the paper's headline claim (its
    abstract's comparison), the setting's row in the README's table (headline_rows). note: what
    the row shows where it is not the paper's claim (e.g. "replay's effect"); beside: an arm whose
    Δ against the same reference is printed beside the row (e.g. naive replay's). post_hoc: a
    second diagnostic shown beside the gate with the word it would give, never the verdict's
    gate, labelled post_hoc_label (one defined after the runs, or a gate since replaced)."""
    arm: str
    direction: int | None = 1
    against: str = ""
    metric: str = "final"
    acted: tuple[str, str] | None = None
    headline: bool = False
    note: str = ""
    beside: str = ""
    post_hoc: tuple[str, str] | None = None
    post_hoc_label: str = "post hoc (defined after the runs, not the gate)"


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
    seed_curves: bool = False                  # also seeds.png: every seed's curve (seed_plot)
    dev_gate: str = ""                         # under shared_lr: this arm is swept there too and
                                               # the report runs only if it does not fall on dev
    looks: tuple[int, ...] = ()                # group-sequential: complete seeds at each look
                                               # (bench/sequential.py; claims[0] is the primary)
    one_machine: bool = False                  # every arm of a seed on one CPU kind (cpu.txt)
    arm_gates: object = None                   # (arm, its runs) -> [(check, value, holds)]: what
                                               # each arm's mechanism did, a table of its own
    beside: str = ""                           # an archived setting whose same claims are shown
                                               # beside this one's, never pooled into them
    interim_primary_only: bool = False         # group-sequential: a look where the runs go on
                                               # reads the primary's two arms alone (the other
                                               # arms withheld until the look that decides them)
    run_columns: tuple[tuple[str, str], ...] = ()   # (column, key): the per-run table's
                                               # (report.per_run_table; default its RUN_KEYS)
    spend: bool = False                        # also what each arm spent (wall, tokens) to reach
                                               # the baseline's final accuracy, seed by seed
                                               # (curves.spend_to_baseline; descriptive)


@dataclass(frozen=True)
class Pooled:
    """One claim read over the paired seeds of several settings of an experiment (the same arms,
    every arm on the same seeds within a setting): Δ paired over every (setting, seed) pair, from
    each setting's summary.json (verdicts.pooled). Its row beside the per-setting rows."""
    label: str                                 # e.g. "arith + arith-s1 (pooled)"
    settings: tuple[str, ...]
    claim: Claim                               # against: a named arm (no setting's baseline)
    post_hoc: str = ""                         # where it was defined after results: when, why


@dataclass(frozen=True)
class Experiment:
    name: str
    paper: str
    claim: str                                 # the paper's claim, in its own words
    held_equal: str
    settings: tuple[Setting, ...]
    notes: str = ""
    pooled: tuple[Pooled, ...] = ()            # claims read over several settings' seeds


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

