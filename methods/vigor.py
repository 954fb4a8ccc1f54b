"""VIGOR (its abstract was read): variance-guided rollout allocation, at the fixed allocation's
budget.

    python train.py --preset vigor          # 2 completions each, then more where they inform most

It fills the allocate slot (`Vigor`, `--allocation vigor`): in place of `group_size` completions
of every prompt, `vigor_generate` gives every prompt `--vigor-n-init` and the rest of the budget,
in rounds, to the prompts whose credits vary most (its docstring has the reading and its
choices); the spine then scores the variable-size groups as they come, and with `--vigor-weight
prompt` each rollout's advantage is scaled by `prompt_weights`.

The variance is of each completion's credit c in [0, 1] (train.credit, the spine's step):
the 0/1 verdict, or (v + share) / 2 under --reward partial. The reward is wrong + (right - wrong)
c, an affine map, so ranking by c is ranking by the trained reward's verdict term; a format term
and other methods' reward terms are not in the ranking.

The readings behind flags (--vigor-rank, --vigor-prior, --vigor-weight, screening more prompts
at the same --vigor-budget) and what the dev split chose among them: docs/methods.md.
vigor_generate's own defaults (variance, prior 0) are the first reading, kept for its tests.
"""
import collections
import functools
import heapq
from dataclasses import dataclass
from typing import Literal

import torch

from data import Prompt
from metrics import Metrics
from rollout import Rollout

ALLOCATIONS = ("fixed", "vigor")
RANKS = ("variance", "marginal", "topk")
WEIGHTS = ("rollout", "prompt")


@dataclass(frozen=True)
class Flags:
    # ---- VIGOR -----------------------------------------------------------------------------------
    allocation: Literal[ALLOCATIONS] = "fixed"
    """completions per prompt: fixed (group_size each) | vigor (variance-guided at the same budget:
    --vigor-*)"""
    vigor_n_init: int = 2
    """VIGOR: completions every prompt starts with"""
    vigor_n_step: int = 2
    """VIGOR: completions added to each chosen prompt per round"""
    vigor_top: int = 16
    """VIGOR: per round, --vigor-rank variance: the prompts (per rank) of highest reward variance
    that get --vigor-n-step more each; marginal: top x n_step completions, one by one to the
    largest gain"""
    vigor_rank: Literal[RANKS] = "marginal"
    """VIGOR: variance (the top prompts by reward variance) | marginal (the largest drop in sum_q
    sigma_q^2 / n_q per completion: Neyman allocation, n_q ∝ sigma_q) | topk (one round: prompts
    in order of sigma_q^2 each brought to --vigor-full completions until the budget is spent, the
    rest keep --vigor-n-init); --preset vigor takes the arith dev split's choice, topk with
    --vigor-prior 0.25 (bench/results/vigor)"""
    vigor_prior: float = 1.0
    """VIGOR: a Beta(a, a) prior on each prompt's success rate, so 2 agreeing completions are not a
    verdict of variance 0 (0 = the empirical rate, the first reading); a weak prior (0.1 to 0.5)
    leaves a prompt with 0 right of n a variance a (n + a) / (n + 2a)^2 (0.043 at a = 0.1, n = 2,
    against 3/16 at a = 1): the budget concentrates on the prompts with signal"""
    vigor_full: int = 0
    """VIGOR: with --vigor-rank topk, the completions a chosen prompt gets in all (0 = twice the
    mean, 2 x budget / prompts, rounded down; at least budget / prompts, rounded up)"""
    vigor_weight: Literal[WEIGHTS] = "rollout"
    """VIGOR: rollout (a prompt weighs as many rollouts as it got) | prompt (advantages x n_mean /
    n_q: every prompt's group weighs as one prompt)"""
    vigor_budget: int = 0
    """VIGOR: completions per step over all ranks (0 = prompts_per_step x group_size, the fixed
    allocation's)"""

    AT_LEAST_1 = ("vigor_n_init", "vigor_n_step", "vigor_top")
    AT_LEAST_0 = ("vigor_budget", "vigor_prior", "vigor_full")

    def rules(self) -> list[tuple[bool, str]]:
        vigor = self.allocation == "vigor"
        return [(vigor and self.vigor_n_init < 2,
                 "--vigor-n-init must be >= 2 (a group needs a baseline)"),
                (vigor and self.vigor_rank == "topk" and 0 < self.vigor_full <= self.vigor_n_init,
                 "--vigor-full must exceed --vigor-n-init (or be 0): a chosen prompt must get "
                 "more than every prompt's first completions")]

    def budget(self, prompts_per_step: int, group_size: int) -> int:
        """Completions per step over all ranks: --vigor-budget, or the fixed allocation's."""
        return self.vigor_budget or prompts_per_step * group_size

    def completions(self, prompts_per_step: int, group_size: int) -> int:
        """The step's completions over all ranks when VIGOR allocates them, else 0
        (memory.sizes)."""
        return self.budget(prompts_per_step, group_size) if self.allocation == "vigor" else 0


