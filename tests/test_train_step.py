"""The pieces of one train.py step, in process: what goes into each mini-batch, the veto under TIS,
what DAPO's dynamic sampling filters on, what the replay buffer stores, and every numeric flag's
validation."""
import dataclasses
import json
import io
import math
import os
from contextlib import redirect_stderr, redirect_stdout

import pytest
import torch

import engine as engine_lib
import flags
import parallel
import rollout
import train
from make_tiny_model import make_model, make_tokenizer
from methods import vigor
from rollout import Rollout
from tiny import run_of, update

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# train.main in process, on the CPU whatever the machine has (conftest's cpu_only): on CUDA it would
# run another precision and --engine auto would pick vLLM, not the runs these tests pin.
pytestmark = pytest.mark.usefixtures("cpu_only")


# ---- 3. fresh-anchored mini-batches --------------------------------------------------------------

def test_every_mini_batch_holds_its_share_of_fresh_and_replayed():
    """512 fresh + 256 replayed in 3 mini-batches: (170 or 171 fresh, 85 or 86 replayed) each, never
    pure replay; every index exactly once per epoch; epoch 0 keeps the batch order; later epochs are
    seeded shuffles."""
    def mini_batches(n_fresh, n_replayed, a, step, epoch):                # as train.update calls it
        return rollout.mini_batches(n_fresh, n_replayed, a.mini_batches,
                                    rollout.shuffle_seed(a.seed, step, epoch) if epoch else None)
    a = flags.Args(mini_batches=3, seed=5)
    for epoch in range(3):
        parts = mini_batches(512, 256, a, step=7, epoch=epoch)
        assert len(parts) == 3
        assert sorted(i for p in parts for i in p) == list(range(768))
        for p in parts:
            fresh, replayed = sum(i < 512 for i in p), sum(i >= 512 for i in p)
            assert fresh in (170, 171) and replayed in (85, 86)
    assert mini_batches(512, 256, a, 7, 0)[0] == list(range(170)) + list(range(512, 597))
    assert mini_batches(512, 256, a, 7, 1) == mini_batches(512, 256, a, 7, 1)
    assert mini_batches(512, 256, a, 7, 1) != mini_batches(512, 256, a, 7, 2)
    other_seed = dataclasses.replace(a, seed=6)
    assert mini_batches(512, 256, a, 7, 1) != mini_batches(512, 256, other_seed, 7, 1)
    # one mini-batch, first epoch: exactly the batch as built (fresh, then replayed)
    assert mini_batches(5, 3, flags.Args(), 0, 0) == [list(range(8))]


# ---- 5. the veto is defined against the behaviour policy, also under TIS -------------------------

def _tiny_policy():
    tok = make_tokenizer()
    return make_model(len(tok), seed=0).eval(), tok


def test_veto_uses_behaviour_logprobs_under_tis():
    """A stale A < 0 rollout whose behaviour policy gave its tokens e^20 times the current
    probability: the veto triggers at its first token and masks the rest. Under --tis-cap the
    ratio's old log-probs are recomputed (equal to the current ones here, ratio 1), but the veto
    still compares against the behaviour log-probs."""
    model, tok = _tiny_policy()
    r = Rollout(prompt_id=0, prompt_ids=tok.encode("7*6="), completion_ids=tok.encode("42"),
                logprobs=[0.0, 0.0], advantage=-1.0)
    a = flags.Args(veto_scope="suffix", veto_threshold=1e-4, tis_cap=2.0)
    mb = rollout.micro_batches([r], 256, tok.pad_token_id, "cpu")[0]
    with torch.no_grad():
        current = rollout.forward_logprobs(model, mb, 1.0)[1]                       # [1, T]
    mask = mb["completion_mask"].bool()
    # TIS: proximal = the current weights
    mb["old_logprobs"] = torch.where(mask, current, 0.0)
    # behaviour: far more likely back then
    mb["behaviour_logprobs"] = torch.where(mask, current + 20.0, 0.0)
    _, m = train.micro_batch_loss(run_of(a, model), mb, 2.0)
    assert m.reduce(1)["loss/veto_frac"] == pytest.approx(0.5)      # 2 tokens: the second is vetoed
    no_veto = dataclasses.replace(a, veto_scope="none")
    _, m_off = train.micro_batch_loss(run_of(no_veto, model), mb, 2.0)
    assert "loss/veto_frac" not in m_off.reduce(1)                  # no veto: not logged at all


