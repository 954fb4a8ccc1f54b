"""Answer verification for RLVR on math: pull the final answer out of untrusted model text, decide whether it is the
gold answer, and turn that into the reward. Nothing in model text is ever executed; every step is bounded.

    python verify.py                                   # grades a few examples
    grade(response, gold) -> bool       reward(response, gold) -> float (1.0 / 0.0)       grade_batch(responses, golds)
    extract_answer(text) -> str | None  is_equivalent(pred, gold) -> bool                stats() -> dict (STATS)

Extraction (issue 4): the text after the last `</think>`; "final answer is X. I hope it is correct" (the Minerva
format); the last `\\boxed{}`/`\\fbox{}` (nested braces), joined with the boxes just before it when only a short
connective separates them ("\\boxed{1} and \\boxed{2}"); `#### N`; "answer is / answer: / réponse : / 答案：" then the
first value after it; the whole text when it reads as maths; else the rightmost maths span or number, sign kept
("3-5=-2" -> "-2"). A predicted chain that ends in a value is reduced to it ("x = 5" -> "5").
Normalisation: $, \\(, \\[, \\left/\\right, spacing commands, \\dfrac/\\tfrac, \\frac12, ^\\circ, \\%, \\$, \\text{} units,
thousands separators, "x \\in", doubled backslashes of JSON-escaped text.
Equivalence, cheapest first: the same string; plain numbers as exact fractions; then the module's own tokenizer and
recursive-descent parser builds an AST (tuples) that is evaluated exactly with fractions when it is rational, probed
at two points with floats (which may only reject), and otherwise rebuilt as sympy objects in a worker process.
Numbers are equal when exact (always so for two integers), within REL_TOL = 1e-9 (relative), or when a prediction
with d >= 2 decimals is the correct rounding of a gold that has no d-digit decimal form (0.33 for 1/3, 2.6667 for 8/3,
3.1416 for pi). Expressions: three random points, then sympy.simplify. Structures: tuples and ratios ordered; sets and bare lists order-insensitive (repeats
dropped); intervals (a 2-tuple is an open interval), unions, matrices, "a <= x < b" as an interval; `\\pm` as the set
of both signs; equations equal up to a non-zero factor, inequalities up to a positive one; text case-insensitively;
the letter A-E when the gold is a choice letter.

Bounds: a response over MAX_RESPONSE_CHARS is read from its tail; an extracted answer over MAX_ANSWER_CHARS, nesting
over MAX_DEPTH, tokens over MAX_TOKENS, a number or integer power over MAX_DIGITS digits, an exponent over
MAX_SYMBOLIC_EXPONENT on an unknown: all grade False (counted `unparseable`) before sympy sees them. Each symbolic
comparison runs in a worker process, started on first need, which the caller kills after SYMBOLIC_TIMEOUT_S (counted
`timeout`); a pre-started spare takes over. No signal.alarm, so it works from any thread. Nothing raises: an internal
error on odd input grades False and is counted (`error`), for the trainer to log and the fuzz test to keep at 0.

Departures from the public checkers (Math-Verify, lighteval, hendrycks/math, NeMo-Skills, dart-math, TRL, verl), why:
- No eval/exec/sympify/parse_expr/latex2sympy on model text (each of them parses with one of those), so our parser
  knows fewer LaTeX constructs: no integrals or limits (they grade False, or drop out as the left side of "... = v").
- The time limit kills a worker process instead of signal.alarm (Math-Verify), which fails off the main thread.
- Always falls back to the rightmost number (Math-Verify's latex-only configs do not); no </think> is required (TRL's
  reasoning reward gives 0 without one): the reward must not depend on a format the task did not ask for.
- A trailing % is dropped (hendrycks, NeMo: "10%" == "10"); no x100 rescaling (dart-math: 0.0304 == 3.04).
- Tolerance 1e-9 relative and integers exact (a tolerance like 1e-6 would make 11111111101 equal 11111111100);
  rounding is accepted only to the prediction's own stated decimals, as above.
- Bare lists compare as sets (hendrycks compares strings: "4, 10" != "10, 4"); tuples stay ordered (dart-math
  treats (2,1) and (1,2) as equal, wrong for points).
- A prediction's chain "a = b = c" reduces to its last side; a gold equation stays an equation ("0" is not
  "a + 3z = 0"); "name = value" reduces on either side ("k = 1/3" == "1/3").
- Runs of 3+ letters are words, not products of symbols ("dog" != "god"; "AZYUK2A" is not 2).
- Units are dropped, not converted ("15 cm^2" == "15"), as Math-Verify does.
This file is longer than the project's ~400-line guide: extraction, the parser, three evaluators and the worker are
one module because the issue's interface is one module (verify.py); the sections below split cleanly if needed.
The cases where we disagree with the checkers' own test tables are listed, each with its reason, in
verify_known_failures.py.
"""
import atexit
import bisect
import cmath
import functools
import json
import math
import os
import re
import select
import subprocess
import sys
import threading
import time
from fractions import Fraction

MAX_RESPONSE_CHARS = 200_000   # only the tail of a longer response is read (the final answer is at the end)
MAX_ANSWER_CHARS = 10_000      # a longer extracted answer is rejected
MAX_TOKENS = 2_000             # per parsed answer
MAX_DEPTH = 40                 # bracket nesting and parser recursion
MAX_DIGITS = 1_000             # digits of a number literal, or estimated digits of a power / factorial / product
MAX_SYMBOLIC_EXPONENT = 1_000  # |n| in x^n when x has unknowns (an expansion would blow up)
MAX_ITEMS = 64                 # elements of a list / set / tuple, rows of a matrix, joined boxes
REL_TOL = 1e-9                 # numeric equality: |a - b| <= REL_TOL * max(|a|, |b|) (two integers: exact)
SYMBOLIC_TIMEOUT_S = 1.0       # wall time of one symbolic comparison in the worker
WORKER_BOOT_TIMEOUT_S = 60.0   # python + sympy import of the first worker (a one-off, outside any comparison)

STATS = {"graded": 0, "unparseable": 0, "timeout": 0, "symbolic": 0, "error": 0}
_STATS_LOCK = threading.Lock()


def stats() -> dict:
    """A copy of the counters: pairs graded; those False because unparseable, timed out, or because of an internal
    error (a bug: counted and logged by the trainer rather than raised mid-run; the fuzz test keeps it at 0); and how
    many comparisons went to the symbolic worker."""
    with _STATS_LOCK:
        return dict(STATS)


def reset_stats() -> None:
    with _STATS_LOCK:
        STATS.update(dict.fromkeys(STATS, 0))


def _count(key: str) -> None:
    with _STATS_LOCK:
        STATS[key] += 1


class ParseError(ValueError):
    """Text this parser cannot read, or that exceeds a bound."""


class NeedSymbolic(Exception):
    """An evaluator met something only sympy can decide."""


# ---- extraction ----------------------------------------------------------------------------------------------------

_PLAIN_NUMBER = re.compile(r"\s*[-+]?(?:\d+(?:\.\d*)?|\.\d+)\s*")
_HOPE = re.compile(r"(?i)final answer is")
_ANCHOR = re.compile(r"(?i)(?:final\s+answer|answer|r[ée]ponse|答案)\s*(?:\*\*\s*)?(?:is|est|:|：|=)")
_HASHES = re.compile(r"####[ \t]*([^\n]+)")
_PHRASE_END = re.compile(r"\n|I hope|\.\s|\.$|。|\$\.\s")
_NUMBER = re.compile(r"(?<![A-Za-z0-9_\\)\]}.])(?:-(?=\.?\d))?(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:[.,]\d+)?(?:/\d+)?"
                     r"(?: ?(?:%|\\%|percent))?|\\[dt]?frac\{-?\d+\}\{\d+\}")
_PROSE_WORD = re.compile(r"(?<![\\A-Za-z])(?=[A-Za-z]*[a-z])[A-Za-z]{2,}|[^\x00-\x7f\W\d_]")   # not "AB", "CD"
_TEXT_CMD = re.compile(r"\\(?:text\w*|mbox|math(?:rm|bf|it)|operatorname)\s*\{[^{}]*\}|\\(?:begin|end)\s*\{\w+\*?\}")
_CONNECTIVE = re.compile(r"(?<![A-Za-z\\])(?:and|or)(?![a-z])")
_MATH_WORDS = {"pi", "sin", "cos", "tan", "sec", "csc", "cot", "log", "ln", "exp", "sqrt", "frac", "inf", "infty",
               "arcsin", "arccos", "arctan", "sinh", "cosh", "tanh", "mod", "pct", "percent", "percentage",
               "cm", "mm", "km", "kg", "mg", "ml", "ft", "hr", "hrs", "min", "sec", "deg", "unit", "units", "sq", "mph"}
_DELIMS = (("$$", "$$"), ("\\[", "\\]"), ("\\(", "\\)"), ("$", "$"))


