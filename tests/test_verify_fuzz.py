"""10,000 generated adversarial strings through verify.py, from the main thread and from a worker
thread: no exception, no internal error, nothing executed (a payload would create a
sentinel file), every call within 2 s.

The mix: code payloads (bare, boxed, after "The answer is", as "x = ..."), bombs (10^4 nested
braces, 1e999999, 9^{9^{9^{9}}}, 10^5-digit numbers, huge factorials/binomials/powers), unbalanced
LaTeX, control and odd Unicode characters, deep runs of one opener, and random soups of
LaTeX/maths/answer-phrase fragments. Most of them must fail fast in the parent process; the ones
that parse reach the symbolic worker.
"""
import random
import threading
import time


import verify

N_STRINGS = 10_000
CALL_LIMIT_S = 2.0
GOLDS = ["1", "x+1", "\\frac{1}{2}", "(1,2)", "[0,1)", "x^2+2x+1", "\\sqrt{2}", "C", "5",
         "\\{1,2\\}", "y = 2x+1"]
PIECES = ["\\frac", "\\sqrt", "{", "}", "(", ")", "[", "]", "^", "_", "\\boxed{", "$", "$$", "\\[",
          "\\]", "\\left(", "\\right)", "\\begin{pmatrix}", "\\end{pmatrix}", "&", "\\\\", "=", "<",
          "\\le", ",", ";", "\\pm", "\\cup", "x", "y", "e", "i", "\\pi", "\\infty", "1", "2", "9",
          "0.5", "-", "+", "*", "/", "!", "%", "\\%", "\\text{", "and", "or", "\x00", "\x1b", "\t",
          "\n", "\u202e", "\ufeff", "𝟙", "∞", "√", "π", "±", "</think>", "####", "\\sin",
          "The answer is", "Final Answer: The final answer is", "I hope it is correct.", "\\log_",
          "\\sum", "\\binom", "\\int", "\\lim", "\\mathrm{", "'", "\"", "\\", "{,}", "\\!", "e999",
          "1e5", "A", "(C)", "\\{", "\\}", "|"]


def adversarial_strings(n: int, seed: int, sentinel: str) -> list[str]:
    rng = random.Random(seed)
    touch = f"open({sentinel!r}, 'w').write('pwned')"
    payloads = [f"__import__('os').system('touch {sentinel}')", f'eval("{touch}")',
                f'exec("{touch}")', touch, "().__class__.__base__.__subclasses__()",
                f"lambda: {touch}", "Symbol('x').__init__.__globals__",
                f"__import__('subprocess').call(['touch', '{sentinel}'])", f"\\input{{{sentinel}}}",
                f"\\write18{{touch {sentinel}}}", f"sympify('{touch}')", f"S('{touch}')"]
    bombs = ["{" * 10_000 + "1" + "}" * 10_000, "\\boxed{" * 5_000 + "1" + "}" * 5_000,
             "(" * 10_000 + "1" + ")" * 10_000, "\\frac{" * 3_000, "\\sqrt{" * 3_000 + "2",
             "-" * 10_000 + "1", "^" * 10_000, "1e999999", "1e-999999", "9^{9^{9^{9}}}",
             "10^{10^{10}}", "2^{2^{2^{2^{2^{2}}}}}", "(10^{100})!", "10^{1000}!", "x^{10^{9}}",
             "\\binom{10^{9}}{10^{5}}", "(x+1)^{100000}", "(x+y+z)^{999}", "9" * 100_000,
             "1" * 100_000 + ".5", "0." + "3" * 100_000, "1/" + "7" * 100_000,
             "\\frac{1}{" + "3" * 5_000 + "}", "x" * 10_000,
             "\\begin{pmatrix}" + " & ".join("9" * 50 for _ in range(60)) + "\\end{pmatrix}",
             "\x00" * 1_000, "\\sin(" * 500 + "x" + ")" * 500, "1+" * 5_000 + "1",
             "\\pm" * 100 + "1", "(1\\pm 2)" * 50, "e^{e^{e^{e^{e^{10}}}}}", "\\sqrt[10^{9}]{2}",
             "0^{-1}", "\\frac{1}{0}", "\\tan(\\pi/2)", "\\log(0)", "answer:" + " " * 50_000,
             "final answer is" + " " * 50_000 + "I hope", "1 " + "ab" * 40 + "1"]
    out = []
    while len(out) < n:
        kind = rng.random()
        if kind < 0.06:
            s = rng.choice(bombs)
        elif kind < 0.16:
            s = rng.choice(payloads)
            s = rng.choice([s, f"\\boxed{{{s}}}", f"The answer is ${s}$", f"#### {s}", f"{s} = 5",
                            f"x = {s}"])
        elif kind < 0.22:
            s = "".join(chr(rng.randrange(0, 0x3000)) for _ in range(rng.randrange(1, 300)))
        elif kind < 0.30:
            s = (rng.choice(["{", "(", "\\frac{", "\\sqrt{", "\\boxed{", "x^{", "[", "|"])
                 * rng.choice([7, 300, 5_000]))
        else:
            s = "".join(rng.choice(PIECES) for _ in range(rng.randrange(1, 40)))
        out.append(s)
    return out


def _run(strings: list[str], slowest: list, with_extract: bool) -> None:
    for i, s in enumerate(strings):
        calls = ([lambda: verify.grade(s, GOLDS[i % len(GOLDS)])]
                 + ([lambda: verify.extract_answer(s)] * with_extract))
        for call in calls:
            start = time.monotonic()
            call()
            slowest.append((time.monotonic() - start, s[:60]))


def test_fuzz_main_thread_and_worker_thread(tmp_path):
    sentinel = tmp_path / "pwned"
    strings = adversarial_strings(N_STRINGS, seed=0, sentinel=str(sentinel))
    assert verify.is_equivalent("x + 1", "1 + x")           # boot the worker before timing anything
    verify.reset_stats()
    start = time.monotonic()
    main_times: list = []
    _run(strings, main_times, with_extract=True)
    main_s = time.monotonic() - start

    thread_times: list = []
    errors: list = []

    def in_thread():
        try:
            _run(strings, thread_times, with_extract=False)
        except BaseException as e:                           # re-raised below, in the test's thread
            errors.append(e)

    start = time.monotonic()
    worker = threading.Thread(target=in_thread)
    worker.start()
    worker.join()
    thread_s = time.monotonic() - start
    if errors:
        raise errors[0]

    stats = verify.stats()
    worst = max(main_times + thread_times)
    print(
        f"\nfuzz: {N_STRINGS} strings, main thread {main_s:.1f} s (grade + extract_answer), "
        f"worker thread {thread_s:.1f} s (grade); slowest call {worst[0]:.3f} s on {worst[1]!r}; "
        f"{stats}")
    assert not sentinel.exists()
    assert stats["graded"] == 2 * N_STRINGS and stats["error"] == 0
    assert stats["symbolic"] < 0.1 * stats["graded"]        # most strings are rejected before sympy
    assert worst[0] <= CALL_LIMIT_S, f"{worst[1]!r} took {worst[0]:.2f} s"
