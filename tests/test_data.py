"""data.py: the published benchmark files load as their README says, gold answers are extracted, bad
input names the file and line, and the prompt templates produce the exact text."""
import json
import sys
from pathlib import Path

import pytest

import data

ROOT = Path(__file__).resolve().parents[1]

# The published files are read from ../shared/data (conftest's `shared_data` fixture: a test that
# needs them skips, naming the path, where the repository is copied without ../shared).
# Row counts from ../shared/data/README.md's table.
README_ROWS = {"gsm8k_train": 7473, "gsm8k_test": 1319, "math500": 500, "aime24": 30, "amc23": 40,
               "minerva": 272, "olympiadbench": 675}


@pytest.mark.parametrize("name", sorted(README_ROWS))
def test_every_benchmark_loads_with_readme_row_count_and_gold(name, shared_data):
    exs = data.load_benchmark(name, data_dir=str(shared_data))
    assert len(exs) == README_ROWS[name]
    assert all(isinstance(e.question, str) and e.question.strip() for e in exs)
    assert all(isinstance(e.answer, str) and e.answer.strip() for e in exs)


def test_every_published_file_has_a_loader(shared_data):
    files = {p.name for p in shared_data.glob("*.jsonl")} - {"verifier_cases.jsonl"}
    assert files == {f for f, _, _ in data.BENCHMARKS.values()}


def test_readme_table_matches_counts(shared_data):
    readme = (shared_data / "README.md").read_text()
    assert "| `gsm8k_train.jsonl`, `gsm8k_test.jsonl` | 7473, 1319 |" in readme
    for name, file in [("math500", "math500"), ("aime24", "aime24"), ("amc23", "amc23"),
                       ("minerva", "minerva_math"), ("olympiadbench", "olympiadbench")]:
        assert f"| `{file}.jsonl` | {README_ROWS[name]} |" in readme


def test_gold_answers_as_published(shared_data):
    load = lambda name: data.load_benchmark(name, data_dir=str(shared_data))   # noqa: E731
    first = {n: load(n)[0].answer
             for n in ("gsm8k", "math500", "aime24", "amc23", "minerva", "olympiadbench")}
    assert first == {"gsm8k": "18", "math500": "\\left( 3, \\frac{\\pi}{2} \\right)",
                     "aime24": "204", "amc23": "27", "minerva": "1.6", "olympiadbench": "2"}
    # GSM8K's "#### 1,080"-style answers lose the separator; every gold is then a plain integer.
    assert all(e.answer.lstrip("-").isdigit() for e in load("gsm8k_train"))
    # AIME keeps its published zero-padded strings; the verifier compares them as numbers.
    assert "025" in {e.answer for e in load("aime24")}


def test_minerva_all_272_from_boxed_with_nested_braces(shared_data):
    text = (shared_data / "minerva_math.jsonl").read_text()
    rows = [json.loads(line) for line in text.splitlines()]
    exs = data.load_benchmark("minerva", data_dir=str(shared_data))
    assert len(exs) == 272
    for row, ex in zip(rows, exs):
        assert "\\boxed{" + ex.answer in row["solution"].replace("\\boxed{ ", "\\boxed{")
        assert ex.answer.count("{") == ex.answer.count("}")
    assert sum("{" in e.answer for e in exs) > 20       # nested braces are common, not an edge case


def test_last_boxed():
    assert data.last_boxed("a \\boxed{1} then \\boxed{\\frac{1}{2}} end") == "\\frac{1}{2}"
    assert data.last_boxed("x = \\boxed{ {a}^{ {b} } }.") == "{a}^{ {b} }"
    assert data.last_boxed("\\fbox{7}") == "7"
    assert data.last_boxed("no box") is None
    assert data.last_boxed("\\boxed{unbalanced {") is None


def test_olympiad_answers():
    assert data.olympiad_answer(["$\\frac{1}{2 n+2}$"]) == "\\frac{1}{2 n+2}"
    assert data.olympiad_answer(["$69$,$84$"]) == "69,84"
    assert data.olympiad_answer(["3", "5"]) == "3, 5"
    # the list written as a string
    assert data.olympiad_answer("['$2^{1009}$', '7']") == "2^{1009}, 7"


def test_olympiadbench_answers_as_published(shared_data):
    exs = data.load_benchmark("olympiadbench", data_dir=str(shared_data))
    assert "(1,8,19), (2,7,13), (4,5,7)" in {e.answer for e in exs}
    assert not any("$" in e.answer for e in exs)