def _boxes(text: str) -> list[tuple[int, int, str]]:
    """(start, end, content) of the last \\boxed/\\fbox and of the boxes joined to it, right to left."""
    out, pos = [], len(text)
    while len(out) < MAX_ITEMS:
        i = max(text.rfind("\\boxed", 0, pos), text.rfind("\\fbox", 0, pos))
        if i < 0:
            break
        j = i + (6 if text.startswith("\\boxed", i) else 5)
        while j < len(text) and text[j] in " \t":
            j += 1
        stop = out[-1][0] if out else min(len(text), j + MAX_ANSWER_CHARS + 2)   # a joined box ends before the next
        if j < len(text) and text[j] == "{":
            depth, k = 0, j
            while k < stop:
                depth += (text[k] == "{") - (text[k] == "}")
                if depth == 0:
                    break
                k += 1
            if depth and out:
                break
            content = text[j + 1:k] if not depth else text[j + 1:]          # unclosed last box: the rest
        else:
            m = re.match(r"[^\s$]+", text[j:j + 100])                        # "\\boxed 5"
            if not m:
                break
            content, k = m.group(), j + m.end() - 1
        if out and not _joins(text[k + 1:out[-1][0]]):
            break
        if not out or content.strip() != out[-1][2].strip():                  # the same box twice counts once
            out.append((i, k, content))
        pos = i
    return out


def _joins(gap: str) -> bool:
    """Boxes are one answer when a short connective separates them ("\\boxed{1}, \\boxed{2}", "\\boxed{1} \\quad
    \\text{and} \\quad \\boxed{2}", "\\boxed{1} papers and \\boxed{2} bins"), not a sentence ("\\boxed{1} no no no no
    no \\boxed{2}"). Math-Verify joins gaps under 10 characters, or under 70 with a separator; we also cap the words."""
    if len(gap) < 10:
        return True
    words = re.findall(r"(?<![\\A-Za-z])[A-Za-z]{2,}|\d+", gap)
    return len(gap) < 70 and len(words) <= 4 and bool(_CONNECTIVE.search(gap) or "," in gap or ";" in gap)


def _math_spans(text: str) -> list[tuple[int, int, str]]:
    """(start, end, body) of the $$..$$, \\[..\\], \\(..\\) and one-line $..$ spans, left to right, in linear time
    (the next position of each delimiter is cached, so no region is rescanned)."""
    def find(s, start):
        k = text.find(s, start)
        while k > 0 and s[0] == "$" and text[k - 1] == "\\":                 # \\$ is a dollar sign
            k = text.find(s, k + 1)
        return k

    out, i, nxt = [], 0, {}
    while True:
        for op, _ in _DELIMS:
            if op not in nxt or -1 < nxt[op] < i:                           # -1: no such opener left
                nxt[op] = find(op, i)
        live = [(nxt[op], -len(op), op, cl) for op, cl in _DELIMS if nxt[op] >= 0]
        if not live:
            return out
        k, _, op, cl = min(live)
        e = find(cl, k + len(op))
        if e < 0 or (op == "$" and "\n" in text[k:e]):                      # inline maths is one line
            if e < 0:
                nxt[op] = -1
            i = k + len(op)
            continue
        out.append((k, e + len(cl), text[k + len(op):e]))
        i = e + len(cl)


def _prose_count(text: str) -> int:
    """Words of prose in the text, counted up to 2 (callers only tell none, one and a sentence apart)."""
    text = _CONNECTIVE.sub(" ", _TEXT_CMD.sub(" ", text))
    count = 0
    for m in _PROSE_WORD.finditer(text):
        count += m.group().lower() not in _MATH_WORDS
        if count == 2:
            break
    return count


def _candidates(text: str) -> list[tuple[int, str]]:
    """(end position, answer) of every maths span, and of every number outside them."""
    spans = _math_spans(text)
    out = [(end, body) for _, end, body in spans if body.strip()]
    starts = [s for s, _, _ in spans]
    for m in _NUMBER.finditer(text):
        k = bisect.bisect_right(starts, m.start()) - 1
        if k < 0 or m.start() >= spans[k][1]:
            out.append((m.end(), m.group()))
    return sorted(out)


def _math_of(text: str, first: bool = False, keep_text: bool = False) -> str | None:
    """The answer a phrase or text holds: itself if it reads as maths, else its rightmost (first) candidate, looked
    into again when that is a prose span. Without any candidate: a word or two is a text answer ("Evelyn", "white"),
    a sentence is no answer (None), unless keep_text: a gold is an answer by definition, whole unless it reads as a
    solution ("(D) Alina", "125 miles", "np.arcsin(10/13)")."""
    text = text.strip()
    if not text:
        return None
    prose = _prose_count(text)
    if prose == 0 or (keep_text and prose == 1):
        return text
    found = _candidates(text)
    if not found:
        return text if prose < 2 or keep_text else None
    body = found[0 if first else -1][1]
    return body if _prose_count(body) < 2 else (_math_of(body) or body)   # one word may be a mangled \\text


def _anchored(text: str) -> str | None:
    """The value after the last "#### " or "answer is / answer: / réponse : / 答案：", up to the end of its sentence."""
    m = None
    for m in _HASHES.finditer(text):
        pass
    if m is not None:
        return m.group(1).strip()
    for m in _ANCHOR.finditer(text):
        pass
    if m is None:
        return None
    tail = text[m.end():].lstrip(" \t\n*:：")
    if tail[:19].lower() == "the final answer is":
        tail = tail[19:].lstrip(" \t\n*:：")
    stop = _PHRASE_END.search(tail)
    phrase = (tail[:stop.start() + (stop.group()[0] == "$")] if stop else tail).strip(" *")
    if not phrase:
        return None
    parts = re.split(r"\s(?:is|est|are|was|equals)\s", phrase)           # "The volume of $V$ is 120"
    if len(parts) > 1 and _prose_count(phrase):
        phrase = parts[-1]
    return _math_of(phrase, first=True)


def _extract(text: str, final_value: bool) -> str | None:
    if not isinstance(text, str) or not text.strip():
        return None
    if _PLAIN_NUMBER.fullmatch(text):                                    # the fast path: "-164", " 40\n"
        return text.strip()
    text = text[-MAX_RESPONSE_CHARS:]
    text = text[text.rfind("</think>") + len("</think>"):] if "</think>" in text else text
    hope = None
    for hope in _HOPE.finditer(text):
        pass
    end = text.find("I hope", hope.end(), hope.end() + 300) if hope else -1
    if end >= 0:
        answer = _math_of(text[hope.end():end].strip(" \t\n:").rstrip(". "), first=True)
    elif boxes := _boxes(text):
        answer = ", ".join(c.strip() for _, _, c in reversed(boxes))
    else:
        answer = _anchored(text) or _math_of(text, keep_text=not final_value)
    if answer is None or len(answer) > MAX_ANSWER_CHARS:
        return None
    answer = answer.strip().rstrip(".").strip()
    spans = _math_spans(answer)
    if len(spans) == 1 and spans[0][0] == 0 and spans[0][1] == len(answer):   # "$\\frac{3}{4}$" -> "\\frac{3}{4}"
        answer = spans[0][2].strip()
    return _final_value(answer) if final_value else answer


def extract_answer(text: str) -> str | None:
    """The final answer a response states (a string, LaTeX kept), or None. A chain ending in a value is reduced to
    that value ("x = 5" -> "5", "3-5=-2" -> "-2"); an equation between unknowns is kept ("y = 2x + 1")."""
    try:
        return _extract(text, final_value=True)
    except Exception:                                         # a bug, never the caller's problem: counted
        _count("error")
        return None


# ---- normalisation -------------------------------------------------------------------------------------------------

_REPLACE = [(re.compile(p), lambda m, r=r: r) for p, r in [      # (pattern, literal replacement), in order
    (r"\\\$|\$|\\[\[\]()]", " "), (r'\\?"', ""),
    (r"\\(?:left|right|[bB]igg?[lr]?)\s*(?:\.|(?=[()\[\]|]|\\[{}|]))", ""),
    (r"\\(?:left|right)\s*\\[lr]?vert|\\[lr]?vert(?![A-Za-z])|\\mid(?![A-Za-z])", "|"),
    (r"\\(?:displaystyle|textstyle|limits|nonumber|noindent)(?![A-Za-z])", " "), (r"(?<!\\)\\! ?", ""),
    (r"(?<!\\)\\(?:q?quad|[,;: ])", " "), (r"~", " "), (r" ?\{ ?, ?\}", ","),
    (r"\\[dtc]frac", "\\frac"), (r"\\[dt]binom", "\\binom"),
    (r"\\(?:textnormal|textbf|textit|textrm|mbox|mathrm|mathbf|mathit|boldsymbol|operatorname) ?\{", "\\text{"),
    (r"\^ ?\{ ?\\circ ?\}|\^ ?\\circ|\\circ|°|\\degree", ""), (r"\^ ?\{ ?\\prime ?\}|\^ ?\\prime|\\prime", "'"),
    (r"\\%|\\text\{ ?(?:percent|percentage|pct) ?\}|(?<![A-Za-z])(?:percentage|percent|pct)(?![A-Za-z])", "%"),
    (r",? ?\\text\{ ?(?:and|or) ?\}", " ; "), (r"(?<![A-Za-z\\])(?:, ?)?(?:and|or)(?![a-z])", " ; "),
    (r"(?:\\in(?![A-Za-z])|∈) ?", " \\in "),
    (r"[−–]", "-"), (r"×|·", "*"), (r"÷", "/"), (r"≤", "<="), (r"≥", ">="), (r"≠", "!="), (r"≈", "\\approx "),
    (r"π", "\\pi "), (r"∞", "\\infty "), (r"±", "\\pm "), (r"√", "\\sqrt"),
]]
_UNIT_TEXT = re.compile(r"(?<=[\d}).]) ?\\text\{[^{}]*\}(?: ?\^ ?\{?\d\}?)? ?$")   # "15\\text{ cm}^2"
_UNIT_WORD = re.compile(r"[A-Za-z]{2,}\.?(?:\^\{?\d\}?)?")


