"""eval.py: pass@k against brute-force enumeration, maj@k and AES by hand, evaluate() on scripted
completions, and the CLI end to end on a tiny random model (outputs, same numbers as in-process
evaluate, one-line errors)."""
import itertools
import json
import math
import os
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import pytest

import cli
import data
import eval as ev
from rollout import Rollout, Sampling

ROOT = Path(__file__).resolve().parents[1]


# ---- pure metrics --------------------------------------------------------------------------------

def brute_pass_at_k(n, c, k):
    """Share of the k-subsets of n samples (the first c correct) that hold at least one correct
    sample."""
    subsets = list(itertools.combinations(range(n), k))
    return Fraction(sum(any(i < c for i in s) for s in subsets), len(subsets))


def test_pass_at_k_equals_brute_force_enumeration():
    for n in range(1, 8):
        for c in range(n + 1):
            for k in range(1, n + 1):
                assert (ev.pass_at_k(n, c, k)
                        == pytest.approx(float(brute_pass_at_k(n, c, k)), abs=1e-12)), (n, c, k)


def test_pass_at_k_large_n_is_stable_and_exact():
    # C(200, 100) ~ 9e58: the product form stays accurate where the quotient of huge combinations is
    # the reference.
    for c, k in [(3, 100), (1, 1), (0, 50), (150, 60), (199, 2)]:
        exact = 1 - Fraction(math.comb(200 - c, k), math.comb(200, k))
        assert ev.pass_at_k(200, c, k) == pytest.approx(float(exact), rel=1e-12, abs=1e-15)
    assert ev.pass_at_k(4, 1, 1) == 0.25 and ev.pass_at_k(4, 2, 2) == pytest.approx(5 / 6)
    with pytest.raises(ValueError):
        ev.pass_at_k(4, 5, 1)
    with pytest.raises(ValueError):
        ev.pass_at_k(4, 1, 5)


def test_maj_at_k_by_hand():
    answers = ["3", "4", "4", "3", "5"]
    correct = [True, False, False, True, False]
    assert ev.maj_at_k(answers, correct, 5) == 1.0    # 3 and 4 tie at two votes; "3" was seen first
    assert ev.maj_at_k(answers, correct, 3) == 0.0    # "4" twice among the first three
    assert ev.maj_at_k(answers, correct, 1) == 1.0
    # samples without an answer do not vote
    assert ev.maj_at_k([None, "", "7"], [False, False, True], 3) == 1.0
    assert ev.maj_at_k([None, None], [False, False], 2) == 0.0
    # whitespace does not split a vote
    assert ev.maj_at_k(["1 / 2", "9", "1/2"], [True, False, True], 3) == 1.0


def test_aes_reproduces_o1_pruner_row():
    # O1-Pruner (arXiv 2501.12570): baseline 73.8% at 1156 tokens -> 77.5% at 657 tokens
    # gives AES 0.58.
    score = ev.aes(77.5, 657, 73.8, 1156)
    assert round(score, 2) == 0.58
    assert score == pytest.approx((1156 - 657) / 1156 + 3 * (77.5 - 73.8) / 73.8)
    assert ev.aes(0.775, 657, 0.738, 1156) == pytest.approx(score)          # units cancel
    assert ev.aes(0.7, 500, 0.8, 1000) == pytest.approx(0.5 - 5 * 0.125)    # a drop weighs 5, not 3
    # dA = 0 takes the >= 0 branch
    assert ev.aes(0.8, 1200, 0.8, 1000) == pytest.approx(-0.2)
    with pytest.raises(ValueError):
        ev.aes(0.5, 10, 0.0, 10)


# ---- evaluate() on scripted completions ----------------------------------------------------------

class CharTok:
    def encode(self, text, add_special_tokens=True):
        return [ord(ch) for ch in text]

    def decode(self, ids):
        return "".join(map(chr, ids))


class ScriptedEngine:
    """Returns fixed completions per question; records the calls it got."""
    batch_size = 3

    def __init__(self, script):
        self.script, self.calls = script, []

    def generate(self, prompts, n, sampling, version=0):
        self.calls.append(([CharTok().decode(p.ids) for p in prompts], n, sampling.seed))
        out = []
        for p in prompts:
            for text, length, trunc in self.script[CharTok().decode(p.ids)]:
                out.append(Rollout(prompt_id=p.prompt_id, prompt_ids=p.ids,
                                   completion_ids=[0] * length, logprobs=[0.0] * length, text=text,
                                   answer=p.answer, truncated=trunc))
        return out