def test_builtin_names():
    assert (data.load_benchmark("builtin")
            == data.arithmetic_examples("test", data.BUILTIN_TEST_SIZE, seed=0))
    assert len(data.load_benchmark("builtin")) == 500
    train = data.load_benchmark("builtin_train")
    assert len(train) == data.BUILTIN_TRAIN_SIZE == len(data.arithmetic_examples("train"))  # all
    assert not {e.question for e in train} & {e.question for e in data.load_benchmark("builtin")}
    dev = data.arithmetic_examples("dev", data.BUILTIN_DEV_SIZE, seed=0)
    assert data.load_benchmark("builtin_dev") == dev
    assert data.template_for("builtin_dev") == "builtin"
    assert data.bench_label("builtin_dev") == "builtin_dev"
    # Every accuracy in the repository is quoted on this test split: it must never change.
    # (assets/make_tiny_model.py trains on the train split and stops by the dev split.)
    assert data.arithmetic_examples("test", 3) == [
        data.Example("6*4+1", "25"), data.Example("1*0-8", "-8"), data.Example("6-3+3", "6")]
    assert data.arithmetic_examples("train", 3) == [
        data.Example("6-4+4", "6"), data.Example("8*3*8", "192"), data.Example("3*4+4", "16")]
    assert sum(len(data.arithmetic_examples(split)) for split in data.SPLITS) == 9300
    assert data.builtin_prompt("3+4*2") == "3+4*2="


@pytest.mark.parametrize("examples", [data.arithmetic_examples, data.arithmetic_chain_examples],
                         ids=["builtin", "builtin_steps"])
def test_train_dev_and_test_splits_are_pairwise_disjoint_whatever_the_seed(examples):
    """Both built-in tasks: crc32 % 10 == 0 is test, 1 dev, the rest train, so the three splits
    share no expression, for any shuffling seed, and each split's questions are distinct."""
    import zlib
    splits = {split: [e.question for e in examples(split, seed=7)] for split in data.SPLITS}
    for split, questions in splits.items():
        assert len(set(questions)) == len(questions) > 500
        assert {zlib.crc32(q.encode()) % 10 for q in questions} == (
            {0} if split == "test" else {1} if split == "dev" else set(range(2, 10)))
        assert set(questions) == {e.question for e in examples(split, seed=0)}  # seed: order only
    train, dev, test = (set(splits[s]) for s in data.SPLITS)
    assert not train & dev and not train & test and not dev & test
    with pytest.raises(ValueError, match="split"):
        examples("valid")


def test_malformed_line_names_file_and_line(tmp_path):
    f = tmp_path / "set.jsonl"
    f.write_text('{"question": "q1", "answer": "1"}\n\n{"question": "q2", "answer": "2"}\n'
                 '{"question": "q3", \n')
    with pytest.raises(ValueError, match=rf"{f}:4: malformed JSON line"):
        data.load_benchmark(str(f))
    # The same for a named benchmark read from another data dir.
    (tmp_path / "math500.jsonl").write_text('{"problem": "p", "answer": "1"}\nnot json\n')
    with pytest.raises(ValueError, match=r"math500.jsonl:2: malformed"):
        data.load_benchmark("math500", data_dir=str(tmp_path))


def test_missing_field_or_gold_names_line(tmp_path):
    f = tmp_path / "m.jsonl"
    (tmp_path / "minerva_math.jsonl").write_text('{"problem": "p", "solution": "\\\\boxed{3}"}\n'
                                                 '{"problem": "p", "solution": "no box here"}\n')
    with pytest.raises(ValueError, match=r"minerva_math.jsonl:2: empty gold answer"):
        data.load_benchmark("minerva", data_dir=str(tmp_path))
    f.write_text('{"q": "a", "a": "1"}\n{"q": "b"}\n')
    with pytest.raises(ValueError, match=rf"{f}:2: missing field 'a'"):
        data.load_benchmark(str(f), question_key="q", answer_key="a")