def _strip_units(s: str) -> str:
    """Drop unit text after a value: "\\frac{1}{3} \\text{meters}", "35 cm", "0.06 yuan" (not "\\text{Evelyn}")."""
    for _ in range(3):
        s = _UNIT_TEXT.sub("", s).strip()
    words = s.split(" ")
    k = len(words)
    while k > 1 and _UNIT_WORD.fullmatch(words[k - 1]) and words[k - 1] not in ("and", "or"):
        k -= 1
    if k < len(words) and re.fullmatch(r"[^A-Za-z]*[\d)}]", " ".join(words[:k])):
        s = " ".join(words[:k])
    return s


@functools.lru_cache(maxsize=4096)                       # golds repeat over a group's rollouts
def normalize(s: str) -> str:
    """Canonical text of an extracted answer (LaTeX in, plainer LaTeX out). ParseError when it is too long."""
    if len(s) > MAX_ANSWER_CHARS:
        raise ParseError("answer too long")
    if "\\boxed" in s or "\\fbox" in s:
        s = ", ".join(c for _, _, c in reversed(_boxes(s))) or s
    s = " ".join(re.sub(r"[\x00-\x1f\x7f]", " ", s).split())             # control characters are spaces
    if "matrix" not in s and "array" not in s:
        s = re.sub(r"\\\\(?=[A-Za-z])", r"\\", s)                          # JSON-escaped: "\\\\frac" -> "\\frac"
    for pattern, replacement in _REPLACE:
        s = pattern.sub(replacement, s)
    s = _strip_units(" ".join(s.split()))
    s = re.sub(r"\\text\{([^{}]*)\}", r"\1", s)
    s = re.sub(r"^[A-Za-z](?:_\{?\w+\}?)? ?\\in ", "", s)                 # "x \\in [0, 1)"
    return " ".join(s.split()).rstrip(" \\.;").lstrip(" ;")


def _readings(s: str) -> list[str]:
    """A normalised answer and the other readings of its commas and spaces: "7,425,000" is a number, "x = 1,000"
    holds one, "1,22" is 1.22 (decimal comma) or the list 1, 22, "1 000" is 1000. Inside brackets a comma separates."""
    if re.fullmatch(r"-?[1-9]\d{0,2}(?:[, ]\d{3})+(?:\.\d+)?", s) and not re.search(r", | ,", s):
        return [s.replace(",", "").replace(" ", "")]
    out = []
    if not re.search(r"[()\[\]{}]", s):
        t = re.sub(r"(?<![\d.,])[1-9]\d{0,2}(?:,\d{3})+(?![\d,])", lambda m: m.group().replace(",", ""), s)
        out += [t] if t != s else []
    if re.fullmatch(r"-?\d+,\d+", s):
        out.append(s.replace(",", "."))
    return out + [s]


# ---- tokenizer and parser: text becomes tuples, nothing is evaluated --------------------------------------------------

_TOKEN = re.compile(r"""
    (?P<env>\\(?:begin|end)\s*\{[A-Za-z]+\*?\})
  | (?P<num>(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+(?![A-Za-z(]))?)
  | (?P<cmd>\\[A-Za-z]+)
  | (?P<op><=|>=|!=|=<|=>|\\\\|\\[{}|%]|[-+*/^_=<>()\[\]{}|,;:!'&%])
  | (?P<word>[A-Za-z]+)
  | (?P<ws>\s+)""", re.X)
_RELOPS = {"=": "=", "<": "<", ">": ">", "<=": "<=", ">=": ">=", "=<": "<=", "=>": ">=", "!=": "!=", "\\le": "<=",
           "\\leq": "<=", "\\leqslant": "<=", "\\ge": ">=", "\\geq": ">=", "\\geqslant": ">=", "\\lt": "<",
           "\\gt": ">", "\\ne": "!=", "\\neq": "!=", "\\approx": "~"}
_FUNCS = {"sin", "cos", "tan", "sec", "csc", "cot", "arcsin", "arccos", "arctan", "sinh", "cosh", "tanh", "log", "ln",
          "lg", "exp"}
_GREEK = {"alpha", "beta", "gamma", "delta", "epsilon", "varepsilon", "zeta", "eta", "theta", "vartheta", "iota",
          "kappa", "lambda", "mu", "nu", "xi", "rho", "sigma", "tau", "upsilon", "phi", "varphi", "chi", "psi", "omega",
          "Gamma", "Delta", "Theta", "Lambda", "Xi", "Sigma", "Phi", "Psi", "Omega"}
_ATOM_CMDS = {"\\frac", "\\sqrt", "\\binom", "\\pi", "\\infty", "\\sum", "\\lfloor", "\\lceil"} | \
             {"\\" + name for name in _FUNCS | _GREEK}
_ONE, _TWO = ("n", Fraction(1), None), ("n", Fraction(2), None)


def _tokenize(s: str) -> list[tuple[str, str]]:
    tokens, pos = [], 0
    while pos < len(s):
        m = _TOKEN.match(s, pos)
        if not m:
            raise ParseError(f"unexpected character {s[pos]!r}")
        pos = m.end()
        if m.lastgroup == "ws":
            continue
        text = m.group().replace(" ", "") if m.lastgroup == "env" else m.group()
        if m.lastgroup == "num" and len(text) > MAX_DIGITS:
            raise ParseError("number too long")
        tokens.append((m.lastgroup, text))
        if len(tokens) > MAX_TOKENS:
            raise ParseError("too many tokens")
    return tokens


def _split_top(tokens: list, seps: set) -> list[list]:
    """Split a token list at the separators that are outside every bracket."""
    parts, cur, depth = [], [], 0
    for tok in tokens:
        t = tok[1]
        depth += t in ("(", "[", "{", "\\{") or t.startswith("\\begin")
        depth -= t in (")", "]", "}", "\\}") or t.startswith("\\end")
        if depth == 0 and t in seps:
            parts.append(cur)
            cur = []
        else:
            cur.append(tok)
    return parts + [cur]