def test_evaluate_numbers_by_hand():
    script = {"2+3=": [("\\boxed{5}", 4, True), ("\\boxed{6}", 5, False), ("\\boxed{5}", 6, False)],
              "3+4=": [("\\boxed{1}", 1, False), ("\\boxed{2}", 2, False),
                       ("\\boxed{1}", 3, False)]}
    engine = ScriptedEngine(script)
    exs = [data.Example("2+3", "5"), data.Example("3+4", "7")]
    summary, records = ev.evaluate(engine, CharTok(), exs, template="builtin", k=3,
                                   sampling=Sampling(seed=10))
    # batch_size 3 // k 3 = one prompt per generate call, each with its own seed
    assert engine.calls == [(["2+3="], 3, 10), (["3+4="], 3, 11)]
    assert records[0]["correct"] == [True, False, True] and records[1]["correct"] == [False] * 3
    assert records[0]["extracted"] == ["5", "6", "5"] and records[0]["prompt"] == "2+3="
    assert summary["n"] == 2 and summary["k"] == 3
    assert summary["mean@k"] == pytest.approx((2 / 3 + 0) / 2)
    assert summary["pass@1"] == pytest.approx(1 / 3)
    # 2 of 3 correct: every pair holds one
    assert summary["pass@2"] == pytest.approx((1 + 0) / 2)
    assert summary["pass@3"] == pytest.approx(0.5)
    assert summary["maj@k"] == pytest.approx(0.5)   # "5" wins problem 0, "1" (wrong) wins problem 1
    assert summary["length/mean"] == pytest.approx(21 / 6)
    assert summary["truncated/frac"] == pytest.approx(1 / 6)
    assert not any(key.startswith("pass@") and key not in ("pass@1", "pass@2", "pass@3")
                   for key in summary)


def test_evaluate_grades_by_the_sets_rule():
    """evaluate(grader=...): builtin_steps' rule (verify.grader) gives an unreduced expression 0
    where the default, verify.grade, gives it 1; train_eval_sets hands each set its rule, skips the
    test set at eval_size 0 and adds the dev split as dev_accuracy."""
    import verify
    script = {"4-1+1*4=": [("4-1+4", 5, False), ("4-1+4=3+4=7", 11, False)]}
    exs = [data.Example("4-1+1*4", "7")]

    def run(**kw):
        return ev.evaluate(ScriptedEngine(script), CharTok(), exs, template="builtin", k=2,
                           sampling=Sampling(), **kw)
    assert run()[1][0]["correct"] == [True, True]
    summary, records = run(grader=verify.grader("builtin_steps"))
    assert records[0]["correct"] == [False, True] and summary["mean@k"] == 0.5
    sets = ev.train_eval_sets(8, "builtin_steps,builtin", 1, 0.0, "auto", data.DEFAULT_DATA_DIR,
                              "builtin_steps_train", dev_size=4)
    assert list(sets) == ["accuracy", "dev_accuracy", "builtin_steps/mean@1", "builtin/mean@1"]
    assert [v[4] for v in sets.values()] == [verify.grade_integer] * 3 + [verify.grade_fast]
    assert sets["dev_accuracy"][0] == data.arithmetic_chain_examples("dev", 4)
    assert sets["accuracy"][0] == data.arithmetic_chain_examples("test", 8)
    sets = ev.train_eval_sets(0, "", 1, 0.0, "auto", data.DEFAULT_DATA_DIR, "builtin", dev_size=5)
    assert list(sets) == ["dev_accuracy"]
    assert sets["dev_accuracy"][0] == data.arithmetic_examples("dev", 5)
    assert sets["dev_accuracy"][4] is verify.grade_fast
    assert ev.train_eval_sets(0, "", 1, 0.0, "auto", data.DEFAULT_DATA_DIR) == {}


def test_cli_grades_builtin_steps_by_its_rule(tmp_path):
    """`python eval.py --benchmarks builtin_steps` on assets/tiny-steps: every verdict is the task's
    rule."""
    import verify
    p = run_cli("--model", str(ROOT / "assets" / "tiny-steps"), "--limit", "24",
                "--benchmarks", "builtin_steps,builtin_steps_dev", "--max-new-tokens", "48",
                "--out", str(tmp_path / "o"))
    assert p.returncode == 0, p.stderr
    for name in ("builtin_steps", "builtin_steps_dev"):
        lines = (tmp_path / "o" / f"{name}.jsonl").read_text().splitlines()
        recs = [json.loads(line) for line in lines]
        assert len(recs) == 24
        assert all(r["correct"] == [verify.grade_integer(t, r["gold"]) for t in r["responses"]]
                   for r in recs)
        assert sum(r["lengths"][0] for r in recs) / len(recs) > 20         # whole worked chains


def test_make_prompts_templates():
    ps = data.make_prompts([data.Example("q?", "1")], "plain", CharTok())
    assert CharTok().decode(ps[0].ids) == "q?\n" + data.BOXED_INSTRUCTION and ps[0].answer == "1"


# ---- the CLI on a tiny random model --------------------------------------------------------------

