"""grpo.py by hand (tier a) and against naive per-token loops (tier b), with the ratios, advantages
and masks of the methods built over it (methods/: drgrpo, gspo, pnpo, mu_grpo, dapo). Golden
numbers from verl: test_golden.py."""
import math

import pytest
import torch

import grpo
import metrics as metrics_lib
from methods import dapo, drgrpo, gspo, mu_grpo, pnpo

EPS = 1e-6
# every importance weight: the spine's token ratio, GSPO's and PNPO's three prefix ratios
RATIOS = {"token": grpo.token_log_ratio, "gspo": gspo.gspo_log_ratio, **pnpo.RATIOS}


def rand_batch(B=6, T=10, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(B, T, generator=g, dtype=dtype) * 3
    logp = old + 0.5 * torch.randn(B, T, generator=g, dtype=dtype)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    lengths[1] = 0                                                              # one empty row
    mask = torch.arange(T)[None, :] < lengths[:, None]
    adv = torch.randn(B, generator=g, dtype=dtype)
    return logp, old, mask, adv


# ---------------------------------------------------------------- advantages

REWARDS = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.5, 2.0, 0.0, 1.0],
                       dtype=torch.float64)
GROUPS = torch.tensor([5, 5, 5, 5, 2, 2, 2, 2, 9, 4, 4, 4])           # unsorted, non-contiguous ids


def test_grpo_advantages_by_hand():
    s5 = math.sqrt((4 * 0.25) / 3)                                      # Bessel std of [1, 0, 0, 1]
    a = 0.5 / (s5 + EPS)
    expected = [a, -a, -a, a, 0, 0, 0, 0, 0.5 / (1 + EPS), 1 / (1 + EPS), -1 / (1 + EPS), 0]
    got = grpo.grpo_advantages(REWARDS, GROUPS)
    torch.testing.assert_close(got, torch.tensor(expected, dtype=torch.float64),
                               rtol=1e-12, atol=1e-12)
    assert (got[4:8] == 0).all()                                        # zero variance: exactly 0


def test_drgrpo_advantages_by_hand():
    expected = [0.5, -0.5, -0.5, 0.5, 0, 0, 0, 0, 0.5, 1, -1, 0]    # group of one: mean 0, so A = r
    torch.testing.assert_close(drgrpo.drgrpo_advantages(REWARDS, GROUPS),
                               torch.tensor(expected, dtype=torch.float64))


def test_zero_variance_is_exact_even_when_the_mean_rounds():
    r = torch.full((7,), 0.7, dtype=torch.float32)               # mean of 0.7f x 7 need not be 0.7f
    ids = torch.zeros(7, dtype=torch.long)
    assert (grpo.grpo_advantages(r, ids) == 0).all()
    assert (drgrpo.drgrpo_advantages(r, ids) == 0).all()


def test_zero_std_fraction_and_dynamic_sampling():
    flat = GROUPS[grpo.flat_groups(REWARDS, GROUPS)].unique()
    assert flat.tolist() == [2]                                   # group 2 of {5, 2, 9, 4}: flat
    keep = dapo.dynamic_sampling_keep(REWARDS, GROUPS)
    assert keep.tolist() == [True] * 4 + [False] * 4 + [True] * 4


# ---------------------------------------------------------------- log-probs, entropy