PRESETS = {
    "vigor": ("VIGOR (abstract only): variance-guided rollout allocation at the fixed "
              "allocation's budget (top-k, Beta(0.25) prior), no replay; lr 1e-4",
              dict(replay="none", allocation="vigor", vigor_n_init=2, vigor_n_step=2,
                   vigor_top=16, vigor_rank="topk", vigor_prior=0.25, vigor_weight="rollout",
                   lr=1e-4)),
}


class Vigor:
    """The allocate slot: VIGOR's completions of this rank's next `per_rank` prompts, graded and
    credited by the spine's steps, scored by its score, then, with --vigor-weight prompt, their
    advantages scaled by prompt_weights."""

    def __init__(self, flags: Flags, run, steps):
        self.f, self.run, self.steps = flags, run, steps

    def allocate(self, prompts: list, mine: list[int], pos: int, *, step: int):
        """1. and 2. for this rank's prompts `mine[pos:]` (wrapping around). Returns (fresh, every
        generated rollout, new pos, the rounds' numbers): the same rollouts twice."""
        f, run, steps = self.f, self.run, self.steps
        metrics = Metrics()
        batch = [prompts[mine[(pos + i) % len(mine)]] for i in range(run.per_rank)]
        new, _ = vigor_generate(run.engine, batch, lambda k: steps.sampling(run, step, k), step,
                                lambda rs: steps.grade(run, rs),
                                credit=lambda rs: steps.credit(rs, run.settings.reward),
                                n_init=f.vigor_n_init, n_step=f.vigor_n_step, top=f.vigor_top,
                                budget=run.completions, rank=f.vigor_rank, prior=f.vigor_prior,
                                full=f.vigor_full, metrics=metrics)
        steps.score(run, new)
        if f.vigor_weight == "prompt":
            adv = torch.tensor([r.advantage for r in new]) * torch.tensor(prompt_weights(new))
            for r, a in zip(new, adv.tolist()):
                r.advantage = a
        return new, new, pos + run.per_rank, metrics


def make(flags: Flags, run, steps) -> dict:
    if flags.allocation != "vigor":
        return {}
    if run.completions < flags.vigor_n_init * run.per_rank:
        raise ValueError("--vigor-budget must cover --vigor-n-init completions of every prompt")
    return {"allocate": Vigor(flags, run, steps)}


def smoothed_variance(rollouts: list[Rollout], credits: list[float],
                      prior: float) -> tuple[dict, dict]:
    """({prompt_id: n_q}, {prompt_id: sigma_q^2}): the variance of each prompt's credits c_i (in
    [0, 1]; credits[i] is rollouts[i]'s, train.credit's), smoothed by a = prior pseudo-credits
    at 0 and a at 1: the population variance of its n_q credits and those 2a,

        m_q  = (sum_i c_i + a) / (n_q + 2a),   m2_q = (sum_i c_i^2 + a) / (n_q + 2a)
        sigma_q^2 = m_q (1 - m_q) - (m_q - m2_q)                 (= m2_q - m_q^2)

    and sigma_q^2 = 0 exactly where a = 0 and the n_q credits are all equal (not left to rounding:
    past 32 equal float32 credits the two terms can differ by about 1e-17). On 0/1 verdicts (the
    credit under --reward correct) c^2 = c, so m2_q = m_q and sigma_q^2 = p_q (1 - p_q) to the last
    bit, with p_q = m_q = (s_q + a) / (n_q + 2a) the mean of a Beta(a, a) posterior after s_q right
    of n_q: 0 right of 2 with prior 1 is p = 1/4, sigma^2 = 3/16, not a verdict of 0; prior 0 is the
    empirical p (1 - p). The prior sets how far a hopeless prompt (0 right of n: p = a / (n + 2a),
    sigma^2 = a (n + a) / (n + 2a)^2) trails one at p = 1/2 (sigma^2 = 1/4), by the factor
    (n + 2a)^2 / (4 a (n + a)): 4/3 at a = 1, n = 2; 1.8 at a = 0.5; 5.8 at a = 0.1. Under --reward
    partial, 2 wrong with credits 1/8 and 3/8 (shares 1/4, 3/4) have sigma^2 = 5/64 - 1/16 = 1/64
    at prior 0, where their verdicts' is 0; with a prior the pseudo-credits can outweigh that
    spread: at a = 0.25 the two have 0.0725, a hopeless prompt's 0 and 0 have 0.09."""
    n, s, s2 = collections.Counter(), collections.Counter(), collections.Counter()
    values = collections.defaultdict(set)
    for r, c in zip(rollouts, credits, strict=True):
        n[r.prompt_id] += 1
        s[r.prompt_id] += c
        s2[r.prompt_id] += c * c
        values[r.prompt_id].add(c)
    var = {}
    for q in n:
        m = (s[q] + prior) / (n[q] + 2 * prior)
        m2 = (s2[q] + prior) / (n[q] + 2 * prior)
        # m2 - m^2, written so that on 0/1 credits (m2 = m) it is p (1 - p) to the last bit
        var[q] = m * (1 - m) - (m - m2)
        if prior == 0 and len(values[q]) == 1:
            var[q] = 0.0                                      # all equal: no signal, exactly
    return dict(n), var


