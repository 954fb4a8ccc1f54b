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
   one is reported (choose_reading).
3. **Report.** The arm at its chosen lr with fresh seeds REPORT_SEEDS, evaluated on the test split
   only. Then EXTRA_SEEDS for every arm whose final accuracy is within 2 standard errors of the
   baseline's (and for the baseline): at least 5 seeds where arms are within the noise.

Outputs in OUT/<setting>/ (OUT = bench/results/NAME by default; one setting per task an
experiment runs on): results.md (the table:
final test accuracy mean ± std over seeds, the difference to the baseline with its standard error,
x to a target and its ratio to the baseline, completion length at the start and the end, the
diagnostics), sweep.md (every arm x lr: final dev accuracy per seed, the chosen one marked),
accuracy.png (test accuracy against the setting's x-axis and wall time: mean over seeds, band
min..max), sweep.png and summary.json; OUT/README.md collects the experiment's claim, what it
holds equal and every setting's table. The runs go to RUNS/<setting>/{sweep,report}/ARM/lr-LR/
seed-S/ (RUNS = runs/experiments/NAME by default, OUT/runs with --out); a run keeps its run.log,
argv.json, metrics.jsonl, updates.jsonl and samples.jsonl (its checkpoints are deleted once it is
done). Runs are `python train.py ...` in subprocesses (in-process `train.main` under --quick); a
finished run (its `done` file) is reused when its recorded flags are the same.
"""
import contextlib
import json
import math
import shutil
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from stats import mean_std  # noqa: E402  (bench/stats.py, shared with compare.py)

LR_GRID = (3e-4, 1e-4, 3e-5)
SWEEP_SEEDS = (0, 1)
REPORT_SEEDS = (100, 101, 102)
EXTRA_SEEDS = (103, 104)
QUICK_GRID = (3e-4, 3e-5)
EXTEND = 2                     # at most this many lrs past the grid's edge (past_edge)
QUICK_EVAL = 16               # --quick: dev and test prompts per eval


@dataclass(frozen=True)
class Arm:
    name: str
    flags: tuple[str, ...]     # train.py flags: a preset and what this arm sets


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
    min_seeds: int = 3                         # reported seeds at least (5: REPORT + EXTRA_SEEDS)


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
STEPS_QUICK = ("--max-new-tokens", "12")      # --quick: a smoke test of the pipeline, not the task
STEPS_EVAL = 300                              # the long task's evals: 48-token greedy chains
DIAG = (("ratio max", "ratio/max"), ("ratio min", "ratio/min"), ("clip frac", "loss/clip_frac"),
        ("KL to behaviour", "loss/ppo_kl"), ("entropy", "entropy"))


def replay(quick: bool) -> Experiment:
    steps, prompts, every = ("2", "4", "1") if quick else ("60", "32", "15")
    size = ("--steps", steps, "--prompts-per-step", prompts, "--eval-every", every)
    arms = (Arm("grpo (replay recipe)", ("--replay", "none")),
            Arm("naive-replay", ("--preset", "naive-replay")),
            Arm("rollout-replay", ("--preset", "rollout-replay")))
    diag = (("replayed/step", "replay/sampled"), ("replay age", "replay/age_mean"),
            ("|A| sampled", "replay/abs_adv_sampled"), *DIAG)
    return Experiment(
        "replay", "rollout-level advantage-prioritized replay (arXiv 2606.04560)",
        "replaying single rollouts drawn by |advantage| (evicted after tau_max steps) reaches "
        "plain GRPO's accuracy with fewer fresh rollouts than GRPO and than naive uniform replay; "
        "its metric: fresh rollouts to a target accuracy (our reading of the paper)",
        "fresh rollouts per step and steps (so fresh rollouts in all); the recipe (token-mean, "
        "clip 0.2/0.28, GRPO advantages); replayed rollouts come on top (ratio 0.5, tau_max 4)",
        (Setting("arith", ARITH + size, arms, "grpo (replay recipe)", "fresh",
                 diagnostics=diag),))


def dapo(quick: bool) -> Experiment:
    steps, prompts, every = ("2", "4", "1") if quick else ("60", "32", "15")
    size = ("--steps", steps, "--prompts-per-step", prompts, "--eval-every", every)
    arms = (Arm("grpo", ("--preset", "grpo")), Arm("dapo", ("--preset", "dapo")))
    diag = (("zero-std groups", "reward/zero_std_frac"), ("generated/step", "rollout/generated"),
            *DIAG)
    return Experiment(
        "dapo", "DAPO (arXiv 2503.14476)",
        "\"outperforming the previous SoTA DeepSeek-R1-Zero-Qwen-32B using 50% training steps\" "
        "(its Figure 1); its ablation adds clip-higher, the token-level loss, overlong shaping and "
        "dynamic sampling to naive GRPO, each adding AIME accuracy",
        "prompts per step and steps; every rollout generated counted on the x-axis (dynamic "
        "sampling regenerates up to 3 extra rounds to refill the batch)",
        (Setting("arith", ARITH + size, arms, "grpo", "fresh", diagnostics=diag),))


def mu_arms(u: int, m: int, group: int, veto_ablation: bool) -> tuple[Arm, ...]:
    """The arms of mu-GRPO's headline at U total updates of M rollouts: GRPO mu = 4 against mu =
    U/4 (4 stages), each stage generating mu x M rollouts."""
    big = u // 4

    def stages(mu: int) -> tuple[str, ...]:
        return ("--steps", str(u // mu), "--prompts-per-step", str(mu * m // group),
                "--mini-batches", str(mu), "--eval-every", str(max(1, u // mu // 4)))

    clip = ("--eps-low", "0.2", "--eps-high", "0.2")
    relaxed = ("--eps-low", "1", "--eps-high", "4")
    arms = [Arm("grpo mu=4", stages(4) + clip),
            Arm(f"naive mu={big}", stages(big) + clip),
            Arm(f"[0,5] no veto mu={big}", stages(big) + relaxed),
            Arm(f"mu-grpo mu={big}", ("--preset", "mu-grpo") + stages(big)),
            Arm(f"m2po mu={big}", ("--preset", "m2po") + stages(big))]
    if veto_ablation:
        for scope in ("trigger", "response"):
            arms.append(Arm(f"[0,5] veto {scope} mu={big}", stages(big) + relaxed + (
                "--veto-scope", scope, "--veto-threshold", "1e-4")))
    return tuple(arms)


def mu_grpo(quick: bool) -> Experiment:
    diag = (("veto frac", "loss/veto_frac"), ("m2po masked", "loss/m2po_masked_frac"), *DIAG)
    common = ("--replay", "none", "--agg", "token-mean", "--group-size", "8")
    u_a, m_a, u_s, m_s = (32, 8, 16, 8) if quick else (128, 128, 64, 32)
    steps = STEPS + common + (STEPS_QUICK if quick else ())
    return Experiment(
        "mu-grpo", "mu-GRPO (arXiv 2605.17570)",
        "\"under the same 4096-update training budget\", mu-GRPO at mu = 1024 updates per refresh "
        "(clip [0, 5] and the negative-advantage veto) keeps up with GRPO at mu = 4 with 256x "
        "fewer refreshes, where the relaxed clip without the veto collapses (our reading of its "
        "project page; naive GRPO and M2PO at mu = 1024 are its other baselines)",
        "total optimizer updates U, rollouts per update M, fresh rollouts U x M; mu = U/4 runs 4 "
        "stages (refreshes, weight syncs) of U/4 updates, GRPO mu = 4 runs U/4 of 4",
        (Setting("arith", ARITH + common, mu_arms(u_a, m_a, 8, False), "grpo mu=4", "updates",
                 diagnostics=diag),
         Setting("steps", steps, mu_arms(u_s, m_s, 8, True), "grpo mu=4", "updates",
                 diagnostics=diag, eval_size=STEPS_EVAL)),
        notes=f"arith: U = {u_a}, M = {m_a}; steps: U = {u_s}, M = {m_s}.")


def pnpo(quick: bool) -> Experiment:
    steps, prompts, every = ("2", "4", "1") if quick else ("24", "16", "8")
    common = STEPS + ("--steps", steps, "--prompts-per-step", prompts, "--eval-every", every,
                      "--replay", "none", "--agg", "seq-mean-token-mean", "--mini-batches", "1")
    common += STEPS_QUICK if quick else ()
    sweep = () if quick else ("--steps", "12", "--eval-every", "6")
    gspo_clip = ("--eps-low", "3e-4", "--eps-high", "4e-4")
    ppo_clip = ("--eps-low", "0.2", "--eps-high", "0.28")
    arms = []
    for epochs in ("1", "4"):
        e = ("--epochs", epochs)
        arms += [Arm(f"token e{epochs}", ("--ratio", "token") + ppo_clip + e),
                 Arm(f"gspo e{epochs}", ("--ratio", "gspo") + gspo_clip + e),
                 Arm(f"pnpo e{epochs} (gspo clip)", ("--ratio", "pnpo") + gspo_clip + e)]
    arms.append(Arm("pnpo e4 (0.2/0.28 clip)", ("--ratio", "pnpo") + ppo_clip + ("--epochs", "4")))
    diag = (("clip first", "loss/clip_frac_first"), ("clip middle", "loss/clip_frac_middle"),
            ("clip last", "loss/clip_frac_last"), *DIAG)
    return Experiment(
        "pnpo", "PNPO (arXiv 2608.01418)",
        "the prefix-normalised ratio beats GSPO when each batch is reused for 4 epochs and matches "
        "it at 1 epoch, on long-context math, Avg@32 (our reading of a summary of the paper; the "
        "comparison at 1 and 4 epochs is the paper's)",
        "fresh rollouts (prompts per step x steps), mini-batches (1), aggregation "
        "(seq-mean-token-mean); epochs 1 (on-policy: the three ratios give the same gradient) or 4",
        (Setting("steps", common, tuple(arms), "gspo e4", "fresh", sweep=sweep, diagnostics=diag,
                 eval_size=STEPS_EVAL),))


def vigor(quick: bool) -> Experiment:
    steps, prompts, every = ("2", "4", "1") if quick else ("60", "32", "15")
    budget = str(int(prompts) * 8)
    common = ARITH + ("--steps", steps, "--prompts-per-step", prompts, "--group-size", "8",
                      "--eval-every", every, "--replay", "none")
    first = ("--preset", "vigor", "--vigor-rank", "variance", "--vigor-prior", "0",
             "--vigor-weight", "rollout")
    marginal = ("--preset", "vigor", "--vigor-rank", "marginal", "--vigor-prior", "1")
    screen = ("--prompts-per-step", str(2 * int(prompts)), "--vigor-budget", budget)
    readings = ("vigor marginal+prior", "vigor marginal+prior, prompt weight",
                "vigor marginal+prior, prompt weight, 2x prompts")
    arms = (Arm("fixed G=8", ()),
            Arm("vigor (first reading)", first),
            Arm(readings[0], marginal + ("--vigor-weight", "rollout")),
            Arm(readings[1], marginal + ("--vigor-weight", "prompt")),
            Arm(readings[2], marginal + ("--vigor-weight", "prompt") + screen))
    diag = (("prompts with signal/step", "rollout/prompts_with_signal"),
            ("zero-var rollouts/step", "rollout/zero_var_rollouts"),
            ("largest group", "vigor/group_size_max"), *DIAG)
    return Experiment(
        "vigor", "VIGOR (variance-guided rollout allocation; abstract only)",
        "\"reaches target accuracy with up to 2.3x fewer rollouts on math\" by starting every "
        "prompt with a few rollouts and giving the rest of a fixed budget to those with the "
        "highest group reward variance",
        f"rollouts generated per step ({budget}: the fixed arm's prompts x 8) and steps; the "
        "recipe (token-mean, clip 0.2/0.28, GRPO advantages, no replay). The readings (rank by "
        "variance or by marginal gain in sum sigma^2/n, a Beta(1,1) prior, prompt weighting, "
        "screening twice the prompts at the same budget) are chosen among on dev",
        (Setting("arith", common, arms, "fixed G=8", "fresh", diagnostics=diag,
                 readings=(readings,)),),
        notes="x-axis: rollouts generated.")


def headroom_drift(quick: bool) -> Experiment:
    steps, prompts, every = ("3", "4", "1") if quick else ("60", "32", "15")
    common = ARITH + ("--steps", steps, "--prompts-per-step", prompts, "--eval-every", every,
                      "--tau-max", "4")
    # replayed groups per step: half the fresh groups, as the preset's 32 of 64 and naive replay's
    # ratio 0.5 (so both replay up to 0.5 x the fresh rollouts)
    hd = ("--preset", "headroom-drift", "--hd-groups", str(int(prompts) // 2))
    # the first reading's absolute gate 0.25 = 1.12 x the nearer clip bound -log(0.8) = 0.223
    readings = ("hd stored p(1-p), gate 1.12 (first reading)", "hd stored p(1-p), gate 0.5",
                "hd current p(1-p), gate 0.5")
    arms = (Arm("grpo (replay recipe)", ("--replay", "none")),
            Arm("naive-replay", ("--preset", "naive-replay")),
            Arm(readings[0], hd + ("--hd-headroom", "variance", "--hd-drift-frac", "1.12")),
            Arm(readings[1], hd + ("--hd-headroom", "variance", "--hd-drift-frac", "0.5")),
            Arm(readings[2], hd + ("--hd-headroom", "current", "--hd-drift-frac", "0.5")))
    k = "2" if quick else "8"
    mean_at_k = ("--eval-benchmarks", "builtin", "--eval-k", k, "--eval-temperature", "1.0")
    diag = (("replayed/step", "replay/sampled"), ("groups/step", "replay/groups"),
            ("gated frac", "replay/drift_gated_frac"), ("drift", "replay/drift_mean"),
            ("headroom", "replay/headroom_mean"),
            ("stored headroom", "replay/headroom_stored_mean"),
            ("replay age", "replay/age_mean"), *DIAG)
    return Experiment(
        "headroom-drift", "Headroom-Drift group replay (abstract only)",
        "\"Headroom ranks stored groups by remaining learning value, while Drift gates them by "
        "compatibility with the current policy. The fresh on-policy stream remains unchanged\"; "
        "it reports Avg Mean@32 against GRPO and naive replay",
        "the fresh stream (prompts per step x 8, steps) and the recipe (token-mean, clip "
        "0.2/0.28); replayed rollouts come on top, at most 0.5 x the fresh ones in every replay "
        "arm (naive: ratio 0.5; Headroom-Drift: half as many groups as fresh). The readings "
        "(headroom fixed at generation or re-scored by the current policy; the gate as a "
        "fraction of the clip range) are chosen among on dev; greedy test accuracy beside "
        f"mean@{k} at temperature 1",
        (Setting("arith", common, arms, "grpo (replay recipe)", "fresh", diagnostics=diag,
                 readings=(readings,), report_flags=mean_at_k,
                 finals=((f"mean@{k} T=1", f"eval/builtin/mean@{k}"),), min_seeds=5),),
        notes="5 seeds reported for every arm.")


def r2po_exp(quick: bool) -> Experiment:
    # R²PO: cycles of H head loop steps then P policy loop steps (official: about 20 then 20-40)
    h, p, cycles, prompts = (1, 1, 2, "4") if quick else (8, 10, 4, "32")
    loop, policy = (h + p) * cycles, p * cycles
    common = ARITH + ("--prompts-per-step", prompts, "--group-size", "8", "--replay", "none",
                      "--temperature", "0.9", "--reward", "correct+format", "--reward-wrong", "-1")

    def size(n):
        return ("--steps", str(n), "--eval-every", str(max(1, n // 4)))

    head_lrs = ("1e-3", "1e-4") if quick else ("1e-2", "1e-3", "1e-4")
    r2 = ("--preset", "r2po", "--r2po-schedule", f"{h},{p}", "--r2po-kl-anchor", "initial",
          "--r2po-kl-coef", "0.04")                     # the official code's values
    readings = tuple(f"r2po head lr {x}" for x in head_lrs)
    arms = (Arm(f"grpo {policy} steps (equal policy updates)", size(policy)),
            Arm(f"grpo {loop} steps (equal rollouts)", size(loop)),
            *(Arm(n, r2 + size(loop) + ("--r2po-head-lr", x)) for n, x in zip(readings, head_lrs)))
    band = 0.1
    diag = (("distinct answers", "rollout/distinct_answers"),
            ("format errors", "rollout/format_error"),
            ("head KL (current)", "r2po/head_kl_current"),
            ("head KL (initial)", "r2po/head_kl"), *DIAG)
    return Experiment(
        "r2po", "R²PO (arXiv 2601.11960; official code RRPO-ARR/Code)",
        "training rollouts sampled from a residual rollout head (base logits + a low-rank head on "
        "the last hidden state, trained for rare outcomes) explore more, and the deployed base "
        "policy, trained on them, ends more accurate than GRPO",
        f"the reward (correct ±1, format +1.25/-1: four outcome classes), temperature 0.9, G = 8, "
        f"prompts per step; R²PO runs {cycles} cycles of {h} head then {p} policy loop steps "
        f"({loop} steps, {policy} policy updates; head rollouts counted on the x-axis): against "
        f"GRPO at equal policy updates ({policy} steps) and at equal rollouts ({loop} steps). The "
        f"head lr is chosen on dev among {', '.join(head_lrs)} with the head's KL to the current "
        f"base (r2po/head_kl_current) at most {band:g} at every step",
        (Setting("arith", common, arms, f"grpo {loop} steps (equal rollouts)", "fresh",
                 diagnostics=diag, readings=(readings,), band=("r2po/head_kl_current", band)),),
        notes="The head's k3 KL: to the initial model, coefficient 0.04 (official); rank 64.")


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


def run_train(argv: list[str], run_dir: Path, *, threads: int, in_process: bool) -> Path:
    """One train.py run into run_dir (stdout in run.log, its flags in argv.json); skipped when
    run_dir/done exists and was made with the same flags (a changed arm runs again)."""
    recorded = run_dir / "argv.json"
    if (run_dir / "done").exists():
        if not recorded.exists() or json.loads(recorded.read_text()) == argv:
            return run_dir
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    recorded.write_text(json.dumps(argv))
    t0 = time.perf_counter()
    argv = [*argv, "--out-dir", str(run_dir), "--save-every", "0"]
    with open(run_dir / "run.log", "w") as log:
        if in_process:
            import train
            with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
                rc = train.main(argv)
        else:
            cmd = [sys.executable, str(ROOT / "train.py"), *argv, "--threads", str(threads)]
            rc = subprocess.run(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT).returncode
    if rc != 0:
        raise RuntimeError(f"train.py {' '.join(argv)} exited {rc}; see {run_dir / 'run.log'}")
    (run_dir / "done").write_text(f"{time.perf_counter() - t0:.1f} s\n")
    shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)     # the metrics are what is kept
    (run_dir / "final").unlink(missing_ok=True)
    return run_dir


def load(run_dir: Path, metric: str, keys: tuple[str, ...]) -> dict:
    """A run's curve [(step, fresh, updates, wall, accuracy)] and its aggregates: response length
    at the first and last step, time split, loop steps, and the mean over steps of each key."""
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
    last = {k: next((r[k] for r in reversed(rows) if k in r), None) for k in keys}
    return {"curve": curve, "final": curve[-1][4], "start": curve[0][4],
            "len_start": steps[0].get("response/len_mean"), "len_end":
            steps[-1].get("response/len_mean"), "refreshes": len(steps), "updates": updates,
            "fresh": fresh, "wall": wall, "gen": gen, "upd": upd, "means": means,
            "maxima": maxima, "last": last}


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


def past_edge(sweep: dict[float, list[float]]) -> float | None:
    """The next lr on the half-decade ladder (..., 1e-5, 3e-5, 1e-4, ...) beyond the swept ones
    when the chosen lr is the smallest or the largest swept, else None."""
    best = choose(sweep)
    if min(sweep) < best < max(sweep) or len(sweep) < 2:
        return None
    step = 1 / 3 if str(f"{best:.0e}").startswith("3") else 0.3
    lr = best * step if best == min(sweep) else best / (0.3 if step == 1 / 3 else 1 / 3)
    return float(f"{lr:.0e}")


def within_noise(a: list[float], b: list[float]) -> bool:
    """|mean a - mean b| < 2 standard errors of the difference (unequal variances)."""
    return abs(statistics.mean(a) - statistics.mean(b)) < 2 * se_diff(a, b)


def se_diff(a: list[float], b: list[float]) -> float:
    var = lambda x: statistics.variance(x) if len(x) > 1 else 0.0     # noqa: E731
    return math.sqrt(var(a) / len(a) + var(b) / len(b))


@dataclass
class Plan:
    """Where a setting's runs go and how they run."""
    out: Path                  # the runs' folders go here
    jobs: int
    threads: int
    quick: bool
    ran: list = field(default_factory=list)

    def run_all(self, runs: list[tuple[list[str], Path]]) -> None:
        def one(job):
            return run_train(job[0], job[1], threads=self.threads, in_process=self.quick)
        if self.quick or self.jobs <= 1:
            for job in runs:
                one(job)
        else:
            with ThreadPoolExecutor(self.jobs) as pool:
                list(pool.map(one, runs))
        self.ran += [d for _, d in runs]


