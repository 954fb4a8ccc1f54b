"""The GRPO objective family as pure tensor functions: advantages, log-probs, importance weights,
clipped surrogate, the mu-GRPO veto, M2PO's second-moment mask, KL to a reference, truncated
importance sampling, DAPO extras and loss aggregation.

    python grpo.py            # prints the advantages and the loss of a small random batch

No model, optimizer, torch.distributed or globals here: tensors and floats in, tensors (and a
metrics dict) out.
Papers: GRPO (DeepSeekMath, arXiv 2402.03300), Dr. GRPO (2503.20783), DAPO (2503.14476),
GSPO (2507.18071), PNPO (2608.01418), mu-GRPO (2605.17570), M2PO (2510.01161), dual-clip PPO
(1912.09729).
Checked against verl's core_algos.py (tests/test_golden.py, ../shared/golden/README.md).
Where we depart from a reference, the docstring says so:
  * zero-variance groups get advantage exactly 0 (verl relies on r - mean rounding to 0);
  * seq-mean-token-sum-norm divides by G * L_max as Dr. GRPO writes it; verl divides by L_max only;
  * means never add verl's 1e-8 to their denominators (an empty step gets N = 1, an exact zero
    loss).

The file follows the default path (GRPO advantages -> log-probs -> token ratio -> policy_loss ->
aggregate), then the variants each flag selects (Dr. GRPO, GSPO, PNPO, the veto, M2PO, KL, TIS,
DAPO's extras) and the tables of choices.

Shapes: B sequences, G group size, T completion tokens, V vocab. `mask` is the [B, T] completion
mask (bool or 0/1 float; EOS counts as a valid token). logits[:, t] is the distribution that
produced ids[:, t]: the caller shifts. Advantages are [B] (one per rollout) or [B, T].

One update step, as train.py wires it (flags in brackets):
    # [B], once, in the rollout's own fresh group
    adv = ADVANTAGES[--adv](rewards, group_ids)
    # DAPO extras before that: rewards += overlong_penalty(...); keep = dynamic_sampling_keep(...);
    #                           mask = overlong_filter(mask, truncated)
    # whole step: fresh + replay, before any micro-batching; under torchrun all-reduce SUM it
    # across ranks (every mode's N is additive)
    N = loss_normaliser(mask_step, --agg, max_len=--max-new-tokens)
    # behaviour_logp: the engine's log-probs at generation time; old_logp is the same unless TIS
    # recomputes it
    # M2PO (--m2po-tau): a no-grad pass over the step's micro-batches (and ranks) first,
    # c = m2po_threshold(m2po_sq(token_log_ratio(logp, old_logp, mask), mask) of all, tau)
    for each micro-batch:
        logp = token_logprobs(model(...).logits, ids, temperature)               # [b, T], with grad
        loss_mask = (veto_mask(logp, behaviour_logp, adv, mask, --veto-threshold, --veto-scope)
                     if veto else mask)
        # M2PO: loss_mask &= m2po_keep(log r of the no-grad pass, mask, tau, c); no eps-clip
        # weight uses the un-vetoed mask
        log_w = log_ratio(--ratio, logp, old_logp, mask, --pnpo-grad)
        # old_logp recomputed by the trainer
        w_tis = tis_weight(old_logp, behaviour_logp, --tis-cap) if tis else None
        loss, m = policy_loss(log_w, adv, loss_mask, eps_low=--eps-low, eps_high=--eps-high,
                              dual_clip=--dual-clip, agg=--agg, normaliser=N, token_weight=w_tis)
        if --kl-coef > 0:
            loss = loss + kl_coef * aggregate(kl_penalty(logp, ref_logp, --kl-estimator),
                                              loss_mask, --agg, N)
        # summed gradients == the gradient of the whole step's loss
        loss.backward()
    # m holds means over the call's loss tokens and their count 'loss/tokens' (COMBINE: min/max,
    # the per-third clip fractions over their own counts): the caller combines micro-batches and
    # ranks as token-weighted means (train.py, metrics.Metrics)
FSDP/DDP average gradients over ranks, so with N summed over ranks the caller multiplies each loss
by world_size.
Logged extras, all under torch.no_grad():
    entropy        masked_mean(entropy_from_logits(logits, temperature), mask)
    KL             masked_mean(kl_penalty(...), mask)
    veto fraction  1 - loss_mask.sum() / mask.sum()
Vetoed tokens stay counted in N: the veto depends on the current policy, so it is only known inside
the micro-batch, and N must be fixed before the first one; the veto removes their gradient, it does
not reweight others.
"""
import math

