"""A run on your file is evaluated on your file: its held-out rows (data.held_out: crc32 of the
question, as the built-in splits; never trained on) or a set --eval-data names, and what the
accuracy is on said in words (eval.eval_sets_about); a file gets a template the model can read (the
model's own, its chat template, else plain), and builtin never doubles an "=". """
import json
import os

import pytest

import data
import eval as ev
from flags import Args

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY_MODEL = os.path.join(ROOT, "assets", "tiny-arith")


def write_file(tmp_path, examples, name="mine.jsonl") -> str:
    path = tmp_path / name
    path.write_text("".join(json.dumps({"question": e.question, "answer": e.answer}) + "\n"
                            for e in examples))
    return str(path)


def test_a_files_held_out_rows_are_disjoint_from_what_it_trains_on(tmp_path):
    """About a tenth each for test and dev, by the question's text (a repeated question is on one
    side only), the same whatever the order; training keeps the rest."""
    examples = data.arithmetic_examples("train", 600) + data.arithmetic_examples("test", 60)
    examples += examples[:30]                                       # repeated rows
    test, dev = data.held_out(examples, "test"), data.held_out(examples, "dev")
    assert {e.question for e in test} == {e.question for e in examples[600:660]}
    assert not dev and len(test) == 60                  # the train split's rows: crc % 10 >= 2
    mine = write_file(tmp_path, examples)
    kept = ev.training_examples(examples, mine, eval_size=500)
    assert len(kept) == len(examples) - 60
    assert not {e.question for e in kept} & {e.question for e in test}
    assert ev.training_examples(examples, mine, eval_size=0) == examples    # no eval: all of it
    assert ev.training_examples(examples, mine, eval_data="math500") == examples
    assert ev.held_out_splits("builtin") == () and ev.held_out_splits(mine, dev_size=5) == (
        "test", "dev")
    with pytest.raises(ValueError, match="every row is held out"):
        ev.training_examples(test, mine)


def test_the_accuracy_of_a_file_run_is_on_its_held_out_rows_and_says_so(tmp_path):
    examples = data.arithmetic_examples("train", 300) + data.arithmetic_examples("test", 40)
    mine = write_file(tmp_path, examples)
    sets = ev.train_eval_sets(500, "", 1, 0.0, "auto", data.DEFAULT_DATA_DIR, mine,
                              eval_data="auto")
    held, template, k, temperature, _ = sets["accuracy"]
    assert held == examples[300:] and (template, k, temperature) == ("plain", 1, 0.0)
    assert ev.eval_sets_about(sets, mine, "auto") == {
        "accuracy": f"40 held-out rows of {mine} (crc32(question) % 10 == 0, not trained on)"}
    builtin = ev.train_eval_sets(500, "", 1, 0.0, "builtin", data.DEFAULT_DATA_DIR, dev_size=8,
                                 eval_data="auto")
    assert ev.eval_sets_about(builtin, "builtin", "auto") == {
        "accuracy": "500 prompts of the built-in test split (builtin)",
        "dev_accuracy": "8 prompts of the built-in dev split (builtin)"}
    fresh = data.arithmetic_examples("dev", 5)                      # none of them in mine
    other = write_file(tmp_path, fresh, "other.jsonl")
    sets = ev.train_eval_sets(500, "", 1, 0.0, "auto", data.DEFAULT_DATA_DIR, mine,
                              eval_data=other)
    assert sets["accuracy"][0] == fresh
    assert ev.eval_sets_about(sets, mine, other) == {
        "accuracy": f"5 prompts of {other} (--eval-data)"}
    before = ev.train_eval_sets(500, "", 1, 0.0, "auto", data.DEFAULT_DATA_DIR, mine)
    assert before["accuracy"][0] == data.builtin_test("builtin", 500)   # eval_data None: as before
    assert ev.eval_sets_about(before, mine) == {
        "accuracy": "500 prompts of the built-in test split (builtin)"}
    few = write_file(tmp_path, data.arithmetic_examples("train", 5), "few.jsonl")
    with pytest.raises(ValueError, match="no row is in its test split.*--eval-data"):
        ev.train_eval_sets(500, "", 1, 0.0, "auto", data.DEFAULT_DATA_DIR, few, eval_data="auto")


