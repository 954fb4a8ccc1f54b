"""The verdict, the shaped reward and the advantage, each set once (train.grade, credit, score, on
the run the door builds: tests/tiny.py); the reward of `--reward correct+format` and the answer
form it pays for (verify.format_rule), on hand-written completions; the format-error rate it is
reported with."""
import functools

import pytest
import torch

import flags
import grpo
import metrics as metrics_lib
import train
import verify
from methods import dapo
from rollout import Rollout
from tiny import run_of


@functools.cache
def run_for(train_data="builtin_steps", **kw):
    """The run the door builds for these flags (--prompt-template builtin): on the long task
    (the default) its grader is verify.grade_integer, on the built-in one verify.grade; the form
    verify.integer_form on both."""
    return run_of(flags.Args(train_data=train_data, prompt_template="builtin", **kw))


def score(rollouts, **kw):
    """train.score of the run of these flags (run_for), with the reward slot's terms where a
    method gives one (DAPO's overlong penalty); returns the verdicts."""
    return train.score(run_for(**kw), rollouts)


def shaped_reward(rollouts, **kw) -> list:
    """r.reward of each rollout as train.score of these flags sets it (run_for)."""
    score(rollouts, **kw)
    return [r.reward for r in rollouts]


@pytest.mark.parametrize("text, ok", [
    ("12", True), (" -3 ", True), ("7+54-6=61-6=55", True), ("3+4=7", True),
    ("61-6", False), ("7+54=61-6", False), ("55.0", False), ("+55", False),
    ("the answer is 55", False), ("55=", False), ("", False), ("1" * 5000, False),
])
def test_integer_form_on_hand_written_completions(text, ok):
    """The built-in tasks' form: a plain integer after the last "=" (whatever its value)."""
    assert verify.integer_form(text) is ok


@pytest.mark.parametrize("text, ok", [
    ("so the area is $\\boxed{\\frac{3}{4}}$.", True), ("\\boxed{12} and then \\fbox{3}", True),
    ("\\boxed{}", False), ("\\boxed{ }", False), ("\\boxed{3", False), ("The answer is 3.", False),
    ("", False),
])
def test_boxed_form_on_hand_written_completions(text, ok):
    assert verify.boxed_form(text) is ok


def test_format_rule_of_each_prompt_set():
    for name in ("builtin", "builtin_dev", "builtin_train", "builtin_steps", "builtin_steps_dev"):
        assert verify.format_rule(name) is verify.integer_form
    for name in ("gsm8k", "math500", "aime24", "some/file.jsonl"):
        assert verify.format_rule(name) is verify.boxed_form


def _rollouts(texts, answers):
    rs = [Rollout(prompt_id=0, prompt_ids=[1], completion_ids=[2] * 3, logprobs=[-1.0] * 3, text=t,
                  answer=a) for t, a in zip(texts, answers)]
    run = run_for()
    assert (run.grader, run.form) == (verify.grade_integer, verify.integer_form)
    train.grade(run, rs)
    return rs


# right and formatted, wrong and formatted, right but unreduced-then-... (not formatted), wrong and
# not formatted: the four outcome classes of R²PO's official reward
TEXTS = ["3+4=7", "3+4=8", "7 ", "3+4"]
ANSWERS = ["7", "7", "7", "7"]


def test_grade_sets_the_verdict_and_the_form():
    rs = _rollouts(TEXTS, ANSWERS)
    assert [r.correct for r in rs] == [1.0, 0.0, 1.0, 0.0]
    assert [r.formatted for r in rs] == [True, True, True, False]


