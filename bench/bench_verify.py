"""Benchmark of verify.grade: numeric grades per second on one core (target >= 5,000/s), the slowest
case, and ratios against baselines measured in the same process.

    python bench/bench_verify.py [--n 20000] [--seconds 2]

Workloads (each timed for about --seconds, after a warm-up):
  numeric/bare     the built-in task's completions: a bare integer, right or wrong
                   ("-164" vs "-164")
  numeric/text     the same answers inside a sentence or a box ("so the result is \\boxed{-164}.")
  math500          MATH-500 reference solutions against their answers (long LaTeX, mostly the
                   fractions path)
  symbolic         expression pairs that need the sympy worker ("(x+1)^2" vs "x^2+2x+1")
  naive baseline   response.strip() == gold.strip(), the cheapest possible "verifier"
The process is pinned to one CPU where the OS allows it; the symbolic worker is a separate process.
"""
import argparse
import json
import os
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import data  # noqa: E402
import mathcheck  # noqa: E402
import verify  # noqa: E402


def pairs_numeric(n: int, rng: random.Random, wrapped: bool) -> list[tuple[str, str]]:
    examples = data.arithmetic_examples("test", seed=0)          # the whole split (938), cycled
    out = []
    for k in range(n):
        gold = examples[k % len(examples)].answer
        answer = gold if rng.random() < 0.5 else str(int(gold) + rng.choice([-2, -1, 1, 10]))
        if wrapped:
            answer = rng.choice([f"so the result is \\boxed{{{answer}}}.",
                                 f"The answer is {answer}.",
                                 f"{examples[k % len(examples)].question}={answer}",
                                 f"$x = {answer}$"])
        out.append((answer, gold))
    return out


def pairs_math500() -> list[tuple[str, str]]:
    with open(ROOT.parent / "shared" / "data" / "math500.jsonl") as f:
        rows = [json.loads(line) for line in f]
    return [(r["solution"], r["answer"]) for r in rows]


SYMBOLIC = [("(x+1)^2", "x^2+2x+1"), ("\\frac{x}{7}+\\frac{2}{7}", "\\frac{x+2}{7}"),
            ("\\sec^2(y)", "\\tan^2(y)+1"), ("2x+4y-3=0", "y=-\\frac{1}{2}x+\\frac{3}{4}"),
            ("x^3+2x+1", "x^2+2x+1"), ("3\\sqrt{13}", "\\sqrt{117}"),
            ("1 \\pm \\sqrt{19}", "\\{1+\\sqrt{19}, 1-\\sqrt{19}\\}"), ("x \\geq 5", "5 \\le x")]


def rate(fn, pairs: list, seconds: float, slowest: list) -> float:
    """Calls per second of fn over the pairs (cycled) for about `seconds`; records the slowest
    single call."""
    done, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        verify.normalize.cache_clear()                      # every cycle pays for every pair again
        mathcheck._parse_or_text.cache_clear()
        for response, gold in pairs:
            t = time.perf_counter()
            fn(response, gold)
            slowest.append((time.perf_counter() - t, response[-60:], gold[:40]))
            done += 1
        slowest[:] = [max(slowest)]
    return done / (time.perf_counter() - start)


def naive(response: str, gold: str) -> bool:
    return response.strip() == gold.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    parser.add_argument("--n", type=int, default=20_000, help="numeric pairs per workload")
    parser.add_argument("--seconds", type=float, default=2.0, help="time per workload")
    args = parser.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    rng = random.Random(0)
    bare, wrapped = (pairs_numeric(args.n, rng, wrapped=False),
                     pairs_numeric(args.n, rng, wrapped=True))
    math500 = pairs_math500()
    # warm-up, boots the worker
    for response, gold in bare[:200] + wrapped[:200] + math500[:50] + SYMBOLIC:
        verify.grade(response, gold)
    verify.reset_stats()

    slowest: list = [(0.0, "", "")]
    rows = [("naive baseline", rate(naive, bare, args.seconds, [(0.0, "", "")])),
            ("numeric/bare", rate(verify.grade, bare, args.seconds, slowest)),
            ("numeric/text", rate(verify.grade, wrapped, args.seconds, slowest)),
            ("math500", rate(verify.grade, math500, args.seconds, slowest)),
            ("symbolic", rate(verify.grade, SYMBOLIC, args.seconds, slowest))]
    base, fast = rows[0][1], rows[1][1]
    print(f"verify.grade on one core "
          f"({'pinned' if hasattr(os, 'sched_setaffinity') else 'not pinned'}), "
          f"~{args.seconds:g} s per workload")
    print(f"{'workload':16} {'grades/s':>12} {'x naive':>10} {'x numeric/bare':>15}")
    for name, r in rows:
        print(f"{name:16} {r:12,.0f} {base / r:10.1f} {fast / r:15.2f}")
    t, response, gold = slowest[0]
    slow_numeric = min(fast, rows[2][1])
    print(f"numeric grades/s: {fast:,.0f} bare, {rows[2][1]:,.0f} in text "
          f"(target >= 5,000: {'met' if slow_numeric >= 5000 else 'MISSED'})")
    print(f"slowest single grade: {t * 1000:.1f} ms on {response!r} vs {gold!r}")
    print(f"stats: {verify.stats()}")


if __name__ == "__main__":
    main()