class _Parser:
    """Recursive descent, loosest first: relation chain, \\cup, ratio (:), sum (+ - ±), term (* / and implicit
    product), unary minus, power (right-assoc), postfix (! ' % _), atom. Nodes are tuples:
    ("n", Fraction, decimals) ("s", name) ("c", pi|E|I|oo) ("+"|"*"|"^", a, b) ("/", 1, b) ("neg", a) ("pm", a, b)
    ("f", name, args) ("sum", var, lo, hi, body) ("mat", rows) ("base", digits, base) ("tuple"|"set"|"list"|"ratio"|
    "union", items) ("iv", lo, hi, closed_lo, closed_hi) ("rel", ops, exprs) ("text", s)."""

    def __init__(self, tokens: list):
        self.toks, self.i, self.depth, self.in_abs, self.closer = tokens, 0, 0, 0, None

    def peek(self) -> tuple[str, str]:
        return self.toks[self.i] if self.i < len(self.toks) else ("eof", "")

    def take(self) -> tuple[str, str]:
        tok = self.peek()
        self.i += 1
        return tok

    def expect(self, text: str) -> None:
        if self.take()[1] != text:
            raise ParseError(f"expected {text!r}")

    def nest(self, step: int) -> None:
        self.depth += step
        if self.depth > MAX_DEPTH:
            raise ParseError("nesting too deep")

    def item(self) -> tuple:
        node = self.relation()
        if self.peek()[0] != "eof":
            raise ParseError(f"unexpected {self.peek()[1]!r}")
        return node

    def relation(self) -> tuple:
        exprs, ops = [self.union()], []
        while self.peek()[1] in _RELOPS or self.peek()[1] == "\\in":
            op = self.take()[1]
            if op == "\\in":                                  # "x \\in S" is S
                return self.relation()
            ops.append(_RELOPS[op])
            exprs.append(self.union())
        return ("rel", tuple(ops), tuple(exprs)) if ops else exprs[0]

    def union(self) -> tuple:
        return self.chain(self.ratio, "\\cup", "union")

    def ratio(self) -> tuple:
        return self.chain(self.sum, ":", "ratio")

    def chain(self, parse_part, sep: str, kind: str) -> tuple:
        parts = [parse_part()]
        while self.peek()[1] == sep:
            self.take()
            parts.append(parse_part())
        return (kind, tuple(parts)) if len(parts) > 1 else parts[0]

    def sum(self) -> tuple:
        node = self.term()
        while self.peek()[1] in ("+", "-", "\\pm", "\\mp"):
            op = self.take()[1]
            rhs = self.term()
            node = ("+", node, rhs) if op == "+" else ("+", node, ("neg", rhs)) if op == "-" else ("pm", node, rhs)
        return node

    def starts_atom(self) -> bool:
        kind, text = self.peek()
        return (kind in ("num", "word") or text in ("(", "\\{") or text in _ATOM_CMDS or text.startswith("\\begin")
                or (text == "|" and not self.in_abs))

    def term(self) -> tuple:
        node = self.unary()
        while True:
            text = self.peek()[1]
            if text in ("*", "/", "\\cdot", "\\times", "\\div"):
                self.take()
                rhs = self.unary()
                node = ("*", node, ("/", _ONE, rhs) if text in ("/", "\\div") else rhs)
            elif self.starts_atom():
                if self.peek()[0] == "num" and node[0] == "n":
                    raise ParseError("two numbers in a row")
                rhs = self.unary()
                proper = _fraction_literal(rhs) if text == "\\frac" and _is_integer(node) else None
                mixed = proper is not None and 0 < proper[0] < proper[1]
                node = ("+" if mixed else "*", node, rhs)     # 15\\frac{39}{40} is a mixed number
            else:
                return node

    def unary(self) -> tuple:
        self.nest(1)
        text = self.peek()[1]
        if text in ("-", "+", "\\pm", "\\mp"):
            self.take()
            inner = self.unary()
            node = inner if text == "+" else ("neg", inner) if text == "-" else ("pm", ("n", Fraction(0), None), inner)
        else:
            node = self.postfix(self.atom())
            if self.peek()[1] == "^":
                self.take()
                node = ("^", node, self.exponent())
        self.nest(-1)
        return node

    def exponent(self) -> tuple:
        self.nest(1)
        text = self.peek()[1]
        if text in ("-", "+"):
            self.take()
            node = self.exponent()
            node = ("neg", node) if text == "-" else node
        else:
            node = self.postfix(self.group() if text == "{" else self.atom())
            if self.peek()[1] == "^":
                self.take()
                node = ("^", node, self.exponent())
        self.nest(-1)
        return node

    def postfix(self, node: tuple) -> tuple:
        while True:
            text = self.peek()[1]
            if text == "!":
                self.take()
                node = ("f", "factorial", (node,))
            elif text in ("%", "\\%"):
                self.take()                                   # a percent sign is dropped (hendrycks, NeMo)
            elif text == "'" and node[0] == "s":
                self.take()
                node = ("s", node[1] + "'")
            elif text == "_" and node[0] in ("s", "n"):
                self.take()
                sub = self.raw_group()
                if node[0] == "s":
                    node = ("s", f"{node[1]}_{sub}")          # a subscript is part of a name: a_{37}, F_{n-k-1}
                elif sub.isdigit() and _is_integer(node):
                    node = ("base", str(node[1]), sub)        # a numeral in base n, kept as written: 204_5
                else:
                    raise ParseError("bad subscript")
            else:
                return node

    def raw_group(self) -> str:
        if self.peek()[1] != "{":
            return self.take()[1]
        depth, out = 0, []
        while True:
            kind, text = self.take()
            if kind == "eof":
                raise ParseError("unclosed subscript")
            depth += (text == "{") - (text == "}")
            out.append(text)
            if depth == 0:
                return "".join(out[1:-1])

    def group(self) -> tuple:
        """{...}: a group, or a set when it holds a top-level comma ("{1, 3}")."""
        self.expect("{")
        items = self.items("}")
        return items[0] if len(items) == 1 else ("set", tuple(items))

    def items(self, *closers: str) -> list:
        self.nest(1)
        out = []
        while True:
            out.append(self.relation())
            if len(out) > MAX_ITEMS:
                raise ParseError("too many items")
            sep = self.take()[1]
            if sep in closers:
                self.closer = sep
                self.nest(-1)
                return out
            if sep not in (",", ";"):
                raise ParseError(f"unexpected {sep!r} in brackets")

    def arg(self) -> tuple:
        """A macro argument: {group}, one digit of a number (\\frac12), or one atom."""
        kind, text = self.peek()
        if text == "{":
            return self.group()
        if kind == "num" and len(text) > 1 and text.isdigit():
            self.toks[self.i] = ("num", text[1:])
            return ("n", Fraction(int(text[0])), None)
        return self.atom()

    def atom(self) -> tuple:
        self.nest(1)
        kind, text = self.take()
        if kind == "num":
            node = _num(text)
        elif kind == "word":
            node = self.word(text)
        elif text in ("(", "["):
            items = self.items(")", "]")
            pair = (text, self.closer)
            if len(items) == 1 and pair in (("(", ")"), ("[", "]")):
                node = items[0]                               # grouping brackets
            elif len(items) == 2 and pair != ("(", ")"):
                node = ("iv", items[0], items[1], text == "[", self.closer == "]")
            elif len(items) > 1:
                node = ("tuple", tuple(items))
            else:
                raise ParseError("half-open bracket around one item")
        elif text == "{":
            self.i -= 1
            node = self.group()
        elif text == "\\{":
            node = ("set", tuple(self.items("\\}")))
        elif text == "|":
            self.in_abs += 1
            inner = self.sum()
            self.in_abs -= 1
            self.expect("|")
            node = ("f", "abs", (inner,))
        elif kind == "cmd":
            node = self.command(text[1:])
        elif kind == "env" and text.startswith("\\begin"):
            node = self.matrix(text[len("\\begin{"):-1].rstrip("*"))
        else:
            raise ParseError(f"unexpected {text!r}")
        self.nest(-1)
        return node

    def word(self, text: str) -> tuple:
        if text in _FUNCS or text == "sqrt":
            return self.command(text)
        if text in ("pi", "inf", "infty", "oo"):
            return ("c", "pi" if text == "pi" else "oo")
        if len(text) > 2:                                     # a word is text, not a product of its letters
            raise ParseError(f"word {text!r}")
        if len(text) == 2:                                    # "xy" is x*y
            self.toks.insert(self.i, ("word", text[1]))
        return {"e": ("c", "E"), "i": ("c", "I")}.get(text[0], ("s", text[0]))

    def command(self, name: str) -> tuple:
        if name == "frac":
            num = self.arg()
            return ("*", num, ("/", _ONE, self.arg()))
        if name == "sqrt":
            index = _TWO
            if self.peek()[1] == "[":
                self.take()
                index = self.sum()
                self.expect("]")
            return ("f", "sqrt", (self.arg(), index))
        if name == "binom":
            return ("f", "binom", (self.arg(), self.arg()))
        if name in ("pi", "infty"):
            return ("c", "pi" if name == "pi" else "oo")
        if name in _GREEK:
            return ("s", name)
        if name in _FUNCS:
            return self.function(name)
        if name == "sum":
            return self.summation()
        if name in ("lfloor", "lceil"):
            inner = self.sum()
            self.expect("\\r" + name[1:])
            return ("f", name[1:], (inner,))
        raise ParseError(f"unsupported \\{name}")

    def function(self, name: str) -> tuple:
        base = power = None
        for _ in range(2):                                    # \\log_2, \\sin^2, in either order
            if self.peek()[1] == "_" and base is None:
                self.take()
                base = self.arg()
            elif self.peek()[1] == "^" and power is None:
                self.take()
                power = self.exponent()
        if self.peek()[1] in ("(", "{"):
            arg = self.group() if self.peek()[1] == "{" else self.atom()
        else:                                                 # "\\sin 2x", "\\sin b \\cos a"
            arg = self.postfix(self.atom())
            while self.peek()[0] in ("num", "word") and self.peek()[1] not in _FUNCS:
                arg = ("*", arg, self.postfix(self.atom()))
        node = ("f", name, (arg,) + ((base,) if base is not None else ()))
        return ("^", node, power) if power is not None else node

    def summation(self) -> tuple:
        self.expect("_")
        self.expect("{")
        var = self.take()
        if var[0] != "word" or len(var[1]) != 1:
            raise ParseError("bad summation index")
        self.expect("=")
        lo = self.sum()
        self.expect("}")
        self.expect("^")
        return ("sum", var[1], lo, self.arg(), self.term())

    def matrix(self, env: str) -> tuple:
        if env == "array" and self.peek()[1] == "{":          # the column spec {cc}
            self.raw_group()
        rows, row = [], []
        while True:
            kind, text = self.peek()
            row.append(None if text in ("&", "\\\\") or kind in ("env", "eof") else self.sum())
            kind, text = self.take()
            if text == "&":
                continue
            if any(c is not None for c in row):
                if None in row:
                    raise ParseError("empty matrix cell")
                rows.append(tuple(row))
            row = []
            if len(rows) > MAX_ITEMS:
                raise ParseError("matrix too large")
            if kind == "env" and text == f"\\end{{{env}}}" and rows and len({len(r) for r in rows}) == 1:
                return ("f", "det", (("mat", tuple(rows)),)) if env == "vmatrix" else ("mat", tuple(rows))
            if text != "\\\\":
                raise ParseError("bad matrix")


