"""Your data and your reward: a training file with fields of its own names (--question-key,
--answer-key) trains, a file that is empty, lacks the field or cannot be read is one error line;
--reward-fn's value is the reward the advantage is computed from (the verdict stays the grader's),
and a bad path, a missing function, a wrong signature, a non-finite or a non-number value are one
error line each, never a traceback."""
import io
import json
import math
import os
from contextlib import redirect_stderr, redirect_stdout

import pytest
import torch

import data
import grpo
import reward_fn
import train
from flags import Args
from rollout import Rollout
from tiny import run_main, run_of

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(ROOT, "examples", "reward_length.py")
pytestmark = pytest.mark.usefixtures("cpu_only")
torch.set_num_threads(1)
# the smallest real run: 1 step of 2 prompts x 2 completions, no eval
TINY = ["--steps", "1", "--prompts-per-step", "2", "--group-size", "2", "--max-new-tokens", "4",
        "--eval-size", "0", "--dev-size", "0", "--eval-every", "0", "--save-every", "0",
        "--threads", "1", "--prompt-template", "builtin"]


def main_error(argv, tmp_path) -> tuple[int, str]:
    """train.main in process: (exit status, stderr); an argparse exit counts as its status."""
    err = io.StringIO()
    with redirect_stdout(io.StringIO()), redirect_stderr(err):
        rc = train.main([*TINY, "--out-dir", str(tmp_path / "run"), *argv])
    return rc, err.getvalue()


def one_error_line(text: str) -> str:
    assert "Traceback" not in text, text
    lines = [line for line in text.splitlines() if "error:" in line]
    assert len(lines) == 1, text
    return lines[0]


def write_rows(path, rows) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


# ---- --question-key, --answer-key ----------------------------------------------------------------

def test_a_data_file_with_its_own_field_names_trains_and_evaluates(tmp_path):
    """Fields named expr / value.int: the training prompts and an --eval-benchmarks file of the
    same layout are read with the flags (eval/mine/mean@1 logged before and after the step)."""
    rows = [{"expr": e.question, "value": {"int": int(e.answer)}}
            for e in data.arithmetic_examples("train", 20)]
    mine = write_rows(tmp_path / "mine.jsonl", rows)
    rc, steps, _ = run_main([*TINY, "--train-data", mine, "--question-key", "expr",
                             "--answer-key", "value.int", "--eval-benchmarks", mine],
                            tmp_path / "run")
    assert rc == 0 and [m["step"] for m in steps] == [1]
    assert 0 <= steps[0]["eval/mine/mean@1"] <= 1 and steps[0]["batch/fresh"] == 4


@pytest.mark.parametrize("content, argv, message", [
    ("", [], "mine.jsonl: the file is empty (no rows)"),
    ('{"expr": "2+3", "value": "5"}\n', ["--question-key", "q", "--answer-key", "value"],
     "missing field 'q' (fields: expr, value); name the question field with --question-key"),
    ('{"expr": "2+3", "value": "5"}\n', ["--question-key", "expr"],
     "no answer field among answer, final_answer, ground_truth (fields: expr, value); name it "
     "with --answer-key"),
    (b"\x89PNG\r\n", [], "not UTF-8 text"),
])
def test_a_data_file_that_is_empty_lacks_the_field_or_is_unreadable(tmp_path, content, argv,
                                                                   message):
    path = tmp_path / "mine.jsonl"
    path.write_bytes(content) if isinstance(content, bytes) else path.write_text(content)
    rc, err = main_error(["--train-data", str(path), *argv], tmp_path)
    assert rc == 2 and message in one_error_line(err)


def test_keys_without_a_data_file_are_refused(tmp_path):
    rc, err = main_error(["--question-key", "q"], tmp_path)
    assert rc == 2 and "--eval-benchmarks name no file" in one_error_line(err)


# ---- --reward-fn ---------------------------------------------------------------------------------

def rollouts(texts, answer="5", group_of=2):
    return [Rollout(prompt_id=i // group_of, prompt_ids=[1, 2], completion_ids=[3],
                    logprobs=[0.0], text=t, answer=answer, correct=float(t == answer))
            for i, t in enumerate(texts)]


