"""The objective, bound once from its flags: what the update minimises over a step's rollouts.

    objective = Objective(flags, temperature=1.0, max_len=8, batching=Batching(256, 0, pad, "cpu"))
    old = objective.proximal_logprobs(model, batch)       # TIS: recomputed; otherwise None
    mbs = objective.micro_batches(rollouts, old)          # one optimizer step's micro-batches
    n = objective.normaliser(mbs)                         # N, over every rank, before the first one
    objective.prepare(model, mbs)                         # M2PO: the step's mask
    loss = objective.loss(model, mb, n, metrics)          # one micro-batch; then loss.backward()

The math is grpo.py's (each function with its paper's equation); this module only wires the flags
to it, in one place: the ratio (token, GSPO, PNPO and PNPO's gradient reading), the clip (its
range, dual-clip), mu-GRPO's veto against the behaviour policy, M2PO's step-wide second-moment mask
(and no eps-clip with it), truncated importance sampling (TIS), KL to a frozen reference, the
aggregation and its normaliser, and DAPO's overlong filter (a truncated rollout has no loss
tokens, and is not stored for replay). `train.update` and `train.optimizer_step` read no flag of
it. The recipe in full is the comment at the top of grpo.py.
"""
import math
from dataclasses import dataclass
from typing import Literal, NamedTuple

import torch

import grpo
import parallel
from metrics import Metrics
from rollout import forward_logprobs, lockstep_logprobs, micro_batches


@dataclass(frozen=True)
class Flags:
    # ---- objective -------------------------------------------------------------------------------
    ratio: Literal[tuple(grpo.RATIOS)] = "token"
    """importance weight: token | gspo (sequence ratio) | pnpo (prefix geometric mean) | pnpo-geo
    (token ratio x the geometric mean before it) | cumulative (the exact prefix ratio)"""
    pnpo_grad: Literal[grpo.PNPO_GRADS] = "detached"
    """the prefix ratios' gradient (pnpo, pnpo-geo, cumulative): detached (w_t = sg[w_t] pi_t /
    sg[pi_t], GRPO's on-policy) | full (through the prefix)"""
    agg: Literal[grpo.AGG_MODES] = "token-mean"
    """loss aggregation: token-mean | seq-mean-token-mean | seq-mean-token-sum |
    seq-mean-token-sum-norm"""
    eps_low: float = 0.2
    """clip range below 1 (mu-GRPO's relaxed range [0, 5]: --eps-low 1 --eps-high 4)"""
    eps_high: float = 0.28
    """clip range above 1 (DAPO clip-higher: 0.28; symmetric PPO: 0.2)"""
    dual_clip: float = 0.0
    """dual-clip constant c for A < 0 (e.g. 3; 0 = off)"""
    veto_scope: Literal["none", *grpo.VETO_SCOPES] = "none"
    """mu-GRPO negative-advantage veto: none | suffix (the method) | trigger | response
    (ablations)"""
    veto_threshold: float = 1e-4
    """veto trigger: a token of an A < 0 response whose ratio is below this"""
    m2po_tau: float = 0.0
    """M2PO: in each optimizer step, mask the tokens of largest |log r| until the mean (log r)^2
    of the rest is below tau; no eps-clip (--eps-low/--eps-high ignored); 0 = off (M2PO: 0.04)"""
    kl_coef: float = 0.0
    """KL-to-reference coefficient; the reference model is loaded only when > 0"""
    kl_estimator: Literal[tuple(grpo.KL_ESTIMATORS)] = "k3"
    """KL estimator: k1 | abs | k2 | k3"""
    tis_cap: float = 0.0
    """truncated importance sampling cap C (0 = off): recompute old log-probs, weight by
    min(pi_old/pi_engine, C)"""
    overlong_filter: bool = False
    """DAPO overlong filtering: truncated responses get no loss (and are not stored for replay)"""

    AT_LEAST_0 = ("kl_coef", "tis_cap", "dual_clip", "m2po_tau")

    def rules(self) -> list[tuple[bool, str]]:
        """(is it broken, the sentence that says so) for each rule between these flags."""
        return [
            (not 0 <= self.eps_low <= 1 or self.eps_high < 0,
             f"need 0 <= --eps-low <= 1 and --eps-high >= 0, got {self.eps_low}, {self.eps_high}"),
            (0 < self.dual_clip <= 1,
             f"--dual-clip must be > 1 (or 0 = off), got {self.dual_clip}"),
            (self.veto_threshold <= 0,
             f"--veto-threshold must be > 0 (a ratio below it triggers the veto), "
             f"got {self.veto_threshold}"),
            (self.m2po_tau > 0 and (self.ratio != "token" or self.dual_clip or self.tis_cap),
             "--m2po-tau (M2PO) needs --ratio token, no --dual-clip and no --tis-cap: its mask is "
             "of the token ratio to the behaviour policy, and it has no clip"),
        ]


