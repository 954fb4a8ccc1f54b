"""grpo.py against numbers verl's core_algos.py computed (tier b: equivalence with an independent
implementation).

Loads EVERY *.npz/*.json pair in $GOLDEN_DIR (default ../shared/golden from the repo root; layout in
its README) and checks each quantity below, values and gradients, at meta.dtype's tolerance
(float32: rtol 1e-5, atol 1e-6; float64: rtol = atol = 1e-10), with the clip settings of that file's
meta.config. A quantity listed here that a file lacks fails the test; so does a file without its
pair.

    grpo_advantage["norm_by_std=True" | "norm_by_std=False"].per_sequence / .per_token
    agg_loss.values[MODE]      of -advantages * exp(log_prob - old_log_prob), 4 modes
    policy_loss.vanilla[MODE]: pg_loss, grad_log_prob, pg_clipfrac, pg_clipfrac_lower, ppo_kl
    policy_loss.gspo[MODE]:    the same, GSPO (verl aggregates it as seq-mean-token-mean whatever
                               MODE says)
    kl_penalty[k1 | abs | k2 | k3]: per_token, token_mean, grad_log_prob_of_token_mean
                                    (verl aliases kl, mse, low_var_kl too when present; "k1+"-style
                                    entries are verl errors, ignored)
Not checked (not in the README's table, conventions undocumented): vectorized_norm_by_std,
legacy_compute_policy_loss, the other verl losses (cispo, clip_cov, ...).

Conventions converted here, not in grpo.py (the README: "where yours differ, convert in the test"):
  * seq-mean-token-sum-norm: verl divides by T only, Dr. GRPO and we by G * L_max, so we pass
    normaliser = T.
  * verl adds 1e-8 to the token count of each row (seq-mean-token-mean) and of masked_mean (the
    metrics); we do not. The test scales ours by n / (n + 1e-8): invisible in float32, 2e-10
    relative in float64.
  * verl gives a group of one std = torch.tensor(1.0), a float32, so its std + 1e-6 is rounded to
    float32 even in a float64 file; the test divides our GRPO advantage of such rollouts by that
    float32 value instead of 1 + 1e-6.
  * The README does not say whether kl token_mean came from agg_loss (sum / n) or masked_mean
    (sum / (n + 1e-8)); ours must match one of the two exactly.
"""
import copy
import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

import grpo
from conftest import require_shared
from methods import drgrpo, gspo

# numbers another implementation computed on another machine: a path comparison, at the float
# tolerances above (rounding of the same sums in another order)
pytestmark = pytest.mark.paths

# $GOLDEN_DIR, when set, must hold the files (a path given by hand that is missing fails below); the
# default ../shared/golden may be absent (a copy of the repository alone): the module skips, with
# the path in the reason.
if "GOLDEN_DIR" in os.environ:
    GOLDEN_DIR = Path(os.environ["GOLDEN_DIR"])
else:
    GOLDEN_DIR = require_shared("golden")
MODES = grpo.AGG_MODES
KL_NAMES = {"k1": "k1", "kl": "k1", "abs": "abs", "k2": "k2", "mse": "k2", "k3": "k3",
            "low_var_kl": "k3"}
REQUIRED_KL = ("k1", "abs", "k2", "k3")
VERL_EPS = 1e-8


def _stems() -> list[str]:
    jsons = {p.stem for p in GOLDEN_DIR.glob("*.json")}
    npzs = {p.stem for p in GOLDEN_DIR.glob("*.npz")}
    assert jsons | npzs, f"no golden files in {GOLDEN_DIR}"
    assert jsons == npzs, f"unpaired golden files in {GOLDEN_DIR}: {sorted(jsons ^ npzs)}"
    return sorted(jsons)


STEMS = _stems()


