"""M2PO (Zheng et al., "Prosperity before Collapse", arXiv 2510.01161): a second-moment trust
region in place of the eps-clip, for training on stale data: in each optimizer step, mask the
tokens of largest (log r)^2 until the mean (log r)^2 of the rest is below tau.

    python train.py --preset m2po       # --m2po-tau 0.04, no eps-clip, token mean

The mask is the whole optimizer step's (every micro-batch and rank: one no-grad pass first,
`M2PO.prepare`, which returns each micro-batch with its mask), so it does not depend on the
micro-batching or the world size. Logged: loss/m2po_masked_frac, the share of completion tokens
masked.
"""
import math
from dataclasses import dataclass

import torch
from torch import Tensor

import grpo
import parallel
from rollout import forward_logprobs


@dataclass(frozen=True)
class Flags:
    # ---- M2PO ------------------------------------------------------------------------------------
    m2po_tau: float = 0.0
    """M2PO: in each optimizer step, mask the tokens of largest |log r| until the mean (log r)^2
    of the rest is below tau; no eps-clip (--eps-low/--eps-high ignored); 0 = off (M2PO: 0.04)"""

    AT_LEAST_0 = ("m2po_tau",)


PRESETS = {
    "m2po": ("M2PO (arXiv 2510.01161): second-moment trust region, mask the largest |log r| "
             "until M2 < 0.04, no eps-clip, token mean; lr 3e-5",
             dict(replay="none", ratio="token", agg="token-mean", m2po_tau=0.04, lr=3e-5)),
}


def m2po_sq(log_ratio: Tensor, mask: Tensor) -> Tensor:
    """(log r_t)^2 of the valid tokens, float64, detached: [n] (row-major order)."""
    return log_ratio.detach().double().square()[mask.bool()]


def m2po_threshold(sq: Tensor, tau: float) -> float:
    """M2PO's cut (Zheng et al. 2025, "Prosperity before Collapse", arXiv 2510.01161) over the
    squared token log-ratios sq = (log r_t)^2, r_t = pi_theta / pi_old, of every valid token of
    one optimizer step (all micro-batches and ranks, in any order), as AReaL implements it:

        s_1 >= s_2 >= ... >= s_n                           sq sorted, largest first
        M2(j) = (1 / (n - j)) sum_{i > j} s_i              the second moment once s_1..s_j are out
        k     = min {j < n : M2(j) < tau}                  (n - 1 when there is none)
        c     = s_k (inf when k = 0);  mask token t  <=>  (log r_t)^2 >= c
    Read: AReaL's docs/algorithms/m2po.md (M2 = (1/N) sum (log pi_theta / pi_behav)^2, its
    m2_threshold tau_M2 a bound on that mean, objective (1/sum|o|) sum M r A) and its code,
    areal/engine/ppo/actor.py _apply_m2po_masking / _get_m2po_loss_mask (inclusionAI/AReaL):
    descending sort, suffix means, the first suffix mean strictly below the threshold, at least one
    token kept. So N counts the tokens that remain, and the test is strict (<). AReaL's log r is
    against the proximal policy of its decoupled loss (recomputed before the update); here it is
    pi_theta at the start of the optimizer step against old_logp, the behaviour policy.
    Ties: every token equal to s_k is masked, so a cut through a run of equal values masks the
    whole run (AReaL masks an arbitrary part of it, by sort order); the kept M2 is still < tau (a
    suffix mean only falls as its largest terms go), but a run at the smallest value can leave no
    token kept. All zero (the first update on fresh rollouts): M2 = 0 < tau, nothing masked.
    Not followed: the authors' released code (Infini-AI-Lab/M2PO, verl core_algos.py), which
    budgets only the tokens PPO's clip would act on (A > 0, r > 1 or A < 0, r < 1) and turns the
    budget into a clip range. tau = 0.04: AReaL's m2_threshold in its gsm8k_m2po.yaml.
    """
    n = sq.numel()
    if n == 0:
        return math.inf
    s = sq.double().sort(descending=True).values                               # [n]
    counts = torch.arange(n, 0, -1, dtype=s.dtype, device=s.device)            # n - j
    suffix_mean = s.flip(0).cumsum(0).flip(0) / counts                         # M2(j), [n]
    below = (suffix_mean < tau).nonzero()
    k = int(below[0]) if len(below) else n - 1
    return float(s[k - 1]) if k else math.inf