def _num(text: str) -> tuple:
    mantissa, _, exp = text.lower().partition("e")
    whole, dot, frac = mantissa.partition(".")
    shift = int(exp or 0) - len(frac)
    if abs(shift) > MAX_DIGITS:
        raise ParseError("exponent too large")
    digits = int(whole + frac or "0")
    value = Fraction(digits * 10 ** shift) if shift >= 0 else Fraction(digits, 10 ** -shift)
    return ("n", value, len(frac) if dot and not exp else None)


def _is_integer(node: tuple) -> bool:
    return node[0] == "n" and node[2] is None and node[1].denominator == 1


def _fraction_literal(node: tuple) -> tuple[int, int] | None:
    """(a, b) of a parsed \\frac{a}{b} with integer literals a and b, else None."""
    if node[0] == "*" and node[2][0] == "/" and _is_integer(node[1]) and _is_integer(node[2][2]):
        return int(node[1][1]), int(node[2][2][1])
    return None


def _is_name(node: tuple) -> bool:
    """A left side that only names the answer: x, f(x), |AB|, (p, q), V_1:V_2, \\frac{NO}{BO}; no numbers, no sums."""
    kind = node[0]
    if kind == "s":
        return True
    if kind == "n":
        return node == _ONE                                   # the 1 of a parsed "/"
    if kind in ("*", "/"):
        return all(_is_name(x) for x in node[1:]) and any(x != _ONE for x in node[1:])
    if kind in ("tuple", "ratio"):
        return all(_is_name(x) for x in node[1])
    return kind == "f" and node[1] == "abs" and _is_name(node[2][0])


def _has_unknowns(node) -> bool:
    if not isinstance(node, tuple) or not node:
        return False
    return node[0] in ("s", "sum") or any(_has_unknowns(x) for x in node[1:])


def parse(s: str) -> tuple:
    """The AST of one normalised answer. A top-level ',' or ';' makes a bare list; groups of assignments separated
    by ';' or 'and' ("p=5, q=2; p=7, q=2") make a list of tuples of their values."""
    depth = peak = 0
    for ch in s:                                              # reject deep nesting before any recursion
        depth += (ch in "([{") - (ch in ")]}")
        peak = max(peak, depth)
    if peak > MAX_DEPTH:
        raise ParseError("nesting too deep")
    tokens = _tokenize(s)
    if not tokens:
        raise ParseError("empty answer")
    groups = [[p for p in _split_top(g, {","}) if p] for g in _split_top(tokens, {";"}) if g]
    if len(groups) > 1 and all(len(g) > 1 for g in groups):
        values = [[_assigned(part) for part in g] for g in groups]
        if all(v is not None for vs in values for v in vs):
            return ("list", tuple(("tuple", tuple(_Parser(v).item() for v in vs)) for vs in values))
    flat = [part for g in groups for part in g]
    if len(flat) > MAX_ITEMS:
        raise ParseError("too many items")
    return _Parser(flat[0]).item() if len(flat) == 1 else ("list", tuple(_Parser(p).item() for p in flat))


def _assigned(tokens: list) -> list | None:
    """The value tokens of "name = value", else None."""
    parts = _split_top(tokens, {"="})
    if len(parts) == 2 and parts[0] and parts[1] and _is_name(_Parser(parts[0]).item()):
        return parts[1]
    return None


_SIMPLE_CHAIN = re.compile(r"(?:[\d\s+\-*/().]+|\s*[A-Za-z]\s*)=\s*(-?\d+(?:\.\d+)?)\s*")


def _final_value(answer: str) -> str:
    """A predicted chain reduced to its value: "x = 5" -> "5", "\\sqrt{4} = 2" -> "2", "a = b = c" -> "c",
    "x = 1/3 \\approx 0.33" -> "1/3"; kept when the value has unknowns or the equation relates unknowns."""
    if "=" not in answer and "approx" not in answer and "≈" not in answer:
        return answer
    if m := _SIMPLE_CHAIN.fullmatch(answer):                  # the common "3+4*2=11" / "x = 5", without the parser
        return m.group(1)
    try:
        tokens = _tokenize(normalize(answer))
        sides = _split_top(tokens, {"=", "\\approx"})
        if len(sides) < 2 or len(_split_top(tokens, {",", ";"})) > 1 or not all(sides):
            return answer
        ops = [t for _, t in tokens if t in ("=", "\\approx")]
        if len(ops) != len(sides) - 1:                        # an "=" inside brackets: \\sum_{k=0}
            return answer
        trees = []
        for side in sides:
            try:
                trees.append(_Parser(side).item())
            except (ParseError, ValueError, IndexError):
                trees.append(None)                            # "\\lim_{x \\to 0} ... = 1": the value still counts
        node = _reduce(("rel", tuple("=" if op == "=" else "~" for op in ops), tuple(trees)), pred=True)
    except (ParseError, ValueError, IndexError):
        return answer
    if node is None or node[0] == "rel" or _has_unknowns(node):
        return answer
    out = ""
    for _, t in sides[trees.index(node)]:                     # tokens back to text, a space only where one is needed
        out += " " + t if out and (out[-1].isalnum() and t[0].isalnum() or out[-1].isdigit() and t[0] == ".") else t
    return out


def _reduce(node: tuple, pred: bool):
    """"name = value" -> value on either side; a prediction's chain -> its last side, or the exact side before a
    "\\approx"; unchanged when that side has unknowns or a two-sided equation relates unknowns ("a + 3z = 0")."""
    if node[0] != "rel" or any(op not in ("=", "~") for op in node[1]):
        return node
    ops, exprs = node[1], node[2]
    if len(exprs) == 2 and exprs[0] is not None and _is_name(exprs[0]) and (pred or ops[0] == "="):
        return exprs[1]
    if not pred:
        return node
    exact = [k for k in range(1, len(exprs)) if ops[k - 1] == "="]
    k = exact[-1] if exact else 0
    if exprs[k] is None or _is_name(exprs[k]):
        k = len(exprs) - 1
    if exprs[k] is None or _has_unknowns(exprs[k]):
        return node
    if k and len(exprs) == 2 and exprs[0] is not None and _has_unknowns(exprs[0]):
        return node
    return exprs[k]


# ---- exact evaluation with fractions (the fast path, no sympy) ------------------------------------------------------

def _bounded(v: Fraction) -> Fraction:
    if max(abs(v.numerator), v.denominator).bit_length() > 3.33 * MAX_DIGITS:
        raise ParseError("number too large")
    return v


def _exact(node: tuple):
    """The value of a rational AST as a Fraction (or +-inf); NeedSymbolic for anything else."""
    kind = node[0]
    if kind == "n":
        return node[1]
    if kind == "c" and node[1] == "oo":
        return math.inf
    if kind == "neg":
        return -_exact(node[1])
    if kind in ("+", "*", "/", "^"):
        a, b = _exact(node[1]), _exact(node[2])
        if not (isinstance(a, Fraction) and isinstance(b, Fraction)):
            raise NeedSymbolic
        if kind == "+":
            return _bounded(a + b)
        if kind == "*":
            return _bounded(a * b)
        if kind == "/":
            if b == 0:
                raise NeedSymbolic
            return _bounded(a / b)
        if b.denominator != 1 or (a == 0 and b < 0):
            raise NeedSymbolic
        if abs(float(b)) * math.log10(max(abs(a.numerator), a.denominator, 2)) > MAX_DIGITS:
            raise ParseError("power too large")
        return a ** int(b)
    if kind == "f" and node[1] in ("abs", "factorial", "sqrt"):
        v = _exact(node[2][0])
        if not isinstance(v, Fraction):
            raise NeedSymbolic
        if node[1] == "abs":
            return abs(v)
        if node[1] == "factorial":
            if v.denominator == 1 and 0 <= v <= 450:          # 450! has ~1000 digits
                return Fraction(math.factorial(int(v)))
            raise ParseError("factorial out of range")
        if _exact(node[2][1]) == 2 and v >= 0:                # a perfect square stays exact: \\sqrt{16} = 4
            root = Fraction(math.isqrt(v.numerator), math.isqrt(v.denominator))
            if root * root == v:
                return root
    raise NeedSymbolic