def reward_file(tmp_path, body: str) -> str:
    path = tmp_path / "mine.py"
    path.write_text(body)
    return str(path)


def test_the_functions_value_is_the_reward_the_advantage_is_computed_from(tmp_path):
    spec = reward_file(tmp_path, "def length(completion, gold_answer):\n"
                                 "    return len(completion) + (gold_answer == '5')\n"
                                 "def with_prompt(completion, gold_answer, prompt):\n"
                                 "    return float(prompt == 'a b')\n")
    rs = rollouts(["5", "5 5", "x", "5"])
    # --reward-right / --reward-wrong are unused under --reward-fn
    run = run_of(Args(reward_wrong=-1.0, reward_right=3.0))
    run.own_reward = reward_fn.make(spec + ":length", tokenizer=None)
    verdicts = train.score(run, rs)
    want = torch.tensor([2.0, 4.0, 2.0, 2.0])
    assert [r.reward for r in rs] == want.tolist()
    adv = grpo.grpo_advantages(want, grpo.group_ids(rs))
    assert [r.advantage for r in rs] == adv.tolist() and adv.abs().sum() > 0
    # the verdict stays the grader's
    assert verdicts.tolist() == [r.correct for r in rs] == [1.0, 0.0, 0.0, 1.0]

    class Tok:
        def decode(self, ids):
            return " ".join("ab"[i - 1] for i in ids)
    run.own_reward = reward_fn.make(spec + ":with_prompt", Tok())
    train.score(run, rs)
    assert [r.reward for r in rs] == [1.0] * 4


def test_a_run_trains_on_the_functions_value(tmp_path):
    """1 step: every rollout's reward is the constant, so every group has zero variance; the
    accuracy is the grader's. The shipped example runs too."""
    spec = reward_file(tmp_path, "def half(completion, gold_answer):\n    return 0.5\n")
    rc, steps, _ = run_main([*TINY, "--reward-fn", spec + ":half"], tmp_path / "a")
    assert rc == 0 and steps[0]["reward/mean"] == 0.5 and steps[0]["reward/zero_std_frac"] == 1.0
    rc, steps, _ = run_main([*TINY, "--reward-fn", EXAMPLE + ":right_and_brief"], tmp_path / "b")
    assert rc == 0 and math.isfinite(steps[0]["reward/mean"])


@pytest.mark.parametrize("body, spec, message", [
    ("", "/no/such/file.py:f", "--reward-fn: no such file: /no/such/file.py"),
    ("", "mine.py", "expected path/to/file.py:function_name"),
    ("def f(c, g):\n    return 1.0\n", "mine.py:g", "has no function 'g' (its functions: f)"),
    ("def f(completion):\n    return 1.0\n", "mine.py:f",
     "it takes (completion), but is called as fn(completion, gold_answer)"),
    ("def f(c, g, extra):\n    return 1.0\n", "mine.py:f", "it takes (c, g, extra)"),
    ("def f(c, g:\n", "mine.py:f", "mine.py, line 1"),
])
def test_a_bad_reward_function_is_one_line_before_training(tmp_path, body, spec, message):
    reward_file(tmp_path, body)
    spec = spec if spec.startswith("/") else str(tmp_path / spec)
    with pytest.raises(ValueError, match="--reward-fn"):
        reward_fn.make(spec, tokenizer=None)
    rc, err = main_error(["--reward-fn", spec], tmp_path)
    assert rc == 2 and message in one_error_line(err)
    assert not (tmp_path / "run" / "metrics.jsonl").exists()        # stopped before step 0


@pytest.mark.parametrize("value, shown", [("float('nan')", "nan (float)"),
                                          ("float('inf')", "inf (float)"),
                                          ("None", "None (NoneType)"), ("'1'", "'1' (str)")])
def test_a_value_that_is_not_a_finite_number_is_one_line_at_the_first_step(tmp_path, value,
                                                                           shown):
    spec = reward_file(tmp_path, f"def f(completion, gold_answer):\n    return {value}\n")
    rc, err = main_error(["--reward-fn", spec + ":f"], tmp_path)
    line = one_error_line(err)
    assert rc == 2 and f"returned {shown}" in line and "must return a finite number" in line