def test_the_kl_reference_is_scored_once_a_step_not_every_epoch():
    """--kl-coef over 3 epochs: the frozen reference's forward runs once a step, on the first
    epoch's micro-batches (train.trainer_logprobs), not once an epoch (it cost PNPO + KL a quarter
    of its update), and the KL is logged."""
    import copy
    model, tok = _tiny_policy()
    a = flags.Args(kl_coef=0.1, epochs=3)
    initial = copy.deepcopy(model).eval().requires_grad_(False)
    calls, real = [], initial.forward
    initial.forward = lambda *x, **k: calls.append(1) or real(*x, **k)
    rs = [Rollout(k, tok.encode(f"{k}*3="), tok.encode(str(3 * k)), [-1.0] * len(str(3 * k)),
                  advantage=(-1.0) ** k) for k in range(8)]
    m = update(model.train(), initial, torch.optim.SGD(model.parameters(), lr=0.1), rs, [], a,
               step=0, pad_id=tok.pad_token_id).reduce(1)
    assert len(calls) == len(rollout.micro_batches(rs, a.micro_batch_size, tok.pad_token_id, "cpu"))
    assert m["stage/updates"] == 3 and math.isfinite(m["kl"])


# ---- 5. length-bucketed micro-batches: the gradient of the whole batch, float rounding aside -----

@pytest.mark.parametrize("kw",
                         [{}, {"agg": "seq-mean-token-mean", "ratio": "gspo", "tis_cap": 2.0}])
@pytest.mark.paths
def test_length_buckets_leave_the_loss_and_gradient_unchanged(kw):
    """train.update's micro-batches (rollout.micro_batches: rows grouped by length) against the
    whole batch collated by hand in its own order, one micro-batch: the same N, the same summed loss
    and the same parameter gradients, to float rounding (N is fixed before the first micro-batch;
    the grouping only reorders a sum). Under --tis-cap the recomputed old log-probs, given in batch
    order, must follow their rollouts into the buckets."""
    model, tok = _tiny_policy()
    a = flags.Args(**kw)
    gen = torch.Generator().manual_seed(1)
    rs = [Rollout(k, tok.encode(f"{k}*{13 * k}="), tok.encode("1234567"[:n]), [0.0] * n,
                  advantage=(-1.0) ** k * (k + 1) / 4)
          # lengths alternate: buckets differ from chunks
          for k, n in enumerate((7, 1, 6, 2, 5, 3, 4, 1))]
    with torch.no_grad():                                  # behaviour, old: near the current policy
        for r in rs:
            # [T]
            lp = rollout.forward_logprobs(model, rollout.collate([r], tok.pad_token_id), 1.0)[1][0]
            r.logprobs = (lp + 0.3 * torch.randn(lp.shape, generator=gen)).tolist()
    old = [[x + 0.1 for x in r.logprobs] for r in rs] if a.tis_cap else None
    assert rollout.length_buckets(rs, 3) != [[0, 1, 2], [3, 4, 5], [6, 7]]

    run = run_of(a, model)

    def loss_and_grads(mbs):
        n = parallel.global_normaliser(mbs, a.agg, a.max_new_tokens, 1)
        model.zero_grad(set_to_none=True)
        loss = 0.0
        for mb in mbs:
            mb_loss = train.micro_batch_loss(run, mb, n)[0]
            mb_loss.backward()
            loss += mb_loss.item()
        return n, loss, [p.grad.clone() for p in model.parameters()]
    # by hand: no bucketing
    n0, loss0, g0 = loss_and_grads([rollout.collate(rs, tok.pad_token_id, old)])
    n1, loss1, g1 = loss_and_grads(rollout.micro_batches(rs, 3, tok.pad_token_id, "cpu",
                                                         old_logprobs=old))
    # float32: the buckets reorder the sums and run other shapes (~1e-7 of values below 1); the
    # ratios are random (noise 0.3), so no token sits within that of a clip boundary
    assert n1 == n0 and loss1 == pytest.approx(loss0, abs=1e-6) and loss0 != 0
    assert max(float((x - y).abs().max()) for x, y in zip(g0, g1)) <= 1e-6
    assert max(float(x.abs().max()) for x in g0) > 1e-3                                # not vacuous