def test_a_file_without_the_field_empty_or_unreadable_says_so(tmp_path, monkeypatch):
    """A user's file: a row without the named field lists the fields it has and the flag; an empty
    file says it is empty; a file that cannot be read (no permission, not text) says so, naming
    it."""
    f = tmp_path / "mine.jsonl"
    f.write_text('{"expr": "2+3", "value": "5"}\n')
    missing = (r"mine.jsonl:1: missing field 'q' \(fields: expr, value\); "
               r"name the question field with --question-key")
    with pytest.raises(ValueError, match=missing):
        data.load_benchmark(str(f), question_key="q", answer_key="value")
    with pytest.raises(ValueError, match=r"missing field 'gold.x' \(fields: expr, value\); "
                                         r"name the answer field with --answer-key"):
        data.load_benchmark(str(f), question_key="expr", answer_key="gold.x")
    assert data.load_benchmark(str(f), question_key="expr", answer_key="value") == [
        data.Example("2+3", "5")]
    for empty, text in (("empty.jsonl", ""), ("blank.jsonl", "\n\n"), ("empty.json", "[]")):
        (tmp_path / empty).write_text(text)
        with pytest.raises(ValueError, match=rf"{empty}: the file is empty"):
            data.load_benchmark(str(tmp_path / empty), question_key="expr")
    binary = tmp_path / "binary.jsonl"
    binary.write_bytes(b"\x89PNG\r\n")
    with pytest.raises(ValueError, match="binary.jsonl: not UTF-8 text"):
        data.load_benchmark(str(binary))
    locked = tmp_path / "locked.jsonl"
    locked.write_text('{"question": "1+1", "answer": "2"}\n')

    def denied(self, *args, **kw):          # chmod 0 would not stop root, who runs CI here
        raise PermissionError(13, "Permission denied", str(self))
    monkeypatch.setattr(Path, "read_text", denied)
    with pytest.raises(OSError, match="locked.jsonl: cannot read it \\(Permission denied\\)"):
        data.load_benchmark(str(locked))


def test_missing_and_unknown():
    with pytest.raises(FileNotFoundError, match="not found"):
        data.load_benchmark("math500", data_dir="/nonexistent/dir")
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        data.load_benchmark("/nonexistent/nope.jsonl")
    with pytest.raises(ValueError, match="unknown benchmark 'math5000'"):
        data.load_benchmark("math5000")


def test_generic_jsonl_and_json_with_keys(tmp_path):
    f = tmp_path / "dapo.jsonl"
    rows = [{"prompt": [{"role": "system", "content": "s"},
                        {"role": "user", "content": "What is 2+2?"}],
             "reward_model": {"ground_truth": 4}},
            {"prompt": [{"role": "user", "content": "What is 1.5*2?"}],
             "reward_model": {"ground_truth": 3.0}}]
    f.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    exs = data.load_benchmark(str(f), answer_key="reward_model.ground_truth")
    assert exs == [data.Example("What is 2+2?", "4"), data.Example("What is 1.5*2?", "3")]
    j = tmp_path / "set.json"
    j.write_text(json.dumps([{"problem": "p1", "final_answer": ["$5$"]},
                             {"problem": "p2", "final_answer": "x"}]))
    assert data.load_benchmark(str(j)) == [data.Example("p1", "$5$"), data.Example("p2", "x")]
    j.write_text('[{"problem": "p1",\n "answer": }]')
    with pytest.raises(ValueError, match=rf"{j}:2: malformed JSON"):
        data.load_benchmark(str(j))
    j.write_text(json.dumps([{"text": "p1", "sol": "1"}]))
    with pytest.raises(ValueError, match="no question field.*--question-key"):
        data.load_benchmark(str(j))


def test_parquet(tmp_path):
    f = tmp_path / "set.parquet"
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:  # the clear message is the behaviour to check without pyarrow
        f.write_bytes(b"PAR1")
        with pytest.raises(ValueError, match="needs pyarrow.*pip install pyarrow"):
            data.load_benchmark(str(f))
        return
    pq.write_table(pa.Table.from_pylist([{"question": "q", "answer": 7.0}]), f)
    assert data.load_benchmark(str(f)) == [data.Example("q", "7")]


def _chat_tokenizer(template):
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast
    tok = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel({"<unk>": 0}, unk_token="<unk>")))
    tok.chat_template = template
    return tok


def test_templates():
    ex = data.Example("What is 1+1?", "2")
    plain = "What is 1+1?\nPlease reason step by step, and put your final answer within \\boxed{}."
    assert data.apply_template(ex, "plain") == plain
    assert data.apply_template("What is 1+1?", "plain") == plain
    assert data.apply_template(data.Example("3+4", "7"), "builtin") == "3+4="
    tok = _chat_tokenizer(
        "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>{% endif %}")
    assert data.apply_template(ex, "chat", tok) == f"<|user|>{plain}<|end|><|assistant|>"
    with pytest.raises(ValueError, match="has none"):
        data.apply_template(ex, "chat", _chat_tokenizer(None))
    with pytest.raises(ValueError, match="needs a tokenizer"):
        data.apply_template(ex, "chat")
    with pytest.raises(ValueError, match="unknown prompt template 'fancy'"):
        data.apply_template(ex, "fancy")