def test_reward_fn_and_partial_credit_are_two_verdict_terms(tmp_path):
    rc, err = main_error(["--reward-fn", EXAMPLE + ":right_and_brief", "--reward", "partial"],
                         tmp_path)
    assert rc == 2 and "choose one" in one_error_line(err)


def test_the_flag_is_in_the_reward_group():
    import flags
    assert Args().reward_fn == "" and "reward_fn" in flags.RewardFlags.__dataclass_fields__


# ---- keys read values, not containers (a gold answer never leaks into a prompt) ------------------

NESTED = [{"item": {"q": "8*7=", "a": "56"}}, {"item": {"q": "2+3=", "a": "5"}}]


@pytest.mark.parametrize("question, answer, message", [
    ("item", "item.a", "--question-key item names an object, not a value: "
                       '{"q": "8*7=", "a": "56"}; name a field inside it (item.q, item.a)'),
    ("item.q", "item", "--answer-key item names an object, not a value"),
    ("item.qq", "item.a", "missing field 'item.qq' (fields of item: q, a); name the question "
                          "field with --question-key"),
    ("item.q.x", "item.a", "missing field 'item.q.x' (item.q is not an object)"),
])
def test_a_key_that_names_an_object_or_misses_is_one_line(tmp_path, question, answer, message):
    """The issue's file: --question-key item once trained on "{'q': '8*7=', 'a': '56'}" (the gold
    in the prompt); now it, an object as the answer and a typo at depth 2 (the fields there listed)
    are one line, exit 2, before step 0."""
    path = write_rows(tmp_path / "nested.jsonl", NESTED)
    with pytest.raises(ValueError, match="nested.jsonl:1: "):
        data.load_benchmark(path, question_key=question, answer_key=answer)
    rc, err = main_error(["--train-data", path, "--question-key", question,
                          "--answer-key", answer], tmp_path)
    assert rc == 2 and message in one_error_line(err)
    assert not (tmp_path / "run" / "metrics.jsonl").exists()
    assert data.load_benchmark(path, question_key="item.q", answer_key="item.a") == [
        data.Example("8*7=", "56"), data.Example("2+3=", "5")]


def test_a_list_of_objects_is_no_value_but_chat_messages_are_a_question(tmp_path):
    """A list holding objects is refused as a question or an answer; a question's list of chat
    messages is its last user message, an answer's list of plain values the published multi-answer
    form ("5, 7"); a question's list of plain values is refused (nothing says which is asked)."""
    rows = [{"messages": [{"role": "system", "content": "be brief"},
                          {"role": "user", "content": "2+3="}], "golds": [{"v": "5"}],
             "two": [5, 7], "parts": ["2+3=", "3+2="]}]
    path = write_rows(tmp_path / "chat.jsonl", rows)
    with pytest.raises(ValueError, match=r"chat.jsonl:1: --answer-key golds names a list of 1, "
                                         r'not a value: \[\{"v": "5"\}\]'):
        data.load_benchmark(path, question_key="messages", answer_key="golds")
    with pytest.raises(ValueError, match=r"--question-key parts names a list of 2"):
        data.load_benchmark(path, question_key="parts", answer_key="two")
    assert data.load_benchmark(path, question_key="messages", answer_key="two") == [
        data.Example("2+3=", "5, 7")]


# ---- every bad reward is one line, exit 2 --------------------------------------------------------

def test_a_reward_file_whose_import_fails_is_one_line_before_training(tmp_path):
    spec = reward_file(tmp_path, "import no_such_module_here\n"
                                 "def f(completion, gold_answer):\n    return 1.0\n") + ":f"
    with pytest.raises(ValueError, match=r"importing .*mine.py failed: ModuleNotFoundError: No "
                                         r"module named 'no_such_module_here' \(mine.py, line 1\)"):
        reward_fn.make(spec, tokenizer=None)
    rc, err = main_error(["--reward-fn", spec], tmp_path)
    assert rc == 2 and "ModuleNotFoundError" in one_error_line(err)
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


