"""data.py: the published benchmark files load as their README says, gold answers are extracted, bad input names
the file and line, and the prompt templates produce the exact text."""
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
    assert first == {"gsm8k": "18", "math500": "\\left( 3, \\frac{\\pi}{2} \\right)", "aime24": "204",
                     "amc23": "27", "minerva": "1.6", "olympiadbench": "2"}
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
    assert sum("{" in e.answer for e in exs) > 20          # nested braces are common, not an edge case


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
    assert data.olympiad_answer("['$2^{1009}$', '7']") == "2^{1009}, 7"     # the list written as a string


def test_olympiadbench_answers_as_published(shared_data):
    exs = data.load_benchmark("olympiadbench", data_dir=str(shared_data))
    assert "(1,8,19), (2,7,13), (4,5,7)" in {e.answer for e in exs}
    assert not any("$" in e.answer for e in exs)


def test_builtin_names():
    assert data.load_benchmark("builtin") == data.arithmetic_examples("test", data.BUILTIN_TEST_SIZE, seed=0)
    assert len(data.load_benchmark("builtin")) == 500
    train = data.load_benchmark("builtin_train")
    assert len(train) == data.BUILTIN_TRAIN_SIZE
    assert not {e.question for e in train} & {e.question for e in data.load_benchmark("builtin")}
    # The tiny model was trained on exactly these: the built-in task must never change.
    assert data.arithmetic_examples("train", 3) == [data.Example("7-6+0", "1"), data.Example("6+6-6", "6"),
                                                    data.Example("7*6*9", "378")]
    assert len(data.arithmetic_examples("train")) + len(data.arithmetic_examples("test")) == 9300
    assert data.builtin_prompt("3+4*2") == "3+4*2="


def test_malformed_line_names_file_and_line(tmp_path):
    f = tmp_path / "set.jsonl"
    f.write_text('{"question": "q1", "answer": "1"}\n\n{"question": "q2", "answer": "2"}\n{"question": "q3", \n')
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


def test_missing_and_unknown():
    with pytest.raises(FileNotFoundError, match="not found"):
        data.load_benchmark("math500", data_dir="/nonexistent/dir")
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        data.load_benchmark("/nonexistent/nope.jsonl")
    with pytest.raises(ValueError, match="unknown benchmark 'math5000'"):
        data.load_benchmark("math5000")


def test_generic_jsonl_and_json_with_keys(tmp_path):
    f = tmp_path / "dapo.jsonl"
    rows = [{"prompt": [{"role": "system", "content": "s"}, {"role": "user", "content": "What is 2+2?"}],
             "reward_model": {"ground_truth": 4}},
            {"prompt": [{"role": "user", "content": "What is 1.5*2?"}], "reward_model": {"ground_truth": 3.0}}]
    f.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    exs = data.load_benchmark(str(f), answer_key="reward_model.ground_truth")
    assert exs == [data.Example("What is 2+2?", "4"), data.Example("What is 1.5*2?", "3")]
    j = tmp_path / "set.json"
    j.write_text(json.dumps([{"problem": "p1", "final_answer": ["$5$"]}, {"problem": "p2", "final_answer": "x"}]))
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
        with pytest.raises(ImportError, match="needs pyarrow.*pip install pyarrow"):
            data.load_benchmark(str(f))
        return
    pq.write_table(pa.Table.from_pylist([{"question": "q", "answer": 7.0}]), f)
    assert data.load_benchmark(str(f)) == [data.Example("q", "7")]


def _chat_tokenizer(template):
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast
    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel({"<unk>": 0}, unk_token="<unk>")))
    tok.chat_template = template
    return tok