def by_variance(prompts, n, var, top: int, n_step: int, left: int) -> list[Prompt]:
    """--vigor-rank variance: the `top` prompts of highest sigma^2 (> 0 only; ties: prompt order)
    get n_step more each, the last one cut to fit `left`."""
    ranked = sorted((p for p in prompts if var[p.prompt_id] > 0), key=lambda p: -var[p.prompt_id])
    extra = []
    for p in ranked[:top]:
        extra += [p] * min(n_step, left - len(extra))
        if len(extra) == left:
            break
    return extra


def by_marginal_gain(prompts, n, var, top: int, n_step: int, left: int) -> list[Prompt]:
    """--vigor-rank marginal: the round's min(top x n_step, left) completions one at a time, each to
    the prompt whose next completion most reduces sum_q sigma_q^2 / n_q (the variance of the batch's
    per-prompt mean estimates):

        gain_q = sigma_q^2 / n_q - sigma_q^2 / (n_q + 1) = sigma_q^2 / (n_q (n_q + 1))

    with n_q counting the completions already given in this round (sigma_q^2 stays as it is until
    they are graded). Greedy on this separable convex objective is its optimum for the round, and
    the optimum of sum sigma^2 / n at a fixed total is Neyman's n_q ∝ sigma_q. A prompt may get
    several in one round; gain 0 (sigma^2 = 0, only without a prior) gets none. Ties: prompt
    order."""
    heap = [(-var[p.prompt_id] / (n[p.prompt_id] * (n[p.prompt_id] + 1)), i, n[p.prompt_id])
            for i, p in enumerate(prompts)]
    heapq.heapify(heap)
    chosen = []
    while len(chosen) < min(top * n_step, left) and heap and heap[0][0] < 0:
        _, i, count = heapq.heappop(heap)
        chosen.append(i)
        q = prompts[i].prompt_id
        heapq.heappush(heap, (-var[q] / ((count + 1) * (count + 2)), i, count + 1))
    return [prompts[i] for i in sorted(chosen)]      # one engine call, grouped by prompt


def by_top_k(prompts, n, var, full: int, left: int) -> list[Prompt]:
    """--vigor-rank topk: the prompts in order of sigma_q^2 (highest first, every prompt, 0
    included; ties: prompt order), each brought up to `full` completions,

        extra_q = min(max(full - n_q, 0), left - (the extras of the prompts ranked above q))

    so the first k prompts get full - n_q each, the next one the rest of `left` (cut to fit), and
    the others none: they keep what they have (n_init, the floor). Returned grouped by prompt, in
    prompt order (one engine call)."""
    ranked = sorted(range(len(prompts)), key=lambda i: -var[prompts[i].prompt_id])
    extra, given = {}, 0
    for i in ranked:
        extra[i] = min(max(full - n[prompts[i].prompt_id], 0), left - given)
        given += extra[i]
    return [prompts[i] for i in sorted(extra) for _ in range(extra[i])]


def prompt_weights(rollouts: list[Rollout]) -> list[float]:
    """--vigor-weight prompt: each rollout's weight n_mean / n_q (n_q its prompt's group size,
    n_mean the mean group size), so every prompt's rollouts weigh n_mean in all, as a fixed group
    does, whatever its size; the weights sum to the number of rollouts. Vigor.allocate multiplies
    the advantages by them once the spine has scored the rollouts (--vigor-weight rollout: all 1, a
    prompt weighs as many rollouts as it got)."""
    count = collections.Counter(r.prompt_id for r in rollouts)
    mean = len(rollouts) / len(count)
    return [mean / count[r.prompt_id] for r in rollouts]