class Batching(NamedTuple):
    """How a list of rollouts becomes forward passes: rows and padded tokens per micro-batch at
    most (memory only, never the gradient), the pad id, the device."""
    size: int
    max_tokens: int
    pad_id: int
    device: str


class Objective:
    """The objective of one run. `ref_model`: the frozen KL reference (--kl-coef > 0), else None.
    `world`: the ranks the normaliser and the no-grad passes span."""

    def __init__(self, flags: Flags, *, temperature: float, max_len: int, batching: Batching,
                 ref_model=None, world: int = 1):
        if flags.kl_coef > 0 and ref_model is None:
            raise ValueError("--kl-coef > 0 needs the reference model")
        self.f = flags
        self.temperature = temperature
        self.max_len = max_len               # L_max, --max-new-tokens: seq-mean-token-sum-norm's
        self.batching = batching
        self.ref_model = ref_model
        self.world = world

    # ---- the step's batch ------------------------------------------------------------------------

    def trains_on(self, r) -> bool:
        """Whether rollout `r` has loss tokens (DAPO's overlong filter: not when truncated): the
        loop stores only those for replay."""
        return not (self.f.overlong_filter and r.truncated)

    def proximal_logprobs(self, model, rollouts: list) -> list | None:
        """TIS (--tis-cap): the old log-probs recomputed at the start of the step, the proximal
        policy's, in lockstep with the other ranks; None otherwise (the ratio's denominator is then
        the behaviour policy's, logged at generation)."""
        if not self.f.tis_cap:
            return None
        b = self.batching
        return lockstep_logprobs(model, rollouts, b.size, self.temperature, b.pad_id, self.world,
                                 b.max_tokens)

    def micro_batches(self, rollouts: list, old_logprobs: list | None = None) -> list[dict]:
        """One optimizer step's micro-batches (rollout.micro_batches), each truncated rollout's
        mask all zero under --overlong-filter (grpo.overlong_filter)."""
        b = self.batching
        mbs = micro_batches(rollouts, b.size, b.pad_id, b.device, old_logprobs=old_logprobs,
                            max_tokens=b.max_tokens)
        if self.f.overlong_filter:
            for mb in mbs:
                mb["completion_mask"] = grpo.overlong_filter(mb["completion_mask"],
                                                             mb["truncated"])
        return mbs

    def normaliser(self, mbs: list[dict]) -> float | None:
        """N of the optimizer step over every rank's micro-batches (parallel.global_normaliser),
        or None when no rank has a rollout in it."""
        return parallel.global_normaliser(mbs, self.f.agg, self.max_len, self.world)

    @torch.no_grad()
    def prepare(self, model, mbs: list[dict]) -> None:
        """What the whole optimizer step needs before its first micro-batch. M2PO: the mask of each
        micro-batch (mb["m2po_keep"], [b, T] bool) with one threshold for the step: a no-grad
        forward over the step's micro-batches (in lockstep with the other ranks) at the weights the
        step's gradient is taken at, every rank's (log r_t)^2 gathered, then grpo.m2po_threshold of
        them all. So the mask is the merged step's, whatever the micro-batching or the world size;
        the grad pass reuses it rather than recomputing log r."""
        if not self.f.m2po_tau:
            return
        log_w = []
        for mb in parallel.forward_passes(mbs, model, self.batching.pad_id, self.world):
            logp = forward_logprobs(model, mb, self.temperature)[1]                # [b, T]
            log_w.append(grpo.token_log_ratio(logp, mb["old_logprobs"], mb["completion_mask"]))
        sq = [grpo.m2po_sq(w, mb["completion_mask"]) for w, mb in zip(log_w, mbs)]
        sq = torch.cat(sq) if sq else torch.zeros(0, dtype=torch.float64)
        c = grpo.m2po_threshold(parallel.all_gather_cat(sq, self.world), self.f.m2po_tau)
        for w, mb in zip(log_w, mbs):
            mb["m2po_keep"] = grpo.m2po_keep(w, mb["completion_mask"], self.f.m2po_tau, c)

    # ---- one micro-batch -------------------------------------------------------------------------

    def loss(self, model, mb: dict, normaliser: float, metrics: Metrics) -> torch.Tensor:
        """The objective of one micro-batch (the recipe at the top of grpo.py); its metrics go to
        `metrics`: policy_loss's means over the loss tokens, the rest over every completion
        token."""
        f = self.f
        logits, logp = forward_logprobs(model, mb, self.temperature)  # [b, T, V], [b, T]
        mask = mb["completion_mask"]                                                 # [b, T]
        old = mb["old_logprobs"]                                                     # [b, T]
        adv = mb["advantages"]                                                       # [b]
        behaviour = mb["behaviour_logprobs"]  # the policy that sampled it (= old, unless TIS)
        loss_mask = mask
        if f.veto_scope != "none":           # mu-GRPO's veto, against the behaviour policy
            loss_mask = grpo.veto_mask(logp, behaviour, adv, mask, f.veto_threshold, f.veto_scope)
        veto_frac = 1 - loss_mask.sum() / mask.sum().clamp(min=1)
        eps_low, eps_high = f.eps_low, f.eps_high
        if f.m2po_tau:                       # M2PO: the step's mask (prepare), and no eps-clip
            loss_mask, eps_low, eps_high = loss_mask.bool() & mb["m2po_keep"], 1.0, math.inf
        log_w = grpo.log_ratio(f.ratio, logp, old, mask, pnpo_grad=f.pnpo_grad)        # [b, T]
        w_tis = grpo.tis_weight(old, behaviour, f.tis_cap) if f.tis_cap else None
        loss, m = grpo.policy_loss(log_w, adv, loss_mask, eps_low=eps_low, eps_high=eps_high,
                                   dual_clip=f.dual_clip or None, agg=f.agg,
                                   normaliser=normaliser, token_weight=w_tis)
        n = float(m.pop("loss/tokens"))
        with torch.no_grad():
            entropy = grpo.masked_mean(grpo.entropy_from_logits(logits, self.temperature), mask)
            extra = {"entropy": entropy, "loss/veto_frac": veto_frac,
                     "ratio/far_prefix_frac": grpo.far_prefix_fraction(logp, old, mask)}
            if f.ratio != "token":       # a sequence or prefix ratio: where it departs from GSPO
                extra["ratio/gspo_differs_frac"] = grpo.gspo_differs_fraction(
                    log_w, logp, old, adv, mask, eps_low, eps_high)
            if f.m2po_tau:
                masked = (mask.bool() & ~mb["m2po_keep"]).sum().double()
                extra["loss/m2po_masked_frac"] = masked / mask.sum().clamp(min=1)
        if f.kl_coef > 0:
            with torch.no_grad():
                ref_logp = forward_logprobs(self.ref_model, mb, self.temperature)[1]   # [b, T]
            kl = grpo.kl_penalty(logp, ref_logp, f.kl_estimator)                        # [b, T]
            loss = loss + f.kl_coef * grpo.aggregate(kl, loss_mask, f.agg, normaliser)
            extra["kl"] = grpo.masked_mean(kl.detach(), mask)
        metrics.token_means(m, n, grpo.COMBINE)       # policy_loss's means: over the loss tokens
        metrics.token_means(extra, float(mask.sum()))  # the rest: over every completion token
        metrics.total("loss/tokens", n)
        return loss


# the objective's fields of the log line (metrics.fields): the step's loss and clip fraction, absent
# in a step without an update (R²PO's head phase)
LOG = ("loss {loss/policy:+.4f}", "clip {loss/clip_frac:.3f}")
