"""The allocation, bound once from its flags: who gets how many completions, how they are graded,
what they are worth. Steps 1 (generate) and 2 (score) of the loop.

    alloc = Allocation(flags, engine=engine, group_size=8, per_rank=64, sampling=Sampling(...),
                       seed_of=lambda step, round_: ..., grader=verify.grade,
                       form=verify.integer_form)
    fresh, generated, pos = alloc.generate_and_score(prompts, mine, pos, step=step, metrics=m)

- Who gets how many: a fixed `group_size` per prompt (one engine.generate), or VIGOR's
  variance-guided group sizes at the same budget (vigor.py, handed in as a `vigor.Vigor`; it ranks
  prompts by the variance of `credit`, which it is handed with the grader); DAPO's dynamic
  sampling drops the groups whose verdicts are all equal and refills the batch with up to
  `--dynamic-sampling-rounds` more rounds of new prompts.
- How they are graded: the task's grader and answer form (verify.grader, verify.format_rule of
  --train-data), resolved once in train.setup; each rollout's r.correct and r.formatted are set
  once, here.
- What they are worth: the shaped reward r.reward (`shaped_reward`: the verdict's term `credit`,
  the verdict or, with --reward partial, the long task's partial credit; the answer form's term;
  DAPO's soft overlong penalty), then one advantage r.advantage per rollout from its own group
  (grpo.ADVANTAGES, the GRPO group key grpo.group_ids), set once.
"""
from dataclasses import dataclass, replace
from typing import Literal

import torch

import grpo
import verify
from metrics import Metrics
from rollout import Sampling


# --reward: the verdict's term (correct: the 1/0 verdict; partial: its partial credit), then
# "+format": the answer form's term added
REWARDS = ("correct", "correct+format", "partial", "partial+format")


@dataclass(frozen=True)
class Flags:
    # ---- reward ----------------------------------------------------------------------------------
    reward: Literal[REWARDS] = "correct"
    """reward: correct (--reward-right / --reward-wrong by the verdict) | correct+format (plus
    --format-ok when the response is in the task's answer form, else --format-bad) | partial (the
    long task's partial credit: the verdict v replaced by (v + the share of the response's "="
    steps of the gold value) / 2, so 1 only for a right chain of right steps, at most 1/2 for a
    wrong answer) | partial+format (that plus the format term)"""
    reward_right: float = 1.0
    """reward of a correct response"""
    reward_wrong: float = 0.0
    """reward of a wrong response (R²PO's official reward: -1)"""
    format_ok: float = 1.25
    """--reward correct+format: added when the response is in the answer form (built-in tasks: a
    plain integer after the last '='; benchmarks: a \\boxed{}); R²PO's official 1.25"""
    format_bad: float = -1.0
    """--reward correct+format: added otherwise (R²PO's official -1)"""
    overlong_buffer: int = 0
    """DAPO soft overlong penalty: the last L_cache tokens before max_new_tokens are penalised (0 =
    off)"""
    reward_fn: str = ""
    """a reward of your own, path/to/file.py:name: fn(completion, gold_answer) -> float replaces
    the verdict's term (reward_fn.py has the contract; the accuracy stays the grader's)"""
    adv: Literal[tuple(grpo.ADVANTAGES)] = "grpo"
    """advantage: grpo ((r - mean) / (std + 1e-6)) | drgrpo (r - mean)"""
    # ---- allocation ------------------------------------------------------------------------------
    dynamic_sampling: bool = False
    """DAPO dynamic sampling: drop zero-variance groups from the fresh batch"""
    dynamic_sampling_rounds: int = 0
    """with dynamic sampling: up to this many extra generation rounds to refill the batch"""

    AT_LEAST_0 = ("overlong_buffer", "dynamic_sampling_rounds")


