"""Chat models on the built-in tasks: the instruct template, `auto` choosing it when the tokenizer
has a chat template, the grading rule on real completions of SmolLM2-135M-Instruct (committed as
tests/data/smollm2_completions.jsonl, labelled by hand), the difficulty-spread task's splits, and
the chat path through the trainer's completion-only logits and the canary on a 49,152-word
vocabulary (the random tiny Llama of assets/make_tiny_llama.py: no download).
"""
import json
import os
import re

import pytest
import torch

import data
import engine as engine_lib
import eval as eval_lib
import rollout
import verify
from conftest import ROOT, TINY_MODEL
from make_tiny_llama import load_tokenizer, make_tiny_llama

COMPLETIONS = os.path.join(ROOT, "tests", "data", "smollm2_completions.jsonl")


@pytest.fixture(scope="module")
def chat_tok():
    return load_tokenizer()


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    from checkpoint import load_model
    return load_model(make_tiny_llama(tmp_path_factory.mktemp("llama") / "model", seed=0), "cpu")


# ---- the template ----------------------------------------------------------------------------

def test_auto_gives_chat_models_the_instruct_template(chat_tok):
    from transformers import AutoTokenizer
    plain_tok = AutoTokenizer.from_pretrained(TINY_MODEL)            # no chat template
    for name in data.BUILTIN_NAMES:
        assert data.template_for(name, "auto", chat_tok) == "instruct"
        assert data.template_for(name, "auto", plain_tok) == "builtin"
        assert data.template_for(name) == "builtin"                   # no tokenizer: builtin
    assert data.template_for("gsm8k", "auto", chat_tok) == "chat"     # any other set: chat
    assert data.template_for("my.jsonl", "auto", chat_tok) == "chat"
    assert data.template_for("builtin", "chat", chat_tok) == "chat"   # a choice is kept
    text = data.apply_template("3+4*2", "instruct", chat_tok)
    assert text.endswith("<|im_start|>user\nWhat is 3+4*2? Reply with only the number."
                         "<|im_end|>\n<|im_start|>assistant\n")
    with pytest.raises(ValueError, match="needs a tokenizer with a chat template"):
        data.apply_template("3+4*2", "instruct", plain_tok)
    # the chat template holds its special tokens: none added again
    (prompt,) = data.make_prompts([data.Example("3+4*2", "11")], "instruct", chat_tok)
    assert prompt.ids == chat_tok(text, add_special_tokens=False)["input_ids"]
    assert chat_tok.decode(prompt.ids) == text


def test_grader_and_answer_form_follow_the_template():
    assert verify.grader("builtin", "instruct") is verify.grade_number
    assert verify.grader("builtin_steps", "instruct") is verify.grade_number
    assert verify.grader("builtin_mixed_train", "instruct") is verify.grade_number
    assert verify.grader("builtin_steps") is verify.grade_integer           # builtin template
    assert verify.grader("builtin_mixed") is verify.grade_fast
    assert verify.grader("gsm8k", "chat") is verify.grade
    assert verify.format_rule("builtin", "instruct") is verify.number_form
    assert verify.format_rule("builtin") is verify.integer_form
    assert verify.format_rule("builtin", "chat") is verify.boxed_form       # it asks for a box
    assert verify.format_rule("math500") is verify.boxed_form


@pytest.mark.parametrize("response, gold, right", [
    ("20", "20", True), (" -4\n", "-4", True), ("1 + 4 = 5", "5", True),
    ("The answer is 20.", "20", True), ("So the result is \\boxed{20}", "20", True),
    ("8*8-1-7+3+9 = 25\n\nThe answer is: 25", "25", True),
    ("The answer is 0+3-1.", "2", False),           # the question restated: not an answer
    ("2 + 8 + 7 = 2 + 8 + 7", "17", False), ("20.5", "20", False), ("", "20", False),
    ("The answer is 21.", "20", False), ("twenty", "20", False),
    # an operand is not a stated answer (a sampled reply seen in training: its last number is
    # the last operand of the question, 5*0, which equals the gold 0)
    ("Help yourself to grapple with impossible questions. Who is 5*0?", "0", False),
    ("4-4+7", "7", False), ("4 - 6 = -2", "-2", True), ("So 9 - 2 = 7, and 7 + 0 = 7", "7", True),
])
def test_grade_number_on_written_replies(response, gold, right):
    assert verify.grade_number(response, gold) is right


def test_number_form_is_the_number_alone():
    assert verify.number_form("20") and verify.number_form(" -4\n")
    for reply in ("4*5 = 20", "20.", "The answer is 20", "\\boxed{20}", "", None):
        assert not verify.number_form(reply)