def _decimals(node: tuple) -> int | None:
    """Decimal places of a literal written as a decimal (the precision a prediction claims), else None."""
    while node[0] == "neg":
        node = node[1]
    return node[2] if node[0] == "n" else None


def _num_close(p, g, p_decimals: int | None) -> bool:
    """p == g exactly; two integers only so (11111111101 is not 11111111100); else within REL_TOL, or p is g
    correctly rounded to p's d >= 2 decimals (with >= 2 significant digits) when g has no d-digit decimal form:
    1/3 -> 0.33, but a gold 0.35 is not matched by 0.3 or 0.4, nor 16386.20 by 16386.21."""
    if p == g:
        return True
    if not (isinstance(p, Fraction) and isinstance(g, Fraction)) or p.denominator == g.denominator == 1:
        return False
    if abs(p - g) <= Fraction(REL_TOL) * max(abs(p), abs(g)):
        return True
    if p_decimals and p_decimals >= 2 and (g * 10 ** p_decimals).denominator != 1:
        return abs(p - g) <= Fraction(1, 2 * 10 ** p_decimals) and abs(p) >= Fraction(10) ** (1 - p_decimals)
    return False


class _Exact:
    value = staticmethod(_exact)
    equal = staticmethod(_num_close)

    @staticmethod
    def relation_equal(p: tuple, g: tuple) -> bool:
        raise NeedSymbolic


# ---- float probes: reject a clear mismatch without the worker (a probe never says True) ----------------------------

_PROBE_AT = ((1.3719, 0.1731), (0.6183, 0.2173))             # (value of the first unknown, step to the next one)
_PROBE_FUNCS = {"sin": cmath.sin, "cos": cmath.cos, "tan": cmath.tan, "sec": lambda z: 1 / cmath.cos(z),
                "csc": lambda z: 1 / cmath.sin(z), "cot": lambda z: 1 / cmath.tan(z), "arcsin": cmath.asin,
                "arccos": cmath.acos, "arctan": cmath.atan, "sinh": cmath.sinh, "cosh": cmath.cosh,
                "tanh": cmath.tanh, "exp": cmath.exp, "ln": cmath.log, "abs": abs}
_PROBE_OPS = {"+": complex.__add__, "*": complex.__mul__, "^": complex.__pow__}


def _probe(node: tuple, names: dict) -> list[complex]:
    """The AST's value at each probe point; NeedSymbolic for what floats cannot tell reliably (unknown constructs,
    magnitudes over 1e8 where cancellation could fake a difference)."""
    kind = node[0]
    if kind == "n":
        vals = [complex(node[1])] * 2
    elif kind == "s":
        j = names.setdefault(node[1], len(names))
        vals = [complex(start + step * j) for start, step in _PROBE_AT]
    elif kind == "c" and node[1] != "oo":
        vals = [{"pi": complex(math.pi), "E": complex(math.e), "I": 1j}[node[1]]] * 2
    elif kind == "neg":
        vals = [-v for v in _probe(node[1], names)]
    elif kind == "/":
        vals = [1 / v for v in _probe(node[2], names)]
    elif kind in _PROBE_OPS:
        vals = [_PROBE_OPS[kind](a, b) for a, b in zip(_probe(node[1], names), _probe(node[2], names))]
    elif kind == "f" and node[1] in _PROBE_FUNCS and len(node[2]) == 1:
        vals = [_PROBE_FUNCS[node[1]](v) for v in _probe(node[2][0], names)]
    elif kind == "f" and node[1] == "sqrt":
        vals = [x ** (1 / n) for x, n in zip(_probe(node[2][0], names), _probe(node[2][1], names))]
    else:
        raise NeedSymbolic
    if not all(abs(v) < 1e8 for v in vals):
        raise NeedSymbolic
    return vals


class _Probe:
    value = staticmethod(lambda node: node)

    @staticmethod
    def equal(p: tuple, g: tuple, p_decimals) -> bool:
        names = {}                                            # one shared unknown -> point assignment
        try:
            pairs = list(zip(_probe(p, names), _probe(g, names)))
        except (ArithmeticError, ValueError, TypeError):
            raise NeedSymbolic
        if any(abs(a - b) > 0.1 * max(abs(a), abs(b)) and max(abs(a), abs(b)) > 1e-6 for a, b in pairs):
            return False                                      # 10% apart: no rounding rule can join them
        raise NeedSymbolic

    relation_equal = _Exact.relation_equal


# ---- sympy (only ever imported inside the worker process) -----------------------------------------------------------

def _sympy_backend():
    import sympy

    funcs = {"sin": sympy.sin, "cos": sympy.cos, "tan": sympy.tan, "sec": sympy.sec, "csc": sympy.csc,
             "cot": sympy.cot, "arcsin": sympy.asin, "arccos": sympy.acos, "arctan": sympy.atan, "sinh": sympy.sinh,
             "cosh": sympy.cosh, "tanh": sympy.tanh, "exp": sympy.exp, "ln": sympy.log, "abs": sympy.Abs,
             "floor": sympy.floor, "ceil": sympy.ceiling}
    consts = {"pi": sympy.pi, "E": sympy.E, "I": sympy.I, "oo": sympy.oo}
    is_matrix = lambda x: isinstance(x, sympy.MatrixBase)

    def checked(v):
        if v.is_Rational and max(abs(v.p), v.q).bit_length() > 3.33 * MAX_DIGITS:
            raise ParseError("number too large")
        return v

    def power(base, exp):
        if is_matrix(exp) or is_matrix(base) and not (exp.is_Integer and 0 <= exp <= 20):
            raise ParseError("matrix power")
        if exp.is_Number and base.is_Rational and base not in (0, 1, -1):
            if abs(float(exp)) * math.log10(max(abs(base.p), base.q, 2)) > MAX_DIGITS:
                raise ParseError("power too large")                # 9^{9^{9^9}} never reaches sympy.Pow
        if exp.is_Number and abs(exp) > MAX_SYMBOLIC_EXPONENT and base.free_symbols:
            raise ParseError("exponent too large")
        return base ** int(exp) if is_matrix(base) else checked(sympy.Pow(base, exp))

    def function(name, args):
        if any(is_matrix(a) for a in args) and name != "det":
            raise ParseError("function of a matrix")
        if name == "sqrt":
            return sympy.sqrt(args[0]) if args[1] == 2 else sympy.root(args[0], args[1])
        if name in ("log", "lg"):
            return sympy.log(args[0], *(args[1:] or ([10] if name == "lg" else [])))
        if name == "factorial":
            if args[0].is_Number and not 0 <= args[0] <= 450:
                raise ParseError("factorial out of range")
            return sympy.factorial(args[0])
        if name == "binom":
            n, k = args
            if n.is_Number and k.is_Number and (abs(n) > 10 ** 6 or min(abs(k), abs(n - k)) > 1000):
                raise ParseError("binomial out of range")
            return sympy.binomial(n, k)
        if name == "det":
            return args[0].det()
        return funcs[name](*args)

    def value(node):
        kind = node[0]
        if kind == "n":
            return sympy.Rational(node[1].numerator, node[1].denominator)
        if kind == "s":
            return sympy.Symbol(node[1])
        if kind == "c":
            return consts[node[1]]
        if kind == "neg":
            return -value(node[1])
        if kind in ("+", "*"):
            a, b = value(node[1]), value(node[2])
            return checked(a + b if kind == "+" else a * b)
        if kind == "/":
            b = value(node[2])
            if is_matrix(b):
                raise ParseError("division by a matrix")
            return checked(1 / b)
        if kind == "^":
            return power(value(node[1]), value(node[2]))
        if kind == "mat":
            return sympy.ImmutableMatrix([[value(c) for c in row] for row in node[1]])
        if kind == "sum":
            return sympy.Sum(value(node[4]), (sympy.Symbol(node[1]), value(node[2]), value(node[3])))
        if kind == "f":
            return function(node[1], [value(a) for a in node[2]])
        raise ParseError(f"not an expression: {kind}")

    def numeric(expr) -> complex | None:
        v = sympy.N(expr, 30)
        return complex(v) if v.is_number and v.is_finite else None

    def equal(p, g, p_decimals) -> bool:
        if is_matrix(p) or is_matrix(g):
            return is_matrix(p) and is_matrix(g) and p.shape == g.shape and all(equal(a, b, None) for a, b in zip(p, g))
        if p == g:
            return True
        if p.is_Rational and g.is_Rational:
            return _num_close(Fraction(p.p, p.q), Fraction(g.p, g.q), p_decimals)
        if any(x.has(sympy.oo, -sympy.oo, sympy.zoo, sympy.nan) for x in (p, g)):
            return False
        if p.free_symbols or g.free_symbols:
            return is_zero(p - g)
        a, b = numeric(p), numeric(g)
        if a is None or b is None:
            return False
        if abs(a - b) <= REL_TOL * max(abs(a), abs(b)):
            return True
        return bool(p_decimals and p_decimals >= 2 and p.is_Rational and abs(b.imag) < 1e-12
                    and abs(a.real - b.real) <= 0.5 * 10 ** -p_decimals and abs(a) >= 10 ** (1 - p_decimals))

    def is_zero(d) -> bool:
        """d == 0 for all values of its unknowns: three random points decide; sympy.simplify settles the rest."""
        unknowns = sorted(d.free_symbols, key=str)
        if len(unknowns) > 20:
            raise ParseError("too many unknowns")
        if d.has(sympy.Sum):
            return False                                      # unequal sums (equal ones matched as trees)
        verdicts = set()
        for start, step in ((1.3719, 0.1731), (0.6183, 0.2173), (2.2361, 0.0917)):
            point = {s: sympy.Rational(round((start + step * j) * 10 ** 4), 10 ** 4) for j, s in enumerate(unknowns)}
            v = numeric(d.xreplace(point))
            verdicts.add(None if v is None else abs(v) <= 1e-12)
        if verdicts == {True}:
            return True
        return False not in verdicts and sympy.simplify(d) == 0

    def relation_equal(p: tuple, g: tuple) -> bool:
        """Two-sided relations as (op, d), d = lhs - rhs, op in <, <=, =, !=: equal when the ops agree and d_p / d_g
        is a constant, positive for inequalities (x > 5 == 5 < x == -x < -5; 2x+4y-3 = 0 == y = 3/4 - x/2)."""
        (op_p, d_p), (op_g, d_g) = relation_form(p), relation_form(g)
        if op_p != op_g:
            return False
        if d_p == d_g or (op_p in ("=", "!=") and d_p == -d_g):
            return True
        ratio = sympy.cancel(sympy.together(d_p / d_g))
        if ratio.free_symbols or not ratio.is_number or ratio == 0:
            return False
        return op_p in ("=", "!=") or bool(ratio > 0)

    def relation_form(node):
        op, (lhs, rhs) = node[1][0], node[2]
        a, b = value(lhs), value(rhs)
        if is_matrix(a) or is_matrix(b):
            raise ParseError("matrix relation")
        if op in (">", ">="):
            return ("<" if op == ">" else "<=", b - a)
        return ("=" if op == "~" else op, a - b)

    return type("SympyBackend", (), {"value": staticmethod(value), "equal": staticmethod(equal),
                                     "relation_equal": staticmethod(relation_equal)})