class Golden:
    """One npz/json pair: inputs as torch tensors of meta.dtype, the JSON, the clip settings and the
    tolerance."""

    def __init__(self, stem: str):
        self.stem = stem
        self.json = json.loads((GOLDEN_DIR / f"{stem}.json").read_text())
        meta = self.need("meta")
        self.dtype = {"float32": torch.float32,
                      "float64": torch.float64}[self.need("meta", "dtype")]
        self.tol = (dict(rtol=1e-5, atol=1e-6) if self.dtype == torch.float32
                    else dict(rtol=1e-10, atol=1e-10))
        cfg = meta["config"]
        self.eps_low = (cfg["clip_ratio_low"] if cfg.get("clip_ratio_low") is not None
                        else cfg["clip_ratio"])
        self.eps_high = (cfg["clip_ratio_high"] if cfg.get("clip_ratio_high") is not None
                         else cfg["clip_ratio"])
        self.c = cfg.get("clip_ratio_c", 3.0)
        with np.load(GOLDEN_DIR / f"{stem}.npz") as z:
            raw = {k: z[k] for k in z.files}
        for key in ("log_prob", "old_log_prob", "advantages", "response_mask", "ref_log_prob",
                    "scores", "index"):
            assert key in raw, f"{stem}.npz lacks {key}"
        t = lambda k: torch.as_tensor(raw[k]).to(self.dtype)                    # noqa: E731
        self.logp, self.old, self.adv, self.ref = (t("log_prob"), t("old_log_prob"),
                                                   t("advantages"), t("ref_log_prob"))
        self.mask, self.scores = t("response_mask"), t("scores")
        self.index = torch.as_tensor(raw["index"]).long()
        self.n_tok = float(self.mask.sum())                                     # valid tokens
        self.row_n = self.mask.sum(-1)                                          # [B] tokens per row

    def need(self, *path):
        node = self.json
        for i, key in enumerate(path):
            if not isinstance(node, dict) or key not in node:
                pytest.fail(f"{self.stem}.json: missing {'.'.join(path[: i + 1])}")
            node = node[key]
        if isinstance(node, dict) and "error" in node:
            pytest.fail(f"{self.stem}.json: {'.'.join(path)} holds an error: {node['error']}")
        return node

    def close(self, ours, expected, what):
        ours = ours.detach().numpy() if torch.is_tensor(ours) else np.asarray(ours)
        np.testing.assert_allclose(ours, np.asarray(expected, dtype=np.float64), **self.tol,
                                   err_msg=f"{self.stem}: {what}")

    def normaliser(self, agg: str) -> float:
        if agg == "seq-mean-token-sum-norm":
            return float(self.mask.shape[-1])                                   # verl: / T, no 1/G
        return grpo.loss_normaliser(self.mask, agg)

    def row_eps(self, agg: str) -> torch.Tensor | None:
        """verl's seq-mean-token-mean divides row i by n_i + 1e-8: the per-token factor
        n_i / (n_i + 1e-8)."""
        if agg != "seq-mean-token-mean":
            return None
        return (self.row_n / (self.row_n + VERL_EPS))[:, None].expand_as(self.mask)

    def mean_eps(self) -> float:
        return self.n_tok / (self.n_tok + VERL_EPS)                 # verl masked_mean's denominator


@pytest.fixture(params=STEMS)
def gold(request) -> Golden:
    return Golden(request.param)


def test_advantages(gold):
    check_advantages(gold)


def test_advantages_with_an_empty_row(gold):
    """Files with a row that has no response token (the README's convention: per-sequence value 0
    there), made from this one by emptying row 0: its expected values become 0, every other row's
    stay as verl computed them."""
    g = copy.copy(gold)
    g.mask = gold.mask.clone()
    g.mask[0] = 0
    g.row_n = g.mask.sum(-1)
    g.json = copy.deepcopy(gold.json)
    for key in ("norm_by_std=True", "norm_by_std=False"):
        entry = g.json["grpo_advantage"][key]
        entry["per_sequence"][0] = 0.0
        entry["per_token"][0] = [0.0] * len(entry["per_token"][0])
    check_advantages(g)


def check_advantages(gold):
    _, inv, count = torch.unique(gold.index, return_inverse=True, return_counts=True)
    single = count[inv] == 1                                     # [B] rollouts alone in their group
    verl_one = torch.tensor(1.0, dtype=torch.float32) + 1e-6     # verl's float32 std + eps
    singleton_fix = torch.where(single, (1 + 1e-6) / verl_one.double(), 1.0).to(gold.dtype)
    for key, fn in (("norm_by_std=True", grpo.grpo_advantages),
                    ("norm_by_std=False", drgrpo.drgrpo_advantages)):
        adv = fn(gold.scores, gold.index)                        # [B]
        if key == "norm_by_std=True":
            adv = adv * singleton_fix
        # the README: per_sequence is read from the masked per-token tensor, so a row without
        # response tokens has 0 (its score still counts in its group's mean and std, as it does in
        # ours)
        per_sequence = torch.where(gold.row_n > 0, adv, 0.0)
        gold.close(per_sequence, gold.need("grpo_advantage", key, "per_sequence"),
                   f"{key} per_sequence")
        gold.close(adv[:, None] * gold.mask, gold.need("grpo_advantage", key, "per_token"),
                   f"{key} per_token")