def run_setting(s: Setting, plan: Plan) -> dict:
    """Sweep, choose, report (and extra seeds within the noise) for one setting; its summary."""
    grid = QUICK_GRID if plan.quick else LR_GRID
    sweep_seeds = SWEEP_SEEDS[:1] if plan.quick else SWEEP_SEEDS
    report_seeds = REPORT_SEEDS[:1] if plan.quick else REPORT_SEEDS
    dev = test = str(QUICK_EVAL if plan.quick else s.eval_size)
    base = plan.out / s.label

    def argv(arm, lr, seed, split):
        sizes = ("--dev-size", dev, "--eval-size", "0") if split == "dev" else (
            "--dev-size", "0", "--eval-size", test)
        extra = s.sweep if split == "dev" else s.report_flags
        return [*s.flags, *arm.flags, *extra, "--lr", f"{lr:g}", "--seed", str(seed), *sizes]

    def sweep_dir(arm, lr, seed):
        return run_dir(base, "sweep", arm.name, lr, seed)

    keys = tuple(k for _, k in s.diagnostics + s.finals) + ((s.band[0],) if s.band else ())
    sweep = {a.name: {} for a in s.arms}
    swept = {}                                             # (arm, lr) -> its sweep runs, loaded
    todo = [(a, lr) for a in s.arms for lr in grid]
    for _ in range(1 + (0 if plan.quick else EXTEND)):     # the grid, then past its edge
        plan.run_all([(argv(a, lr, sd, "dev"), sweep_dir(a, lr, sd))
                      for a, lr in todo for sd in sweep_seeds])
        for a, lr in todo:
            swept[a.name, lr] = [load(sweep_dir(a, lr, sd), "eval/dev_accuracy", keys)
                                 for sd in sweep_seeds]
            sweep[a.name][lr] = [r["final"] for r in swept[a.name, lr]]
        todo = [(a, lr) for a in s.arms if (lr := past_edge(sweep[a.name])) is not None]
    chosen = {a.name: choose(sweep[a.name]) for a in s.arms}
    band = {}                                # the band metric's max at each arm's chosen lr
    if s.band:
        band = {a.name: max((m for r in swept[a.name, chosen[a.name]]
                             if (m := r["maxima"][s.band[0]]) is not None), default=None)
                for a in s.arms}
    picked = {g: choose_reading(g, sweep, chosen, band, s.band and s.band[1]) for g in s.readings}
    dropped = {n for g in s.readings for n in g if n != picked[g]}
    arms = [a for a in s.arms if a.name not in dropped]

    def report_dir(arm, seed):
        return run_dir(base, "report", arm.name, chosen[arm.name], seed)

    first = list(report_seeds) + (list(EXTRA_SEEDS) if s.min_seeds > 3 and not plan.quick else [])
    seeds = {a.name: list(first) for a in arms}

    def report(names):
        plan.run_all([(argv(a, chosen[a.name], sd, "test"), report_dir(a, sd))
                      for a in arms if a.name in names for sd in seeds[a.name]])
        return {a.name: [load(report_dir(a, sd), "eval/accuracy", keys) for sd in seeds[a.name]]
                for a in arms}

    runs = report(set(seeds))
    finals = {name: [r["final"] for r in rs] for name, rs in runs.items()}
    close = [n for n in finals if n != s.baseline and within_noise(finals[n], finals[s.baseline])]
    if close and not plan.quick and s.min_seeds <= 3:
        for name in [*close, s.baseline]:
            seeds[name] += list(EXTRA_SEEDS)
        runs = report(set(close) | {s.baseline})
    return {"setting": s, "grid": grid, "sweep_seeds": sweep_seeds, "sweep": sweep,
            "chosen": chosen, "runs": runs, "picked": picked, "band": band}