RAISES = ("def f(completion, gold_answer):\n"
          "    table = {}\n"
          "    return table[completion]\n")


def test_a_reward_function_that_raises_mid_run_is_one_line_naming_it(tmp_path):
    """It raised KeyError at its line 3: one line with the exception, the line and the completion,
    exit 2 (it was 33 lines of traceback, exit 1)."""
    spec = reward_file(tmp_path, RAISES) + ":f"
    with pytest.raises(reward_fn.RewardFnError, match=r"raised KeyError: '5' \(mine.py, line 3\) "
                                                      r"on the completion '5' \(gold '5'\)"):
        reward_fn.make(spec, tokenizer=None)(rollouts(["5"]))
    rc, err = main_error(["--reward-fn", spec], tmp_path)
    line = one_error_line(err)
    assert rc == 2 and "raised KeyError" in line and "(mine.py, line 3)" in line


def test_a_held_reward_error_gives_zeros_and_is_kept_for_every_rank_to_stop(tmp_path):
    """hold=True (train.py under torchrun): the failing call's rollouts get 0.0 and the first error
    is kept; parallel.stop_together raises it (one rank: the error itself)."""
    import parallel
    own = reward_fn.make(reward_file(tmp_path, RAISES) + ":f", tokenizer=None, hold=True)
    assert own(rollouts(["5", "6"])) == [0.0, 0.0] and "KeyError: '5'" in str(own.error)
    own(rollouts(["7"]))
    assert "KeyError: '5'" in str(own.error)                  # the first one stays
    parallel.stop_together(None, 1)
    with pytest.raises(reward_fn.RewardFnError, match="KeyError"):
        parallel.stop_together(own.error, 1)


def _stop_on_two_ranks(rank: int, init: str, out: str) -> None:
    import torch.distributed as dist

    import parallel
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    try:
        parallel.stop_together(None, 2)                       # nobody failed: both go on
        error = reward_fn.RewardFnError("bad value") if rank == 1 else None
        parallel.stop_together(error, 2)
        result = "went on"
    except parallel.RanksStopped as e:
        result = str(e)
    finally:
        dist.destroy_process_group()
    with open(f"{out}.{rank}", "w") as f:
        f.write(result)


def test_under_two_ranks_both_stop_with_the_failing_ranks_cause(tmp_path):
    """Rank 1's reward failed: both ranks raise RanksStopped at the same call, with rank 1's
    message (main prints it on rank 0 once; neither is left waiting in a collective)."""
    import torch.multiprocessing as mp
    out = str(tmp_path / "result")
    mp.spawn(_stop_on_two_ranks, args=(f"file://{tmp_path / 'store'}", out), nprocs=2)
    results = {open(f"{out}.{r}").read() for r in (0, 1)}
    assert results == {"bad value (rank 1 of 2; every rank stopped)"}


def test_the_error_record_is_what_torchruns_summary_shows(tmp_path, monkeypatch):
    """parallel.record_error writes torch's elastic error file: torchrun's ProcessFailure reads our
    one line as the failure's message (in place of "To enable traceback see: ...")."""
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

    import parallel
    path = tmp_path / "error.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(path))
    assert parallel.fail("error: runs/x already holds a run", 2) == 2
    failure = ProcessFailure(local_rank=0, pid=1, exitcode=2, error_file=str(path))
    assert failure.message == "error: runs/x already holds a run"
    monkeypatch.delenv("TORCHELASTIC_ERROR_FILE")
    path.unlink()
    parallel.record_error("error: nothing to record")
    assert not path.exists()


def test_reward_fn_py_prints_the_value_rounded():
    """`python reward_fn.py FILE:NAME COMPLETION GOLD` prints 0.82, not 0.8200000000000001."""
    import subprocess
    import sys
    p = subprocess.run([sys.executable, "reward_fn.py", f"{EXAMPLE}:right_and_brief",
                        " 42 and more", "42"], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0 and p.stdout == "0.82\n", p.stdout + p.stderr