# ---- 6. DAPO dynamic sampling filters on the verdict, not the shaped reward ----------------------

def _rollout(pid, text, answer, n_tokens):
    return Rollout(prompt_id=pid, prompt_ids=[1], completion_ids=[5] * n_tokens,
                   logprobs=[-1.0] * n_tokens, text=text, answer=answer)


class FixedEngine:
    """An engine that returns the same rollouts (copies) for every call, whatever the prompts."""

    def __init__(self, rollouts):
        self.rollouts = rollouts

    def generate(self, prompts, n, sampling, version=0):
        return [dataclasses.replace(r, version=version) for r in self.rollouts]


def test_dynamic_sampling_drops_all_correct_groups_whatever_their_lengths():
    """Through generate_and_score: with the overlong penalty an all-correct group of different
    lengths has different shaped rewards and non-zero advantages, yet DAPO drops it: it filters on
    the verifier's verdicts."""
    a = flags.Args(max_new_tokens=8, overlong_buffer=4, dynamic_sampling=True, prompts_per_step=2,
                   group_size=4)
    group0 = [_rollout(0, "5", "5", n) for n in (2, 6, 7, 8)]          # all correct, lengths differ
    group1 = [_rollout(1, t, "5", 2) for t in ("5", "4", "4", "4")]          # one correct
    run = run_of(a, engine=FixedEngine(group0 + group1))
    run.prompts, run.mine = [None] * 2, [0, 1]
    fresh, generated, _, _ = train.generate_and_score(run, 0, 0)
    shaped = [r for r in generated if r.prompt_id == 0]
    # shaped rewards differ
    assert len({r.reward for r in shaped}) > 1 and any(r.advantage != 0 for r in shaped)
    assert [r.prompt_id for r in fresh] == [1] * 4          # ...but group 0 is all correct: dropped


# ---- 8. every numeric flag: nan, -1 and an absurdly large value ----------------------------------

NUMERIC = [f.name for f in dataclasses.fields(flags.Args)
           if isinstance(f.default, (int, float)) and not isinstance(f.default, bool)]
BASE = ["--prompts-per-step", "8", "--group-size", "4", "--max-new-tokens", "6", "--eval-size", "8",
        "--threads", "1"]


class Started(Exception):
    """Raised where the first step would generate: set-up, flags, data, buffers and the step-0 eval
    all passed."""


def run_main(argv, monkeypatch, tmp_path):
    def first_step(*args, **kw):
        raise Started
    monkeypatch.setattr(train, "generate_and_score", first_step)
    err, out = io.StringIO(), io.StringIO()
    try:
        with redirect_stderr(err), redirect_stdout(out):
            rc = train.main([*BASE, "--out-dir", str(tmp_path / "run"), *argv])
    except Started:
        rc = "started"
    except SystemExit as e:                                         # argparse: an unparseable value
        rc = e.code
    return rc, err.getvalue()


def test_numeric_flags_are_all_covered():
    """The owners' lists of bounds name real flags, and the parametrised test below sees every
    numeric one."""
    bounded = {name for owner in flags.OWNERS for attr in ("AT_LEAST_0", "AT_LEAST_1")
               for name in getattr(owner, attr, ())}
    assert bounded <= set(NUMERIC)
    assert {"veto_threshold", "temperature", "top_p", "eps_low", "eps_high", "seed"} <= set(NUMERIC)