def allocator(rank: str, *, top: int, n_step: int, full: int, budget: int, n_prompts: int):
    """--vigor-rank's round, (prompts, n, var, left=...) -> the round's extra prompts: by_variance
    or by_marginal_gain (top, n_step), or by_top_k bringing each chosen prompt to

        N = max(full or 2 budget // P, ceil(budget / P))      (P = n_prompts)

    (--vigor-full, 0 = twice the mean group size; N >= budget / P, so N P >= budget: the budget
    can always be spent)."""
    if rank not in RANKS:
        raise ValueError(f"VIGOR: rank must be one of {', '.join(RANKS)}, got {rank!r}")
    if rank == "topk":
        return functools.partial(by_top_k, full=max(full or 2 * budget // n_prompts,
                                                    -(-budget // n_prompts)))
    by_rank = by_variance if rank == "variance" else by_marginal_gain
    return functools.partial(by_rank, top=top, n_step=n_step)


# how vigor_generate's numbers combine over ranks (metrics.Metrics.add): the extremes of the group
# sizes, the rest means over the prompts
COMBINE = {"vigor/group_size_min": "min", "vigor/group_size_max": "max",
           "vigor/rounds": "mean prompts", "vigor/group_size_mean": "mean prompts",
           "vigor/zero_std_frac_before": "mean prompts"}


def vigor_generate(engine, prompts: list[Prompt], sampling_for, version: int, grade, *, credit,
                   n_init: int, n_step: int, top: int, budget: int, rank: str = "variance",
                   prior: float = 0.0, full: int = 0, metrics=None) -> tuple[list[Rollout], dict]:
    """VIGOR's variance-guided allocation. The paper was not available; this is the reading of its
    abstract ("begins with a small number of rollouts for all examples in a batch and iteratively
    allocates additional rollouts to those with the highest group reward variance until a fixed
    total rollout budget is reached"):

        round 0:  every prompt gets n_init completions;
        round k:  with sigma_q^2 the variance of each prompt's credits so far (smoothed_variance:
                  `prior` pseudo-credits at 0 and at 1; prior 0 = the empirical variance),
                  --vigor-rank variance: the `top` prompts of highest sigma^2 (> 0 only) get
                  n_step more each (by_variance); marginal: top x n_step completions go one by one
                  to the largest gain in sum_q sigma_q^2 / n_q (by_marginal_gain); topk: the
                  prompts in order of sigma^2 each brought to N completions (by_top_k; N:
                  `allocator`), all that is left in this one round; in one engine call; the last
                  round is cut to fit, so exactly `budget` completions are generated in all (fewer
                  only when every sigma^2 is 0 under variance or marginal, possible only with
                  prior 0). Every prompt keeps its n_init: none is starved.

    The readings and the defaults: the module docstring. `sampling_for(k)` is round k's Sampling
    (its own seed). Each round's new rollouts are graded, `grade(rollouts)` (r.correct), then
    credited, `credit(rollouts)` -> [B] (train.credit, from r.correct, r.text, r.answer): the
    variance is of those credits, and so is vigor/zero_std_frac_before (the share of prompts whose
    n_init credits are all equal). A prompt's completions keep its prompt_id: its variable-size
    group is one GRPO group. Returns (rollouts grouped by prompt in prompt order, stats), also
    reported to `metrics` (a metrics.Metrics) if given, each as COMBINE says."""
    allocate = allocator(rank, top=top, n_step=n_step, full=full, budget=budget,
                         n_prompts=len(prompts))
    if budget < n_init * len(prompts):
        raise ValueError(f"VIGOR: budget {budget} < n_init {n_init} x {len(prompts)} prompts")
    out = engine.generate(prompts, n_init, sampling_for(0), version=version)
    grade(out)
    credits = credit(out).tolist()                          # credits[i] is out[i]'s
    zero_before = sum(v == 0 for v in smoothed_variance(out, credits, 0.0)[1].values())
    rounds = 0
    while len(out) < budget:
        n, var = smoothed_variance(out, credits, prior)
        extra = allocate(prompts, n, var, left=budget - len(out))
        if not extra:
            break
        rounds += 1
        new = engine.generate(extra, 1, sampling_for(rounds), version=version)
        grade(new)
        out += new
        credits += credit(new).tolist()
    order = {p.prompt_id: i for i, p in enumerate(prompts)}
    # stable: each group's completions in generation order
    out.sort(key=lambda r: order[r.prompt_id])
    count = collections.Counter(r.prompt_id for r in out)
    sizes = [count[p.prompt_id] for p in prompts]
    stats = {"vigor/group_size_min": min(sizes), "vigor/group_size_max": max(sizes),
             "vigor/rounds": rounds, "vigor/group_size_mean": sum(sizes) / len(sizes),
             "vigor/zero_std_frac_before": zero_before / len(prompts)}
    if metrics is not None:
        metrics.add(COMBINE, stats, prompts=len(prompts))
    return out, stats
