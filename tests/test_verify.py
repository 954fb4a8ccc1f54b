"""verify.py rules, one by one: extraction, normalisation, numbers, structures, bounds, the worker,
the API.

Expected values are worked out by hand in the comments; tests/test_verify_cases.py checks the public
tables and tests/test_verify_fuzz.py the adversarial strings.
"""
import io
import os
import subprocess
import sys
import threading
import time
import tokenize
from pathlib import Path

import pytest

import mathcheck
import verify

ROOT = Path(__file__).resolve().parents[1]


# ---- extraction ----------------------------------------------------------------------------------

@pytest.mark.parametrize("text, answer", [
    ("-164", "-164"),                                         # the built-in task's completions
    (" 40\n", "40"),
    # a chain reduces to its value, sign kept
    ("3-5=-2", "-2"),
    ("x = 5", "5"),
    ("I had 3 apples and ate 5, so I owe -2 apples", "-2"),   # the rightmost number, with its sign
    ("The total is 1,234.5 dollars", "1,234.5"),
    ("so $\\boxed{\\frac{1}{2}}$ wins", "\\frac{1}{2}"),
    # nested braces
    ("\\boxed{\\frac{\\sqrt{\\frac{1}{2}}}{3}}", "\\frac{\\sqrt{\\frac{1}{2}}}{3}"),
    # the last box
    ("first \\boxed{7}; after much more thinking, we find that it is \\boxed{8}", "8"),
    ("\\fbox{12}", "12"),
    ("\\boxed{1} and \\boxed{2}", "1, 2"),                    # joined by a short connective
    ("\\boxed{1} no no no no no \\boxed{2}", "2"),            # not by a sentence
    ("so \\boxed{3}\n#### 4", "3"),
    ("He pays 2*3=<<2*3=6>>6 dollars.\n#### 6", "6"),         # GSM8K's worked solutions
    ("The answer is 42. Next we check 43.", "42"),
    ("Final Answer: The final answer is $\\frac{3}{4}$. I hope it is correct.", "\\frac{3}{4}"),
    ("we get \\boxed{255}. Final Answer: The final answer is $10,455$. I hope it is correct.",
     "10,455"),
    # only the text after the reasoning
    ("<think>maybe \\boxed{41}</think> The answer is 42", "42"),
    ("Therefore $x \\geq 5$ is the solution.", "x \\geq 5"),  # the rightmost maths span
    ("y = 2x + 1", "y = 2x + 1"),                             # an equation between unknowns stays
    ("$\\sqrt{4} = 2$", "2"),
    # the exact side before an approximation
    ("x = \\frac{1}{3} \\approx 0.33", "\\frac{1}{3}"),
])
def test_extract_answer(text, answer):
    assert verify.extract_answer(text) == answer


@pytest.mark.parametrize("text", ["", "   ", None, 42, "Some words and no answer at all.",
                                  "<think>\\boxed{42}</think> Some other text.",
                                  "\\boxed{" + "1" * 20_000 + "}"])
def test_extract_answer_none(text):
    assert verify.extract_answer(text) is None


# ---- normalisation -------------------------------------------------------------------------------

@pytest.mark.parametrize("raw, norm", [
    ("$\\left( 3, \\dfrac{\\pi}{2} \\right)$", "( 3, \\frac{\\pi}{2} )"),
    ("90^\\circ", "90"), ("10\\%", "10%"), ("\\$5", "5"), ("5\\text{ cm}^2", "5"), ("35 cm", "35"),
    ("x \\in [0,1)", "[0,1)"), ("\\\\frac{1}{2}", "\\frac{1}{2}"), ("14{,}916", "14,916"),
    ("11,\\! 111", "11,111"), ("\\text{Evelyn}", "Evelyn"), ("6 \\text{ and } 8", "6 ; 8"),
    ("185\\", "185"), ("\\quad 1\\,000 ", "1 000"),
])
def test_normalize(raw, norm):
    assert verify.normalize(raw) == norm


# ---- equivalence ---------------------------------------------------------------------------------

