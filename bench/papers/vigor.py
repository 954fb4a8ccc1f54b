"""VIGOR's settings (variance-guided rollout allocation; abstract only): its readings against a
fixed G = 8 at the same rollouts per step, on arith, the long task and the difficulty spread."""
from design import (ARITH, DIAG, MIXED, PARTIAL, QUICK_PROMPTS, STEPS, STEPS_EVAL, Arm, Claim,
                    Experiment, Setting, sized)


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
    # reallocated: on average over the steps the largest group is above 8, the fixed arm's even
    # share (budget / prompts), as registered before the runs. The reading that screens twice the
    # prompts has an even share of 4 and cannot pass "> 8" however it reallocates; its "> 4"
    # reading was defined after the long task's runs (2026-12-04), so it is shown beside the
    # registered gate, labelled post hoc, and never decides the verdict.
    acted = ("vigor/group_size_max", "mean > 8")
    claims = (Claim("vigor (first reading)", 1, acted=acted),
              *(Claim(n, 1, acted=acted, headline=True,
                      post_hoc=("vigor/group_size_max", "mean > 4") if n == readings[3] else None)
                for n in readings))
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