def test_shaped_reward_values():
    """correct: the verdict's value alone (defaults 1 / 0, exactly r.correct); correct+format with
    R²PO's official values right 1, wrong -1, ok 1.25, bad -1: 1 + 1.25, -1 + 1.25, 1 + 1.25 (a
    plain "7 " is in the form), -1 - 1."""
    rs = _rollouts(TEXTS, ANSWERS)
    plain = shaped_reward(rs, max_new_tokens=8)
    assert plain == [1.0, 0.0, 1.0, 0.0]
    official = dict(reward="correct+format", reward_right=1.0, reward_wrong=-1.0, format_ok=1.25,
                    format_bad=-1.0)
    assert shaped_reward(rs, max_new_tokens=8, **official) == [2.25, 0.25, 2.25, -2.0]
    two_sided = dict(reward_right=1.0, reward_wrong=-1.0)                 # no format term
    assert shaped_reward(rs, max_new_tokens=8, **two_sided) == [1.0, -1.0, 1.0, -1.0]


def test_four_classes_give_four_rewards_and_the_format_error_rate():
    rs = _rollouts(TEXTS + ["3+4=9x"], ANSWERS + ["7"])
    score(rs, reward="correct+format", reward_wrong=-1.0, max_new_tokens=8)
    assert [r.reward for r in rs] == [2.25, 0.25, 2.25, -2.0, -2.0]
    row = metrics_lib.rollout_metrics(rs, rs).reduce(1)
    assert row["rollout/format_error"] == pytest.approx(2 / 5)
    assert row["rollout/prompts_with_signal"] == 1 and row["rollout/zero_var_rollouts"] == 0


def test_reward_flag_in_help_and_a_bad_value_is_one_line(capsys):
    with pytest.raises(SystemExit) as e:
        flags.parse(["--reward", "format"])
    assert e.value.code == 2
    assert "correct+format" in capsys.readouterr().err


# ---- the verdict and the shaped reward: set once each --------------------------------------------

def test_grade_sets_the_verdict_and_score_the_shaped_reward():
    """train.grade sets r.correct (the verifier's verdict) and nothing else; score reads it,
    sets r.reward (with DAPO's overlong penalty, the term its allocate slot adds: not the verdict)
    and r.advantage, leaves the verdict as it was and returns the verdicts. Scoring again gives the
    same rewards: it starts from r.correct, never from an earlier r.reward."""
    texts = ["7", "7", "8", "8", "5", "5"]
    lengths = [1, 4, 1, 3, 2, 4]       # max_new_tokens 4, buffer 2: penalty 0, -1, 0, -0.5, 0, -1
    rs = [Rollout(prompt_id=i // 4, prompt_ids=[1], completion_ids=[2] * n, logprobs=[0.0] * n,
                  text=t, answer="7" if i < 4 else "5")
          for i, (t, n) in enumerate(zip(texts, lengths))]
    train.grade(run_for("builtin"), rs)
    assert [r.correct for r in rs] == [1.0, 1.0, 0.0, 0.0, 1.0, 1.0]
    assert all(r.reward == 0.0 and r.advantage == 0.0 for r in rs)  # grading scores nothing
    overlong = dict(train_data="builtin", overlong_buffer=2, max_new_tokens=4)
    verdicts = score(rs, **overlong)
    assert verdicts.tolist() == [1.0, 1.0, 0.0, 0.0, 1.0, 1.0]
    assert [r.correct for r in rs] == verdicts.tolist()            # the verdict unchanged
    rewards = [1.0, 0.0, 0.0, -0.5, 1.0, 0.0]
    assert [r.reward for r in rs] == rewards                       # shaped: not the verdict
    adv = grpo.grpo_advantages(torch.tensor(rewards), torch.tensor([0, 0, 0, 0, 1, 1]))
    assert [r.advantage for r in rs] == pytest.approx(adv.tolist())
    # DAPO's dynamic sampling reads the verdicts: group 1 is all correct, whatever its rewards
    assert dapo.dynamic_sampling_keep(verdicts, torch.tensor([0, 0, 0, 0, 1, 1])).tolist() == [
        True] * 4 + [False] * 2
    score(rs, **overlong)
    assert [r.reward for r in rs] == rewards and [r.correct for r in rs] == verdicts.tolist()
    score(rs, train_data="builtin", max_new_tokens=4)            # no penalty: reward = verdict
    assert [r.reward for r in rs] == [r.correct for r in rs]