@pytest.mark.paths
@pytest.mark.parametrize("slab", [None, 2 * 5 * 11, 1])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_token_logprobs_and_entropy(temperature, slab, monkeypatch):
    """Also in slabs: of 2 sequences (3 rows -> slabs of 2 and 1) and of less than one sequence (one
    row each). assert_close's float32 tolerance (rtol 1.3e-6, atol 1e-5): a slab is the same rows
    through kernels of another shape, which may sum in another order (a few ulps)."""
    if slab is not None:
        monkeypatch.setattr(grpo, "SLAB_LOGITS", slab)
        assert len(grpo._slabs(torch.zeros(3, 5, 11))) == (2 if slab > 1 else 3)
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(3, 5, 11, generator=g)
    ids = torch.randint(0, 11, (3, 5), generator=g)
    logp_all = (logits / temperature).log_softmax(-1)
    expected = logp_all.gather(-1, ids[..., None])[..., 0]
    torch.testing.assert_close(grpo.token_logprobs(logits, ids, temperature), expected)
    torch.testing.assert_close(grpo.entropy_from_logits(logits, temperature),
                               -(logp_all.exp() * logp_all).sum(-1))
    half = grpo.token_logprobs(logits.bfloat16(), ids, temperature)            # computed in float32
    assert half.dtype == torch.float32


def test_token_logprobs_gradient():
    logits = torch.randn(2, 4, 7, dtype=torch.float64, requires_grad=True)
    ids = torch.randint(0, 7, (2, 4))
    torch.autograd.gradcheck(lambda x: grpo.token_logprobs(x, ids, 0.8), (logits,))


# ---------------------------------------------------------------- importance weights

def test_gspo_value_and_tokenwise_gradient():
    logp, old, mask, _ = rand_batch()
    log_w = gspo.gspo_log_ratio(logp, old, mask)
    for i in range(logp.shape[0]):
        n = int(mask[i].sum())
        log_s = sum(float(logp[i, t] - old[i, t]) for t in range(n)) / max(n, 1)
        assert torch.allclose(log_w[i, :n], torch.full((n,), log_s, dtype=logp.dtype))
        assert (log_w[i, n:] == 0).all()
    # [B, T, B, T]
    jac = torch.autograd.functional.jacobian(lambda x: gspo.gspo_log_ratio(x, old, mask), logp)
    B, T = logp.shape
    # d log w_it / d logp_js
    token_wise = torch.einsum("ij,ts->itjs", torch.eye(B), torch.eye(T)).to(logp.dtype)
    torch.testing.assert_close(jac, token_wise * mask[:, :, None, None])


def test_pnpo_properties():
    logp, old, mask, _ = rand_batch(seed=3)
    # a hole: t counts valid tokens only
    mask[0, 3] = False
    log_w = pnpo.pnpo_log_ratio(logp, old, mask)
    token, seq = grpo.token_log_ratio(logp, old, mask), gspo.gspo_log_ratio(logp, old, mask)
    for i in range(logp.shape[0]):
        valid = mask[i].nonzero().flatten().tolist()
        if not valid:
            assert (log_w[i] == 0).all()
            continue
        assert torch.allclose(log_w[i, valid[0]], token[i, valid[0]])   # t = 1: the token ratio
        assert torch.allclose(log_w[i, valid[-1]], seq[i, valid[-1]])  # last valid: GSPO's s_i
        for k, t in enumerate(valid):                                   # the definition, by loop
            mean = sum(float(logp[i, s] - old[i, s]) for s in valid[: k + 1]) / (k + 1)
            assert math.isclose(float(log_w[i, t]), mean, rel_tol=1e-12, abs_tol=1e-12)