# ---- the second built-in task: arithmetic worked step by step ------------------------------------

def test_steps_task_worked_solution_grades_and_reduces_one_operation_at_a_time():
    import verify
    grade = verify.grader("builtin_steps")
    assert data.worked_solution("7*6*9") == "42*9=378"
    assert data.worked_solution("7+6*9-3*2") == "7+54-3*2=7+54-6=61-6=55"
    assert data.worked_solution("7+6*9-3*2-1") == "7+54-3*2-1=7+54-6-1=61-6-1=55-1=54"
    assert data.worked_solution("3-9*9+1") == "3-81+1=-78+1=-77"
    test = data.arithmetic_chain_examples("test", 300)
    for ex in test:
        worked = data.worked_solution(ex.question)
        assert ex.answer == str(eval(ex.question)) == worked.rsplit("=", 1)[1]
        assert grade(worked, ex.answer) and verify.grade(worked, ex.answer)    # the whole chain
        wrong = worked.rsplit("=", 1)[0] + f"={int(ex.answer) + 1}"
        assert not grade(wrong, ex.answer)                                     # wrong final number
        assert worked.count("=") == sum(map(ex.question.count, "+-*")) - 1


def test_steps_task_scores_only_a_plain_integer_final_answer():
    """The task's rule (data.STEPS_NAMES, verify.grader -> verify.grade_integer): an expression left
    unreduced scores 0 on builtin_steps whatever its value, where the general verifier (value
    equality) gives it 1; the worked chain and the bare integer score; "55.0", "+55" and "5 5" are
    not integer literals; spaces and a trailing newline around the integer are stripped."""
    import verify
    steps = verify.grader("builtin_steps")
    assert all(verify.grader(name) is verify.grade_integer for name in data.STEPS_NAMES)
    arith = ("builtin", "builtin_train", "builtin_dev")       # grade, integers read directly
    assert all(verify.grader(name) is verify.grade_fast for name in arith)
    assert all(verify.grader(name) is verify.grade for name in ("gsm8k", "x.jsonl"))
    assert verify.grade("4-1+4", "7") and not steps("4-1+4", "7")     # "4-1+1*4=" after one step
    assert verify.grade("7+54-6=61-6", "55") and not steps("7+54-6=61-6", "55")
    for response in ("7+54-3*2=7+54-6=61-6=55", "55", " 55 ", "61-6= 55\n", "=55", "055"):
        assert steps(response, "55"), response
    for response in ("55.0", "+55", "5 5", "55=", "", "answer: 55", "61-6=-55", "x" * 300_000):
        assert not steps(response, "55"), response
    assert steps("3-81+1=-78+1=-77", "-77") and steps("-0", "0") and not steps("-77", "77")
    assert not steps("1" * 2000, "1" * 2000)                 # bounded: no int() of huge text
    verify.reset_stats()
    steps("55", "55"), steps("4-1+4", "7")
    assert verify.stats()["graded"] == 2 and verify.stats()["unparseable"] == 1   # as grade counts


