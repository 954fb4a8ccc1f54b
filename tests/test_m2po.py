"""M2PO's second-moment mask (methods.m2po: m2po_threshold / m2po_keep, M2PO.prepare) by hand
and through the loop, and the clip fraction by position (grpo's loss/clip_frac_first, _middle,
_last) by hand and combined over micro-batches."""
import io
import json
import math
from contextlib import redirect_stderr, redirect_stdout

import pytest
import torch

import flags
import grpo
import rollout
import train
from make_tiny_model import make_model, make_tokenizer
from methods import m2po
from metrics import Metrics
from rollout import Rollout
from tiny import run_of, update

# train.main in process, on the CPU whatever the machine has (conftest's cpu_only)
pytestmark = pytest.mark.usefixtures("cpu_only")
BASE = ["--prompts-per-step", "8", "--group-size", "4", "--max-new-tokens", "6", "--eval-size", "8",
        "--eval-every", "0", "--threads", "1", "--save-every", "0"]


def keep(log_r, tau=0.04, mask=None):
    lr = torch.tensor([log_r], dtype=torch.float64)
    return m2po.m2po_keep(lr, torch.ones_like(lr, dtype=torch.bool) if mask is None else mask,
                          tau)[0].tolist()


# ---- the rule, by hand ---------------------------------------------------------------------------

def test_threshold_by_hand():
    """log r = [0.5, -0.3, 0.1, 0]: (log r)^2 = [0.25, 0.09, 0.01, 0],
    M2 = 0.35 / 4 = 0.0875 >= 0.04; without 0.25 the rest has M2 = 0.10 / 3 = 0.033 < 0.04: only the
    first token is masked."""
    sq = torch.tensor([0.25, 0.09, 0.01, 0.0], dtype=torch.float64)
    assert m2po.m2po_threshold(sq, 0.04) == 0.25
    assert keep([0.5, -0.3, 0.1, 0.0]) == [False, True, True, True]
    assert m2po.m2po_threshold(sq, 0.1) == math.inf                      # 0.0875 < 0.1: none masked


def test_n_is_the_kept_count_and_the_test_is_strict():
    """AReaL's N: the tokens that remain. [0.25, 0.09, 0]: without 0.25, 0.09 / 2 = 0.045 >= 0.04
    (0.09 / 3 = 0.03 had N counted the masked one too), so 0.09 goes as well. Strict: M2 = 0.125 is
    not below tau = 0.125. Nothing qualifies: all but the smallest are masked."""
    assert keep([0.5, 0.3, 0.0]) == [False, False, True]
    assert keep([0.5, 0.0], tau=0.125) == [False, True]
    assert keep([0.5, 0.0], tau=0.12500001) == [True, True]
    assert keep([1.0, -2.0, 3.0]) == [True, False, False]


def test_ties_at_the_cut_are_masked_together():
    """[0.09, 0.09, 0.01, 0]: M2 = 0.0475, one 0.09 out leaves 0.10 / 3 < 0.04, but one threshold
    cannot tell the two 0.09 apart: both are masked (the rest's M2 only falls)."""
    assert keep([0.3, -0.3, 0.1, 0.0]) == [False, False, True, True]


def test_padding_is_ignored_and_zero_masks_nothing():
    log_r = torch.tensor([[0.5, -0.3, 0.1, 0.0, 9.0, 9.0], [0.0] * 6])
    mask = torch.tensor([[1, 1, 1, 1, 0, 0], [0] * 6])
    assert m2po.m2po_keep(log_r, mask, 0.04).tolist() == [[False, True, True, True, False, False],
                                                          [False] * 6]
    assert m2po.m2po_sq(log_r, mask).tolist() == pytest.approx([0.25, 0.09, 0.01, 0.0])
    zero = torch.zeros(3, 5)
    valid = torch.arange(5)[None, :] < torch.tensor([[5], [2], [0]])
    assert torch.equal(m2po.m2po_keep(zero, valid, 0.04), valid)       # the first update: log r = 0
    assert m2po.m2po_threshold(torch.zeros(0, dtype=torch.float64), 0.04) == math.inf


# ---- through the loss slot and the loop: the step's mask, the loss, the flags --------------------

def keep_masks(model, mbs, args):
    """M2PO.prepare's mask of each micro-batch (the "m2po_keep" of the micro-batches it returns):
    the loss slot's prepare hook of the run the door builds from `args`."""
    (prepare,) = run_of(args, model).hooks.prepare
    return [mb["m2po_keep"] for mb in prepare(model, mbs)]


def _policy_and_rollouts(offsets):
    """The tiny policy, and rollouts whose behaviour log-probs are the current ones minus
    `offsets` (one list per rollout): log r = offsets exactly, to float rounding."""
    tok = make_tokenizer()
    model = make_model(len(tok), seed=0).eval()
    rs = []
    for k, off in enumerate(offsets):
        r = Rollout(k, tok.encode(f"{k}*{7 * k}="), tok.encode("1234567"[:len(off)]),
                    [0.0] * len(off), advantage=(-1.0) ** k * (k + 1) / 4)
        with torch.no_grad():
            lp = rollout.forward_logprobs(model, rollout.collate([r], tok.pad_token_id), 1.0)[1][0]
        r.logprobs = [x - o for x, o in zip(lp.tolist(), off)]
        rs.append(r)
    return model, tok, rs