def random_model(path):
    """A random 2-layer Qwen2 with a character tokenizer, saved as a Hugging Face directory."""
    import torch
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM
    vocab = {chr(i): i - 32 for i in range(32, 127)}
    vocab["\n"] = len(vocab)
    t = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    t.decoder = decoders.Fuse()
    t.add_special_tokens(["<|endoftext|>", "<|pad|>"])
    tok = PreTrainedTokenizerFast(tokenizer_object=t, eos_token="<|endoftext|>",
                                  pad_token="<|pad|>")
    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=len(tok), hidden_size=32, intermediate_size=64,
                      num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                      max_position_embeddings=1024, tie_word_embeddings=True,
                      eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    Qwen2ForCausalLM(cfg).save_pretrained(path)
    tok.save_pretrained(path)


# eval.py runs on 1 torch thread, as the in-process comparison below does: kernels may sum in
# another order on another thread count, and a sampled or greedy token can then differ (1 thread is
# also what train.py --threads 1 uses)
ONE_THREAD = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def run_cli(*flags):
    return subprocess.run([sys.executable, str(ROOT / "eval.py"), *flags], capture_output=True,
                          text=True, cwd=ROOT, timeout=120, env=ONE_THREAD)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny")
    random_model(path)
    return path


def test_cli_end_to_end(model_dir, tmp_path):
    gen = tmp_path / "mine.jsonl"
    gen.write_text('{"q": "1+1=?", "sol": {"final": 2}}\n{"q": "2+2=?", "sol": {"final": 4}}\n')
    base = tmp_path / "base.json"
    base.write_text(json.dumps({"benchmarks": {"builtin": {"mean@k": 0.5, "length/mean": 8.0},
                                               "mine": {"mean@k": 0.25, "length/mean": 2.0}}}))
    out = tmp_path / "out"
    p = run_cli("--model", str(model_dir), "--benchmarks", f"builtin,{gen}", "--limit", "3",
                "--k", "2", "--temperature", "1.0", "--max-new-tokens", "4", "--seed", "5",
                "--out", str(out), "--question-key", "q", "--answer-key", "sol.final",
                "--baseline", str(base))
    assert p.returncode == 0, p.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["benchmarks"]) == {"builtin", "mine"}
    for name, n in [("builtin", 3), ("mine", 2)]:
        recs = [json.loads(line) for line in (out / f"{name}.jsonl").read_text().splitlines()]
        s = summary["benchmarks"][name]
        assert (len(recs) == n == s["n"]
                and all(len(r["responses"]) == len(r["lengths"]) == 2 for r in recs))
        assert all(1 <= x <= 4 for r in recs for x in r["lengths"])
        assert s["mean@k"] == pytest.approx(sum(sum(r["correct"]) for r in recs) / (2 * n))
        assert s["length/mean"] == pytest.approx(sum(sum(r["lengths"]) for r in recs) / (2 * n))
        assert (s["truncated/frac"]
                == pytest.approx(sum(sum(r["truncated"]) for r in recs) / (2 * n)))
        b = json.loads(base.read_text())["benchmarks"][name]
        assert s["aes"] == pytest.approx(ev.aes(s["mean@k"], s["length/mean"], b["mean@k"],
                                                b["length/mean"]))
    assert ([r["gold"] for r in map(json.loads, (out / "mine.jsonl").read_text().splitlines())]
            == ["2", "4"])
    assert summary["macro"]["mean@k"] == pytest.approx(
        (summary["benchmarks"]["builtin"]["mean@k"] + summary["benchmarks"]["mine"]["mean@k"]) / 2)
    table = (out / "summary.md").read_text()
    assert (table.startswith("| benchmark | n | mean@2 | pass@2 | maj@2 |")
            and "| average |" in table)
    assert table.strip() in p.stdout

    # What train.py logs (evaluate() on its own engine) equals what the CLI reports for the same
    # model and settings.
    import torch
    from checkpoint import load_model
    from engine import TorchEngine
    model, tok = load_model(str(model_dir))
    engine = TorchEngine(model, tok, batch_size=ev.Args.batch_size)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)                 # as the CLI ran: the same computation, token for token
    try:
        s, recs = ev.evaluate(engine, tok, data.load_benchmark("builtin")[:3], template="builtin",
                              k=2, sampling=Sampling(temperature=1.0, max_new_tokens=4, seed=5))
    finally:
        torch.set_num_threads(threads)
    cli = [json.loads(line) for line in (out / "builtin.jsonl").read_text().splitlines()]
    assert [r["responses"] for r in recs] == [r["responses"] for r in cli]
    assert ([r["prompt"] for r in cli]
            == [data.builtin_prompt(e.question) for e in data.load_benchmark("builtin")[:3]])
    assert {key: v for key, v in summary["benchmarks"]["builtin"].items() if key != "aes"} == s