@pytest.mark.parametrize("name", NUMERIC)
def test_numeric_flag_bad_values_are_one_error_line(name, monkeypatch, tmp_path):
    """Each value either starts training normally or ends with exit status 2 and exactly one
    `error:` line; never a traceback (an exception here fails the test)."""
    flag = "--" + name.replace("_", "-")
    is_int = type(getattr(flags.Args(), name)) is int
    for value in ("nan", "-1", "1000000000000" if is_int else "1e300"):
        # each value its own out dir: a started run's step 0 is a run a second one must not join
        rc, err = run_main([flag, value], monkeypatch, tmp_path / value)
        assert rc in (2, "started"), (flag, value, rc, err)
        if rc == 2:
            lines = [ln for ln in err.splitlines() if "error:" in ln]
            assert (len(lines) == 1
                    and (flag in lines[0] or "invalid" in lines[0])), (flag, value, err)
        if value == "nan":
            assert rc == 2, (flag, "nan must never be accepted")


@pytest.mark.parametrize("argv, message", [
    (["--veto-threshold", "0"], "--veto-threshold"),         # crashed in math.log before
    (["--eps-high", "nan"], "--eps-high"),                   # nan passed every comparison before
    (["--max-grad-norm", "inf"], "--max-grad-norm"),
    # 8 x 4 = 32 fresh rollouts: one step would be empty
    (["--mini-batches", "33"], "--mini-batches"),
    (["--prompts-per-step", "9000"], "--prompts-per-step"),  # more than the 7,450 training prompts
    (["--eval-size", "939"], "--eval-size"),                 # the built-in test split holds 938
    (["--dev-size", "913"], "--dev-size"),                   # ... and its dev split 912
    (["--max-new-tokens", "300"], "--max-new-tokens"),       # past the tiny model's 256 positions
    (["--seed", "-1"], "--seed"),
])
def test_specific_bounds(argv, message, monkeypatch, tmp_path):
    rc, err = run_main(argv, monkeypatch, tmp_path)
    assert rc == 2 and message in err and "Traceback" not in err, err


@pytest.mark.parametrize("argv",
                         [["--tau-max", "1000000000000"], ["--replay-capacity", "1000000000000"],
                          ["--priority-alpha", "1e300"], ["--replay-ratio", "1e300"],
                          ["--micro-batch-size", "1000000000000"], ["--lr", "0"], ["--steps", "1"]])
def test_large_legal_values_train_a_step(argv, tmp_path):
    """Legal extremes run two real steps (the second one replays) to the end."""
    out = io.StringIO()
    with redirect_stdout(out), redirect_stderr(io.StringIO()):
        rc = train.main([*BASE, "--steps", "2", "--eval-every", "0",
                         "--out-dir", str(tmp_path / "run"), *argv])
    assert rc == 0
    assert math.isfinite(float(out.getvalue().split("| loss ")[1].split()[0]))


# ---- through the loop: 2. capacity, 7. overlong filter, 9. verifier errors -----------------------

def run_steps(argv, tmp_path):
    out = io.StringIO()
    with redirect_stdout(out), redirect_stderr(io.StringIO()):
        rc = train.main([*BASE, "--eval-every", "0", "--out-dir", str(tmp_path / "run"), *argv])
    with open(tmp_path / "run" / "metrics.jsonl") as f:
        return rc, [json.loads(line) for line in f][1:], out.getvalue()


def test_capacity_at_the_fresh_count_still_replays(tmp_path):
    """Capacity 8 with 8 fresh rollouts per step and 4 requested: the loop samples before it stores,
    so the previous step's 8 are drawn from before this step's 8 replace them (storing first
    replayed 0 at every step)."""
    rc, steps, _ = run_steps(["--steps", "3", "--prompts-per-step", "2", "--replay", "uniform",
                              "--replay-capacity", "8", "--replay-ratio", "0.5",
                              "--mini-batches", "1"], tmp_path)
    assert rc == 0
    assert [m["batch/fresh"] for m in steps] == [8, 8, 8]
    assert [m["replay/sampled"] for m in steps] == [0, 4, 4]
    assert [m["replay/size"] for m in steps] == [8, 8, 8]
    assert [m["replay/age_max"] for m in steps] == [0, 1, 1]


def test_overlong_filter_stores_only_untruncated(tmp_path):
    rc, steps, _ = run_steps(["--steps", "1", "--overlong-filter", "--max-new-tokens", "2"],
                             tmp_path)
    assert rc == 0
    m = steps[0]
    untruncated = round(m["batch/fresh"] * (1 - m["response/truncated_frac"]))
    assert 0 < untruncated < m["batch/fresh"]                              # the case is not vacuous
    assert m["replay/size"] == untruncated