def grade(rollouts, grader=verify.grade, form=verify.integer_form) -> None:
    """The verdict of each rollout, r.correct (1.0 = right), by `grader`, and whether it is in the
    answer form, r.formatted, by `form` (the task's: verify.grader, verify.format_rule); set once,
    here."""
    for r in rollouts:
        r.correct = 1.0 if grader(r.text, r.answer) else 0.0
        r.formatted = form(r.text)


def credit(rollouts, flags: Flags) -> torch.Tensor:
    """c_i in [0, 1], the verdict's term of the reward [B]: the reward is wrong + (right - wrong) c
    (shaped_reward), and VIGOR ranks prompts by the variance of c (Allocation.generate hands this
    to it; the "+format" term and DAPO's overlong penalty are not in c), so the two read one rule:

        --reward correct, correct+format:   c = v,                v = r.correct (1 / 0)
        --reward partial, partial+format:   c = (v + share) / 2,  share = verify.step_share

    share = verify.step_share(r.text, r.answer), the share of the response's "=" steps whose value
    is the gold's. So c is 1 exactly when the verdict is right and every step keeps the value. A
    right answer scores c >= 1/2 (> 1/2 under the long task's grader, whose right final step keeps
    the value), a wrong one c = share / 2 <= 1/2: the grader's order is kept, and the partial
    credit orders the responses within each verdict. A chain of right steps left unreduced
    ("61-6-1=55-1": not the task's plain integer) gets 1/2, one wrong at step k of K that carries
    the error on (k - 1) / 2K, garbage and "" 0. Meant for the step-by-step task (builtin_steps),
    whose answers are "="-chains of integers; on a benchmark's \\boxed{} answers the share is
    mostly 0 and c = v / 2. A known weakness, not yet closed: a response that only restates the
    question keeps its value, so it scores 1/2 like a right chain left unreduced (the question is
    not at hand here to tell the two apart)."""
    c = torch.tensor([r.correct for r in rollouts])                                  # [B] v
    if flags.reward.startswith("partial"):
        share = torch.tensor([verify.step_share(r.text, r.answer) for r in rollouts])  # [B]
        c = (c + share) / 2
    return c


def shaped_reward(rollouts, flags: Flags, max_len: int, reward_fn=None) -> torch.Tensor:
    """r_i, the reward the advantage is computed from [B]:

        r = wrong + (right - wrong) c,   c = credit(rollouts, flags): v, or (v + share) / 2
        "+format" (correct+format, partial+format): + (ok if formatted else bad)
        then, with --overlong-buffer, + DAPO's soft overlong penalty (L_max = max_len)

    right, wrong, ok, bad = --reward-right, --reward-wrong, --format-ok, --format-bad (defaults 1,
    0, 1.25, -1: the verdict alone is 1 / 0; R²PO's official reward is right 1, wrong -1 with its
    format term, four outcome classes). --reward partial's credit (`credit`) replaces the
    verdict's term only: r.correct stays the grader's 1 / 0 (dynamic sampling and the samples'
    log read it; VIGOR ranks on c). The long task's VIGOR, Headroom-Drift and R²PO experiments
    (bench/results/) ran with --reward partial. `reward_fn` (--reward-fn, reward_fn.make: rollouts
    -> [float]) replaces the verdict's term, wrong + (right - wrong) c, by its values."""
    f = flags
    if reward_fn is not None:
        rewards = torch.tensor(reward_fn(rollouts), dtype=torch.float32)             # [B]
    else:
        rewards = credit(rollouts, f) * (f.reward_right - f.reward_wrong) + f.reward_wrong
    if f.reward.endswith("+format"):
        formatted = torch.tensor([r.formatted for r in rollouts])                    # [B]
        rewards = rewards + torch.where(formatted, f.format_ok, f.format_bad)
    if f.overlong_buffer:
        lengths = torch.tensor([len(r.completion_ids) for r in rollouts])
        rewards = rewards + grpo.overlong_penalty(lengths, max_len, f.overlong_buffer)
    return rewards


