"""Answer verification (first version; the full verifier replaces this file, keeping the interface).

    python verify.py          # prints a few graded examples

extract_answer(text): the last \\boxed{...} (nested braces), else the last number (with its sign).
grade(response, gold): the extracted answer equals the gold as a number, else as a whitespace-free string.
reward(response, gold): 1.0 if grade else 0.0. No torch, no eval.
"""
import re
from fractions import Fraction

_NUMBER = re.compile(r"(?<![\w.])-?\d+(?:,\d{3})*(?:\.\d+)?")


def _last_boxed(text: str) -> str | None:
    start = text.rfind("\\boxed")
    if start < 0:
        return None
    i = text.find("{", start)
    if i < 0:
        return None
    depth = 0
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i + 1:j].strip()
    return None


def extract_answer(text: str) -> str | None:
    if not isinstance(text, str):
        return None
    boxed = _last_boxed(text)
    if boxed is not None:
        return boxed
    numbers = _NUMBER.findall(text)
    return numbers[-1] if numbers else None


def _number(s: str) -> Fraction | None:
    try:
        return Fraction(s.replace(",", ""))
    except (ValueError, ZeroDivisionError):
        return None


def is_equivalent(pred: str, gold: str) -> bool:
    a, b = _number(pred), _number(gold)
    if a is not None and b is not None:
        return a == b
    return "".join(pred.split()) == "".join(gold.split())


def grade(response: str, gold: str) -> bool:
    pred = extract_answer(response)
    return pred is not None and is_equivalent(pred, str(gold))


def reward(response: str, gold: str) -> float:
    return 1.0 if grade(response, gold) else 0.0


def grade_batch(responses: list[str], golds: list[str]) -> list[bool]:
    return [grade(r, g) for r, g in zip(responses, golds, strict=True)]


if __name__ == "__main__":
    for response, gold in [("-164", "-164"), ("3-5=-2", "-2"), ("so \\boxed{\\frac{1}{2}}", "\\frac{1}{2}"), ("40", "41")]:
        print(f"{response!r:28} gold {gold!r:14} -> {grade(response, gold)}")
