"""Prompt sets: the built-in synthetic arithmetic task (the default, no download) and its prompt template.

    python data.py            # prints a few built-in examples

The built-in task: integer expressions of 2-3 operands in [0, 20) joined by + - *, evaluated with the usual
precedence. Deterministic given a seed. Train and test are disjoint by construction: an expression belongs to the
test split iff crc32(expression) % 10 == 0, whatever the seed, so no test expression can ever appear in training.

The prompt is the expression followed by "=" and the gold answer is the integer value, e.g. "3+4*2=" -> "11".
"""
import random
import zlib
from dataclasses import dataclass

BUILTIN = "builtin"          # name of the built-in task wherever a prompt set is named
OPERATORS = "+-*"
MAX_OPERAND = 20             # operands are drawn from [0, MAX_OPERAND)


@dataclass
class Example:
    question: str
    answer: str


def _is_test(expr: str) -> bool:
    return zlib.crc32(expr.encode()) % 10 == 0


def arithmetic_examples(split: str, n: int, seed: int = 0) -> list[Example]:
    """n distinct examples of the given split ("train" or "test"), the same list for the same (split, n, seed)."""
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    rng = random.Random(f"{split}-{seed}")
    seen, out = set(), []
    for _ in range(200 * n + 1000):             # bounded: the test split holds ~10% of ~70k expressions
        k = rng.choice((2, 3))
        terms = [str(rng.randrange(MAX_OPERAND)) for _ in range(k)]
        ops = [rng.choice(OPERATORS) for _ in range(k - 1)]
        expr = terms[0] + "".join(o + t for o, t in zip(ops, terms[1:]))
        if expr in seen or _is_test(expr) != (split == "test"):
            continue
        seen.add(expr)
        # Only digits and + - * reach eval here: strings this module built itself, never model output.
        out.append(Example(question=expr, answer=str(eval(expr))))
        if len(out) == n:
            return out
    raise ValueError(f"could not draw {n} distinct {split} examples")


def builtin_prompt(question: str) -> str:
    """The built-in task's template: the expression and '='; the model answers with the number."""
    return f"{question}="


if __name__ == "__main__":
    for ex in arithmetic_examples("train", 5):
        print(f"{builtin_prompt(ex.question)!r:16} gold {ex.answer}")