# ---- the tables and plots ---------------------------------------------------------------------

TARGET_FRAC = 0.9


def to_target(runs: list[dict], target: float, x: str) -> tuple[float | None, float | None, int]:
    """(mean x, mean wall seconds, seeds reaching) at the first eval after step 0 >= target."""
    col = {"fresh": 1, "updates": 2}[x]
    hits = [next(((p[col], p[3]) for p in r["curve"] if p[0] > 0 and p[4] >= target), None)
            for r in runs]
    hits = [h for h in hits if h is not None]
    if not hits:
        return None, None, 0
    return statistics.mean(h[0] for h in hits), statistics.mean(h[1] for h in hits), len(hits)


def fmt(x, spec: str) -> str:
    return "—" if x is None else format(x, spec)


def table(summary: dict) -> str:
    """results.md of one setting."""
    s, runs, chosen = summary["setting"], summary["runs"], summary["chosen"]
    finals = {n: [r["final"] for r in rs] for n, rs in runs.items()}
    start = statistics.mean(r["start"] for rs in runs.values() for r in rs)
    base = statistics.mean(finals[s.baseline])
    target = start + TARGET_FRAC * (base - start) if base > start else None
    b_x, b_wall, _ = to_target(runs[s.baseline], target, s.x) if target else (None, None, 0)
    x_name = {"fresh": "fresh rollouts", "updates": "updates"}[s.x]
    head = (f"start (step 0, every run) {100 * start:.1f}%; target = start + {TARGET_FRAC:g} x "
            f"({s.baseline}'s gain) = {fmt(target and 100 * target, '.1f')}%")
    cols = ["arm", "lr", "seeds", "final test acc", f"Δ vs {s.baseline} ± SE", f"{x_name} to "
            "target", "ratio", "wall s to target", "ratio", "length start → end",
            "refreshes (= syncs)",
            "updates", "generate / update s", *(f"final {c}" for c, _ in s.finals),
            *(c for c, _ in s.diagnostics)]
    out = [head, "", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for a in (a for a in s.arms if a.name in runs):         # a reading not chosen is not reported
        rs, f = runs[a.name], finals[a.name]
        acc, std = mean_std(f)
        x, wall, n = to_target(rs, target, s.x) if target else (None, None, 0)
        diff = "—" if a.name == s.baseline else (
            f"{100 * (acc - base):+.1f} ± {100 * se_diff(f, finals[s.baseline]):.1f}")
        ratio = lambda v, b: fmt(v / b if v is not None and b else None, ".2f")   # noqa: E731
        avg = lambda key: statistics.mean(r[key] for r in rs if r[key] is not None) \
            if any(r[key] is not None for r in rs) else None                   # noqa: E731
        diag = [fmt(statistics.mean(r["means"][k] for r in rs) if all(
            r["means"][k] is not None for r in rs) else None, ".3g") for _, k in s.diagnostics]
        lasts = []
        for _, k in s.finals:
            vals = [r["last"][k] for r in rs if r["last"][k] is not None]
            lasts.append(f"{100 * mean_std(vals)[0]:.1f} ± {100 * mean_std(vals)[1]:.1f}"
                         if vals else "—")
        cells = [a.name, f"{chosen[a.name]:g}", str(len(rs)), f"{100 * acc:.1f} ± {100 * std:.1f}",
                 diff, f"{fmt(x, ',.0f')} ({n}/{len(rs)})", ratio(x, b_x), fmt(wall, ".1f"),
                 ratio(wall, b_wall), f"{fmt(avg('len_start'), '.1f')} → "
                 f"{fmt(avg('len_end'), '.1f')}", f"{avg('refreshes'):.0f}",
                 f"{avg('updates'):.0f}", f"{avg('gen'):.1f} / {avg('upd'):.1f}", *lasts, *diag]
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


def sweep_table(summary: dict) -> str:
    s = summary["setting"]
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
    return "\n".join(out) + "\n"


def plots(summary: dict, out: Path) -> bool:
    """accuracy.png and sweep.png; False without matplotlib."""
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
    return True


def write_setting(summary: dict, out: Path) -> str:
    out.mkdir(parents=True, exist_ok=True)
    s = summary["setting"]
    text = (f"## {s.label}\n\nCommon flags: `{' '.join(s.flags)}`"
            + (f"; sweep runs add `{' '.join(s.sweep)}`" if s.sweep else "") + "\n\n"
            + "\n".join(f"- {a.name}: `{' '.join(a.flags)}`" for a in s.arms) + "\n\n"
            + table(summary) + "\nThe sweep:\n\n" + sweep_table(summary))
    (out / "results.md").write_text(text)
    (out / "sweep.md").write_text(sweep_table(summary))
    data = {"chosen": summary["chosen"], "picked": {" | ".join(g): p for g, p in
                                                    summary["picked"].items()},
            "band": summary["band"], "sweep": {n: {str(k): v for k, v in d.items()}
                                                   for n, d in summary["sweep"].items()},
            "runs": summary["runs"]}
    (out / "summary.json").write_text(json.dumps(data, indent=1, default=str))
    plots(summary, out)
    return text


def run_experiment(name: str, out: Path, *, runs: Path, jobs: int = 1, threads: int = 1,
                   quick: bool = False) -> str:
    """Every setting of experiment `name`, its runs in RUNS; writes OUT and returns
    OUT/README.md's text."""
    exp = EXPERIMENTS[name](quick)
    plan = Plan(runs, jobs, threads, quick)
    t0 = time.perf_counter()
    parts = [write_setting(run_setting(s, plan), out / s.label) for s in exp.settings]
    took = sum(float((d / "done").read_text().split()[0]) for d in set(plan.ran))
    head = (f"# {exp.name}: {exp.paper}\n\n**Claim** (words in quotes are the paper's): "
            f"{exp.claim}\n\n**Held equal**: "
            f"{exp.held_equal}. {exp.notes}\n\n**Protocol**: bench/experiments.py's docstring "
            f"(lr grid {', '.join(f'{x:g}' for x in (QUICK_GRID if quick else LR_GRID))}, the "
            f"best mean final dev accuracy, ties to the larger lr, up to {EXTEND} more past an "
            f"edge; reported seeds fresh, test split).\n\n"
            f"`python bench/compare.py --experiment {name}"
            f"{' --quick' if quick else ''} --jobs {jobs}`: {len(set(plan.ran))} runs, "
            f"{took:.0f} s of runs ("
            + ("in-process, one at a time" if quick
               else f"{jobs} at a time, {threads} thread(s) each")
            + "), "
            f"{time.perf_counter() - t0:.0f} s this call.\n\n")
    text = head + "\n".join(parts)
    (out / "README.md").write_text(text)
    return text
