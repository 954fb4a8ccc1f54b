"""GRPO's objective as pure tensor functions: group advantages, log-probs, the token ratio, the
clipped surrogate (asymmetric clip, dual-clip), the loss aggregations and their normaliser, KL
estimators, truncated importance sampling (TIS), and what is logged (entropy, masked means).

    python grpo.py            # prints the advantages and the loss of a small random batch

No model, optimizer, torch.distributed or flags here: tensors and floats in, tensors (and a
metrics dict) out. GRPO is DeepSeekMath's (arXiv 2402.03300); the clip-higher range and the
token-level aggregation are DAPO's knobs (2503.14476) and dual-clip is arXiv 1912.09729, kept here
because every trainer has them. Checked against verl's core_algos.py (tests/test_golden.py: an
independent implementation's values, where the project's shared data holds them). Where we depart
from it, the docstring says so:
  * zero-variance groups get advantage exactly 0 (verl relies on r - mean rounding to 0);
  * seq-mean-token-sum-norm divides by (non-empty rows) * L_max as Dr. GRPO writes it (its G *
    L_max, with the whole step's rows for its G); verl divides by L_max only;
  * means never add verl's 1e-8 to their denominators (an empty step gets N = 1, an exact zero
    loss).

Shapes: B sequences, G group size, T completion tokens, V vocab. `mask` is the [B, T] completion
mask (bool or 0/1 float; EOS counts as a valid token). logits[:, t] is the distribution that
produced ids[:, t]: the caller shifts. Advantages are [B] (one per rollout) or [B, T].

One optimizer step, as train.py computes it (`micro_batch_loss`):
    adv = grpo_advantages(rewards, group_ids)       # [B], once, in the rollout's own fresh group
    N = loss_normaliser(mask of the whole step, agg)  # before any micro-batch; summed over ranks
    for each micro-batch:
        logp = token_logprobs(logits, ids, temperature)                      # [b, T], with grad
        loss, m = policy_loss(token_log_ratio(logp, old_logp, mask), adv, mask,
                              eps_low=..., eps_high=..., agg=..., normaliser=N)
        loss += kl_coef * aggregate(kl_penalty(logp, ref_logp), mask, agg, N)   # --kl-coef > 0
        loss.backward()                   # summed gradients == the whole step's gradient
FSDP averages gradients over ranks, so with N summed over ranks the caller multiplies each loss by
world_size. The other papers' ratios, masks and advantages are in methods/, each over these.
"""
import math

import torch
from torch import Tensor

# |log rho| cap before exp(), as verl: keeps exp() finite, not a trust region
LOG_RATIO_CLAMP = 20.0
# a completion's thirds by position (loss/clip_frac_first, ...), each a mean over its own tokens
THIRDS = ("first", "middle", "last")
# how callers combine policy_loss's metrics over micro-batches and ranks (metrics.Metrics.add): a
# mean over the loss tokens (the count loss/tokens, which the caller hands in as tokens=), the
# ratio's extremes over the parts with a token (a mean of none is NaN), each third's clip fraction
# a mean over its own count
COMBINE = {**dict.fromkeys(("loss/clip_frac", "loss/clip_frac_low", "loss/clip_frac_high",
                            "loss/dual_clip_frac", "ratio/mean", "loss/ppo_kl"), "mean tokens"),
           "ratio/min": "min tokens", "ratio/max": "max tokens", "loss/tokens": "sum",
           **{f"loss/clip_frac_{p}": f"mean loss/tokens_{p}" for p in THIRDS},
           **{f"loss/tokens_{p}": "weight" for p in THIRDS}}


# ------------------------------------ the default path: advantages (one per rollout)

def group_ids(rollouts) -> Tensor:
    """The GRPO group key [B]: a rollout's group is its prompt_id, so the completions of one prompt
    generated in one step are one group (a step never generates a prompt twice: memory.check_sizes;
    replay keeps each rollout's advantage from its own group). Takes any records with a
    .prompt_id (rollout.Rollout)."""
    return torch.tensor([r.prompt_id for r in rollouts])


def flat_groups(rewards: Tensor, group_ids: Tensor) -> Tensor:
    """The one "flat group" rule, bool [B]: True where the rollout's group is zero-variance, a group
    of k >= 2 whose rewards are all equal (max == min), so that every advantage in it is exactly 0
    and it carries no signal. A group of one is not flat (its advantage is r / (1 + eps))."""
    return group_stats(rewards, group_ids)[2]