def test_steps_task_splits_long_chains_deterministic_and_named():
    """Drawn, not enumerated: STEPS_POOL distinct 5-6 operand expressions (seeded, whatever the
    caller's seed), at most two "*" and none side by side, every worked solution 19-41 characters
    (48 new tokens hold it and EOS), generated in well under 2 s."""
    import time
    data._steps_pool.cache_clear()
    t0 = time.perf_counter()
    splits = {split: data.arithmetic_chain_examples(split) for split in data.SPLITS}
    assert time.perf_counter() - t0 < 2.0
    questions = [e.question for split in splits.values() for e in split]
    assert len(questions) == len(set(questions)) == data.STEPS_POOL
    assert [len(splits[s]) for s in ("train", "dev", "test")] == [data.STEPS_TRAIN_SIZE, 2514, 2455]
    assert {len(q) for q in questions} == {9, 11}                  # 5 and 6 single-digit operands
    assert max(q.count("*") for q in questions) == data.STEPS_MAX_PRODUCTS
    assert not any("**" in q for q in questions)
    lengths = [len(data.worked_solution(q)) for q in questions]
    assert (min(lengths), max(lengths)) == (19, 41) and 28 < sum(lengths) / len(lengths) < 28.3
    assert max(lengths) + 1 <= data.STEPS_MAX_NEW_TOKENS
    values = [int(e.answer) for split in splits.values() for e in split]
    assert -171 <= min(values) and max(values) <= 180
    train = data.arithmetic_chain_examples
    assert train("train", 50, seed=3) == train("train", 50, seed=3) != train("train", 50, seed=4)
    assert train("test", 3)[0] == data.Example("1*5+8+2+9", "24")             # pinned: the pool
    assert data.load_benchmark("builtin_steps") == train("test", data.STEPS_TEST_SIZE)
    assert data.load_benchmark("builtin_steps_dev") == train("dev", data.STEPS_DEV_SIZE)
    assert len(data.load_benchmark("builtin_steps_train")) == data.STEPS_TRAIN_SIZE
    assert data.train_split("builtin_steps") == "builtin_steps_train"
    assert data.train_split("builtin") == "builtin_train"
    assert data.train_split("math500") == "math500"
    for name in data.STEPS_NAMES:
        assert data.template_for(name) == "builtin" and data.bench_label(name) == name
    assert data.builtin_dev("builtin_steps_train", 5) == train("dev", 5)
    assert data.builtin_dev("builtin", 5) == data.arithmetic_examples("dev", 5)


def test_shipped_tiny_steps_model_works_step_by_step_with_headroom():
    """assets/tiny-steps (assets/make_tiny_model.py --task steps): greedy answers are whole worked
    chains (about 29 tokens), some right under the task's integer-only rule, far from all."""
    import torch
    from make_tiny_model import greedy_completions
    from checkpoint import load_model
    import verify
    torch.set_num_threads(1)
    model, tok = load_model(str(ROOT / "assets" / "tiny-steps"))
    test = data.arithmetic_chain_examples("test", 200)
    rs = greedy_completions(model, tok, test, data.STEPS_MAX_NEW_TOKENS)
    acc = sum(verify.grader(data.STEPS)(r.text, r.answer) for r in rs) / len(rs)
    assert 0.15 < acc < 0.5, acc                      # shipped at 25.4% on the 500 test prompts
    assert sum(len(r.completion_ids) for r in rs) / len(rs) > 25
    assert not any(r.truncated for r in rs)
    assert sum(r.text.count("=") >= 3 for r in rs) / len(rs) > 0.95    # the chain, no shortcut


def test_cli_help_and_unknown_name_are_not_tracebacks():
    import subprocess
    script = str(ROOT / "data.py")
    ok = subprocess.run([sys.executable, script, "--help"], capture_output=True,
                        text=True, timeout=60)
    assert ok.returncode == 0 and "python data.py math500" in ok.stdout
    bad = subprocess.run([sys.executable, script, "nosuch"], capture_output=True,
                         text=True, timeout=60)
    assert (bad.returncode == 1 and bad.stderr.startswith("error: unknown benchmark")
            and "Traceback" not in bad.stderr)


def test_the_warm_start_stops_by_the_dev_rule_and_scores_test_once(tmp_path, monkeypatch):
    """assets/make_tiny_model.py: dev accuracy every EVAL_EVERY steps, stopped at the first
    evaluation at or above STOP_DEV_ACC; test is scored once, after the stop, and recorded with
    the step count in warm_start.json (greedy_accuracy scripted: 0.1, 0.3 on dev, then test)."""
    import make_tiny_model as m
    scored = []

    def scripted(model, tok, examples, max_new, grade):
        split = "test" if examples == m.TASKS["arith"][1]("test") else "dev"
        scored.append(split)
        return ({"dev": [0.1, 0.3]}.get(split, [0.2])[scored.count(split) - 1], 3.0)

    monkeypatch.setattr(m, "greedy_accuracy", scripted)
    monkeypatch.setattr(sys, "argv", ["make_tiny_model.py", "--out", str(tmp_path / "model"),
                                      "--batch-size", "2", "--threads", "1"])
    m.main()
    assert scored == ["dev", "dev", "test"]                  # stopped at the second evaluation
    record = json.loads((tmp_path / "model" / "warm_start.json").read_text())
    assert record["steps"] == 2 * m.EVAL_EVERY and record["rule"] == m.STOP_RULE
    assert (record["dev_accuracy"], record["test_accuracy"]) == (0.3, 0.2)