# ---- --reward partial: the long task's partial credit (verify.step_share, train.credit) ---------

@pytest.mark.parametrize("step, value", [
    ("7+54-3*2-1", 54), ("61-6-1", 54), ("54", 54), (" 54 ", 54), ("2*3*4-5*6", -6),
    ("-17+3", -14), ("-17 + 3", -14), ("5--3", 8), ("2*-3", -6), ("1-9*2+3", -14), ("0*7", 0),
    ("007", 7), ("", None), ("  ", None), ("+54", None), ("54+", None), ("5 4", None),
    ("5**3", None), ("5/3", None), ("(5)", None), ("5+ +3", None), ("5---3", None),
    ("54.0", None), ("x", None), ("\u0663", None), ("__import__('os')", None), ("1" * 201, None),
    ("1+" * 100 + "1", None), ("1+" * 99 + "1", 100),
])
def test_step_value_by_hand(step, value):
    """Integers -?[0-9]+ joined by + - *, * first, spaces between tokens; anything else None (an
    Arabic-Indic digit too); a step over MAX_STEP_CHARS = 200 characters is not read (201 "1"s,
    and 1+1+...+1 of 201 characters; of 199 it is 100)."""
    assert verify.step_value(step) == value


# (completion, gold, share of steps of the gold value, the verdict by grade_integer)
CHAINS = [
    ("7+54-3*2-1=7+54-6-1=61-6-1=55-1=54", "54", 5 / 5, 1.0),    # all right (the worked solution)
    ("7+54-3*2-1=7+54-6-1=60-6-1=54-1=53", "54", 2 / 5, 0.0),    # wrong at step 3, carried on
    ("7+54-3*2-1=7+54-6-1=61-6-1", "54", 3 / 3, 0.0),            # right steps, unreduced final
    ("7+54-3*2-1=99=54", "54", 2 / 3, 1.0),                      # right answer through a bad step
    ("54", "54", 1.0, 1.0),                                      # no "=": one step
    ("7+47", "54", 1.0, 0.0),                                    # one unreduced step
    ("54=", "54", 1 / 2, 0.0),                                   # a trailing "=": an empty step
    ("1-18+3=-17+3=-14", "-14", 1.0, 1.0),                       # negative numbers
    ("1-18+3=-17+3=-15", "-14", 2 / 3, 0.0),                     # wrong at the last step
    ("7 + 54 - 6 - 1 = 61 - 6 - 1 = 55 - 1 = 54 ", "54", 1.0, 1.0),   # spaces
    ("7+54-6-1=61-6-1=5 4", "54", 2 / 3, 0.0),                  # a space inside a number
    ("hello=world", "54", 0.0, 0.0), ("the answer is 54", "54", 0.0, 0.0),   # garbage
    ("54.0", "54", 0.0, 0.0), ("+54", "54", 0.0, 0.0), ("", "54", 0.0, 0.0),
    ("54", "x", 0.0, 0.0),                                       # a gold that is not an integer
    ("1" * 5000, "54", 0.0, 0.0),                                # one overlong step: not read
    ("54=" * 3000 + "54", "54", 1.0, 1.0),                       # 3,001 right steps: all read
    ("=" * 1000, "54", 0.0, 0.0),
    ("54=" * 70_000 + "54", "54", 0.0, 1.0),   # over MAX_RESPONSE_CHARS: its steps are not read
]


@pytest.mark.parametrize("text, gold, share, verdict", CHAINS)
def test_step_share_on_hand_written_chains(text, gold, share, verdict):
    assert verify.step_share(text, gold) == pytest.approx(share)
    assert float(verify.grade_integer(text, gold)) == verdict