def m2po_keep(log_ratio: Tensor, mask: Tensor, tau: float,
              threshold: float | None = None) -> Tensor:
    """[B, T] bool: the valid tokens M2PO keeps, (log r_t)^2 < c with c = m2po_threshold(...) of
    this call's tokens, or `threshold` when given (train.py: the one of the whole optimizer step,
    from a no-grad pass over all its micro-batches and ranks). log_ratio [B, T] is the token log
    ratio (token_log_ratio); invalid tokens are never kept. The loss with it (train.py):

        L = -(1 / sum_i |o_i|) sum_i sum_t M_it r_it A_i       no eps-clip, token mean
    N counts every valid token, masked ones too, as AReaL's doc writes the objective and as the
    veto does (AReaL's code divides by the kept tokens of each micro-batch)."""
    if threshold is None:
        threshold = m2po_threshold(m2po_sq(log_ratio, mask), tau)
    return mask.bool() & (log_ratio.detach().double().square() < threshold)


# how its number combines (metrics.Metrics.add): a mean over the completion tokens
COMBINE = {"loss/m2po_masked_frac": "mean tokens"}


class M2PO:
    """The loss slot: the step's mask (prepare), then in each micro-batch the loss mask narrowed
    to the kept tokens and no eps-clip (restrict)."""

    def __init__(self, tau: float, temperature: float, pad_id: int, world: int):
        self.tau, self.temperature, self.pad_id, self.world = tau, temperature, pad_id, world

    @torch.no_grad()
    def prepare(self, model, mbs: list[dict]) -> list[dict]:
        """The micro-batches, each with its mask ("m2po_keep", [b, T] bool) of one threshold for
        the optimizer step: a no-grad forward over the step's micro-batches (in lockstep with the
        other ranks) at the weights the step's gradient is taken at, every rank's (log r_t)^2
        gathered, then m2po_threshold of them all; the grad pass reads the mask (restrict) rather
        than recomputing log r."""
        log_w = []
        for mb in parallel.forward_passes(mbs, model, self.pad_id, self.world):
            logp = forward_logprobs(model, mb, self.temperature)[1]                # [b, T]
            log_w.append(grpo.token_log_ratio(logp, mb["old_logprobs"], mb["completion_mask"]))
        sq = [m2po_sq(w, mb["completion_mask"]) for w, mb in zip(log_w, mbs)]
        sq = torch.cat(sq) if sq else torch.zeros(0, dtype=torch.float64)
        c = m2po_threshold(parallel.all_gather_cat(sq, self.world), self.tau)
        return [{**mb, "m2po_keep": m2po_keep(w, mb["completion_mask"], self.tau, c)}
                for w, mb in zip(log_w, mbs)]

    def restrict(self, logp: Tensor, mb: dict, loss_mask: Tensor, eps: tuple) -> tuple:
        """(the loss mask narrowed to the kept tokens, no eps-clip, {"loss/m2po_masked_frac": the
        share of completion tokens masked})."""
        mask = mb["completion_mask"]
        masked = (mask.bool() & ~mb["m2po_keep"]).sum().double()
        return (loss_mask.bool() & mb["m2po_keep"], (1.0, math.inf),
                {"loss/m2po_masked_frac": masked / mask.sum().clamp(min=1)})


def make(flags: Flags, run, steps) -> dict:
    if not flags.m2po_tau:
        return {}
    loss = run.settings.loss
    if loss.ratio != "token" or loss.dual_clip or loss.tis_cap:
        raise ValueError("--m2po-tau (M2PO) needs --ratio token, no --dual-clip and no --tis-cap: "
                         "its mask is of the token ratio to the behaviour policy, and it has no "
                         "clip")
    return {"loss": M2PO(flags.m2po_tau, run.settings.run.temperature, run.tok.pad_token_id,
                         run.world)}