# ---- structural comparison (the same code runs with every backend) ---------------------------------------------------

_SEQS = ("list", "set", "tuple", "ratio", "iv", "union")


def _expand_pm(node):
    """Every sign choice of the ± in an AST (at most 8)."""
    if not isinstance(node, tuple) or not node:
        return [node]
    if node[0] == "pm":
        a, b = _expand_pm(node[1]), _expand_pm(node[2])
        return [("+", x, y) for x in a for y in b] + [("+", x, ("neg", y)) for x in a for y in b]
    out = [()]
    for part in node:
        out = [o + (c,) for o in out for c in _expand_pm(part)]
        if len(out) > 8:
            raise ParseError("too many ± signs")
    return out


def _has_pm(node) -> bool:
    return isinstance(node, tuple) and bool(node) and (node[0] == "pm" or any(_has_pm(x) for x in node[1:]))


def _is_equation(node: tuple) -> bool:
    return node[0] == "rel" and len(node[1]) == 1 and node[1][0] == "="


def _as_interval(node: tuple):
    """a < x <= b (x a name) as the interval (a, b]; None for other relations."""
    if node[0] != "rel" or len(node[1]) != 2 or not _is_name(node[2][1]):
        return None
    (o1, o2), (a, _, b) = node[1], node[2]
    if {o1, o2} <= {"<", "<="}:
        return ("iv", a, b, o1 == "<=", o2 == "<=")
    if {o1, o2} <= {">", ">="}:
        return ("iv", b, a, o2 == ">=", o1 == ">=")
    return None


def _match(p: tuple, g: tuple, B) -> bool:
    """Whether the prediction's AST p denotes the gold's AST g, with backend B for the leaves."""
    if _is_equation(p) and _is_equation(g) and not (_is_name(p[2][0]) and _is_name(g[2][0])):
        return B.relation_equal(p, g)                         # y = 3/4 - x/2 vs 2x + 4y - 3 = 0
    p, g = _reduce(p, pred=True), _reduce(g, pred=False)
    if _has_pm(p) or _has_pm(g):
        pv, gv = _expand_pm(p), _expand_pm(g)
        p, g = ("set", tuple(pv)) if len(pv) > 1 else pv[0], ("set", tuple(gv)) if len(gv) > 1 else gv[0]
    kp, kg = p[0], g[0]
    if kp == "text" or kg == "text":
        return p == g
    if kp == "rel" or kg == "rel":
        if kp == kg:
            if len(p[1]) == len(g[1]) == 1:
                return "=" not in p[1] + g[1] and B.relation_equal(p, g)
            return p[1] == g[1] and all(_match(a, b, B) for a, b in zip(p[2], g[2]))
        p, g = (_as_interval(p) or p) if kp == "rel" else p, (_as_interval(g) or g) if kg == "rel" else g
        if p[0] == "rel" or g[0] == "rel":
            return False
        kp, kg = p[0], g[0]
    if kp in _SEQS or kg in _SEQS:
        return _seq_match(p, g, B)
    if kp == "base" or kg == "base":
        return kp == kg and p[1:] == g[1:]
    if kp == kg == "mat":
        return (len(p[1]) == len(g[1]) and all(len(a) == len(b) for a, b in zip(p[1], g[1]))
                and all(_match(x, y, B) for a, b in zip(p[1], g[1]) for x, y in zip(a, b)))
    return B.equal(B.value(p), B.value(g), _decimals(p))


def _seq_match(p: tuple, g: tuple, B) -> bool:
    kp, kg = p[0], g[0]
    if kp in ("list", "set") and kg not in _SEQS:             # {x, x} is x: sets drop repeats
        return all(_match(x, g, B) for x in p[1])
    if kg in ("list", "set") and kp not in _SEQS:
        return all(_match(p, y, B) for y in g[1])
    if kp == "tuple" and len(p[1]) == 2 and kg == "iv":       # (a, b) read as an open interval
        p, kp = ("iv", *p[1], False, False), "iv"
    if kg == "tuple" and len(g[1]) == 2 and kp == "iv":
        g, kg = ("iv", *g[1], False, False), "iv"
    if kp == "iv" or kg == "iv":
        return kp == kg and p[3:] == g[3:] and _match(p[1], g[1], B) and _match(p[2], g[2], B)
    if kp not in _SEQS or kg not in _SEQS or ("union" in (kp, kg) and kp != kg):
        return False
    a, b = p[1], g[1]
    if kp in ("tuple", "ratio") or kg in ("tuple", "ratio"):  # against a tuple a set or list keeps its written order
        return (len(a) == len(b) and (kp == kg or {kp, kg} <= {"tuple", "set", "list"})
                and all(_match(x, y, B) for x, y in zip(a, b)))
    return all(any(_match(x, y, B) for y in b) for x in a) and all(any(_match(x, y, B) for x in a) for y in b)


@functools.lru_cache(maxsize=4096)
def _parse_or_text(s: str) -> tuple:
    try:
        return parse(s)
    except (ParseError, ValueError, IndexError, ArithmeticError, RecursionError):
        return ("text", re.sub(r"[\s{}]", "", s).lower())


def _compare_readings(p_readings: list[str], g_readings: list[str], B) -> bool | None:
    """True or False; None when some answer could not be parsed and nothing matched; NeedSymbolic from B."""
    needs_symbolic = unparsed = False
    for ps in p_readings:
        for gs in g_readings:
            p, g = _parse_or_text(ps), _parse_or_text(gs)
            unparsed |= p[0] == "text" or g[0] == "text"
            try:
                if _match(p, g, B):
                    return True
            except NeedSymbolic:
                needs_symbolic = True
    if needs_symbolic:
        raise NeedSymbolic
    return None if unparsed else False


# ---- the symbolic worker process ------------------------------------------------------------------------------------

def _worker_main() -> None:
    """The worker's loop: one JSON request per line on stdin, one verdict per line on stdout ("1", "0", "u")."""
    try:
        import resource
        resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))   # a runaway expansion fails here, not the host
    except (ImportError, ValueError, OSError):
        pass
    backend = _sympy_backend()
    for p, g in (("(x+1)^2", "x^2+2x+1"), ("\\sqrt{2}", "1.41"), ("x > 1", "1 < x"), ("\\sin(y)^2", "1-\\cos(y)^2")):
        _compare_readings([p], [g], backend)                  # sympy's lazy imports happen now, not in a timed call
    sys.modules["sympy"].simplify(sys.modules["sympy"].Symbol("x") ** 2 - 1)
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    for line in sys.stdin:
        try:
            request = json.loads(line)
            verdict = _compare_readings(request["p"], request["g"], backend)
        except Exception:                                     # sympy failing on odd input is a False, not a crash
            verdict = None
        sys.stdout.write({True: "1", False: "0", None: "u"}[verdict] + "\n")
        sys.stdout.flush()