def test_templates():
    ex = data.Example("What is 1+1?", "2")
    plain = "What is 1+1?\nPlease reason step by step, and put your final answer within \\boxed{}."
    assert data.apply_template(ex, "plain") == plain
    assert data.apply_template("What is 1+1?", "plain") == plain
    assert data.apply_template(data.Example("3+4", "7"), "builtin") == "3+4="
    tok = _chat_tokenizer("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
                          "{% if add_generation_prompt %}<|assistant|>{% endif %}")
    assert data.apply_template(ex, "chat", tok) == f"<|user|>{plain}<|end|><|assistant|>"
    with pytest.raises(ValueError, match="has none"):
        data.apply_template(ex, "chat", _chat_tokenizer(None))
    with pytest.raises(ValueError, match="needs a tokenizer"):
        data.apply_template(ex, "chat")
    with pytest.raises(ValueError, match="unknown prompt template 'fancy'"):
        data.apply_template(ex, "fancy")


# ---- the second built-in task: arithmetic worked step by step -------------------------------------------------------

def test_steps_task_worked_solution_grades_and_reduces_one_operation_at_a_time():
    import verify
    assert data.worked_solution("7*6*9") == "42*9=378"
    assert data.worked_solution("7+6*9-3*2") == "7+54-3*2=7+54-6=61-6=55"
    assert data.worked_solution("3-9*9+1") == "3-81+1=-78+1=-77"
    test = data.arithmetic_chain_examples("test", 300)
    for ex in test:
        worked = data.worked_solution(ex.question)
        assert ex.answer == str(eval(ex.question)) == worked.rsplit("=", 1)[1]
        assert verify.grade(worked, ex.answer)                                  # the full worked completion
        assert not verify.grade(worked.rsplit("=", 1)[0] + f"={int(ex.answer) + 1}", ex.answer)  # wrong final number
        assert worked.count("=") == ex.question.count("+") + ex.question.count("-") + ex.question.count("*") - 1


def test_steps_task_splits_disjoint_deterministic_and_named():
    train, test = data.arithmetic_chain_examples("train"), data.arithmetic_chain_examples("test")
    assert not {e.question for e in train} & {e.question for e in test}
    assert len(train) + len(test) == 10 ** 3 * 9 + 10 ** 4 * 27                  # every 3- and 4-operand expression
    assert all(zlib_test(e.question) for e in test) and not any(zlib_test(e.question) for e in train[:2000])
    assert data.arithmetic_chain_examples("train", 50, seed=3) == data.arithmetic_chain_examples("train", 50, seed=3)
    assert data.arithmetic_chain_examples("train", 50, seed=3) != data.arithmetic_chain_examples("train", 50, seed=4)
    assert data.load_benchmark("builtin_steps") == data.arithmetic_chain_examples("test", data.STEPS_TEST_SIZE)
    assert len(data.load_benchmark("builtin_steps_train")) == data.STEPS_TRAIN_SIZE
    assert data.train_split("builtin_steps") == "builtin_steps_train" and data.train_split("builtin") == "builtin_train"
    assert data.train_split("math500") == "math500"
    for name in ("builtin_steps", "builtin_steps_train"):
        assert data.template_for(name) == "builtin" and data.bench_label(name) == name
    with pytest.raises(ValueError, match="split"):
        data.arithmetic_chain_examples("dev")


def zlib_test(expr: str) -> bool:
    import zlib
    return zlib.crc32(expr.encode()) % 10 == 0


def test_shipped_tiny_steps_model_works_step_by_step_with_headroom():
    """assets/tiny-steps (assets/make_tiny_model.py --task steps): greedy answers in the worked form, some right."""
    import torch
    from make_tiny_model import greedy_accuracy
    from rollout import load_model
    torch.set_num_threads(1)
    model, tok = load_model(str(ROOT / "assets" / "tiny-steps"))
    acc = greedy_accuracy(model, tok, data.arithmetic_chain_examples("test", 200), max_new_tokens=24)
    assert 0.15 < acc < 0.6, acc                                   # shipped at 33.0% on the 500 test prompts


def test_cli_help_and_unknown_name_are_not_tracebacks():
    import subprocess
    script = str(ROOT / "data.py")
    ok = subprocess.run([sys.executable, script, "--help"], capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0 and "python data.py math500" in ok.stdout
    bad = subprocess.run([sys.executable, script, "nosuch"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 1 and bad.stderr.startswith("error: unknown benchmark") and "Traceback" not in bad.stderr
