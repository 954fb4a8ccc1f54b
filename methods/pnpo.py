"""PNPO (arXiv 2608.01418): the importance weight of each token normalised over its causal prefix,
the geometric mean of the prefix's token ratios, between the token ratio and GSPO's sequence
ratio; the paper's regime is off-policy updates (4 mini-batches x 4 epochs a step).

    python train.py --preset pnpo       # --ratio pnpo, GSPO's clip and aggregation, 4 x 4 updates

Three weights are offered (`--ratio`): pnpo (the prefix's geometric mean, the token's own ratio
in it), pnpo-geo (the token's ratio times the geometric mean before it) and cumulative (the exact
prefix weight, what the normalisation replaces); and two readings of their gradient
(`--pnpo-grad`). Only the abstract was read; the choices are in each function's docstring and
docs/methods.md. Its diagnostics (logged with a PNPO ratio): ratio/far_prefix_frac, the share of
tokens whose exact prefix ratio is beyond e^+-1 (where prefix ratios can differ), and
ratio/gspo_differs_frac, the share whose surrogate term differs from GSPO's.
"""
import math
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

import grpo

PNPO_GRADS = ("detached", "full")
GSPO_LOG_RATIO_MAX = 10.0    # verl's upper cap on GSPO's log s_i (gspo_differs_fraction's GSPO)
GSPO_DIFF_TOL = 0.1          # a weight 10% away from GSPO's counts as a different term


@dataclass(frozen=True)
class Flags:
    # ---- PNPO ------------------------------------------------------------------------------------
    pnpo_grad: Literal[PNPO_GRADS] = "detached"
    """the prefix ratios' gradient (--ratio pnpo, pnpo-geo, cumulative): detached (w_t = sg[w_t]
    pi_t / sg[pi_t], GRPO's on-policy) | full (through the prefix)"""


PRESETS = {
    "pnpo": ("PNPO (arXiv 2608.01418): prefix geometric-mean ratio, GSPO's clip 3e-4/4e-4 and "
             "aggregation, 4 mini-batches x 4 epochs per batch (off-policy regime); lr 3e-5 "
             "(the long task's)",
             dict(replay="none", ratio="pnpo", agg="seq-mean-token-mean", eps_low=3e-4,
                  eps_high=4e-4, mini_batches=4, epochs=4, lr=3e-5)),
}


def pnpo_log_ratio(logp: Tensor, old_logp: Tensor, mask: Tensor, grad: str = "detached") -> Tensor:
    """PNPO prefix-normalised ratio (arXiv 2608.01418): the geometric mean of the token ratios of
    the causal prefix,

        log w_it = (1/n_it) sum_{s <= t, valid} (logp_is - old_logp_is),
        n_it = number of valid s <= t
    At the first valid token it is the token ratio, at the last one GSPO's s_i. Clamped to
    [-20, 20] like the token ratio; 0 on invalid tokens. The abstract does not say how the gradient
    flows; two readings (`grad`):

        "detached" (default):  log w_it = sg[log w_it] + logp_it - sg[logp_it],
                               grad w_it = w_it grad logp_it
        "full":                grad w_it = w_it (1/n_it) sum_{s <= t, valid} grad logp_is
    "detached" is GSPO-token's construction applied to the prefix weight: the prefix mean sets each
    token's weight (and what is clipped), the gradient goes through the token itself, so on-policy
    (every ratio 1) it is exactly GRPO's. "full" backpropagates through the prefix mean: even
    on-policy token s then weighs sum_{t >= s} w_t / n_t (2.72x a GRPO token for the first of 8
    tokens, about 8.6x for the first of 3,000), a long-response bias we do not want by default.
    """
    _check_grad(grad)
    valid = mask.bool()
    prefix_sum = torch.where(valid, logp - old_logp, 0.0).cumsum(-1)          # [B, T]
    n_prefix = valid.cumsum(-1).clamp(min=1)                                   # [B, T]
    return _prefix_weight(prefix_sum / n_prefix, logp, valid, grad)


def _check_grad(grad: str) -> None:
    if grad not in PNPO_GRADS:
        raise ValueError(f"PNPO grad must be one of {PNPO_GRADS}, got {grad!r}")


def _prefix_weight(log_w: Tensor, logp: Tensor, valid: Tensor, grad: str) -> Tensor:
    """A prefix ratio's log weight, clamped to [-20, 20]; "detached": value unchanged, token-wise
    gradient (sg[log w] + logp - sg[logp]); 0 on invalid tokens. [B, T]."""
    log_w = log_w.clamp(-grpo.LOG_RATIO_CLAMP, grpo.LOG_RATIO_CLAMP)
    if grad == "detached":
        log_w = log_w.detach() + logp - logp.detach()
    return torch.where(valid, log_w, 0.0)


def pnpo_geo_log_ratio(logp: Tensor, old_logp: Tensor, mask: Tensor,
                       grad: str = "detached") -> Tensor:
    """A second reading of PNPO's prefix normalisation: the token's own ratio times the geometric
    mean of the ratios before it,

        log w_it = (logp_it - old_logp_it)
                   + (1/(n_it - 1)) sum_{s < t, valid} (logp_is - old_logp_is)
    (n_it as in pnpo_log_ratio; at the first valid token, n_it = 1, the token ratio alone). Where
    pnpo_log_ratio averages the token into its prefix (so a token's own ratio counts 1/n_it),
    here it counts fully and the prefix is normalised: the exact prefix weight
    prod_{s < t} rho_s of cumulative_log_ratio with its log divided by t - 1. Clamped to [-20, 20];
    `grad` as pnpo_log_ratio's ("full": also through the prefix mean). [B, T]."""
    _check_grad(grad)
    valid = mask.bool()
    d = torch.where(valid, logp - old_logp, 0.0)                               # [B, T]
    before = d.cumsum(-1) - d                                                  # sum over s < t
    n_before = (valid.cumsum(-1) - 1).clamp(min=1)                             # [B, T]
    return _prefix_weight(d + before / n_before, logp, valid, grad)