OFFSETS = [[0.5, -0.3, 0.1], [0.0, 0.02], [-0.4, 0.05, 0.0, 0.3], [0.01]]


@pytest.mark.paths
def test_step_threshold_is_the_merged_batch_one():
    """M2PO.prepare over micro-batches of 2 rows and over one micro-batch of all 4: the
    same kept tokens per rollout, and the same as m2po.m2po_keep on all 10 tokens at once. The two
    shapes round log r differently (~1e-7); OFFSETS keep every partial M2 7e-4 or more from tau."""
    model, tok, rs = _policy_and_rollouts(OFFSETS)
    a = flags.Args(m2po_tau=0.04)
    kept = []
    for size in (2, 4):
        mbs = rollout.micro_batches(rs, size, tok.pad_token_id, "cpu")
        masks = keep_masks(model, mbs, a)
        assert len(mbs) == 4 // size
        by_rollout = {}
        for idx, mb, k in zip(rollout.length_buckets(rs, size), mbs, masks):
            for b, i in enumerate(idx):
                by_rollout[i] = k[b][mb["completion_mask"][b].bool()].tolist()
        kept.append(by_rollout)
    assert kept[0] == kept[1]
    flat = torch.tensor([x for off in OFFSETS for x in off], dtype=torch.float64)[None]
    assert m2po.m2po_keep(flat, torch.ones_like(flat), 0.04)[0].tolist() == \
        [x for i in range(4) for x in kept[0][i]]
    # (log r)^2 sorted: .25 .16 .09 .09 .01 ...: M2 of all 10 = 0.0607, without .25 = 0.0397 < 0.04
    assert sum(not x for i in range(4) for x in kept[0][i]) == 1 and kept[0][0][0] is False


def test_loss_is_the_masked_token_mean_without_clip():
    """One micro-batch with M2PO: L = -(1/N) sum_t M_t r_t A_t, N = every valid token (10), the
    masked one included; ratios far outside [0.8, 1.28] are not clipped (clip_frac 0)."""
    model, tok, rs = _policy_and_rollouts(OFFSETS)
    a = flags.Args(m2po_tau=0.04, eps_low=0.2, eps_high=0.28)
    mb = rollout.micro_batches(rs, 4, tok.pad_token_id, "cpu")[0]
    run = run_of(a, model)
    for prepare in run.hooks.prepare:
        (mb,) = prepare(model, [mb])
    loss, m = train.micro_batch_loss(run, mb, 10.0)
    order = rollout.length_buckets(rs, 4)[0]
    by_hand = 0.0
    for b, i in enumerate(order):
        for t, off in enumerate(OFFSETS[i]):
            if not (i == 0 and t == 0):                                        # the masked token
                by_hand -= math.exp(off) * rs[i].advantage / 10.0
    assert loss.item() == pytest.approx(by_hand, abs=1e-6)
    row = m.reduce(1)
    assert row["loss/m2po_masked_frac"] == pytest.approx(0.1)
    assert row["loss/clip_frac"] == 0.0 and row["loss/tokens"] == 9
    assert row["ratio/max"] == pytest.approx(math.exp(0.3), rel=1e-5)         # kept, unclipped


def run_steps(argv, tmp_path):
    out = tmp_path / "run"
    with redirect_stdout(io.StringIO()), redirect_stderr(io.StringIO()):
        rc = train.main([*BASE, "--out-dir", str(out), *argv])
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()][1:]
    updates = [json.loads(line) for line in (out / "updates.jsonl").read_text().splitlines()]
    return rc, lines, updates


def test_preset_m2po_runs_and_logs_the_masked_share(tmp_path):
    rc, steps, updates = run_steps(["--preset", "m2po", "--steps", "2", "--mini-batches", "4"],
                                   tmp_path)
    assert rc == 0 and [m["step"] for m in steps] == [1, 2]
    for m in steps + updates:
        assert 0.0 <= m["loss/m2po_masked_frac"] <= 1.0 and m["loss/clip_frac"] == 0.0
    assert len(updates) == 8
    assert flags.PRESETS["m2po"][1]["m2po_tau"] == 0.04


def _one_update(rs, tok, size):
    """One optimizer step of train.update (M2PO, lr 0: the weights stay those the rollouts' offsets
    were measured at) over `rs` in micro-batches of `size` rows: the step's masked share."""
    model = make_model(len(tok), seed=0)
    opt = torch.optim.AdamW(model.parameters(), lr=0.0)
    a = flags.Args(m2po_tau=0.04, micro_batch_size=size)
    m = update(model, None, opt, rs, [], a, step=0, pad_id=tok.pad_token_id)
    return m.reduce(1)["loss/m2po_masked_frac"]