def test_agg_loss(gold):
    loss_mat = -gold.adv * torch.exp(gold.logp - gold.old)               # the README's input matrix
    for agg in MODES:
        row = gold.row_eps(agg)
        ours = grpo.aggregate(loss_mat if row is None else loss_mat * row, gold.mask, agg,
                              gold.normaliser(agg))
        gold.close(ours, gold.need("agg_loss", "values", agg), f"agg_loss {agg}")


def _check_policy(gold: Golden, section: str, ratio_fn, dual_clip, agg_of):
    for mode in MODES:
        agg = agg_of(mode)
        logp = gold.logp.clone().requires_grad_()
        loss, m = grpo.policy_loss(ratio_fn(logp, gold.old, gold.mask), gold.adv, gold.mask,
                                   eps_low=gold.eps_low, eps_high=gold.eps_high,
                                   dual_clip=dual_clip, agg=agg, normaliser=gold.normaliser(agg),
                                   token_weight=gold.row_eps(agg))
        loss.backward()
        gold.close(loss, gold.need("policy_loss", section, mode, "pg_loss"),
                   f"{section} {mode} pg_loss")
        gold.close(logp.grad, gold.need("policy_loss", section, mode, "grad_log_prob"),
                   f"{section} {mode} grad")
        metrics = gold.need("policy_loss", section, mode, "metrics")
        for verl_key, our_key in (("actor/pg_clipfrac", "loss/clip_frac"),
                                  ("actor/ppo_kl", "loss/ppo_kl"),
                                  ("actor/pg_clipfrac_lower", "loss/dual_clip_frac")):
            if verl_key not in metrics:
                pytest.fail(
                    f"{gold.stem}.json: missing policy_loss.{section}.{mode}.metrics.{verl_key}")
            gold.close(m[our_key] * gold.mean_eps(), metrics[verl_key],
                       f"{section} {mode} {verl_key}")


def test_vanilla_policy_loss(gold):
    _check_policy(gold, "vanilla", grpo.token_log_ratio, gold.c, agg_of=lambda mode: mode)


def test_gspo_policy_loss(gold):
    _check_policy(gold, "gspo", gspo.gspo_log_ratio, None,
                  agg_of=lambda mode: "seq-mean-token-mean")


def test_kl_penalty(gold):
    entries = gold.need("kl_penalty")
    missing = [name for name in REQUIRED_KL if name not in entries]
    assert not missing, f"{gold.stem}.json: kl_penalty lacks {missing}"
    checked = 0
    for name, entry in entries.items():
        if name not in KL_NAMES:
            assert name.endswith("+") or not isinstance(entry, dict) or "per_token" not in entry, \
                f"{gold.stem}.json: unknown KL estimator {name!r} with values"
            continue
        logp = gold.logp.clone().requires_grad_()
        kl = grpo.kl_penalty(logp, gold.ref, KL_NAMES[name])               # [B, T]
        gold.close(kl, gold.need("kl_penalty", name, "per_token"), f"kl {name} per_token")
        mean = grpo.aggregate(kl, gold.mask, "token-mean",
                              grpo.loss_normaliser(gold.mask, "token-mean"))
        mean.backward()
        expected_mean = gold.need("kl_penalty", name, "token_mean")
        expected_grad = np.asarray(gold.need("kl_penalty", name, "grad_log_prob_of_token_mean"))
        errors = []
        for scale in (1.0, gold.mean_eps()):                               # agg_loss or masked_mean
            try:
                gold.close(mean * scale, expected_mean, f"kl {name} token_mean (scale {scale!r})")
                gold.close(logp.grad * scale, expected_grad, f"kl {name} grad (scale {scale!r})")
                break
            except AssertionError as e:
                errors.append(str(e))
        else:
            pytest.fail("\n".join(errors))
        checked += 1
    assert checked >= len(REQUIRED_KL)