@pytest.mark.parametrize("pred, gold, same", [
    ("0.5", "\\frac{1}{2}", True), ("1/2", "\\dfrac12", True), ("2/4", "0.5", True),
    ("0.50", "1/2", True), ("1000.0", "1000", True), ("1,000", "1000", True),
    ("1 000", "1000", True), ("1,22", "1.22", True),
    # a decimal comma, or a pair: both readings
    ("12,34", "(12, 34)", True),
    ("32, 349", "32349", False), ("7,425,000", "7425000", True), ("3.54e-07", "3.54*10^{-7}", True),
    ("10^3", "1000", True), ("2^{10}", "1024", True), ("918\\frac{1}{2}", "918.5", True),
    ("28%", "28", True), ("28 percent", "28\\%", True), ("0.28", "28\\%", False),
    ("90^\\circ", "90", True), ("\\$1,000.99", "1000.99", True), ("-\\frac{10}{9}", "-10/9", True),
    ("\\frac{10}{9}", "-10/9", False), ("5.001", "5", False), ("2\\sqrt{2}", "\\sqrt{8}", True),
    ("\\frac{\\pi}{2}", "\\pi/2", True), ("3\\sqrt{13}", "3 * \\sqrt{13}", True),
    ("\\sqrt{2}", "1.41421356237", True), ("e^{i\\pi}", "-1", True), ("6 - 5i", "6-5i", True),
    ("(x+1)^2", "x^2+2x+1", True), ("(x+1)^2", "x^2+1", False),
    ("\\sec^2(y)", "\\tan^2(y)+1", True), ("\\frac{x}{7}+\\frac{2}{7}", "\\frac{x+2}{7}", True),
    ("2xy", "2yx", True), ("x^3+2x+1", "x^2+2x+1", False), ("\\binom{5}{2}", "10", True),
    ("5!", "120", True), ("\\log_2 8", "3", True), ("|3-5|", "2", True),
    ("3 \\pm \\sqrt{2}", "\\{3-\\sqrt2, 3+\\sqrt2\\}", True), ("\\pm 2021", "2021", False),
    ("(1, 2)", "(1, 2)", True), ("(1, 2)", "(2, 1)", False),           # tuples are ordered
    ("\\{1, 2\\}", "\\{2, 1\\}", True), ("1, 2, 3", "3, 2, 1", True),  # sets and bare lists are not
    # a set against a tuple keeps its order
    ("{1,3}", "(1,3)", True), ("{1,3}", "(3,1)", False),
    ("3, 3", "3", True), ("3, 4", "3", False),                         # a set drops repeats
    ("[0,1)", "[0, 1)", True), ("[0,1)", "[0,1]", False), ("(0,1)", "(0,1]", False),
    ("(-\\infty, 0) \\cup (0, \\infty)", "(-\\infty,0)\\cup(0,\\infty)", True),
    ("0 < x \\le 1", "(0, 1]", True), ("-2 \\le x \\le 7", "[-2,7]", True),
    ("\\begin{pmatrix}1 & 2 \\\\ 3 & 4\\end{pmatrix}",
     "\\begin{bmatrix}1&2\\\\3&4\\end{bmatrix}", True),
    ("\\begin{pmatrix}1 & 2 \\\\ 3 & 5\\end{pmatrix}",
     "\\begin{pmatrix}1&2\\\\3&4\\end{pmatrix}", False),
    ("x \\geq 5", "5 \\le x", True), ("-x > -1", "x < 1", True), ("x > -1", "x < 1", False),
    ("x < 5", "x \\le 5", False), ("2x+4y-3=0", "y=-\\frac{1}{2}x+\\frac{3}{4}", True),
    ("x + y = 1", "x - y = 1", False), ("k = \\frac{1}{3}", "1/3", True), ("1", "y = 1", True),
    # a gold equation is not its right side
    ("0", "a + 3z = 0", False),
    ("p=5,q=2;p=7,q=2", "(5,2),(7,2)", True), ("a=4,\\,-8,\\,-10", "-10,-8,4", True),
    ("7:32", "7:32", True), ("12:00", "1:00", False), ("204_5", "204_{5}", True),
    ("204_5", "54", False), ("\\text{Evelyn}", "Evelyn", True), ("white", "White", True),
    ("odd", "\\text{oddd}", False), ("dog", "god", False), ("AZYUK2A", "2", False),
    ("", "1", False), ("1", "", False),
])
def test_is_equivalent(pred, gold, same):
    assert verify.is_equivalent(pred, gold) is same


