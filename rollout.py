"""Rollouts: the record that flows through the trainer, collation into tensors, and the generation engines.

(work in progress: the Rollout record first)
"""
from dataclasses import dataclass, field


@dataclass
class Rollout:
    """One completion of one prompt. Plain Python values only (no tensors): cheap to store, pickle and replay."""
    prompt_id: int                 # rollouts with the same prompt_id and version form one GRPO group
    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]          # behaviour-policy log-prob of each completion token
    text: str = ""                 # decoded completion
    answer: str = ""               # gold answer
    reward: float = 0.0
    advantage: float = 0.0         # set once from its own fresh group; replay never recomputes it
    version: int = 0               # optimizer step whose weights generated it; age = step - version
    truncated: bool = False        # hit the max-new-tokens limit before EOS