def test_verifier_errors_are_logged_and_warned(tmp_path, monkeypatch):
    import verify

    def broken(response, gold):
        raise RuntimeError("a verifier bug")
    monkeypatch.setattr(verify, "_grade", broken)
    # every answer through the broken full grader, integers too (the task's grade_fast skips it)
    monkeypatch.setattr(verify, "grade_fast", verify.grade)
    rc, steps, stdout = run_steps(["--steps", "1"], tmp_path)
    assert rc == 0
    m = steps[0]
    # 8 x 4 rollouts scored, 8 eval prompts
    assert m["verify/error"] == m["verify/graded"] == 32 + 8
    assert m["verify/timeout"] == 0 and m["verify/worker_restarts"] == 0
    # step 1's line and its continuation (metrics.log_line wraps at 100 characters)
    step = stdout.split("step    1 |", 1)[1].split("\nstep", 1)[0]
    assert "WARNING verifier: 40 internal errors" in step
    assert m["reward/mean"] == 0.0                            # what the warning is there to explain


# ---- the canary: every engine's log-probs against the trainer's ----------------------------------

def test_canary_is_logged_every_check_every_steps(tmp_path):
    rc, steps, _ = run_steps(["--steps", "3", "--check-every", "2"], tmp_path)
    assert rc == 0
    # steps 1 and 3 (step 0, 2 of 0..)
    assert ["rollout/logprob_diff" in m for m in steps] == [True, False, True]
    # fp32: ~1e-7
    assert all(m["rollout/logprob_diff"] < 1e-5 for m in steps if "rollout/logprob_diff" in m)
    rc, steps, _ = run_steps(["--steps", "2", "--check-every", "0"], tmp_path / "off")
    assert rc == 0 and not any("rollout/logprob_diff" in m for m in steps)


def test_a_stale_engine_stops_the_run(tmp_path, monkeypatch):
    """An engine whose weight sync silently does nothing samples from the base model; the canary
    ends the run."""
    monkeypatch.setattr(engine_lib.TorchEngine, "load_weights", lambda self, named: None)
    err = io.StringIO()
    with redirect_stdout(io.StringIO()), redirect_stderr(err):
        rc = train.main([*BASE, "--steps", "3", "--check-every", "1", "--lr", "1e-2",
                         "--max-logprob-diff", "1e-3", "--eval-every", "0",
                         "--out-dir", str(tmp_path / "run")])
    assert rc == 1
    lines = [ln for ln in err.getvalue().splitlines() if "error:" in ln]
    assert (len(lines) == 1 and "rollout/logprob_diff" in lines[0]
            and "step 2" in lines[0]), err.getvalue()


def test_the_long_completion_task_trains_on_its_own_splits(tmp_path):
    """--train-data builtin_steps (the second task, with its own tiny model): it trains on its train
    split and eval/accuracy and eval/dev_accuracy are measured on its own test and dev splits, the
    step-by-step answers graded by the task's rule (a plain integer after the last "=")."""
    import data
    import verify
    model = os.path.join(ROOT, "assets", "tiny-steps")
    rc, steps, out = run_steps(["--steps", "1", "--train-data", "builtin_steps", "--model", model,
                                "--max-new-tokens", "48", "--dev-size", "8"], tmp_path)
    assert rc == 0
    first = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
    assert 0 < first["eval/accuracy"] < 1 and "eval/dev_accuracy" in first
    assert steps[0]["response/len_mean"] > 20                                 # long completions
    lines = (tmp_path / "run" / "samples.jsonl").read_text().splitlines()
    samples = [json.loads(line) for line in lines]
    held_out = {e.question for split in ("test", "dev")
                for e in data.arithmetic_chain_examples(split)}
    assert samples and all(s["prompt"].rstrip("=") not in held_out for s in samples)  # train only
    rule = verify.grader("builtin_steps")
    assert all(s["correct"] == float(rule(s["completion"], s["answer"])) for s in samples)