def test_grading_rule_on_real_smollm2_completions():
    """80 completions of SmolLM2-135M-Instruct (the Q4_1 weights dequantized) under the instruct
    template, 32 new tokens: 56 greedy on the test splits of builtin_mixed and builtin, 24 sampled
    at temperature 1 (assets/make_smollm2_completions.py), each labelled by reading it: right when
    the answer it states is the gold number. The rule agrees with every label; value equality
    (verify.grade) would also pay the 5 replies that only restate the question."""
    rows = [json.loads(line) for line in open(COMPLETIONS, encoding="utf-8")]
    assert len(rows) == 80 and sum(r["label"] for r in rows) == 3
    grade = verify.grader("builtin", "instruct")
    for r in rows:
        assert grade(r["completion"], r["gold"]) is r["label"], r
        if r["echo"]:
            assert verify.grade(r["completion"], r["gold"]) and not r["label"]
    assert sum(r["echo"] for r in rows) == 5
    assert not any(verify.number_form(r["completion"]) for r in rows)   # never the number alone


# ---- the difficulty-spread task --------------------------------------------------------------

def test_mixed_task_splits_are_disjoint_and_span_2_to_6_operands():
    splits = {s: data.mixed_examples(s) for s in data.SPLITS}
    sets = {s: {e.question for e in exs} for s, exs in splits.items()}
    assert [len(sets[s]) for s in data.SPLITS] == [len(splits[s]) for s in data.SPLITS]
    assert not sets["train"] & sets["dev"] and not sets["train"] & sets["test"]
    assert not sets["dev"] & sets["test"]
    # the crc32 rule is every built-in task's: no other task's test or dev expression is trained on
    others = {e.question for s in ("dev", "test") for e in data.arithmetic_examples(s)}
    others |= {e.question for s in ("dev", "test") for e in data.arithmetic_chain_examples(s)}
    assert not sets["train"] & others
    assert len(data.load_benchmark("builtin_mixed")) == data.MIXED_TEST_SIZE == 500
    assert len(data.load_benchmark("builtin_mixed_dev")) == data.MIXED_DEV_SIZE
    assert len(data.load_benchmark("builtin_mixed_train")) == data.MIXED_TRAIN_SIZE
    counts = {data.operands(e.question) for e in data.load_benchmark("builtin_mixed")}
    assert counts == set(data.MIXED_OPERANDS)
    for e in splits["train"][:500]:
        assert re.fullmatch(r"[0-9]([-+*][0-9]){1,5}", e.question)
        assert int(e.answer) == int(data.worked_solution(e.question).rsplit("=", 1)[-1])
        ops = "".join(re.findall(r"[-+*]", e.question))     # the step task's rule for "*"
        assert ops.count("*") <= 2 and "**" not in ops
    assert data.mixed_examples("test", 2) == [data.Example("8*8-1-7+3+9", "68"),
                                              data.Example("8+4-3*2", "6")]       # pinned
    assert data.train_split("builtin_mixed") == "builtin_mixed_train"
    assert data.builtin_dev("builtin_mixed", 3) == data.mixed_examples("dev", 3)
    assert data.operands("7+6*9-3*2-1") == 6 and data.operands("4") == 1


def test_train_eval_sets_use_the_run_template_and_its_rule(chat_tok):
    sets = eval_lib.train_eval_sets(4, "", 1, 0.0, "auto", data.DEFAULT_DATA_DIR, "builtin",
                                    dev_size=2, tokenizer=chat_tok)
    for key in ("accuracy", "dev_accuracy"):
        examples, template, k, temperature, grader = sets[key]
        assert template == "instruct" and grader is verify.grade_number
    examples, template, *_ = eval_lib.train_eval_sets(4, "", 1, 0.0, "auto", data.DEFAULT_DATA_DIR,
                                                      "builtin")["accuracy"]
    assert template == "builtin"


# ---- the chat path through the trainer, on a 49,152-word vocabulary --------------------------

def test_completion_only_logits_and_the_canary_on_a_49k_vocabulary(tiny_llama):
    """The engine samples from chat prompts of different lengths; the trainer's forward computes
    logits at the completion positions only (a [B, T, 49152] tensor, T the completion span) and
    they equal the full forward's there (fp32, another matmul shape: ~1e-6); the canary, engine
    against trainer on the same weights, is at float32 rounding."""
    model, tok = tiny_llama
    prompts = data.make_prompts([data.Example("3+4*2", "11"), data.Example("9*9-1+2*3", "86")],
                                "instruct", tok)
    engine = engine_lib.TorchEngine(model, tok)
    rs = engine.generate(prompts, 2, rollout.Sampling(temperature=1.0, max_new_tokens=6, seed=0))
    batch = rollout.collate(rs, tok.pad_token_id)
    s = rollout.first_predicting(rs)
    L = batch["input_ids"].shape[1]
    assert s == min(len(p.ids) for p in prompts) - 1 > 30       # the system turn, the question
    with torch.no_grad():
        logits, logp = rollout.forward_logprobs(model, batch, 1.0)
        full = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    assert logits.shape == (4, L - 1 - s, 49152)
    assert torch.allclose(logits, full[:, s:-1], atol=1e-4)
    mask = batch["completion_mask"].bool()
    want = full[:, s:-1].log_softmax(-1).gather(-1, batch["input_ids"][:, s + 1:, None])[..., 0]
    assert torch.allclose(logp[mask], want[mask], atol=1e-4)
    assert engine_lib.logprob_diff(model, rs, 1.0, tok.pad_token_id) < 1e-4
