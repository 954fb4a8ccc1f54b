"""Dr. GRPO (Liu et al., "Understanding R1-Zero-Like Training: A Critical Perspective", arXiv
2503.20783): GRPO without its two normalisations.

    python train.py --preset drgrpo

Its two changes, as this repository reads them: the advantage drops the group's std (this file,
`--adv drgrpo`), and the loss sums a response's tokens and divides by G * L_max
(`--agg seq-mean-token-sum-norm`, one of the spine's aggregations, grpo.aggregate).
"""
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

import grpo

ADVANTAGES = ("grpo", "drgrpo")


@dataclass(frozen=True)
class Flags:
    # ---- Dr. GRPO --------------------------------------------------------------------------------
    adv: Literal[ADVANTAGES] = "grpo"
    """advantage: grpo ((r - mean) / (std + 1e-6)) | drgrpo (r - mean)"""


PRESETS = {
    "drgrpo": ("Dr. GRPO (arXiv 2503.20783): advantage r - mean (no std), token sum / (G L_max), "
               "no replay",
               dict(replay="none", adv="drgrpo", ratio="token", agg="seq-mean-token-sum-norm",
                    eps_low=0.2, eps_high=0.2)),
}


def drgrpo_advantages(rewards: Tensor, group_ids: Tensor) -> Tensor:
    """Dr. GRPO advantage (arXiv 2503.20783, "GRPO Done Right"): A_i = r_i - mean_g(r), no std
    division.

    Same group conventions as grpo.grpo_advantages (a group of one: A = r; zero variance: exactly
    0). Returns [B].
    """
    mean, _, constant = grpo.group_stats(rewards, group_ids)
    return torch.where(constant, 0.0, rewards - mean)                          # [B]


def make(flags: Flags, run, steps) -> dict:
    return {"advantage": drgrpo_advantages} if flags.adv == "drgrpo" else {}