def cumulative_log_ratio(logp: Tensor, old_logp: Tensor, mask: Tensor,
                         grad: str = "detached") -> Tensor:
    """The exact importance weight of the prefix, what PNPO's normalisation replaces: the
    per-decision ratio of y_{<=t} (Precup et al. 2000),

        log w_it = sum_{s <= t, valid} (logp_is - old_logp_is) = log pi(y_{i,<=t}) / old(y_{i,<=t})
    Unbiased for the off-policy policy gradient of token t, and of variance growing with t (the
    product of t ratios): why PNPO takes a mean instead. Clamped to [-20, 20]; `grad` as
    pnpo_log_ratio's ("detached": value w_it, gradient w_it grad logp_it, the per-decision
    estimator). [B, T]."""
    _check_grad(grad)
    valid = mask.bool()
    return _prefix_weight(torch.where(valid, logp - old_logp, 0.0).cumsum(-1), logp, valid, grad)


@torch.no_grad()
def far_prefix_fraction(logp: Tensor, old_logp: Tensor, mask: Tensor,
                        bound: float = 1.0) -> Tensor:
    """Share of valid tokens whose prefix's exact ratio prod_{s <= t} rho_s lies beyond
    e^{+-bound}: where the prefix ratios (cumulative, PNPO's means, GSPO's sequence mean) can
    differ, so where PNPO's normalisation can act. 0-dim."""
    valid = mask.bool()
    cum = torch.where(valid, logp - old_logp, 0.0).cumsum(-1)
    far = (cum.abs() > bound) & valid
    return far.sum().double() / valid.sum().clamp(min=1)


@torch.no_grad()
def gspo_differs_fraction(log_w: Tensor, logp: Tensor, old_logp: Tensor, adv: Tensor,
                          mask: Tensor, eps_low: float, eps_high: float,
                          tol: float = GSPO_DIFF_TOL) -> Tensor:
    """Share of valid tokens whose surrogate term differs from the one GSPO gives them: what a
    sequence or prefix ratio (PNPO's) changes, so whether it acted. A token's gradient weight
    under policy_loss is

        g_t = w_t   where its term is not clipped,   0 where it is
        clipped: A > 0 and w_t > 1 + eps_high, or A < 0 and w_t < 1 - eps_low
    with w_t = exp(log_w_t) (this call's ratio) against GSPO's s_i = exp(gspo_log_ratio) at the
    same eps. The term differs where exactly one of the two is clipped, or neither is and
    |log w_t - log s_i| > log(1 + tol). Tokens with A = 0 have no term under either and count as
    equal. adv [B] or [B, T]. 0-dim."""
    valid = mask.bool()
    adv = adv[:, None] if adv.dim() == 1 else adv                             # [B, 1] or [B, T]
    log_s = _sequence_log_ratio(logp, old_logp, valid)                         # [B, T]

    low = math.log1p(-eps_low) if eps_low < 1 else -math.inf     # eps_low = 1: no lower clip

    def clipped(lw):                                                           # [B, T]
        return ((adv > 0) & (lw > math.log1p(eps_high))) | ((adv < 0) & (lw < low))

    a, b = clipped(log_w.detach()), clipped(log_s)
    apart = (log_w.detach() - log_s).abs() > math.log1p(tol)
    differs = valid & (adv != 0) & ((a != b) | (~a & ~b & apart))
    return differs.sum().double() / valid.sum().clamp(min=1)


def _sequence_log_ratio(logp: Tensor, old_logp: Tensor, valid: Tensor) -> Tensor:
    """GSPO's weight's value on every valid token, log s_i = (1/|y_i|) sum_t (logp_it -
    old_logp_it) capped above at 10, 0 elsewhere (no gradient: gspo_differs_fraction's). [B, T]."""
    log_s = torch.where(valid, logp - old_logp, 0.0).sum(-1) / valid.sum(-1).clamp(min=1)  # [B]
    return torch.where(valid, log_s[:, None].clamp(max=GSPO_LOG_RATIO_MAX), 0.0)


RATIOS = {"pnpo": pnpo_log_ratio, "pnpo-geo": pnpo_geo_log_ratio,
          "cumulative": cumulative_log_ratio}
CHOICES = {"ratio": tuple(RATIOS)}
# how its diagnostics combine (metrics.Metrics.add): means over the completion tokens
COMBINE = {"ratio/far_prefix_frac": "mean tokens", "ratio/gspo_differs_frac": "mean tokens"}


class PrefixRatio:
    """The loss slot: a prefix weight in place of the token ratio, and its two diagnostics."""

    def __init__(self, kind: str, grad: str):
        self.kind, self.grad = kind, grad

    def log_ratio(self, logp: Tensor, old_logp: Tensor, mask: Tensor) -> Tensor:
        return RATIOS[self.kind](logp, old_logp, mask, grad=self.grad)

    def diagnostics(self, logp: Tensor, mb: dict, log_w: Tensor, eps: tuple) -> dict:
        old, mask = mb["old_logprobs"], mb["completion_mask"]
        return {"ratio/far_prefix_frac": far_prefix_fraction(logp, old, mask),
                "ratio/gspo_differs_frac": gspo_differs_fraction(log_w, logp, old,
                                                                 mb["advantages"], mask, *eps)}


def make(flags: Flags, run, steps) -> dict:
    ratio = run.settings.loss.ratio
    return {"loss": PrefixRatio(ratio, flags.pnpo_grad)} if ratio in RATIOS else {}