@pytest.mark.paths
def test_micro_batch_size_leaves_the_masked_share_unchanged():
    """The threshold is the optimizer step's, not a micro-batch's: the first optimizer step over
    the same weights and rollouts, in micro-batches of 1, 2 and 4 rows, masks the same share (1 of
    10 tokens). Compared where the inputs are bitwise equal (the first step, before any update:
    after one, two batchings' weights differ by rounding and a token at the cut can cross it). The
    forwards of different micro-batch shapes may still round log r differently, by about 1e-7; the
    offsets keep the M2 on either side of the cut at least 7e-4 from tau (0.0603 with the largest,
    0.0392 without), 1e3 times that rounding, so it cannot move a token."""
    _, tok, rs = _policy_and_rollouts(OFFSETS)
    shares = [_one_update(rs, tok, size) for size in (1, 2, 4)]
    # each micro-batch's share times its tokens, summed and divided: 1e-12 is that sum's rounding
    assert shares == pytest.approx([0.1, 0.1, 0.1], rel=1e-12)


@pytest.mark.paths
def test_a_micro_batch_threshold_would_fail_that_check(monkeypatch):
    """The check above can fail: with the threshold taken per micro-batch (what the step-wide mask
    replaces), micro-batches of 2 rows mask 2 of 10 tokens, not 1 (rollouts 2 and 0 together:
    M2 = 0.6025 / 7, without 0.25: 0.3525 / 6 = 0.059 >= 0.04, so 0.16 goes too)."""
    _, tok, rs = _policy_and_rollouts(OFFSETS)

    def per_micro_batch(self, model, mbs):
        return [real(self, model, [mb])[0] for mb in mbs]

    real = m2po.M2PO.prepare
    monkeypatch.setattr(m2po.M2PO, "prepare", per_micro_batch)
    assert _one_update(rs, tok, 4) == pytest.approx(0.1, rel=1e-12)    # one: the step's threshold
    assert _one_update(rs, tok, 2) == pytest.approx(0.2, rel=1e-12)    # two: each its own


@pytest.mark.parametrize("kw", [{"ratio": "gspo"}, {"dual_clip": 3.0}, {"tis_cap": 2.0}])
def test_m2po_refuses_what_it_cannot_combine_with(kw):
    """A rule across owners: methods.m2po.make raises it when the door fills the slots."""
    with pytest.raises(ValueError, match="--m2po-tau"):
        run_of(flags.Args(m2po_tau=0.04, **kw))
    run_of(flags.Args(m2po_tau=0.04))
    run_of(flags.Args(**kw))


# ---- the clip fraction by position ---------------------------------------------------------------

def test_clip_fraction_by_third_by_hand():
    """Rows of 6, 3 and 2 valid tokens (padding after them, prompt positions before the first):
    thirds floor(3 t / n): n = 6 -> 0 0 1 1 2 2; n = 3 -> 0 1 2; n = 2 -> 0 1. A > 0 and
    log r = 1 (ratio e > 1.28) clips; log r = 0 does not."""
    mask = torch.tensor([[0, 1, 1, 1, 1, 1, 1, 0],
                         [0, 0, 1, 1, 1, 0, 0, 0],
                         [1, 1, 0, 0, 0, 0, 0, 0]], dtype=torch.bool)
    clip = torch.tensor([[0, 1, 0, 1, 1, 0, 0, 1],                           # padding's 1 ignored
                         [0, 0, 1, 1, 1, 0, 0, 0],
                         [0, 1, 0, 0, 0, 0, 0, 0]], dtype=torch.float32)
    adv = torch.ones(3)
    _, m = grpo.policy_loss(clip, adv, mask, eps_low=0.2, eps_high=0.28, normaliser=11.0)
    # first: row 0 t0, t1 (1 clipped), row 1 t0 (1), row 2 t0 (0): 2 / 4
    # middle: row 0 t2, t3 (2), row 1 t1 (1), row 2 t1 (1): 4 / 4
    # last: row 0 t4, t5 (0), row 1 t2 (1): 1 / 3
    assert [float(m[f"loss/clip_frac_{p}"]) for p in grpo.THIRDS] == [0.5, 1.0, 1 / 3]
    assert [int(m[f"loss/tokens_{p}"]) for p in grpo.THIRDS] == [4, 4, 3]
    assert float(m["loss/clip_frac"]) == pytest.approx(7 / 11)

    # two micro-batches combined as train.py does: each third over its own tokens of both
    parts = Metrics()
    for rows in ([0], [1, 2]):
        _, mm = grpo.policy_loss(clip[rows], adv[rows], mask[rows], eps_low=0.2, eps_high=0.28,
                                 normaliser=11.0)
        n = float(mm.pop("loss/tokens"))
        parts.add(grpo.COMBINE, mm, tokens=n)
    row = parts.reduce(1)
    assert [row[f"loss/clip_frac_{p}"] for p in grpo.THIRDS] == pytest.approx([0.5, 1.0, 1 / 3],
                                                                              rel=1e-15)
    assert not any(k.startswith("loss/tokens_") for k in row)               # weights, not logged
    assert row["loss/clip_frac"] == pytest.approx(7 / 11)
