"""VIGOR: variance-guided rollout allocation, at the fixed allocation's budget.

    python train.py --preset vigor          # 2 completions each, then 2 more to the 16 most varied

The reading of the paper and its choices are `vigor_generate`'s docstring; the loop calls it in
place of one `engine.generate(prompts, group_size, ...)` (train.generate), and everything after it
(scoring, advantages of variable-size groups, the normaliser, replay) takes its groups as they come.
"""
import collections

from rollout import Prompt, Rollout

ALLOCATIONS = ("fixed", "vigor")


def group_variance(rollouts: list[Rollout]) -> dict[int, float]:
    """{prompt_id: population variance of its rollouts' verdicts} (for 0/1 verdicts p(1 - p))."""
    by_prompt: dict[int, list[float]] = {}
    for r in rollouts:
        by_prompt.setdefault(r.prompt_id, []).append(r.correct)
    return {pid: sum((x - sum(rs) / len(rs)) ** 2 for x in rs) / len(rs)
            for pid, rs in by_prompt.items()}


def vigor_generate(engine, prompts: list[Prompt], sampling_for, version: int, grade, *, n_init: int,
                   n_step: int, top: int, budget: int, metrics=None) -> tuple[list[Rollout], dict]:
    """VIGOR's variance-guided allocation. The paper was not available; this is the reading of its
    abstract ("begins with a small number of rollouts for all examples in a batch and iteratively
    allocates additional rollouts to those with the highest group reward variance until a fixed
    total rollout budget is reached"):

        round 0:  every prompt gets n_init completions;
        round k:  the `top` prompts with the highest reward variance (population variance of their
                  group so far, > 0 only: a prompt whose completions all agree gets no more) get
                  n_step more each, in one engine call; the last round is cut to fit, so exactly
                  `budget` completions are generated in all (fewer only when every prompt's variance
                  is 0: nothing is left to learn from them this step).

    `sampling_for(k)` is round k's Sampling (its own seed); `grade(rollouts)` sets each one's
    r.correct (the variance is of those verdicts). A prompt's completions keep its prompt_id, so its
    whole variable-size group is one GRPO group. Returns (rollouts grouped by prompt in prompt
    order, stats); with `metrics` (a metrics.Metrics) the stats are also reported there, each with
    how it combines over ranks."""
    if budget < n_init * len(prompts):
        raise ValueError(f"VIGOR: budget {budget} < n_init {n_init} x {len(prompts)} prompts")
    out = engine.generate(prompts, n_init, sampling_for(0), version=version)
    grade(out)
    zero_before = sum(v == 0 for v in group_variance(out).values()) / len(prompts)
    rounds = 0
    while len(out) < budget:
        var = group_variance(out)
        with_variance = (p for p in prompts if var[p.prompt_id] > 0)
        ranked = sorted(with_variance, key=lambda p: -var[p.prompt_id])[:top]
        if not ranked:
            break
        left, extra = budget - len(out), []
        # n_step each, highest variance first, the last one cut
        for p in ranked:
            extra += [p] * min(n_step, left - len(extra))
            if len(extra) == left:
                break
        rounds += 1
        new = engine.generate(extra, 1, sampling_for(rounds), version=version)
        grade(new)
        out += new
    order = {p.prompt_id: i for i, p in enumerate(prompts)}
    # stable: each group's completions in generation order
    out.sort(key=lambda r: order[r.prompt_id])
    count = collections.Counter(r.prompt_id for r in out)
    sizes = [count[p.prompt_id] for p in prompts]
    stats = {"vigor/rounds": rounds, "vigor/group_size_min": min(sizes),
             "vigor/group_size_max": max(sizes), "vigor/group_size_mean": sum(sizes) / len(sizes),
             "vigor/zero_std_frac_before": zero_before}
    if metrics is not None:
        metrics.min("vigor/group_size_min", stats["vigor/group_size_min"])
        metrics.max("vigor/group_size_max", stats["vigor/group_size_max"])
        for key in ("vigor/rounds", "vigor/group_size_mean", "vigor/zero_std_frac_before"):
            metrics.mean(key, stats[key], len(prompts))
    return out, stats
