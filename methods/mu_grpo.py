"""mu-GRPO (arXiv 2605.17570, read from its project page): many optimizer steps on one large batch
of prompts (a "stage": the prompts of mu mini-batches generated once, then mu updates), made safe
by a relaxed clip range and a veto of negative-advantage tokens after the policy has left them.

    python train.py --preset mu-grpo    # 4 stages of 512 prompts x 64 updates, clip [0, 5], veto

A stage is the spine's loop step with a large --prompts-per-step and --mini-batches mu; the clip
range [0, 5] is the spine's --eps-low 1 --eps-high 4. What is this file's: the veto
(`veto_mask`), a mask of the loss, logged as loss/veto_frac (the share of completion tokens it
removes).
"""
import math
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

VETO_SCOPES = ("suffix", "trigger", "response")


@dataclass(frozen=True)
class Flags:
    # ---- mu-GRPO ---------------------------------------------------------------------------------
    veto_scope: Literal[("none", *VETO_SCOPES)] = "none"
    """mu-GRPO negative-advantage veto: none | suffix (the method) | trigger | response
    (ablations)"""
    veto_threshold: float = 1e-4
    """veto trigger: a token of an A < 0 response whose ratio is below this"""

    def rules(self) -> list[tuple[bool, str]]:
        return [(self.veto_threshold <= 0,
                 f"--veto-threshold must be > 0 (a ratio below it triggers the veto), "
                 f"got {self.veto_threshold}")]


PRESETS = {
    "mu-grpo": ("mu-GRPO (arXiv 2605.17570, project page): 4 stages of 512 prompts x 64 updates, "
                "clip [0, 5], veto; lr 3e-5",
                dict(replay="none", eps_low=1.0, eps_high=4.0, veto_scope="suffix",
                     veto_threshold=1e-4, steps=4, prompts_per_step=512, mini_batches=64,
                     eval_every=1, lr=3e-5)),
}


@torch.no_grad()
def veto_mask(logp: Tensor, old_logp: Tensor, adv_tok: Tensor, mask: Tensor,
              threshold: float = 1e-4, scope: str = "suffix") -> Tensor:
    """mu-GRPO negative-advantage veto (arXiv 2605.17570), recomputed from the current logp at
    every update:

        trigger_it = valid_it and A_it < 0 and rho_it < delta,
        rho_it = exp(logp_it - old_logp_it) (detached)
    old_logp is the behaviour policy's (the one that generated the response, what the veto is
    defined against), also under TIS, where the ratio's old log-probs are recomputed ones.
        kappa_i    = the first trigger of response i
        scope "suffix"   (the method): mask every valid token t > kappa_i; kappa_i itself keeps
                                       its (rho-sized) term
        scope "trigger"  (ablation):   mask the trigger tokens only
        scope "response" (ablation):   mask the whole response if it has a trigger
    Responses with A >= 0 are never touched. adv_tok [B] or [B, T]. Returns the new mask, same
    dtype as mask.
    """
    if scope not in VETO_SCOPES:
        raise ValueError(f"veto scope must be one of {VETO_SCOPES}, got {scope!r}")
    adv = adv_tok[:, None] if adv_tok.dim() == 1 else adv_tok                 # [B, 1] or [B, T]
    valid = mask.bool()
    # [B, T]; log space: no exp underflow
    trigger = valid & (adv < 0) & ((logp - old_logp) < math.log(threshold))
    if scope == "trigger":
        drop = trigger
    elif scope == "response":
        drop = trigger.any(-1, keepdim=True).expand_as(trigger)
    else:
        # triggers strictly before t
        n_before = trigger.long().cumsum(-1) - trigger.long()
        drop = n_before > 0
    return torch.where(drop, torch.zeros_like(mask), mask)


# how its number combines (metrics.Metrics.add): a mean over the completion tokens
COMBINE = {"loss/veto_frac": "mean tokens"}


class Veto:
    """The loss slot: the veto restricts the loss mask (against the behaviour policy, the one that
    generated the response, also under TIS), and logs the share of tokens it removed."""

    def __init__(self, flags: Flags):
        self.f = flags

    def restrict(self, logp: Tensor, mb: dict, loss_mask: Tensor, eps: tuple) -> tuple:
        """(the loss mask with the veto's tokens removed, eps as given, {"loss/veto_frac": the
        share of completion tokens left out after it})."""
        mask = mb["completion_mask"]
        loss_mask = veto_mask(logp, mb["behaviour_logprobs"], mb["advantages"], loss_mask,
                              self.f.veto_threshold, self.f.veto_scope)
        frac = 1 - loss_mask.sum() / mask.sum().clamp(min=1)
        return loss_mask, eps, {"loss/veto_frac": frac}


def make(flags: Flags, run, steps) -> dict:
    return {"loss": Veto(flags)} if flags.veto_scope != "none" else {}