def test_numbers_rounding_rule_and_tolerance():
    # 0.33 rounds 1/3: |0.33 - 1/3| = 1/300 <= 0.5e-2; 0.34 is 1/150 away, more than 0.005.
    assert verify.is_equivalent("0.33", "1/3") and not verify.is_equivalent("0.34", "1/3")
    # one decimal is too few to claim rounding
    assert not verify.is_equivalent("0.3", "1/3")
    # |2.6667 - 8/3| = 3.3e-5 <= 5e-5
    assert verify.is_equivalent("2.6667", "\\frac{8}{3}")
    # 0.35 is exact
    assert not verify.is_equivalent("0.3", "0.35") and not verify.is_equivalent("0.4", "0.35")
    # pi = 3.14159..
    assert verify.is_equivalent("3.1416", "\\pi") and not verify.is_equivalent("3.1415", "\\pi")
    # 1.3e-16 relative <= REL_TOL = 1e-9
    assert verify.is_equivalent("0.3", "0.30000000000000004")
    assert not verify.is_equivalent("0.1000001", "0.1")               # 1e-6 relative > REL_TOL
    assert not verify.is_equivalent("11111111101", "11111111100")     # two integers compare exactly
    assert not verify.is_equivalent("16386.21", "16386.20")


def test_multiple_choice_letters():
    assert verify.grade("thinking about it I think the correct answer is C", "C")
    assert verify.grade(
        "Let's think. It's not A because it makes no sense, therefore I think it's B", "B")
    assert verify.grade("The answer is for sure D, it can't be A or B", "(D) Alina")
    assert verify.grade("B。不是 A", "B") and verify.grade("$\\boxed{\\text{(C)}}$", "\\text{C}")
    assert not verify.grade("C", "(A) Cecile") and not verify.grade("\\mathrm{E}*2", "E")


# ---- safety and bounds ---------------------------------------------------------------------------

def test_source_never_calls_an_evaluator():
    """No name that runs or parses code as Python is called anywhere in verify.py, mathparse.py or
    mathcheck.py (tokens, not text search)."""
    forbidden = {"eval", "exec", "sympify", "parse_expr", "lambdify", "latex2sympy", "parse_latex",
                 "__import__", "getattr", "globals", "locals", "vars"}
    source = "\n".join((ROOT / name).read_text()
                       for name in ("verify.py", "mathparse.py", "mathcheck.py"))
    tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    names = [(a.string, b.string) for a, b in zip(tokens, tokens[1:]) if b.type == tokenize.NAME]
    assert not {name for _, name in names} & forbidden
    strings = [t.string for t in tokens]
    # sympy.S(...) sympifies too
    assert ("sympy", "S") not in set(zip(strings, strings[2:]))
    assert all(prev == "." for prev, name in names if name == "compile")           # re.compile only


def test_payloads_are_not_executed(tmp_path, monkeypatch):
    # The payloads name the sentinel by a relative path, run from inside tmp_path: the text the
    # verifier sees is the same on every machine (an absolute temp path such as .../pytest-0/...
    # holds digits it would extract). The symbolic worker may have started earlier, in another
    # folder: that folder is checked too.
    before = os.getcwd()
    monkeypatch.chdir(tmp_path)
    sentinel = "pwned"
    for payload in [f"__import__('os').system('touch {sentinel}')", f"open('{sentinel}', 'w')",
                    f"\\boxed{{exec(\"open('{sentinel}', 'w')\")}}",
                    f"x = eval(\"open('{sentinel}','w')\")"]:
        assert not any(c.isdigit() for c in payload)
        assert not verify.grade(payload, "0") and not verify.is_equivalent(payload, "x")
    assert not (tmp_path / sentinel).exists() and not os.path.exists(os.path.join(before, sentinel))


@pytest.fixture
def warm_worker():
    """The first symbolic comparison boots the worker (python + sympy import, seconds on a loaded
    machine): once, outside any timed call."""
    assert verify.is_equivalent("x + 1", "1 + x")


@pytest.mark.parametrize("bomb",
                         ["1e999999", "9^{9^{9^{9}}}", "10^{10^{10}}", "(10^{100})!", "x^{10^{9}}",
                          "9" * 100_000, "{" * 10_000 + "1" + "}" * 10_000, "\\sqrt{" * 3_000,
                          "\\binom{10^{9}}{10^{5}}", "2^{2^{2^{2^{2^{2}}}}}"])