def test_pnpo_full_gradient_is_analytic():
    """--pnpo-grad full: d w_it / d logp_is = w_it * (1/n_it) * [s <= t, s valid]: the chain rule
    through a model then gives grad w_it = w_it (1/t) sum_{s<=t} grad log pi_s, checked with a tiny
    model's parameters too."""
    logp, old, mask, _ = rand_batch(seed=4)
    mask[2, 1] = False
    w = lambda x: pnpo.pnpo_log_ratio(x, old, mask, grad="full").exp()           # noqa: E731
    jac = torch.autograd.functional.jacobian(w, logp)                           # [B, T, B, T]
    B, T = logp.shape
    n = mask.cumsum(-1).clamp(min=1)
    analytic = torch.zeros(B, T, B, T, dtype=logp.dtype)
    wv = w(logp)
    for i in range(B):
        for t in range(T):
            if mask[i, t]:
                for s in range(t + 1):
                    if mask[i, s]:
                        analytic[i, t, i, s] = wv[i, t] / n[i, t]
    torch.testing.assert_close(jac, analytic)
    # through a model's parameters:
    # grad_theta w_t = w_t (1/n_t) sum_{s <= t, valid} grad_theta log pi_s
    model, ids, m0 = tiny_policy(seed=7), torch.randint(0, 13, (1, T)), mask[2:3]
    params = list(model.parameters())
    flat_grad = lambda y: torch.cat([g.flatten()  # noqa
                                     for g in torch.autograd.grad(y, params, retain_graph=True)])
    lp = grpo.token_logprobs(model(ids), ids)                                   # [1, T]
    old0 = lp.detach() + 0.3 * torch.randn(1, T, dtype=lp.dtype)
    w0 = pnpo.pnpo_log_ratio(lp, old0, m0, grad="full").exp()[0]               # [T]
    grad_logp = [flat_grad(lp[0, s]) for s in range(T)]
    n0 = m0[0].cumsum(0)
    for t in range(T):
        if m0[0, t]:
            expected = w0[t] / n0[t] * sum(grad_logp[s] for s in range(t + 1) if m0[0, s])
            torch.testing.assert_close(flat_grad(w0[t]), expected.detach())


def test_pnpo_detached_gradient_is_token_wise():
    """--pnpo-grad detached (the default): w_it = sg[w_it] pi_it / sg[pi_it], so
    d w_it / d logp_js = w_it [i=j, s=t]; the value is still the prefix geometric mean."""
    logp, old, mask, _ = rand_batch(seed=5)
    mask[3, 2] = False
    full, det = (pnpo.pnpo_log_ratio(logp, old, mask, grad=g) for g in ("full", "detached"))
    torch.testing.assert_close(det, full)                                       # same value
    w = lambda x: pnpo.pnpo_log_ratio(x, old, mask, grad="detached").exp()      # noqa: E731
    jac = torch.autograd.functional.jacobian(w, logp)                           # [B, T, B, T]
    B, T = logp.shape
    eye = torch.einsum("ij,ts->itjs", torch.eye(B), torch.eye(T)).to(logp.dtype)
    torch.testing.assert_close(jac, eye * (w(logp) * mask)[:, :, None, None])


@pytest.mark.parametrize("grad, first_token_weight",
                         [("detached", 1.0), ("full", sum(1 / t for t in range(1, 9)))])
def test_pnpo_on_policy(grad, first_token_weight):
    """On-policy (old = logp, every ratio 1), T = 8, token-sum loss -A sum_t w_t with A = 1: token s
    gets gradient -sum_{t >= s} 1/t under "full" (2.72 for s = 1, by hand:
    1 + 1/2 + ... + 1/8 = 2.7179) and exactly GRPO's -1 under "detached"."""
    logp = torch.randn(1, 8, dtype=torch.float64, requires_grad=True)
    mask = torch.ones(1, 8, dtype=torch.bool)
    loss = -pnpo.pnpo_log_ratio(logp, logp.detach(), mask, grad=grad).exp().sum()
    loss.backward()
    expected = ([-sum(1 / t for t in range(s, 9)) for s in range(1, 9)] if grad == "full"
                else [-1.0] * 8)
    torch.testing.assert_close(logp.grad[0], torch.tensor(expected, dtype=torch.float64))
    assert (-logp.grad[0, 0].item() == pytest.approx(first_token_weight)
            and round(first_token_weight, 2) in (1, 2.72))
    # the same through policy_loss as the trainer calls it: detached equals the token ratio exactly
    # on-policy
    if grad == "detached":
        lp = logp.detach().clone().requires_grad_()
        tok = lp.detach().clone().requires_grad_()
        kw = dict(eps_low=0.2, eps_high=0.28, normaliser=8.0)
        grpo.policy_loss(pnpo.RATIOS["pnpo"](lp, lp.detach(), mask), torch.ones(1), mask,
                         **kw)[0].backward()
        grpo.policy_loss(grpo.token_log_ratio(tok, tok.detach(), mask), torch.ones(1), mask,
                         **kw)[0].backward()
        torch.testing.assert_close(lp.grad, tok.grad)


