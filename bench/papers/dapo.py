"""DAPO's setting (arXiv 2503.14476): DAPO against GRPO at equal prompts and steps, every rollout
generated counted, and GRPO at DAPO's 16 updates a step as a control."""
from design import ARITH, DIAG, QUICK_PROMPTS, Arm, Claim, Experiment, Setting, sized


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