class _Worker:
    """A python process running _worker_main (a fresh interpreter: no fork of the caller's threads or state)."""

    def __init__(self):
        code = "import sys; sys.path.insert(0, sys.argv[1]); import verify; verify._worker_main()"
        self.proc = subprocess.Popen([sys.executable, "-c", code, os.path.dirname(os.path.abspath(__file__))],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        self.ready, self.buf = False, b""

    def readline(self, deadline: float) -> str | None:
        """The next line the worker writes, or None at the deadline (time.monotonic()) or when it has exited."""
        fd = self.proc.stdout.fileno()
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return None
            chunk = os.read(fd, 4096)
            if not chunk:
                return None
            self.buf += chunk
        line, _, self.buf = self.buf.partition(b"\n")
        return line.decode()

    def wait_ready(self, timeout: float) -> bool:
        if not self.ready:
            self.ready = self.readline(time.monotonic() + timeout) == "ready"
        return self.ready

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.proc.stdin.close()
        self.proc.stdout.close()


class _WorkerPool:
    """The active worker and a pre-started spare. A worker over its budget is killed and the spare, already booted,
    takes over; a new spare boots in the background. A replacement still booting makes a call a timeout rather than a
    wait, so no call blocks for much more than 2 * SYMBOLIC_TIMEOUT_S (the very first boot excepted)."""

    def __init__(self):
        self.lock, self.active, self.spare, self.pid, self.booted = threading.Lock(), None, None, None, False

    def compare(self, p_readings: list[str], g_readings: list[str], timeout: float) -> str:
        with self.lock:
            if self.pid != os.getpid():                       # in a forked child: never share the parent's pipes
                self.active = self.spare = None
                self.pid, self.booted = os.getpid(), False
            if self.active is None or self.active.proc.poll() is not None:
                self.active, self.spare = self.spare or _Worker(), None
            self.spare = self.spare or _Worker()
            worker = self.active
            if not worker.wait_ready(timeout if self.booted else WORKER_BOOT_TIMEOUT_S):
                if worker.proc.poll() is not None or not self.booted:
                    self.discard()
                    return "u"
                return "timeout"
            self.booted = True
            deadline = time.monotonic() + timeout                  # the budget starts before the request is sent
            try:
                worker.proc.stdin.write((json.dumps({"p": p_readings, "g": g_readings}) + "\n").encode())
                worker.proc.stdin.flush()
                answer = worker.readline(deadline)
            except OSError:
                answer = None
            if answer is None:
                self.discard()
                return "timeout"
            return answer

    def discard(self) -> None:
        if self.active is not None:
            self.active.kill()
        self.active = None

    def close(self) -> None:
        with self.lock:
            for worker in (self.active, self.spare):
                if worker is not None and self.pid == os.getpid():
                    worker.kill()
            self.active = self.spare = None


_POOL = _WorkerPool()
atexit.register(_POOL.close)


# ---- public API ----------------------------------------------------------------------------------------------------

def _equivalent(pred: str, gold: str) -> tuple[bool, str | None]:
    """(verdict, why it is False: None, "unparseable" or "timeout")."""
    if _PLAIN_NUMBER.fullmatch(pred) and _PLAIN_NUMBER.fullmatch(gold) and len(pred) + len(gold) < MAX_DIGITS:
        p, g = pred.strip(), gold.strip()                     # the fast path: two plain numbers
        return _num_close(Fraction(p), Fraction(g), len(p.partition(".")[2]) if "." in p else None), None
    try:
        p, g = normalize(pred), normalize(gold)
    except ParseError:
        return False, "unparseable"
    if not p or not g:
        return False, "unparseable"
    if p.replace(" ", "") == g.replace(" ", "") or (p.lower() == g.lower() and re.fullmatch(r"[A-Za-z ]{2,}", p)):
        return True, None
    p_readings, g_readings = _readings(p), _readings(g)
    for backend in (_Exact, _Probe):                          # exact fractions, then float probes that only reject
        try:
            verdict = _compare_readings(p_readings, g_readings, backend)
            return bool(verdict), (None if verdict is not None else "unparseable")
        except NeedSymbolic:
            pass
        except (ParseError, ValueError, ArithmeticError, RecursionError):
            return False, "unparseable"
    _count("symbolic")
    answer = _POOL.compare(p_readings, g_readings, SYMBOLIC_TIMEOUT_S)
    return answer == "1", {"1": None, "0": None, "timeout": "timeout"}.get(answer, "unparseable")


def is_equivalent(pred: str, gold: str) -> bool:
    """Whether two extracted answers are the same mathematical object (the rules are in the module docstring)."""
    if not isinstance(pred, str) or not isinstance(gold, str):
        return False
    try:
        return _equivalent(pred, gold)[0]
    except Exception:
        _count("error")
        return False


_CHOICE_GOLD = re.compile(r"\(?([A-E])\)?(?: [A-Z][a-z].*)?")       # "C", "(D) Alina", "C Cecile"
_LETTER = re.compile(r"(?<![A-Za-z'])\(?([A-E])\)?(?![A-Za-z'])")


def _choice(response: str) -> str | None:
    """The letter A-E a response picks (lighteval's rules): its extracted answer; else, in prose, the first letter
    within 50 characters after an answer phrase, a letter opening the text ("B。不是 A"), or the last lone letter."""
    answer = extract_answer(response)
    try:
        m = re.fullmatch(r"\(?([A-E])\)?", normalize(answer)) if answer else None
    except ParseError:
        m = None
    if m:
        return m.group(1)
    text = response[-MAX_RESPONSE_CHARS:]
    if not _prose_count(text):
        return None
    anchor = None
    for anchor in _ANCHOR.finditer(text):
        pass
    if anchor and (m := _LETTER.search(text, anchor.end(), anchor.end() + 50)):
        return m.group(1)
    if m := re.match(r"\s*\**\(?([A-E])\)?\**(?=[.:,)。]|$|[^\x00-\x7f])", text):
        return m.group(1)
    last = None
    for last in _LETTER.finditer(text):
        pass
    return last.group(1) if last else None


@functools.lru_cache(maxsize=4096)                        # a group's rollouts share their gold
def _gold_answer(gold: str) -> str | None:
    return _extract(gold, final_value=False)


def _grade(response, gold) -> tuple[bool, str | None]:
    gold = str(gold) if isinstance(gold, (int, Fraction)) else gold
    if not isinstance(response, str) or not isinstance(gold, str):
        return False, "unparseable"
    if response.strip() and response.strip() == gold.strip():
        return True, None
    gold_answer = _gold_answer(gold)
    if gold_answer is None:
        return False, "unparseable"
    if re.search(r"[A-E]", gold_answer):                      # a multiple-choice gold: "C", "(D) Alina", "\\text{E}"
        try:
            m = _CHOICE_GOLD.fullmatch(normalize(gold_answer))
        except ParseError:
            m = None
        if m:
            return _choice(response) == m.group(1), None
    pred = extract_answer(response)
    if pred is None:
        return False, "unparseable"
    return _equivalent(pred, gold_answer)


def grade(response: str, gold: str) -> bool:
    """Whether the response's final answer equals the gold (an answer, or a solution whose answer is extracted)."""
    try:
        verdict, why = _grade(response, gold)
    except Exception:                                         # a bug, never the trainer's crash: counted as "error"
        verdict, why = False, "error"
    _count("graded")
    if why is not None:
        _count(why)
    return verdict


def reward(response: str, gold: str) -> float:
    """1.0 for a correct final answer, else 0.0."""
    return 1.0 if grade(response, gold) else 0.0


def grade_batch(responses: list[str], golds: list[str]) -> list[bool]:
    if len(responses) != len(golds):
        raise ValueError(f"{len(responses)} responses but {len(golds)} golds")
    return [grade(r, g) for r, g in zip(responses, golds)]


if __name__ == "__main__":
    for response, gold in [("-164", "-164"), ("3-5=-2", "-2"), ("The answer is 40.", "41"),
                           ("so the area is $\\boxed{\\dfrac{3}{4}}$.", "0.75"), ("x = 1,000", "1000"),
                           ("$\\boxed{2\\sqrt{2}}$", "\\sqrt{8}"), ("$(x+1)^2$", "x^2+2x+1"),
                           ("\\boxed{(1, 2)}", "(2, 1)"), ("\\boxed{3 \\pm \\sqrt{2}}", "\\{3-\\sqrt2, 3+\\sqrt2\\}"),
                           ("$[0, 1)$", "[0,1]"), ("I think it's (C).", "C"), ("$x > 5$", "5 < x"),
                           ("__import__('os').system('echo hi')", "0"), ("$9^{9^{9^{9}}}$", "1")]:
        print(f"{response!r:42} gold {gold!r:26} -> {grade(response, gold)}")
    print("stats:", stats())