def score(rollouts, flags: Flags, *, max_len: int, vigor=None, reward_fn=None) -> torch.Tensor:
    """2. The shaped reward r.reward (shaped_reward; with `reward_fn`, --reward-fn's), then
    r.advantage within each group (VIGOR's --vigor-weight prompt: weighed by `vigor.weigh`).
    Returns the verdicts [B]: DAPO's dynamic sampling filters on them, not on the shaped reward."""
    rewards = shaped_reward(rollouts, flags, max_len, reward_fn)
    adv = grpo.ADVANTAGES[flags.adv](rewards, grpo.group_ids(rollouts))             # [B]
    if vigor is not None:
        adv = vigor.weigh(adv, rollouts)
    for r, reward, a in zip(rollouts, rewards.tolist(), adv.tolist()):
        r.reward = reward
        r.advantage = a
    return torch.tensor([r.correct for r in rollouts])


class Allocation:
    """Steps 1 and 2 of one run on one rank. `per_rank`: the prompts this rank generates groups
    for each step; `sampling`: the engine's settings (its seed is set per round from `seed_of(step,
    round_)`); `vigor`: a vigor.Vigor, or None for fixed groups; `reward_fn`: --reward-fn's
    rewards (reward_fn.make), or None."""

    def __init__(self, flags: Flags, *, engine, group_size: int, per_rank: int,
                 sampling: Sampling, seed_of, grader, form, vigor=None, reward_fn=None):
        self.f = flags
        self.engine = engine
        self.group_size = group_size
        self.per_rank = per_rank
        self.sampling = sampling
        self.seed_of = seed_of
        self.grader, self.form = grader, form
        self.vigor = vigor
        self.reward_fn = reward_fn

    def grade(self, rollouts) -> None:
        grade(rollouts, self.grader, self.form)

    def credit(self, rollouts) -> torch.Tensor:
        return credit(rollouts, self.f)

    def generate(self, prompts: list, *, step: int, round_: int, metrics: Metrics) -> list:
        """1. `group_size` completions per prompt, or VIGOR's group sizes (its rounds seeded
        round_ + 1, ...; its numbers go to `metrics`), each graded once; VIGOR ranks its prompts
        by the variance of `credit`, the verdict's term of the reward `score` trains on."""
        def sampling_for(k: int) -> Sampling:
            return replace(self.sampling, seed=self.seed_of(step, round_ + k))

        if self.vigor is not None:
            return self.vigor.generate(self.engine, prompts, sampling_for, step, self.grade,
                                       self.credit, metrics)
        new = self.engine.generate(prompts, self.group_size, sampling_for(0), version=step)
        self.grade(new)
        return new

    def generate_and_score(self, prompts: list, mine: list[int], pos: int, *, step: int,
                           metrics: Metrics):
        """1. generate and 2. score this rank's `per_rank` prompts (`mine[pos:]`, wrapping
        around), with DAPO's extra rounds when dynamic sampling drops groups. Returns (fresh, every
        generated rollout, new pos)."""
        fresh, generated = [], []
        rounds = 1 + (self.f.dynamic_sampling_rounds if self.f.dynamic_sampling else 0)
        for round_ in range(rounds):
            need = self.per_rank - len({r.prompt_id for r in fresh})
            batch_prompts = [prompts[mine[(pos + i) % len(mine)]] for i in range(need)]
            pos += need
            new = self.generate(batch_prompts, step=step, round_=round_, metrics=metrics)
            correct = score(new, self.f, max_len=self.sampling.max_new_tokens, vigor=self.vigor,
                            reward_fn=self.reward_fn)
            generated += new
            if self.f.dynamic_sampling:
                # DAPO: drop all-correct and all-wrong groups, by the verdicts (not the rewards)
                keep = grpo.dynamic_sampling_keep(correct, grpo.group_ids(new)).tolist()
                new = [r for r, k in zip(new, keep) if k]
            fresh += new
            if len({r.prompt_id for r in fresh}) >= self.per_rank:
                break
        return fresh, generated, pos