import torch
from torch import Tensor

VETO_SCOPES = ("suffix", "trigger", "response")
# |log rho| cap before exp(), as verl: keeps exp() finite, not a trust region
LOG_RATIO_CLAMP = 20.0
GSPO_LOG_RATIO_MAX = 10.0    # verl's upper cap on GSPO's log s_i
PNPO_GRADS = ("detached", "full")
# policy_loss metrics that are extremes, not means
EXTREMES = {"ratio/min": "min", "ratio/max": "max"}
# a completion's thirds by position (loss/clip_frac_first, ...), each a mean over its own tokens
THIRDS = ("first", "middle", "last")
# how callers combine policy_loss's metrics that are not means over 'loss/tokens'
# (metrics.Metrics.token_means): an extreme, or a mean over the count of another key
COMBINE = {**EXTREMES, **{f"loss/clip_frac_{p}": f"loss/tokens_{p}" for p in THIRDS}}


# ------------------------------------ the default path: advantages (one per rollout)

def group_ids(rollouts) -> Tensor:
    """The GRPO group key [B]: a rollout's group is its prompt_id, so the completions of one prompt
    generated in one step are one group (a step never generates a prompt twice: flags.check_sizes;
    replay keeps each rollout's advantage from its own group). Takes any records with a
    .prompt_id (rollout.Rollout)."""
    return torch.tensor([r.prompt_id for r in rollouts])


def flat_groups(rewards: Tensor, group_ids: Tensor) -> Tensor:
    """The one "flat group" rule, bool [B]: True where the rollout's group is zero-variance, a group
    of k >= 2 whose rewards are all equal (max == min), so that every advantage in it is exactly 0
    and it carries no signal. A group of one is not flat (its advantage is r / (1 + eps))."""
    return _group_stats(rewards, group_ids)[2]