def group_stats(rewards: Tensor, group_ids: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Per rollout: its group's mean, Bessel std (divisor k-1) and whether the group is
    zero-variance.

    The golden values' conventions (tests/test_golden.py): a group of one has mean 0 and std 1; a
    zero-variance group is one of k >= 2 rollouts whose rewards are all equal (max == min, so
    rounding in the mean cannot hide it).
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
    mean, std, constant = group_stats(rewards, group_ids)
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
    """Clipped surrogate (PPO; GRPO eq. 3; clip-higher; dual-clip arXiv 1912.09729),
    to minimise:

        l_t  = max(-A w_t, -A clip(w_t, 1 - eps_low, 1 + eps_high))        w_t = exp(log_ratio_t)
        l_t  = min(l_t, -A c)                    for A < 0 when dual_clip = c (c > 1)
        l_t *= token_weight_t                    (TIS weight, when given)
        L    = aggregate(l, mask, agg, normaliser)
    Symmetric PPO: eps_low = eps_high (0.2). Clip-higher: 0.2 / 0.28 (the default).
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
      loss/ppo_kl          mean of -log_ratio: for the token ratio exactly mean(old_logp - logp),
                           verl's ppo_kl
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

    # masked reductions, not ratio[valid]: a boolean index waits for the device (its size), and
    # the update reads no number before the optimizer step (metrics.Metrics)
    inf = torch.tensor(float("inf"), dtype=ratio.dtype, device=ratio.device)
    nan = torch.tensor(float("nan"), dtype=ratio.dtype, device=ratio.device)
    some = n > 0                                                    # a mean of no token is NaN
    return {
        "loss/clip_frac": frac(clipped),
        "loss/clip_frac_low": frac(clipped & (adv < 0)),
        "loss/clip_frac_high": frac(clipped & (adv > 0)),
        "loss/dual_clip_frac": frac(dual),
        "ratio/min": torch.where(some, torch.where(valid, ratio, inf).amin(), nan),
        "ratio/mean": torch.where(some, torch.where(valid, ratio, 0.0).sum() / n, nan),
        "ratio/max": torch.where(some, torch.where(valid, ratio, -inf).amax(), nan),
        "loss/ppo_kl": -torch.where(valid, log_ratio.detach(), 0.0).sum() / n.clamp(min=1),
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

        token-mean               L = (1/N) sum_i sum_t m_it l_it            (token-level)
        seq-mean-token-mean      L = (1/N) sum_i (1/|o_i|) sum_t m_it l_it  (GRPO, eq. 3)
        seq-mean-token-sum       L = (1/N) sum_i sum_t m_it l_it
        seq-mean-token-sum-norm  L = (1/N) sum_i sum_t m_it l_it, N = #{non-empty rows} * L_max
                                 (Dr. GRPO: (1/G) sum_i (1/L_max) sum_t, its G the rows)
    |o_i| = sum_t m_it; empty rows contribute 0. Three modes share the numerator and differ only
    in N.
    """
    if agg not in AGGREGATIONS:
        raise ValueError(f"agg must be one of {AGG_MODES}, got {agg!r}")
    valid = mask.bool()
    # [B, T]; where, not *: pads may be inf
    masked = torch.where(valid, loss_mat, 0.0)
    return AGGREGATIONS[agg][0](masked, valid) / normaliser


# ------------------------------------ KL to a reference, truncated importance sampling

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


if __name__ == "__main__":
    g = torch.Generator().manual_seed(0)
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0])
    groups = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    adv = grpo_advantages(rewards, groups)
    print("rewards", rewards.tolist(), "groups", groups.tolist())
    flat = groups[flat_groups(rewards, groups)].unique()       # the groups whose A are all 0
    print("GRPO advantages", [round(a, 4) for a in adv.tolist()],
          "zero-std groups", flat.tolist())
    old = -torch.rand(8, 12, generator=g) * 3
    logp = (old + 0.3 * torch.randn(8, 12, generator=g)).requires_grad_()
    mask = torch.arange(12)[None, :] < torch.randint(4, 13, (8, 1), generator=g)
    loss, m = policy_loss(token_log_ratio(logp, old, mask), adv, mask, eps_low=0.2, eps_high=0.28,
                          dual_clip=3.0, normaliser=loss_normaliser(mask, "token-mean"))
    print(f"loss {loss.item():+.4f}  clip_frac {float(m['loss/clip_frac']):.3f}")