def test_log_ratio_caps():
    """exp() never sees |log w| > 20 (10 above for GSPO, as verl); a capped token has no
    gradient."""
    logp = torch.tensor([[25.0, -30.0, 0.5]], requires_grad=True)
    old, mask = torch.zeros(1, 3), torch.ones(1, 3, dtype=torch.bool)
    lw = grpo.token_log_ratio(logp, old, mask)
    assert lw.tolist() == [[20.0, -20.0, 0.5]]
    lw.sum().backward()
    assert logp.grad.tolist() == [[0.0, 0.0, 1.0]]
    assert gspo.gspo_log_ratio(torch.full((1, 3), 40.0), old, mask).tolist() == [[10.0] * 3]
    # prefix means 50, 0, -16.7
    prefix = pnpo.pnpo_log_ratio(torch.tensor([[50.0, -50.0, -50.0]]), old, mask)
    torch.testing.assert_close(prefix, torch.tensor([[20.0, 0.0, -50 / 3]]))



def test_pnpo_geo_and_cumulative_on_hand_numbers():
    """Token log-ratios d = (0.3, -0.6, 0.9) with a masked hole before the last: the exact prefix
    ratio sums them, the pnpo-geo reading adds the token's d to the mean of the ones before it,
    PNPO averages all of the prefix. By hand:
        cumulative  0.3, -0.3, 0.6
        pnpo-geo    0.3, -0.6 + 0.3 = -0.3, 0.9 + (0.3 - 0.6) / 2 = 0.75
        pnpo        0.3, -0.15, 0.2"""
    old = torch.zeros(1, 4, dtype=torch.float64)
    logp = torch.tensor([[0.3, -0.6, 5.0, 0.9]], dtype=torch.float64)
    mask = torch.tensor([[True, True, False, True]])
    cases = {"cumulative": [0.3, -0.3, 0.0, 0.6], "pnpo-geo": [0.3, -0.3, 0.0, 0.75],
             "pnpo": [0.3, -0.15, 0.0, 0.2]}
    for kind, want in cases.items():
        got = pnpo.RATIOS[kind](logp, old, mask)
        torch.testing.assert_close(got, torch.tensor([want], dtype=torch.float64))
    # detached (the default): the gradient of w_t is w_t grad logp_t, token by token
    lp = logp.clone().requires_grad_(True)
    for kind in ("cumulative", "pnpo-geo"):
        w = pnpo.RATIOS[kind](lp, old, mask).exp()
        (jac,) = torch.autograd.grad(w.sum(), lp)
        torch.testing.assert_close(jac, torch.where(mask, w.detach(), 0.0))
    # full: pnpo-geo's last token also moves with the two before it, by w / 2 each
    w = pnpo.RATIOS["pnpo-geo"](lp, old, mask, grad="full")
    (jac,) = torch.autograd.grad(w[0, 3].exp(), lp)
    e = math.exp(0.75)
    torch.testing.assert_close(jac, torch.tensor([[e / 2, e / 2, 0.0, e]], dtype=torch.float64))
    # on-policy all three are GRPO's weight 1
    for kind in pnpo.RATIOS:
        assert (pnpo.RATIOS[kind](logp, logp, mask) == 0).all()


def test_far_prefix_fraction():
    """The share of valid tokens whose exact prefix ratio is beyond e^{+-1}: cumulative log ratios
    0.3, -0.3, (hole), 1.2 -> 1 of 3."""
    old = torch.zeros(1, 4)
    logp = torch.tensor([[0.3, -0.6, 5.0, 1.5]])
    mask = torch.tensor([[True, True, False, True]])
    assert math.isclose(float(pnpo.far_prefix_fraction(logp, old, mask)), 1 / 3)
    assert float(pnpo.far_prefix_fraction(logp, logp, mask)) == 0.0



