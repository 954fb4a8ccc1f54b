"""verify.grade_fast, the built-in arithmetic tasks' grader, is verify.grade with two plain integers
read without the parser: on every completion of a large sample of real rollouts (the shipped
model's, sampled on the built-in tasks' prompts at three temperatures) and on adversarial strings
against adversarial golds, its verdict and its counts in verify.stats() are grade's, exactly."""
import functools
import itertools
import os

import pytest
import torch

import data
import verify
from checkpoint import load_model
from engine import TorchEngine
from rollout import Sampling

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL = os.path.join(ROOT, "assets", "tiny-arith")

RESPONSES = [
    "", " ", "\n", "56", " 56 ", "56\n", "\t-56", "-56", "056", "-056", "0", "-0", " -0 ", "00",
    "+56", "--56", "-", "+", "56.0", "56.", ".56", "5 6", "5_6", "0x38", "1e2", "56/1", "56abc",
    "abc56", "\\boxed{56}", "$56$", "56=56", "7*8=56", "7*8", "56 56", "56,000", "56\u00a0",
    "\u300056", "56\x1c", "\u200b56", "\uff15\uff16", "\u0665\u0666", "\u00b2", "56\u0301",
    "1" * 998, "1" * 999, "1" * 1000, "9" * 5000, "-" + "9" * 600, "The answer is 56",
    "#### 56", "56 I hope it is correct", "</think>56", "A", "(C)", "56%", "\\frac{112}{2}",
]
GOLDS = ["56", "-56", "0", " 56 ", "056", "-0", "56.0", "+56", "1" * 998, "1" * 500,
         "9" * 5000, "A", ""]


def verdict_and_counts(grade, response, gold) -> tuple[bool, dict]:
    """(grade(response, gold), what the call added to each verify.stats() count)."""
    before = verify.stats()
    verdict = grade(response, gold)
    after = verify.stats()
    return verdict, {k: after[k] - before[k] for k in after}


def agree(response, gold) -> None:
    fast = verdict_and_counts(verify.grade_fast, response, gold)
    full = verdict_and_counts(verify.grade, response, gold)
    assert fast == full, (response[:40], gold[:40], fast, full)


def fast_path_taken(response, gold) -> bool:
    """Whether grade_fast answered without calling grade."""
    with pytest.MonkeyPatch.context() as mp:
        calls = []
        mp.setattr(verify, "grade", lambda *a: calls.append(a) or False)
        verify.grade_fast(response, gold)
    return not calls


def test_grade_fast_agrees_with_grade_on_adversarial_strings():
    for response, gold in itertools.product(RESPONSES, GOLDS):
        agree(response, gold)
    taken = {r for r in RESPONSES if fast_path_taken(r, "56")}
    assert taken == {"56", " 56 ", "56\n", "\t-56", "-56", "056", "-056", "0", "-0", " -0 ",
                     "00", "56\u00a0", "\u300056", "56\x1c", "-" + "9" * 600}
    assert not fast_path_taken("1" * 998, "56")          # MAX_DIGITS characters together: grade's


@functools.lru_cache(maxsize=1)
def sampled() -> list[tuple[str, str]]:
    """(completion, gold) of 256 prompts of each built-in arithmetic task's train split, 8 samples
    each at temperatures 0.7, 1 and 2 (the last far off the model's answers): 12,288 rollouts."""
    model, tok = load_model(MODEL)
    engine = TorchEngine(model, tok)
    out = []
    for name in ("builtin_train", "builtin_mixed_train"):
        examples = data.load_benchmark(name, data.DEFAULT_DATA_DIR)[:256]
        prompts = data.make_prompts(examples, "builtin", tok)
        gold = {p.prompt_id: e.answer for p, e in zip(prompts, examples)}
        for seed, temperature in enumerate((0.7, 1.0, 2.0)):
            sampling = Sampling(temperature, 1.0, 8, seed=seed)
            out += [(r.text, gold[r.prompt_id]) for r in engine.generate(prompts, 8, sampling)]
    return out


def test_grade_fast_agrees_with_grade_on_sampled_rollouts():
    torch.set_num_threads(1)
    pairs = sampled()
    assert len(pairs) == 12_288 and len({t for t, _ in pairs}) > 500     # varied
    for response, gold in pairs:
        agree(response, gold)
    fast = sum(fast_path_taken(r, g) for r, g in pairs)
    assert 0.5 * len(pairs) < fast < len(pairs)            # both paths are exercised
    assert any(verify.grade(r, g) for r, g in pairs) and not all(verify.grade(r, g)
                                                                for r, g in pairs)


def test_the_built_in_arithmetic_tasks_are_graded_by_it():
    for name in ("builtin", "builtin_dev", "builtin_train", "builtin_mixed", "builtin_mixed_train"):
        assert verify.grader(name) is verify.grade_fast
    assert verify.grader("builtin_steps") is verify.grade_integer
    assert verify.grader("builtin", "instruct") is verify.grade_number
    assert verify.grader("gsm8k") is verify.grade