def _group_stats(rewards: Tensor, group_ids: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Per rollout: its group's mean, Bessel std (divisor k-1) and whether the group is
    zero-variance.

    Conventions of ../shared/golden/README.md: a group of one has mean 0 and std 1; a zero-variance
    group is one of k >= 2 rollouts whose rewards are all equal (max == min, so rounding in the mean
    cannot hide it).
    """
    # [B] group index 0..n_groups-1
    _, inv = torch.unique(group_ids, return_inverse=True)
    n_groups = int(inv.max()) + 1
    r = rewards
    zeros = torch.zeros(n_groups, dtype=r.dtype, device=r.device)
    count = zeros.index_add(0, inv, torch.ones_like(r))                        # [n_groups]
    mean = zeros.index_add(0, inv, r) / count                                  # [n_groups]
    var = zeros.index_add(0, inv, (r - mean[inv]) ** 2) / (count - 1).clamp(min=1)
    hi = zeros.scatter_reduce(0, inv, r, "amax", include_self=False)
    lo = zeros.scatter_reduce(0, inv, r, "amin", include_self=False)
    single = count == 1
    mean = torch.where(single, 0.0, mean)
    std = torch.where(single, 1.0, var.sqrt())
    constant = (hi == lo) & ~single
    return mean[inv], std[inv], constant[inv]                                  # [B] each


def grpo_advantages(rewards: Tensor, group_ids: Tensor, eps: float = 1e-6) -> Tensor:
    """GRPO outcome advantage (DeepSeekMath, arXiv 2402.03300, sec. 4.1.2), one per rollout:

        A_i = (r_i - mean_g(r)) / (std_g(r) + eps),
        std with Bessel's correction (divisor k-1), eps = 1e-6

    A group of one gets mean 0, std 1 (A = r / (1 + eps)); a zero-variance group gets exactly 0.
    rewards [B] float, group_ids [B] int (any values; equal id = same group). Returns [B].
    """
    mean, std, constant = _group_stats(rewards, group_ids)
    adv = (rewards - mean) / (std + eps)                                       # [B]
    return torch.where(constant, 0.0, adv)



# ------------------------------------ log-probs from logits

def _as_float(logits: Tensor, temperature: float) -> Tensor:
    """logits / temperature in at least float32; a new tensor only when a cast or a division is
    needed."""
    x = logits if logits.dtype in (torch.float32, torch.float64) else logits.float()
    return x if temperature == 1.0 else x / temperature


# logits per slab of whole sequences (64 MB in fp32): bounds the reductions' transients
SLAB_LOGITS = 2 ** 24


def _slabs(logits: Tensor) -> list[slice]:
    """Row slices of logits [B, T, V], each at most SLAB_LOGITS elements (and at least one
    sequence): a real model's sequence (T x V ~ 10^8) is a slab of one, the built-in model's 256
    rows one slab (one op instead of 256)."""
    per = max(1, SLAB_LOGITS // max(1, logits[0].numel()))
    return [slice(i, i + per) for i in range(0, len(logits), per)]


def token_logprobs(logits: Tensor, ids: Tensor, temperature: float = 1.0) -> Tensor:
    """log pi(y_t | y_<t) = z_t[y_t] - logsumexp_v z_t[v], z = logits / temperature.
    logits [B, T, V], ids [B, T].

    A slab of sequences at a time (_slabs), so the transient of logsumexp is at most one slab; with
    temperature 1 and float32 logits no [B, T, V] copy is made at all, otherwise autograd keeps
    exactly one (the scaled logits). Returns [B, T].
    """
    out = []
    for s in _slabs(logits):
        z = _as_float(logits[s], temperature)                                  # [b, T, V]
        out.append(z.gather(-1, ids[s, :, None])[..., 0] - z.logsumexp(-1))    # [b, T]
    return torch.cat(out)                                                      # [B, T]



# ------------------------------------ the token ratio and the clipped surrogate

def token_log_ratio(logp: Tensor, old_logp: Tensor, mask: Tensor) -> Tensor:
    """PPO/GRPO token ratio (arXiv 2402.03300, eq. 3): log rho_t = logp_t - old_logp_t, clamped to
    [-20, 20] before exp() as verl does. 0 on invalid tokens (ratio 1, no gradient). [B, T]."""
    return torch.where(mask.bool(), (logp - old_logp).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP), 0.0)


def policy_loss(log_ratio: Tensor, adv: Tensor, mask: Tensor, *, eps_low: float, eps_high: float,
                dual_clip: float | None = None, agg: str = "token-mean", normaliser: float,
                token_weight: Tensor | None = None) -> tuple[Tensor, dict]:
    """Clipped surrogate (PPO; GRPO eq. 3; DAPO clip-higher; dual-clip arXiv 1912.09729),
    to minimise:

        l_t  = max(-A w_t, -A clip(w_t, 1 - eps_low, 1 + eps_high))        w_t = exp(log_ratio_t)
        l_t  = min(l_t, -A c)                    for A < 0 when dual_clip = c (c > 1)
        l_t *= token_weight_t                    (TIS weight, when given)
        L    = aggregate(l, mask, agg, normaliser)
    Symmetric PPO: eps_low = eps_high (0.2). Clip-higher (DAPO): 0.2 / 0.28. mu-GRPO's relaxed
    range [0, 5]: eps_low = 1, eps_high = 4. GSPO (verl): no dual-clip, agg seq-mean-token-mean.
    adv [B] or [B, T].

    Metrics (0-dim detached tensors), each a mean over this call's valid tokens, plus 'loss/tokens'
    (their count); callers combine micro-batches and ranks as token-weighted means, ratio/min and
    ratio/max as extremes, the per-third fractions over their own counts (COMBINE):
      loss/clip_frac       the clipped branch is strictly larger (no gradient): verl's pg_clipfrac
      loss/clip_frac_low   ... and A < 0 (w < 1 - eps_low)
      loss/clip_frac_high  ... and A > 0 (w > 1 + eps_high)
      loss/dual_clip_frac  A < 0 and the dual-clip cap is active: verl's pg_clipfrac_lower
      loss/clip_frac_first, _middle, _last   loss/clip_frac over the first, middle and last
                           third of each response's valid tokens, each with its count
                           loss/tokens_first, ... (a mean over that count: COMBINE)
      ratio/min, ratio/mean, ratio/max   of w_t
      loss/ppo_kl          mean of -log_ratio: for token and GSPO ratios exactly
                           mean(old_logp - logp), verl's ppo_kl
    """
    if dual_clip is not None and dual_clip <= 1.0:
        raise ValueError(f"dual-clip c must be > 1, got {dual_clip}")
    adv = adv[:, None] if adv.dim() == 1 else adv                             # [B, 1] or [B, T]
    ratio = log_ratio.exp()                                                    # [B, T]
    surr = -adv * ratio
    surr_clip = -adv * ratio.clamp(1 - eps_low, 1 + eps_high)
    loss_mat = torch.maximum(surr, surr_clip)                                  # [B, T]
    clipped = surr_clip > surr
    dual = torch.zeros_like(clipped)
    if dual_clip is not None:
        cap = -adv * dual_clip
        dual = (adv < 0) & (loss_mat > cap)
        loss_mat = torch.where(adv < 0, torch.minimum(loss_mat, cap), loss_mat)
    if token_weight is not None:
        loss_mat = loss_mat * token_weight
    loss = aggregate(loss_mat, mask, agg, normaliser)
    return loss, _surrogate_metrics(log_ratio, ratio, adv, mask, clipped, dual)


@torch.no_grad()
def _surrogate_metrics(log_ratio, ratio, adv, mask, clipped, dual) -> dict:
    valid = mask.bool()
    n = valid.sum()

    def frac(b):
        return (b & valid).sum().to(ratio.dtype) / n.clamp(min=1)

    w = ratio[valid]
    empty = torch.tensor(float("nan"), dtype=ratio.dtype, device=ratio.device)
    return {
        "loss/clip_frac": frac(clipped),
        "loss/clip_frac_low": frac(clipped & (adv < 0)),
        "loss/clip_frac_high": frac(clipped & (adv > 0)),
        "loss/dual_clip_frac": frac(dual),
        "ratio/min": w.min() if w.numel() else empty,
        "ratio/mean": w.mean() if w.numel() else empty,
        "ratio/max": w.max() if w.numel() else empty,
        "loss/ppo_kl": -log_ratio.detach()[valid].sum() / n.clamp(min=1),
        "loss/tokens": n,
        **_clip_by_third(clipped, valid),
    }


def _clip_by_third(clipped: Tensor, valid: Tensor) -> dict:
    """Clip fraction by position: token t (0-based among its row's n valid tokens) is in third
    floor(3 t / n) (n = 2: first, middle; n = 1: first):

        loss/clip_frac_<third> = #(clipped and in the third) / #(in the third)
        loss/tokens_<third>    = #(in the third)
    The fraction is a mean over its third's tokens: COMBINE tells callers to weight it by that
    count, so micro-batches and ranks combine to sum(clipped) / sum(tokens) of the third."""
    pos = valid.long().cumsum(-1) - 1                                          # [B, T]
    n = valid.sum(-1, keepdim=True).clamp(min=1)                               # [B, 1]
    third = torch.div(3 * pos, n, rounding_mode="floor")                       # [B, T] in 0, 1, 2
    out = {}
    for k, name in enumerate(THIRDS):
        inside = valid & (third == k)
        count = inside.sum()
        out[f"loss/clip_frac_{name}"] = (clipped & inside).sum().double() / count.clamp(min=1)
        out[f"loss/tokens_{name}"] = count
    return out



# ------------------------------------ aggregation: one table of modes

def _token_sum(masked: Tensor, valid: Tensor) -> Tensor:
    return masked.sum()


def _row_mean_sum(masked: Tensor, valid: Tensor) -> Tensor:
    # sum of per-response means
    return (masked.sum(-1) / valid.sum(-1).clamp(min=1)).sum()


def _n_tokens(valid: Tensor, max_len: int) -> int:
    return int(valid.sum())


def _n_rows(valid: Tensor, max_len: int) -> int:
    return int(valid.any(-1).sum())


def _n_rows_x_len(valid: Tensor, max_len: int) -> int:
    return int(valid.any(-1).sum()) * max_len


# mode -> (numerator of aggregate(), N of loss_normaliser());
# the equations are in aggregate()'s docstring
AGGREGATIONS = {
    "token-mean": (_token_sum, _n_tokens),
    "seq-mean-token-mean": (_row_mean_sum, _n_rows),
    "seq-mean-token-sum": (_token_sum, _n_rows),
    "seq-mean-token-sum-norm": (_token_sum, _n_rows_x_len),
}
AGG_MODES = tuple(AGGREGATIONS)


def loss_normaliser(mask: Tensor, agg: str, max_len: int | None = None, floor: int = 1) -> float:
    """N of aggregate() for this step's whole mask [B, T] (all micro-batches; all-reduce SUM it
    across ranks):

        token-mean               N = sum_it m_it                      (valid tokens)
        seq-mean-token-mean      N = #{i : sum_t m_it > 0}            (non-empty responses)
        seq-mean-token-sum       N = #{i : sum_t m_it > 0}
        seq-mean-token-sum-norm  N = #{i : sum_t m_it > 0} * L_max
                                 (Dr. GRPO; L_max = max_len, default T)
    At least `floor`: an empty step gets N = 1, so its loss is an exact 0 rather than NaN. Every N
    is a count, so the N of several micro-batches or ranks is the sum of theirs (pass floor=0,
    floor the sum once).
    """
    if agg not in AGGREGATIONS:
        raise ValueError(f"agg must be one of {AGG_MODES}, got {agg!r}")
    n = AGGREGATIONS[agg][1](mask.bool(), mask.shape[-1] if max_len is None else max_len)
    return float(max(n, floor))


def aggregate(loss_mat: Tensor, mask: Tensor, agg: str, normaliser: float) -> Tensor:
    """Reduce a per-token loss [B, T] to a scalar with N = loss_normaliser(whole step), so that the
    sum over micro-batches equals the whole step's value whatever the micro-batching or world size:

        token-mean               L = (1/N) sum_i sum_t m_it l_it            (DAPO token-level loss)
        seq-mean-token-mean      L = (1/N) sum_i (1/|o_i|) sum_t m_it l_it  (GRPO, eq. 3)
        seq-mean-token-sum       L = (1/N) sum_i sum_t m_it l_it
        seq-mean-token-sum-norm  L = (1/N) sum_i sum_t m_it l_it, N = G * L_max
                                 (Dr. GRPO: (1/G) sum_i (1/L_max) sum_t)
    |o_i| = sum_t m_it; empty rows contribute 0. Three modes share the numerator and differ only
    in N.
    """
    if agg not in AGGREGATIONS:
        raise ValueError(f"agg must be one of {AGG_MODES}, got {agg!r}")
    valid = mask.bool()
    # [B, T]; where, not *: pads may be inf
    masked = torch.where(valid, loss_mat, 0.0)
    return AGGREGATIONS[agg][0](masked, valid) / normaliser


# ------------------------------------ variants: Dr. GRPO's advantage

def drgrpo_advantages(rewards: Tensor, group_ids: Tensor) -> Tensor:
    """Dr. GRPO advantage (arXiv 2503.20783, "GRPO Done Right"): A_i = r_i - mean_g(r), no std
    division.

    Same group conventions as grpo_advantages (a group of one: A = r; zero variance: exactly 0).
    Returns [B].
    """
    mean, _, constant = _group_stats(rewards, group_ids)
    return torch.where(constant, 0.0, rewards - mean)                          # [B]


# ------------------------------------ variants: sequence and prefix ratios (GSPO, PNPO)

def gspo_log_ratio(logp: Tensor, old_logp: Tensor, mask: Tensor) -> Tensor:
    """GSPO sequence ratio with token-wise gradient (arXiv 2507.18071: s_i, and the GSPO-token
    variant):

        log s_i  = (1/|y_i|) sum_{valid t} (logp_it - old_logp_it)
        log w_it = logp_it - sg(logp_it) + sg(log s_i),  capped above at 10 (verl)
    Its value is log s_i on every valid token; its gradient is grad logp_it. 0 on invalid tokens.
    [B, T].
    """
    valid = mask.bool()
    log_s = torch.where(valid, logp - old_logp, 0.0).sum(-1) / valid.sum(-1).clamp(min=1)  # [B]
    log_w = logp - logp.detach() + log_s.detach()[:, None]                                  # [B, T]
    return torch.where(valid, log_w.clamp(max=GSPO_LOG_RATIO_MAX), 0.0)


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
    log_w = log_w.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
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


PREFIX_RATIOS = ("pnpo", "pnpo-geo", "cumulative")       # the ones --pnpo-grad applies to


def log_ratio(kind: str, logp: Tensor, old_logp: Tensor, mask: Tensor,
              pnpo_grad: str = "detached") -> Tensor:
    """RATIOS[kind](logp, old_logp, mask), with PNPO's gradient reading passed to the prefix
    ratios (PREFIX_RATIOS). [B, T]."""
    if kind in PREFIX_RATIOS:
        return RATIOS[kind](logp, old_logp, mask, grad=pnpo_grad)
    return RATIOS[kind](logp, old_logp, mask)


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


GSPO_DIFF_TOL = 0.1          # a weight 10% away from GSPO's counts as a different term


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
    log_s = gspo_log_ratio(logp, old_logp, mask)                               # [B, T]

    low = math.log1p(-eps_low) if eps_low < 1 else -math.inf     # eps_low = 1: no lower clip

    def clipped(lw):                                                           # [B, T]
        return ((adv > 0) & (lw > math.log1p(eps_high))) | ((adv < 0) & (lw < low))

    a, b = clipped(log_w.detach()), clipped(log_s)
    apart = (log_w.detach() - log_s).abs() > math.log1p(tol)
    differs = valid & (adv != 0) & ((a != b) | (~a & ~b & apart))
    return differs.sum().double() / valid.sum().clamp(min=1)



# ------------------------------------ variants: the mu-GRPO negative-advantage veto

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



# ------------------------------------ variants: M2PO's second-moment mask

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



# ------------------------------------ variants: KL to a reference, truncated importance sampling

def _k1(d: Tensor) -> Tensor:
    return d


def _abs(d: Tensor) -> Tensor:
    return d.abs()


def _k2(d: Tensor) -> Tensor:
    return 0.5 * d.square()


def _k3(d: Tensor) -> Tensor:
    d = d.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return (torch.exp(-d) + d - 1).clamp(-10.0, 10.0)


KL_ESTIMATORS = {"k1": _k1, "abs": _abs, "k2": _k2, "k3": _k3}


def kl_penalty(logp: Tensor, ref_logp: Tensor, estimator: str = "k3") -> Tensor:
    """Per-token estimate of KL(pi || pi_ref) (Schulman, "Approximating KL divergence", 2020),
    d = logp - ref_logp:

        k1 = d,  abs = |d|,  k2 = d^2 / 2,  k3 = exp(-d') + d' - 1 with d' = clamp(d, -20, 20),
                                            clamped to [-10, 10]
    k3 is DeepSeekMath's eq. 4 (verl's low_var_kl). Not masked: aggregate it with the loss mask.
    [B, T].
    """
    if estimator not in KL_ESTIMATORS:
        raise ValueError(f"KL estimator must be one of {tuple(KL_ESTIMATORS)}, got {estimator!r}")
    return KL_ESTIMATORS[estimator](logp - ref_logp)


@torch.no_grad()
def tis_weight(old_logp_trainer: Tensor, engine_logp: Tensor, cap: float) -> Tensor:
    """Truncated importance sampling for the engine/trainer mismatch (Yao et al., "Your efficient
    RL framework secretly brings you off-policy RL training", 2025):
    w_t = min(pi_trainer_old / pi_engine, C), detached. [B, T]."""
    if cap <= 0:
        raise ValueError(f"TIS cap must be > 0, got {cap}")
    return torch.exp((old_logp_trainer - engine_logp).clamp(max=math.log(cap)))



# ------------------------------------ variants: DAPO's extras

def zero_std_fraction(rewards: Tensor, group_ids: Tensor) -> float:
    """Share of groups (not rollouts) with zero variance, i.e. whose advantages are all
    exactly 0."""
    _, inv = torch.unique(group_ids, return_inverse=True)
    per_group = torch.zeros(int(inv.max()) + 1, dtype=torch.bool, device=rewards.device)
    per_group[inv] = flat_groups(rewards, group_ids)
    return per_group.float().mean().item()


def dynamic_sampling_keep(rewards: Tensor, group_ids: Tensor) -> Tensor:
    """DAPO dynamic sampling (arXiv 2503.14476, 'Dynamic Sampling': keep groups with
    0 < |{correct}| < G) as a bool [B]: True for rollouts whose group has non-zero variance.
    Groups of one are kept (their advantage is not 0)."""
    return ~flat_groups(rewards, group_ids)


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



# ------------------------------------ logged only: entropy, masked means

def entropy_from_logits(logits: Tensor, temperature: float = 1.0) -> Tensor:
    """H_t = logsumexp(z_t) - sum_v softmax(z_t)_v z_t[v], z = logits / temperature, the
    full-vocabulary entropy of the sampling distribution. logits [B, T, V]. Returns [B, T]. Wrap in
    torch.no_grad() when it is only logged."""
    out = []
    for s in _slabs(logits):                                                   # as token_logprobs
        z = _as_float(logits[s], temperature)                                  # [b, T, V]
        out.append(z.logsumexp(-1) - (z.softmax(-1) * z).sum(-1))              # [b, T]
    return torch.cat(out)                                                      # [B, T]


def masked_mean(x: Tensor, mask: Tensor) -> Tensor:
    """sum over valid tokens of x / number of valid tokens (0 for an empty mask). For logged means
    (entropy, KL)."""
    valid = mask.bool()
    return torch.where(valid, x, 0.0).sum() / valid.sum().clamp(min=1)



# ------------------------------------ the tables the flags choose from

ADVANTAGES = {"grpo": grpo_advantages, "drgrpo": drgrpo_advantages}
RATIOS = {"token": token_log_ratio, "gspo": gspo_log_ratio, "pnpo": pnpo_log_ratio,
          "pnpo-geo": pnpo_geo_log_ratio, "cumulative": cumulative_log_ratio}


if __name__ == "__main__":
    g = torch.Generator().manual_seed(0)
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0])
    groups = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    adv = grpo_advantages(rewards, groups)
    print("rewards", rewards.tolist(), "groups", groups.tolist())
    print("GRPO advantages", [round(a, 4) for a in adv.tolist()],
          "zero-std groups", zero_std_fraction(rewards, groups))
    old = -torch.rand(8, 12, generator=g) * 3
    logp = (old + 0.3 * torch.randn(8, 12, generator=g)).requires_grad_()
    mask = torch.arange(12)[None, :] < torch.randint(4, 13, (8, 1), generator=g)
    for name, fn in RATIOS.items():
        loss, m = policy_loss(fn(logp, old, mask), adv, mask, eps_low=0.2, eps_high=0.28,
                              dual_clip=3.0, normaliser=loss_normaliser(mask, "token-mean"))
        print(f"{name:6s} loss {loss.item():+.4f}  clip_frac {float(m['loss/clip_frac']):.3f}")