def test_gspo_differs_fraction_hand_computed():
    """PNPO's prefix mean against GSPO's sequence mean, clip 0.2 / 0.2 (log bounds log 1.2 = 0.182,
    log 0.8 = -0.223), tol 10% (log 1.1 = 0.0953). Row 0, A = +1, log rho = 0.3, 0, -0.3, (pad):
    GSPO's log s = 0 on every token; PNPO's prefix means 0.3, 0.15, 0. Token 0: PNPO clipped (0.3 >
    0.182), GSPO not: differs. Token 1: neither clipped, |0.15 - 0| > 0.0953: differs. Token 2:
    equal. Row 1, A = -1, log rho = -0.3, 0, 0.3: prefix means -0.3 (clipped: < -0.223), -0.15
    (not, 0.15 apart), 0: 2 of 3 again. Row 2: the same ratios at A = 0: no term, equal. 4 of 9."""
    d = torch.tensor([[0.3, 0.0, -0.3, 9.0], [-0.3, 0.0, 0.3, 9.0], [0.3, 0.0, -0.3, 9.0]],
                     dtype=torch.float64)
    old = torch.zeros_like(d)
    mask = torch.tensor([[True, True, True, False]] * 3)
    adv = torch.tensor([1.0, -1.0, 0.0], dtype=torch.float64)
    log_w = pnpo.pnpo_log_ratio(d, old, mask)
    frac = pnpo.gspo_differs_fraction(log_w, d, old, adv, mask, 0.2, 0.2)
    assert math.isclose(float(frac), 4 / 9)
    # a 20% tolerance (log 1.2 = 0.182 > 0.15): only the clip decisions differ, 2 of 9
    frac = pnpo.gspo_differs_fraction(log_w, d, old, adv, mask, 0.2, 0.2, tol=0.2)
    assert math.isclose(float(frac), 2 / 9)
    # GSPO against itself: nothing differs; the relaxed range (eps_low 1: no lower clip) too
    seq = gspo.gspo_log_ratio(d, old, mask)
    assert float(pnpo.gspo_differs_fraction(seq, d, old, adv, mask, 0.2, 0.2)) == 0.0
    assert float(pnpo.gspo_differs_fraction(seq, d, old, adv, mask, 1.0, 4.0)) == 0.0

# ---------------------------------------------------------------- the veto

def test_veto_by_hand():
    rho = torch.tensor([[1.0, 0.9, 1e-5, 1.2, 1e-6, 1.0],       # A < 0, trigger at kappa = 2
                        [1.0, 0.9, 1e-5, 1.2, 1e-6, 1.0],       # A > 0: never vetoed
                        [1.0, 0.5, 2e-4, 1.0, 1.0, 1.0],        # A < 0, no ratio below 1e-4
                        [1.0, 1.0, 1.0, 1.0, 1e-9, 1.0]],       # A < 0, trigger only in padding
                       dtype=torch.float64)
    old = torch.full_like(rho, -2.0)
    logp = old + rho.log()
    adv = torch.tensor([-1.0, 1.0, -0.5, -2.0], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 0],
                         [1, 1, 1, 1, 0, 0]], dtype=torch.float32)
    keep = {"suffix": [1, 1, 1, 0, 0, 0], "trigger": [1, 1, 0, 1, 0, 1],
            "response": [0, 0, 0, 0, 0, 0]}
    for scope, row0 in keep.items():
        out = mu_grpo.veto_mask(logp, old, adv, mask, threshold=1e-4, scope=scope)
        assert out.dtype == mask.dtype
        assert out[0].tolist() == row0, scope
        assert torch.equal(out[1:], mask[1:]), scope             # A > 0, no trigger, padded trigger
    token_adv = adv[:, None] * mask                              # [B, T] advantages: same answer
    assert mu_grpo.veto_mask(logp, old, token_adv, mask)[0].tolist() == keep["suffix"]
    with pytest.raises(ValueError):
        mu_grpo.veto_mask(logp, old, adv, mask, scope="prefix")