def _graded(train_data, texts, answer, allocation="fixed", monkeypatch=None):
    """r.correct of hand-made rollouts of one prompt, through train.generate_and_score (fixed
    allocation) or the spine's grade step VIGOR's allocate slot calls (methods.Steps)."""
    rs = [_rollout(0, t, answer, 4) for t in texts]
    a = flags.Args(train_data=train_data, prompts_per_step=1, group_size=len(rs),
                   allocation=allocation, vigor_budget=len(rs))
    if allocation == "fixed":
        run = run_of(a, engine=FixedEngine(rs))
        run.prompts, run.mine = [None], [0]
        _, generated, _, _ = train.generate_and_score(run, 0, 0)
        return [r.correct for r in generated]

    def vigor_generate(engine, prompts, sampling_for, version, grade, **kw):
        grade(rs)
        return rs, {}
    monkeypatch.setattr(vigor, "vigor_generate", vigor_generate)
    run = run_of(a)
    run.prompts, run.mine = [None], [0]
    train.generate_and_score(run, 0, 0)
    return [r.correct for r in rs]


@pytest.mark.parametrize("allocation", ["fixed", "vigor"])
def test_the_long_task_rewards_only_a_plain_integer_final_answer(allocation, monkeypatch):
    """Training on builtin_steps, the reward is the task's rule: "4-1+1*4=" answered with the
    expression after one reduction ("4-1+4", the right value: the shortcut RL found under value
    equality) earns 0, the worked chain and the bare integer 1; on the arithmetic task the same
    completion still earns 1 (verify.grade)."""
    texts = ["4-1+4", "4-1+4=3+4=7", "7", "4-1+4=3+4", "7.0", "4-1+4=3+4=8"]
    for name in ("builtin_steps", "builtin_steps_train"):
        assert _graded(name, texts, "7", allocation, monkeypatch) == [0, 1, 1, 0, 0, 0]
    assert _graded("builtin", texts, "7", allocation, monkeypatch) == [1, 1, 1, 1, 1, 0]


def test_dev_split_is_evaluated_as_dev_accuracy_and_eval_size_0_skips_the_test_eval(tmp_path):
    """--dev-size N: greedy accuracy on the first N prompts of the built-in dev split,
    eval/dev_accuracy, at each eval, the same number eval.evaluate gives on them; --eval-size 0: no
    eval/accuracy at all (a sweep run evaluates only dev)."""
    import data
    import eval as eval_lib
    import verify
    from checkpoint import load_model
    from engine import TorchEngine
    from rollout import Sampling

    def rows(argv, name):
        rc, _, _ = run_steps(["--steps", "2", "--eval-every", "1", "--dev-size", "16", *argv],
                             tmp_path / name)
        assert rc == 0
        lines = (tmp_path / name / "run" / "metrics.jsonl").read_text().splitlines()
        return [json.loads(line) for line in lines]
    both = rows([], "a")
    assert [r["step"] for r in both if "eval/dev_accuracy" in r] == [0, 1, 2]
    assert all("eval/accuracy" in r for r in both)
    model, tok = load_model(os.path.join(ROOT, "assets", "tiny-arith"))
    summary, _ = eval_lib.evaluate(TorchEngine(model, tok), tok, data.builtin_dev("builtin", 16),
                                   template="builtin", k=1, sampling=Sampling(0.0, 1.0, 6, seed=0),
                                   grader=verify.grader("builtin"))
    assert both[0]["eval/dev_accuracy"] == pytest.approx(summary["mean@k"], abs=1e-12)
    dev_only = rows(["--eval-size", "0"], "b")
    assert not any("eval/accuracy" in r for r in dev_only)
    assert [r["step"] for r in dev_only if "eval/dev_accuracy" in r] == [0, 1, 2]


def test_help_lists_every_flag_and_preset(capsys):
    """`python train.py --help` exits 0 (argparse %-formats help strings: a literal % in a field's
    docstring, as in --r2po-head-rank's '2% of a 0.5B model', once made it a traceback)."""
    with pytest.raises(SystemExit) as exit_:
        train.main(["--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert "2% of a 0.5B model" in out and all(f"  {name} " in out for name in flags.PRESETS)
    assert all("--" + f.name.replace("_", "-") in out for f in dataclasses.fields(flags.Args))