def test_cli_defaults_are_the_builtin_greedy_eval():
    a = ev.parse_args([])
    assert (a.model, a.benchmarks, a.k, a.temperature) == ("assets/tiny-arith", "builtin", 1, 0.0)
    assert ev.parse_args(["--k", "4", "--top-p", "0.9"]).k == 4


@pytest.mark.parametrize("flags, message", [
    (["--model", "/nonexistent/model"], "/nonexistent/model"),
    (["--benchmarks", "math5000"], "unknown benchmark 'math5000'"),
    (["--benchmarks", "BAD"], "BAD:2: malformed JSON line"),
    (["--k", "0"], "--k >= 1"),
    (["--baseline", "/nonexistent/summary.json"], "/nonexistent/summary.json"),
    (["--baseline", str(ROOT / "requirements.txt")], "not a summary.json"),
])
def test_cli_bad_input_is_one_line(model_dir, tmp_path, flags, message):
    if "BAD" in flags:
        bad = tmp_path / "bad.jsonl"
        bad.write_text('{"question": "q", "answer": "1"}\n{"question": \n')
        flags = [str(bad) if f == "BAD" else f for f in flags]
        message = message.replace("BAD", cli.shown_path(str(bad), str(ROOT)))   # its cwd
    p = run_cli("--model", str(model_dir), "--out", str(tmp_path / "o"), *flags)
    assert p.returncode == 2                      # bad input: exit 2, as train.py's
    assert "Traceback" not in p.stderr
    lines = [line for line in p.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], p.stderr


def test_cli_reads_values_not_objects_and_names_a_missing_benchmark_file(model_dir, tmp_path):
    """A key naming an object is one line (the gold would otherwise sit in the prompt); a named
    benchmark whose file is not in --data-dir says which file and where to look; both exit 2,
    without a weight-loading bar."""
    nested = tmp_path / "nested.jsonl"
    nested.write_text('{"item": {"q": "8*7=", "a": "56"}}\n')
    p = run_cli("--model", str(model_dir), "--out", str(tmp_path / "o"), "--benchmarks",
                str(nested), "--question-key", "item", "--answer-key", "item.a")
    assert p.returncode == 2 and p.stderr.strip().splitlines() == [
        f'error: {cli.shown_path(str(nested), str(ROOT))}:1: --question-key item names an '
        'object, not a value: {"q": "8*7=", "a": "56"}; name a field inside it (item.q, item.a)']
    p = run_cli("--model", str(model_dir), "--out", str(tmp_path / "o"), "--benchmarks", "aime24",
                "--data-dir", str(tmp_path / "nowhere"))
    missing = cli.shown_path(str(tmp_path / "nowhere" / "aime24.jsonl"), str(ROOT))  # its cwd
    assert p.returncode == 2 and p.stderr.strip().splitlines() == [
        f"error: benchmark 'aime24': {missing} not found: set --data-dir to the folder that "
        "holds aime24.jsonl (data.py says where the benchmark files come from)"]
    p = run_cli("--model", str(model_dir), "--out", str(tmp_path / "o"), "--limit", "2")
    assert p.returncode == 0 and "Loading" not in p.stderr and "it/s" not in p.stderr, p.stderr


def test_help_text_comes_from_field_docstrings():
    docs = cli.field_docs(ev.Args)
    assert set(docs) == {f.name for f in ev.dataclasses.fields(ev.Args)}
    assert docs["k"].startswith("samples per problem")
    p = run_cli("--help")
    assert (p.returncode == 0 and "--max-new-tokens" in p.stdout
            and "sampling temperature; 0 is greedy" in p.stdout)


def test_help_lines_fit_100_characters_on_a_wide_terminal():
    """argparse wraps at the terminal's width: capped at 100 (cli.HELP_WIDTH), eval.py's and
    train.py's --help alike, the default --model relative to the repository."""
    for script in ("eval.py", "train.py"):
        p = subprocess.run([sys.executable, script, "--help"], capture_output=True, text=True,
                           cwd=ROOT, timeout=120, env={**ONE_THREAD, "COLUMNS": "250"})
        assert p.returncode == 0 and max(map(len, p.stdout.splitlines())) <= 100, script
        assert str(ROOT) not in p.stdout and "(default: 'assets/tiny-arith')" in p.stdout


def test_help_and_import_do_not_import_torch():
    """eval.py's --help answers at once: importing eval and parsing --help load no torch (nor
    transformers); the imports wait for the functions that use them."""
    code = ("import sys, eval\n"
            "try:\n"
            "    eval.parse_args(['--help'])\n"
            "except SystemExit:\n"
            "    pass\n"
            "print('torch' in sys.modules, 'transformers' in sys.modules, file=sys.stderr)")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                       timeout=60)
    assert p.returncode == 0 and p.stderr.strip() == "False False", p.stderr
    assert "--max-new-tokens" in p.stdout
