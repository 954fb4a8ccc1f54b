"""The verdict, the shaped reward and the advantage, each set once (allocation.grade,
shaped_reward, score); the reward of `--reward correct+format` and the answer form it pays for
(verify.format_rule), on hand-written completions; the format-error rate it is reported with."""
import pytest
import torch

import allocation
import flags
import grpo
import metrics as metrics_lib
import verify
from metrics import Metrics
from rollout import Rollout


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
    allocation.grade(rs, verify.grade_integer, verify.integer_form)
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
    plain = allocation.shaped_reward(rs, allocation.Flags(), max_len=8)
    assert plain.tolist() == [1.0, 0.0, 1.0, 0.0]
    official = allocation.Flags(reward="correct+format", reward_right=1.0, reward_wrong=-1.0,
                                format_ok=1.25, format_bad=-1.0)
    assert allocation.shaped_reward(rs, official, max_len=8).tolist() == [2.25, 0.25, 2.25, -2.0]
    two_sided = allocation.Flags(reward_right=1.0, reward_wrong=-1.0)     # no format term
    assert allocation.shaped_reward(rs, two_sided, max_len=8).tolist() == [1.0, -1.0, 1.0, -1.0]


def test_four_classes_give_four_rewards_and_the_format_error_rate():
    rs = _rollouts(TEXTS + ["3+4=9x"], ANSWERS + ["7"])
    allocation.score(rs, allocation.Flags(reward="correct+format", reward_wrong=-1.0), max_len=8)
    assert [r.reward for r in rs] == [2.25, 0.25, 2.25, -2.0, -2.0]
    m = Metrics()
    metrics_lib.rollout_metrics(m, rs, rs)
    row = m.reduce(1)
    assert row["rollout/format_error"] == pytest.approx(2 / 5)
    assert row["rollout/prompts_with_signal"] == 1 and row["rollout/zero_var_rollouts"] == 0


def test_reward_flag_in_help_and_a_bad_value_is_one_line(capsys):
    with pytest.raises(SystemExit) as e:
        flags.parse(["--reward", "format"])
    assert e.value.code == 2
    assert "correct+format" in capsys.readouterr().err


# ---- the verdict and the shaped reward: set once each --------------------------------------------

def test_grade_sets_the_verdict_and_score_the_shaped_reward():
    """allocation.grade sets r.correct (the verifier's verdict) and nothing else; score reads it,
    sets r.reward (with DAPO's overlong penalty: not the verdict) and r.advantage, leaves the
    verdict as it was and returns the verdicts. Scoring again gives the same rewards: it starts from
    r.correct, never from an earlier r.reward."""
    texts = ["7", "7", "8", "8", "5", "5"]
    lengths = [1, 4, 1, 3, 2, 4]       # max_new_tokens 4, buffer 2: penalty 0, -1, 0, -0.5, 0, -1
    rs = [Rollout(prompt_id=i // 4, prompt_ids=[1], completion_ids=[2] * n, logprobs=[0.0] * n,
                  text=t, answer="7" if i < 4 else "5")
          for i, (t, n) in enumerate(zip(texts, lengths))]
    allocation.grade(rs)
    assert [r.correct for r in rs] == [1.0, 1.0, 0.0, 0.0, 1.0, 1.0]
    assert all(r.reward == 0.0 and r.advantage == 0.0 for r in rs)  # grading scores nothing
    dapo = allocation.Flags(overlong_buffer=2)
    verdicts = allocation.score(rs, dapo, max_len=4)
    assert verdicts.tolist() == [1.0, 1.0, 0.0, 0.0, 1.0, 1.0]
    assert [r.correct for r in rs] == verdicts.tolist()            # the verdict unchanged
    rewards = [1.0, 0.0, 0.0, -0.5, 1.0, 0.0]
    assert [r.reward for r in rs] == rewards                       # shaped: not the verdict
    adv = grpo.grpo_advantages(torch.tensor(rewards), torch.tensor([0, 0, 0, 0, 1, 1]))
    assert [r.advantage for r in rs] == pytest.approx(adv.tolist())
    # DAPO's dynamic sampling reads the verdicts: group 1 is all correct, whatever its rewards
    assert grpo.dynamic_sampling_keep(verdicts, torch.tensor([0, 0, 0, 0, 1, 1])).tolist() == [
        True] * 4 + [False] * 2
    allocation.score(rs, dapo, max_len=4)
    assert [r.reward for r in rs] == rewards and [r.correct for r in rs] == verdicts.tolist()
    allocation.score(rs, allocation.Flags(), max_len=4)            # no penalty: reward = verdict
    assert [r.reward for r in rs] == [r.correct for r in rs]