# ---------------------------------------------------------------- the loss against a naive loop

def naive_loss(logp, old, adv, mask, eps_low, eps_high, dual_clip, agg, max_len, weight=None):
    """The equations, one token at a time, in plain Python over 0-dim tensors (so autograd gives the
    gradient)."""
    B, T = logp.shape
    rows, total, n_tok = [], 0.0, 0
    clip = low = high = dual = 0
    for i in range(B):
        row, n = 0.0, 0
        for t in range(T):
            if not mask[i, t]:
                continue
            r = torch.exp(torch.clamp(logp[i, t] - old[i, t], -20, 20))
            a = float(adv[i])
            l1, l2 = -a * r, -a * torch.clamp(r, 1 - eps_low, 1 + eps_high)
            loss = l1 if l1 >= l2 else l2
            if l2 > l1:
                clip += 1
                low, high = low + (a < 0), high + (a > 0)
            if dual_clip is not None and a < 0 and loss > -a * dual_clip:
                loss, dual = -a * dual_clip + 0 * loss, dual + 1
            loss = loss * (1.0 if weight is None else float(weight[i, t]))
            row, n = row + loss, n + 1
        if n:
            rows.append(row / n if agg == "seq-mean-token-mean" else row)
            total, n_tok = total + row, n_tok + n
    denom = {"token-mean": n_tok, "seq-mean-token-mean": len(rows), "seq-mean-token-sum": len(rows),
             "seq-mean-token-sum-norm": len(rows) * max_len}[agg]
    value = (total if agg != "seq-mean-token-mean" else sum(rows)) / denom
    return value, {"loss/clip_frac": clip / n_tok, "loss/clip_frac_low": low / n_tok,
                   "loss/clip_frac_high": high / n_tok, "loss/dual_clip_frac": dual / n_tok}


@pytest.mark.parametrize("agg", grpo.AGG_MODES)
@pytest.mark.parametrize("clip",
                         [(0.2, 0.2, None), (0.2, 0.28, 3.0), (1.0, 4.0, None), (1.0, 4.0, 3.0)])
@pytest.mark.paths
def test_policy_loss_matches_naive_loop(agg, clip):
    eps_low, eps_high, dual = clip
    logp, old, mask, adv = rand_batch(B=7, T=9, seed=11)
    logp = (old + 2.0 * (logp - old)).detach()                    # wide ratios: every branch is hit
    weight = (torch.rand(logp.shape, dtype=logp.dtype, generator=torch.Generator().manual_seed(2))
              + 0.5)
    a = logp.clone().requires_grad_()
    ours, m = grpo.policy_loss(grpo.token_log_ratio(a, old, mask), adv, mask, eps_low=eps_low,
                               eps_high=eps_high, dual_clip=dual, agg=agg,
                               normaliser=grpo.loss_normaliser(mask, agg, 12), token_weight=weight)
    ours.backward()
    b = logp.clone().requires_grad_()
    ref, ref_m = naive_loss(b, old, adv, mask, eps_low, eps_high, dual, agg, 12, weight)
    ref.backward()
    # float64, vectorised against a per-token loop: the sums differ in order only (~1e-16); the
    # ratios are random, so none sits within that of a clip boundary, and the clip counts are
    # exact
    torch.testing.assert_close(ours, ref)
    torch.testing.assert_close(a.grad, b.grad)
    for key, v in ref_m.items():
        assert math.isclose(float(m[key]), v, abs_tol=1e-12), key
    valid = mask.bool()
    r = (logp - old).exp()[valid]
    assert (math.isclose(float(m["ratio/min"]), float(r.min()))
            and math.isclose(float(m["ratio/max"]), float(r.max())))
    assert math.isclose(float(m["loss/ppo_kl"]), float((old - logp)[valid].mean()), rel_tol=1e-12)
    assert float(m["loss/clip_frac"]) > 0 and (dual is None or float(m["loss/dual_clip_frac"]) > 0)