def test_a_file_gets_a_template_the_model_reads_and_builtin_never_doubles_the_equals():
    """The tiny model names builtin in its tokenizer_config.json (it was trained on "8*7=" only):
    auto gives it builtin on a file too (plain gave it 0.2%, against 23% under builtin); a question
    that ends in "=" is not given a second one."""
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(TINY_MODEL)
    assert data.model_template(tok) == "builtin"
    assert data.template_for("mine.jsonl", "auto", tok) == "builtin"
    assert data.template_for("mine.jsonl", "auto", None) == "plain"
    assert data.template_for("mine.jsonl", "plain", tok) == "plain"          # a choice is kept
    assert data.builtin_prompt("8*7=") == "8*7=" == data.builtin_prompt("8*7")
    assert data.builtin_prompt("8*7 = ") == "8*7 ="

    class Named:
        init_kwargs = {"prompt_template": "fancy"}
    with pytest.raises(ValueError, match="names prompt_template 'fancy'"):
        data.template_for("mine.jsonl", "auto", Named())


def test_a_checkpoint_keeps_the_models_own_template(tmp_path):
    from transformers import AutoTokenizer
    AutoTokenizer.from_pretrained(TINY_MODEL).save_pretrained(tmp_path)
    assert data.model_template(AutoTokenizer.from_pretrained(tmp_path)) == "builtin"


def test_the_eval_data_flag_is_the_evals_and_names_a_file_for_the_keys():
    import flags
    assert Args().eval_data == "auto" and "eval_data" in ev.TrainFlags.__dataclass_fields__
    with pytest.raises(ValueError, match="--eval-data and --eval-benchmarks name no file"):
        flags.check_args(Args(question_key="q"))
    flags.check_args(Args(question_key="q", eval_data="mine.jsonl"))


def test_a_file_run_logs_its_accuracy_on_its_held_out_rows(tmp_path):
    """End to end: train.py on a file holds its held-out rows out of training, evaluates on them,
    and says so on the first screen and in step 0's eval_on."""
    import io
    from contextlib import redirect_stdout

    import train
    examples = data.arithmetic_examples("train", 300) + data.arithmetic_examples("test", 40)
    mine = write_file(tmp_path, examples)
    out = io.StringIO()
    with redirect_stdout(out):
        rc = train.main(["--train-data", mine, "--steps", "1", "--prompts-per-step", "2",
                         "--group-size", "2", "--max-new-tokens", "4", "--threads", "1",
                         "--out-dir", str(tmp_path / "run")])
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    about = f"40 held-out rows of {mine} (crc32(question) % 10 == 0, not trained on)"
    assert rc == 0 and rows[0]["eval_on"] == {"accuracy": about} and about in out.getvalue()
    assert "eval/accuracy" in rows[-1]


def test_eval_data_that_trains_is_refused_in_one_line(tmp_path, capsys, monkeypatch):
    """--eval-data naming the training file (or any set whose questions --train-data trains on)
    would report accuracy on trained rows as held out: refused at start, one line, exit status 2,
    naming the file relative to where the user ran and the count; a set of fresh questions runs."""
    import train
    examples = data.arithmetic_examples("train", 300) + data.arithmetic_examples("test", 40)
    mine = write_file(tmp_path, examples)
    overlap = write_file(tmp_path, examples[:3] + data.arithmetic_examples("dev", 2), "some.jsonl")
    with pytest.raises(ValueError, match=r"some.jsonl: 3 of its 5 questions are trained on"):
        ev.train_eval_sets(500, "", 1, 0.0, "auto", data.DEFAULT_DATA_DIR, mine,
                           eval_data=overlap)
    monkeypatch.chdir(tmp_path)                          # the user runs where the file is
    rc = train.main(["--train-data", mine, "--eval-data", mine, "--steps", "1", "--threads", "1",
                     "--out-dir", str(tmp_path / "run")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err == ("error: --eval-data mine.jsonl: 340 of its 340 questions are "
                               "trained on (--train-data): use --eval-data auto"), err