def test_partial_reward_by_hand():
    """--reward partial: c = (v + share) / 2 on CHAINS, v = grade_integer's verdict: 1 (all right),
    2/5 / 2 = 0.2 (wrong at step 3 of 5: (k - 1) / 2K), 1/2 (unreduced), (1 + 2/3) / 2 = 5/6 (a
    right answer through a wrong step), ... 0 (garbage, empty, overlong), 1/2 (over
    MAX_RESPONSE_CHARS, right: v alone). c = 1 exactly where the verdict is right and every step
    keeps the value; a wrong answer scores at most 1/2, a right one at least 1/2 and more when its
    steps are read (its last step keeps the value). With right 1, wrong -1: r = -1 + 2c; with
    partial+format, the form's term on top."""
    texts = [t for t, *_ in CHAINS]
    rs = _rollouts(texts, [g for _, g, *_ in CHAINS])
    credit = [(v + s) / 2 for _, _, s, v in CHAINS]
    assert credit[:4] == pytest.approx([1.0, 0.2, 0.5, 5 / 6])
    got = shaped_reward(rs, reward="partial", max_new_tokens=8)
    assert got == pytest.approx(credit)
    assert [c == 1.0 for c in got] == [s == 1.0 and v == 1.0 for _, _, s, v in CHAINS]
    right = [c for c, r in zip(got, rs) if r.correct == 1.0]
    wrong = [c for c, r in zip(got, rs) if r.correct == 0.0]
    assert min(right) == 0.5 == max(wrong)            # the unread right one; the unreduced chain
    assert min(c for c, r in zip(got, rs) if r.correct == 1.0 and len(r.text) < 10_000) > 0.5
    two_sided = dict(reward="partial", reward_right=1.0, reward_wrong=-1.0)
    assert shaped_reward(rs, max_new_tokens=8, **two_sided) == pytest.approx(
        [-1 + 2 * c for c in credit])
    official = dict(reward="partial+format", reward_wrong=-1.0)           # ok 1.25, bad -1
    form = [1.25 if verify.integer_form(t) else -1.0 for t in texts]
    assert shaped_reward(rs, max_new_tokens=8, **official) == pytest.approx(
        [-1 + 2 * c + b for c, b in zip(credit, form)])


def test_partial_reward_shapes_only_the_reward_not_the_verdict():
    """score with --reward partial sets r.reward to the credit and leaves r.correct the grader's
    1/0 (what it returns, what dynamic sampling reads); --reward correct gives the verdict as
    before. A group of all-wrong answers (0 signal under the verdict) gets advantages."""
    texts = ["61-6-1=55-1=54", "61-6-1=55-1", "61-6-1=56-1=55", "xyz"]
    rs = _rollouts(texts, ["54"] * 4)
    verdicts = score(rs, reward="partial", max_new_tokens=8)
    assert verdicts.tolist() == [1.0, 0.0, 0.0, 0.0] == [r.correct for r in rs]
    assert [r.reward for r in rs] == pytest.approx([1.0, 0.5, 1 / 6, 0.0])
    score(rs, max_new_tokens=8)
    assert [r.reward for r in rs] == [1.0, 0.0, 0.0, 0.0]
    wrong = _rollouts(texts[1:], ["54"] * 3)
    score(wrong, reward="partial", max_new_tokens=8)
    assert len({r.advantage for r in wrong}) == 3


def test_partial_credit_of_every_worked_solution_is_1():
    """data.worked_solution's chains, the task's own answers: every step keeps the value, the
    verdict is right, c = 1."""
    import data
    for ex in data.arithmetic_chain_examples("dev", 300):
        chain = data.worked_solution(ex.question)
        assert verify.step_share(chain, ex.answer) == 1.0 and verify.grade_integer(chain, ex.answer)


def test_partial_reward_flag():
    a = flags.parse(["--reward", "partial"])
    assert a.reward == "partial" and flags.Args().reward == "correct"    # the default unchanged
    assert flags.parse(["--reward", "partial+format"]).reward == "partial+format"