def test_aggregate_and_normaliser_by_hand():
    loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0], [9.0, 9.0, 9.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0], [0, 0, 0]])                      # row 2 empty
    cases = {"token-mean": (4.0, 10 / 4), "seq-mean-token-mean": (2.0, (2 + 4) / 2),
             "seq-mean-token-sum": (2.0, 10 / 2), "seq-mean-token-sum-norm": (2.0 * 5, 10 / 10)}
    for agg, (n, value) in cases.items():
        assert grpo.loss_normaliser(mask, agg, max_len=5) == n
        assert math.isclose(float(grpo.aggregate(loss, mask, agg, n)), value, rel_tol=1e-6)
    # L_max defaults to T
    assert grpo.loss_normaliser(mask, "seq-mean-token-sum-norm") == 2.0 * 3
    # empty step: loss 0, not NaN
    assert grpo.loss_normaliser(torch.zeros(2, 3), "token-mean") == 1.0
    with pytest.raises(ValueError):
        grpo.aggregate(loss, mask, "token-sum", 1.0)


def tiny_policy(seed=0, V=13, D=8):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Embedding(V, D), torch.nn.Tanh(),
                               torch.nn.Linear(D, V)).double()


@pytest.mark.paths
@pytest.mark.parametrize("agg", grpo.AGG_MODES)
def test_gradient_invariant_to_micro_batching(agg):
    """One step's gradient with 1, 2 and 4 micro-batches (normaliser from the whole step), the full
    recipe: every ratio, dual-clip, veto, TIS and a KL term. float64: the micro-batchings differ
    in summation order only (~1e-15), far inside the 1e-6 on gradients of 1e-4 and more and the
    1e-9 on the metrics; no random ratio sits that close to a clip or veto boundary."""
    B, T, V = 8, 7, 13
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(0, V, (B, T), generator=g)
    lengths = torch.tensor([7, 3, 0, 5, 1, 7, 6, 2])
    mask = torch.arange(T)[None, :] < lengths[:, None]
    model = tiny_policy()
    with torch.no_grad():
        base = grpo.token_logprobs(model(ids), ids)
        old = base + 0.4 * torch.randn(B, T, generator=g, dtype=base.dtype)
        old[1, 1] = base[1, 1] + 12.0                           # a veto trigger (rho ~ 6e-6, A < 0)
        engine = old + 0.05 * torch.randn(B, T, generator=g, dtype=base.dtype)
        ref = base + 0.3 * torch.randn(B, T, generator=g, dtype=base.dtype)
    adv = grpo.grpo_advantages(torch.tensor([1.0, 0, 0, 1, 1, 0, 1, 1], dtype=base.dtype),
                               torch.arange(B) // 4)
    N = grpo.loss_normaliser(mask, agg, max_len=T)
    # the veto fires
    assert mu_grpo.veto_mask(base, old, adv, mask)[1].tolist() == [True, True] + [False] * 5
    for ratio_fn in RATIOS.values():
        grads, metrics = [], []
        for n_mb in (1, 2, 4):
            model.zero_grad()
            parts = metrics_lib.Metrics()                # micro-batches combined as train.py does
            for sl in torch.arange(B).chunk(n_mb):
                logp = grpo.token_logprobs(model(ids[sl]), ids[sl], temperature=0.9)
                lmask = mu_grpo.veto_mask(logp, old[sl], adv[sl], mask[sl])
                loss, m = grpo.policy_loss(ratio_fn(logp, old[sl], mask[sl]), adv[sl], lmask,
                                           eps_low=0.2, eps_high=0.28, dual_clip=3.0, agg=agg,
                                           normaliser=N,
                                           token_weight=grpo.tis_weight(old[sl], engine[sl], 2.0))
                loss = loss + 0.1 * grpo.aggregate(grpo.kl_penalty(logp, ref[sl], "k3"),
                                                   lmask, agg, N)
                loss.backward()
                n = float(m.pop("loss/tokens"))
                parts.add(grpo.COMBINE, m, tokens=n)
                parts.add(grpo.COMBINE, {"loss/tokens": n})
            grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
            metrics.append(parts.reduce(world=1))
        assert grads[0].abs().max() > 1e-4
        for k in (1, 2):
            assert (grads[k] - grads[0]).abs().max() <= 1e-6
            for key, v in metrics[0].items():
                assert math.isclose(metrics[k][key], v, rel_tol=1e-9, abs_tol=1e-12), key


# ---------------------------------------------------------------- KL, TIS, DAPO extras, contracts

def test_kl_estimators_by_hand():
    logp = torch.tensor([0.0, -1.0, -2.0, 30.0], dtype=torch.float64)
    ref = torch.tensor([0.0, -2.0, -1.0, -20.0], dtype=torch.float64)           # d = [0, 1, -1, 50]
    expected = {"k1": [0, 1, -1, 50], "abs": [0, 1, 1, 50], "k2": [0, 0.5, 0.5, 1250],
                # k3 at 50: exp(-20)+19 -> cap 10
                "k3": [0, math.exp(-1), math.e - 2, 10.0]}
    for name, values in expected.items():
        torch.testing.assert_close(grpo.kl_penalty(logp, ref, name),
                                   torch.tensor(values, dtype=torch.float64))
    with pytest.raises(ValueError):
        grpo.kl_penalty(logp, ref, "k4")


def test_tis_weight():
    old = torch.tensor([-1.0, -1.0, -3.0], requires_grad=True)
    engine = torch.tensor([-2.0, -1.0, -1.0])
    w = grpo.tis_weight(old, engine, cap=2.0)
    # e^1 = 2.72 truncated at C = 2
    torch.testing.assert_close(w, torch.tensor([2.0, 1.0, math.exp(-2.0)]))
    assert not w.requires_grad


def test_overlong_penalty_and_filter():
    lengths = torch.tensor([10, 16, 17, 18, 20, 21])
    got = dapo.overlong_penalty(lengths, max_len=20, cache_len=4)               # soft zone (16, 20]
    torch.testing.assert_close(got, torch.tensor([0.0, 0.0, -0.25, -0.5, -1.0, -1.0]))
    mask = torch.ones(3, 4)
    out = dapo.overlong_filter(mask, torch.tensor([False, True, False]))
    # caller's mask untouched
    assert out.tolist() == [[1] * 4, [0] * 4, [1] * 4] and mask.sum() == 12
    with pytest.raises(ValueError):
        dapo.overlong_penalty(lengths, max_len=20, cache_len=0)


def test_caller_tensors_are_not_mutated_and_bad_args_fail():
    logp, old, mask, adv = rand_batch()
    snapshot = [x.clone() for x in (logp, old, mask, adv)]
    for fn in RATIOS.values():
        lw = fn(logp, old, mask)
        grpo.policy_loss(lw, adv, mu_grpo.veto_mask(logp, old, adv, mask), eps_low=0.2,
                         eps_high=0.2, dual_clip=3.0, normaliser=1.0)
    assert all(torch.equal(a, b) for a, b in zip(snapshot, (logp, old, mask, adv)))
    with pytest.raises(ValueError):
        grpo.policy_loss(grpo.token_log_ratio(logp, old, mask), adv, mask, eps_low=0.2,
                         eps_high=0.2, dual_clip=1.0, normaliser=1.0)
