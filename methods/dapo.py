"""DAPO (Yu et al., arXiv 2503.14476): four changes to GRPO, of which the spine has two
(clip-higher: --eps-high 0.28; the token-level loss: --agg token-mean) and this file the other
two: dynamic sampling and overlong reward shaping.

    python train.py --preset dapo       # + 16 updates a step, 3 refill rounds, L_cache 2

- Dynamic sampling (`--dynamic-sampling`): the groups whose verdicts are all equal carry no signal
  and are dropped; up to `--dynamic-sampling-rounds` more rounds of new prompts refill the batch
  (`Refill.allocate`, in place of the spine's one round of fixed groups).
- Soft overlong punishment (`--overlong-buffer L_cache`): a term added to the reward of a response
  in the last L_cache tokens before --max-new-tokens (`overlong_penalty`, the reward slot).
- Overlong filtering (`--overlong-filter`): a truncated response has no loss tokens and is not
  stored for replay (`OverlongFilter`).
"""
from dataclasses import dataclass

import torch
from torch import Tensor

import grpo
from metrics import Metrics


@dataclass(frozen=True)
class Flags:
    # ---- DAPO ------------------------------------------------------------------------------------
    dynamic_sampling: bool = False
    """DAPO dynamic sampling: drop zero-variance groups from the fresh batch"""
    dynamic_sampling_rounds: int = 0
    """with dynamic sampling: up to this many extra generation rounds to refill the batch"""
    overlong_buffer: int = 0
    """DAPO soft overlong penalty: the last L_cache tokens before max_new_tokens are penalised (0 =
    off)"""
    overlong_filter: bool = False
    """DAPO overlong filtering: truncated responses get no loss (and are not stored for replay)"""

    AT_LEAST_0 = ("overlong_buffer", "dynamic_sampling_rounds")


PRESETS = {
    "dapo": ("DAPO (arXiv 2503.14476): clip-higher 0.2/0.28, token mean, dynamic sampling, "
             "overlong shaping and filter, 16 updates per step; lr 3e-5",
             dict(replay="none", adv="grpo", ratio="token", agg="token-mean", eps_low=0.2,
                  eps_high=0.28, dynamic_sampling=True, dynamic_sampling_rounds=3,
                  overlong_buffer=2, overlong_filter=True, mini_batches=16, lr=3e-5)),
}


def dynamic_sampling_keep(rewards: Tensor, group_ids: Tensor) -> Tensor:
    """DAPO dynamic sampling (arXiv 2503.14476, 'Dynamic Sampling': keep groups with
    0 < |{correct}| < G) as a bool [B]: True for rollouts whose group has non-zero variance.
    Groups of one are kept (their advantage is not 0)."""
    return ~grpo.flat_groups(rewards, group_ids)


def overlong_penalty(lengths: Tensor, max_len: int, cache_len: int) -> Tensor:
    """DAPO soft overlong punishment (arXiv 2503.14476, 'Overlong Reward Shaping'), added to each
    response's reward:

        R(|y|) = 0                                   if |y| <= L_max - L_cache
               = ((L_max - L_cache) - |y|) / L_cache  if L_max - L_cache < |y| <= L_max
               = -1                                  if |y| > L_max
    lengths [B] (tokens), max_len = L_max, cache_len = L_cache. Returns float [B] in [-1, 0].
    """
    if not 0 < cache_len <= max_len:
        raise ValueError(f"need 0 < cache_len <= max_len, got cache_len={cache_len}, "
                         f"max_len={max_len}")
    n = lengths.to(torch.get_default_dtype())
    soft = ((max_len - cache_len) - n) / cache_len
    return torch.where(n <= max_len - cache_len, 0.0, torch.where(n <= max_len, soft, -1.0))


def overlong_filter(mask: Tensor, truncated: Tensor) -> Tensor:
    """DAPO overlong filtering (arXiv 2503.14476, 'Overlong Reward Shaping'): each truncated
    response (bool [B]) gets an all-zero loss mask. Returns a new mask [B, T] of mask's dtype."""
    return torch.where(truncated.bool()[:, None], torch.zeros_like(mask), mask)


class Refill:
    """The allocate slot: rounds of fixed groups (the spine's generate), each scored (its score),
    the flat groups dropped, until the step holds per_rank prompts' groups or the rounds are
    spent."""

    def __init__(self, flags: Flags, run, steps):
        self.f, self.run, self.steps = flags, run, steps

    def allocate(self, prompts: list, mine: list[int], pos: int, *, step: int):
        """1. and 2. for this rank's prompts `mine[pos:]` (wrapping around). Returns (fresh, every
        generated rollout, new pos, no numbers of its own)."""
        f, run, steps = self.f, self.run, self.steps
        fresh, generated = [], []
        rounds = 1 + f.dynamic_sampling_rounds
        for round_ in range(rounds):
            need = run.per_rank - len({r.prompt_id for r in fresh})
            batch = [prompts[mine[(pos + i) % len(mine)]] for i in range(need)]
            pos += need
            new = steps.generate(run, batch, run.settings.run.group_size, step, round_)
            correct = steps.score(run, new)
            generated += new
            # drop all-correct and all-wrong groups, by the verdicts (not the rewards)
            keep = dynamic_sampling_keep(correct, grpo.group_ids(new)).tolist()
            new = [r for r, k in zip(new, keep) if k]
            fresh += new
            if len({r.prompt_id for r in fresh}) >= run.per_rank:
                break
        return fresh, generated, pos, Metrics()


class Overlong:
    """The reward slot: the soft overlong punishment of each rollout's length."""

    def __init__(self, cache_len: int, max_len: int):
        self.cache_len, self.max_len = cache_len, max_len

    def __call__(self, rollouts) -> Tensor:
        lengths = torch.tensor([len(r.completion_ids) for r in rollouts])
        return overlong_penalty(lengths, self.max_len, self.cache_len)


class OverlongFilter:
    """The loss slot: a truncated rollout's mask all zero, and it is not stored for replay."""

    def batch(self, mbs: list[dict]) -> list[dict]:
        return [{**mb, "completion_mask": overlong_filter(mb["completion_mask"], mb["truncated"])}
                for mb in mbs]

    def keeps(self, r) -> bool:
        return not r.truncated


def make(flags: Flags, run, steps) -> dict:
    max_len = run.settings.run.max_new_tokens
    if flags.overlong_buffer > max_len:
        raise ValueError(f"--overlong-buffer ({flags.overlong_buffer}) cannot exceed "
                         f"--max-new-tokens ({max_len})")
    out = {}
    if flags.dynamic_sampling:
        out["allocate"] = Refill(flags, run, steps)
    if flags.overlong_buffer:
        out["reward"] = Overlong(flags.overlong_buffer, max_len)
    if flags.overlong_filter:
        out["loss"] = OverlongFilter()
    return out