def test_bombs_are_rejected_fast(bomb, warm_worker):
    verify.reset_stats()
    start = time.monotonic()
    assert not verify.grade(bomb, "1") and not verify.grade(f"\\boxed{{{bomb}}}", "x + 1")
    assert time.monotonic() - start < 2.0
    assert (verify.stats()["unparseable"] + verify.stats()["timeout"] == 2
            and verify.stats()["error"] == 0)


def test_fast_path_needs_neither_sympy_nor_the_worker_and_import_is_light():
    code = ("import sys, time; t = time.perf_counter(); import verify, mathcheck; "
            "dt = time.perf_counter() - t\n"
            "ok = [verify.grade(a, b) for a, b in [('-164', '-164'), ('40', '41'), "
            "('The answer is 7.', '7'),"
            " ('\\\\boxed{\\\\frac{1}{2}}', '0.5'), ('x = 3', '3'), ('(1, 2)', '(1,2)'), "
            "('[0,1)', '[0,1]')]]\n"
            "print(ok, dt, 'sympy' in sys.modules, 'torch' in sys.modules, "
            "mathcheck.POOL.active is None)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout
    ok, dt, sympy_loaded, torch_loaded, no_worker = out.rsplit(" ", 4)[0], *out.split()[-4:]
    assert ok == "[True, False, True, True, True, True, False]"
    assert float(dt) < 0.5 and sympy_loaded == torch_loaded == "False" and no_worker == "True"


# ---- the symbolic worker -------------------------------------------------------------------------

def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:                       # a zombie is dead too
        return f.read().split()[2] != "Z"


def test_worker_timeout_kills_and_replaces(monkeypatch, warm_worker):
    stuck = mathcheck.POOL.active.proc.pid
    verify.reset_stats()
    monkeypatch.setattr(verify, "SYMBOLIC_TIMEOUT_S", 1e-4)  # no symbolic comparison fits in 0.1 ms
    start = time.monotonic()
    assert not verify.grade("(y+2)^2", "y^2+4y+4")
    assert time.monotonic() - start < 1.0 and verify.stats()["timeout"] == 1
    # what train.py logs as verify/worker_restarts
    assert verify.stats()["worker_restarts"] == 1
    assert not _alive(stuck)
    # the pre-started spare (booting since the warm-up)
    assert mathcheck.POOL.spare.wait_ready(60)
    monkeypatch.setattr(verify, "SYMBOLIC_TIMEOUT_S", 1.0)
    assert verify.is_equivalent("(z+3)^2", "z^2+6z+9")        # the spare took over
    assert mathcheck.POOL.active.proc.pid != stuck


def test_worker_serves_other_threads():
    results = []
    threads = [threading.Thread(target=lambda k=k: results.append(
                   verify.is_equivalent(f"(a+{k})^2", f"a^2+{2 * k}a+{k * k}")))
               for k in range(1, 4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [True, True, True]


def test_workers_exit_with_the_process():
    code = ("import mathcheck, verify; verify.is_equivalent('x+1', '1+x');"
            "print(mathcheck.POOL.active.proc.pid, mathcheck.POOL.spare.proc.pid)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout
    pids = [int(p) for p in out.split()]
    deadline = time.monotonic() + 10
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(_alive(p) for p in pids)


# ---- API -----------------------------------------------------------------------------------------

def test_reward_grade_batch_and_stats():
    verify.reset_stats()
    assert verify.reward("\\boxed{11}", "11") == 1.0 and verify.reward("12", "11") == 0.0
    assert verify.grade_batch(["-164", "40", "no idea", "\\frac{"],
                              ["-164", "41", "3", "2"]) == [True, False, False, False]
    assert verify.grade(7, "7") is False and verify.grade("7", 7) is True
    s = verify.stats()
    # "no idea", "\\frac{", response 7
    assert s["graded"] == 8 and s["unparseable"] == 3 and s["error"] == 0
    with pytest.raises(ValueError):
        verify.grade_batch(["1"], ["1", "2"])


def test_module_runs_as_a_script():
    out = subprocess.run([sys.executable, "verify.py"], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout
    assert "'-164'" in out and "-> True" in out and "-> False" in out and "stats:" in out
    assert max(map(len, out.splitlines())) <= 100
