"""The verifier's API: reward(response, gold) -> 1.0 / 0.0, grade(response, gold) -> bool,
stats() -> dict. A reader of the RL code (train.py, grpo.py, buffer.py, rollout.py) need not read
further: the rest is the verifier's inner workings.

Answer verification for RLVR on math: pull the final answer out of untrusted model text, decide
whether it is the gold answer, and turn that into the reward. Nothing in model text is ever
executed; every step is bounded.

    python verify.py                                   # grades a few examples
    grade(response, gold) -> bool         reward(response, gold) -> float (1.0 / 0.0)
    grade_batch(responses, golds)         extract_answer(text) -> str | None
    is_equivalent(pred, gold) -> bool     stats() -> dict (STATS)
    grade_integer(response, gold): a plain integer after the last "="    grader(name): a set's rule
    grade_fast(response, gold): grade, two plain integers read without the parser

Extraction: the text after the last `</think>`; "final answer is X. I hope it is correct" (the
Minerva format); the last `\\boxed{}`/`\\fbox{}` (nested braces), joined with the boxes just before
it when only a short connective separates them ("\\boxed{1} and \\boxed{2}"); `#### N`;
"answer is / answer: / réponse : / 答案：" then the first value after it; the whole text when it
reads as maths; else the rightmost maths span or number, sign kept ("3-5=-2" -> "-2"). A predicted
chain that ends in a value is reduced to it ("x = 5" -> "5").
Normalisation: $, \\(, \\[, \\left/\\right, spacing commands, \\dfrac/\\tfrac, \\frac12, ^\\circ,
\\%, \\$, \\text{} units, thousands separators, "x \\in", doubled backslashes of JSON-escaped text.
Equivalence, cheapest first: the same string; plain numbers as exact fractions; then our own
tokenizer and recursive-descent parser (mathparse.py) builds an AST (tuples) that is evaluated
exactly with fractions when it is rational, probed at two points with floats (which may only
reject), and otherwise rebuilt as sympy objects in a worker process (all three in mathcheck.py).
Numbers are equal when exact (always so for two integers), within REL_TOL = 1e-9 (relative), or when
a prediction with d >= 2 decimals is the correct rounding of a gold that has no d-digit decimal form
(0.33 for 1/3, 2.6667 for 8/3, 3.1416 for pi). Expressions: three random points, then
sympy.simplify. Structures: tuples and ratios ordered; sets and bare lists order-insensitive
(repeats dropped); intervals (a 2-tuple is an open interval), unions, matrices, "a <= x < b" as an
interval; `\\pm` as the set of both signs; equations equal up to a non-zero factor, inequalities up
to a positive one; text case-insensitively; the letter A-E when the gold is a choice letter.

Bounds: a response over MAX_RESPONSE_CHARS is read from its tail; an extracted answer over
MAX_ANSWER_CHARS, nesting over MAX_DEPTH, tokens over MAX_TOKENS, a number or integer power over
MAX_DIGITS digits (those three in mathparse.py), an exponent over MAX_SYMBOLIC_EXPONENT on an
unknown (mathcheck.py): all grade False (counted `unparseable`) before sympy sees them. Each
symbolic comparison runs in a worker process, started on first need, which the caller kills after
SYMBOLIC_TIMEOUT_S (counted `timeout`); a pre-started spare takes over. No signal.alarm, so it works
from any thread. Nothing raises: an internal error on odd input grades False and is counted
(`error`), for the trainer to log and the fuzz test to keep at 0.

Departures from the public checkers (Math-Verify, lighteval, hendrycks/math, NeMo-Skills, dart-math,
TRL, verl), why:
- No eval/exec/sympify/parse_expr/latex2sympy on model text (each of them parses with one of those),
  so our parser knows fewer LaTeX constructs: no integrals or limits (they grade False, or drop out
  as the left side of "... = v").
- The time limit kills a worker process instead of signal.alarm (Math-Verify), which fails off the
  main thread.
- Always falls back to the rightmost number (Math-Verify's latex-only configs do not); no </think>
  is required (TRL's reasoning reward gives 0 without one): the reward must not depend on a format
  the task did not ask for.
- A trailing % is dropped (hendrycks, NeMo: "10%" == "10"); no x100 rescaling (dart-math:
  0.0304 == 3.04).
- Tolerance 1e-9 relative and integers exact (a tolerance like 1e-6 would make 11111111101 equal
  11111111100); rounding is accepted only to the prediction's own stated decimals, as above.
- Bare lists compare as sets (hendrycks compares strings: "4, 10" != "10, 4"); tuples stay ordered
  (dart-math treats (2,1) and (1,2) as equal, wrong for points).
- A prediction's chain "a = b = c" reduces to its last side; a gold equation stays an equation ("0"
  is not "a + 3z = 0"); "name = value" reduces on either side ("k = 1/3" == "1/3").
- Runs of 3+ letters are words, not products of symbols ("dog" != "god"; "AZYUK2A" is not 2).
- Units are dropped, not converted ("15 cm^2" == "15"), as Math-Verify does.
Files: this one holds the API, extraction, normalisation and the orchestration (_equivalent);
mathparse.py the tokenizer and parser (text -> tuples); mathcheck.py the evaluators, the structural
comparison and the sympy worker. This file imports only their public names. The cases where we
disagree with the checkers' own test tables are listed, each with its reason, in
tests/verify_known_failures.py.
"""
import bisect
import functools
import re
import threading
from fractions import Fraction

import data
from mathcheck import POOL, ExactBackend, NeedSymbolic, ProbeBackend, compare_readings, num_close
from mathparse import MAX_DIGITS, MAX_ITEMS, ParseError, chain_value

MAX_RESPONSE_CHARS = 200_000   # only the tail of a longer response is read (the final answer is
                               # at the end)
MAX_ANSWER_CHARS = 10_000      # a longer extracted answer is rejected
SYMBOLIC_TIMEOUT_S = 1.0       # wall time of one symbolic comparison in the worker

STATS = {"graded": 0, "unparseable": 0, "timeout": 0, "symbolic": 0, "error": 0}
# how a step's counts of them (verify/<key>) combine over ranks (metrics.Metrics.add)
COMBINE = {"verify/*": "sum"}
_STATS_LOCK = threading.Lock()


def stats() -> dict:
    """A copy of the counters: pairs graded; those False because unparseable, timed out, or because
    of an internal error (a bug: counted and logged by the trainer rather than raised mid-run; the
    fuzz test keeps it at 0); how many comparisons went to the symbolic worker; and how many workers
    were killed (over budget) or found dead."""
    with _STATS_LOCK:
        return {**STATS, "worker_restarts": POOL.restarts}


def log_fields(row: dict) -> list[str]:
    """The log line's warning when a step's verify/* counts (train.py totals the stats() of each
    step) show internal errors or worker restarts: a verifier bug would quietly zero rewards."""
    if not (row.get("verify/error") or row.get("verify/worker_restarts")):
        return []
    return [f"WARNING verifier: {row['verify/error']} internal errors, "
            f"{row['verify/worker_restarts']} worker restarts (see verify/* in metrics.jsonl)"]


def reset_stats() -> None:
    with _STATS_LOCK:
        STATS.update(dict.fromkeys(STATS, 0))
        POOL.restarts = 0


def _count(key: str) -> None:
    with _STATS_LOCK:
        STATS[key] += 1


# ---- extraction ----------------------------------------------------------------------------------

_PLAIN_NUMBER = re.compile(r"\s*[-+]?(?:\d+(?:\.\d*)?|\.\d+)\s*")
_HOPE = re.compile(r"(?i)final answer is")
_ANCHOR = re.compile(r"(?i)(?:final\s+answer|answer|r[ée]ponse|答案)\s*(?:\*\*\s*)?"
                     r"(?:is|est|:|：|=)")
_HASHES = re.compile(r"####[ \t]*([^\n]+)")
_PHRASE_END = re.compile(r"\n|I hope|\.\s|\.$|。|\$\.\s")
_NUMBER = re.compile(r"(?<![A-Za-z0-9_\\)\]}.])(?:-(?=\.?\d))?"
                     r"(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:[.,]\d+)?(?:/\d+)?"
                     r"(?: ?(?:%|\\%|percent))?|\\[dt]?frac\{-?\d+\}\{\d+\}")
_PROSE_WORD = re.compile(r"(?<![\\A-Za-z])(?=[A-Za-z]*[a-z])[A-Za-z]{2,}"   # not "AB", "CD"
                         r"|[^\x00-\x7f\W\d_]")
_TEXT_CMD = re.compile(r"\\(?:text\w*|mbox|math(?:rm|bf|it)|operatorname)\s*\{[^{}]*\}"
                       r"|\\(?:begin|end)\s*\{\w+\*?\}")
_CONNECTIVE = re.compile(r"(?<![A-Za-z\\])(?:and|or)(?![a-z])")
_MATH_WORDS = {"pi", "sin", "cos", "tan", "sec", "csc", "cot", "log", "ln", "exp", "sqrt", "frac",
               "inf", "infty", "arcsin", "arccos", "arctan", "sinh", "cosh", "tanh", "mod",
               "pct", "percent", "percentage",
               "cm", "mm", "km", "kg", "mg", "ml", "ft", "hr", "hrs", "min", "sec", "deg", "unit",
               "units", "sq", "mph"}
_DELIMS = (("$$", "$$"), ("\\[", "\\]"), ("\\(", "\\)"), ("$", "$"))


def _boxes(text: str) -> list[tuple[int, int, str]]:
    """(start, end, content) of the last \\boxed/\\fbox and of the boxes joined to it, right to
    left."""
    out, pos = [], len(text)
    while len(out) < MAX_ITEMS:
        i = max(text.rfind("\\boxed", 0, pos), text.rfind("\\fbox", 0, pos))
        if i < 0:
            break
        j = i + (6 if text.startswith("\\boxed", i) else 5)
        while j < len(text) and text[j] in " \t":
            j += 1
        # a joined box ends before the next
        stop = out[-1][0] if out else min(len(text), j + MAX_ANSWER_CHARS + 2)
        if j < len(text) and text[j] == "{":
            depth, k = 0, j
            while k < stop:
                depth += (text[k] == "{") - (text[k] == "}")
                if depth == 0:
                    break
                k += 1
            if depth and out:
                break
            content = text[j + 1:k] if not depth else text[j + 1:]  # unclosed last box: the rest
        else:
            m = re.match(r"[^\s$]+", text[j:j + 100])               # "\\boxed 5"
            if not m:
                break
            content, k = m.group(), j + m.end() - 1
        if out and not _joins(text[k + 1:out[-1][0]]):
            break
        if not out or content.strip() != out[-1][2].strip():        # the same box twice counts once
            out.append((i, k, content))
        pos = i
    return out


def _joins(gap: str) -> bool:
    """Boxes are one answer when a short connective separates them ("\\boxed{1}, \\boxed{2}",
    "\\boxed{1} \\quad \\text{and} \\quad \\boxed{2}", "\\boxed{1} papers and \\boxed{2} bins"), not
    a sentence ("\\boxed{1} no no no no no \\boxed{2}"). Math-Verify joins gaps under 10 characters,
    or under 70 with a separator; we also cap the words."""
    if len(gap) < 10:
        return True
    words = re.findall(r"(?<![\\A-Za-z])[A-Za-z]{2,}|\d+", gap)
    return (len(gap) < 70 and len(words) <= 4
            and bool(_CONNECTIVE.search(gap) or "," in gap or ";" in gap))


def _math_spans(text: str) -> list[tuple[int, int, str]]:
    """(start, end, body) of the $$..$$, \\[..\\], \\(..\\) and one-line $..$ spans, left to right,
    in linear time (the next position of each delimiter is cached, so no region is rescanned)."""
    def find(s, start):
        k = text.find(s, start)
        while k > 0 and s[0] == "$" and text[k - 1] == "\\":  # \\$ is a dollar sign
            k = text.find(s, k + 1)
        return k

    out, i, nxt = [], 0, {}
    while True:
        for op, _ in _DELIMS:
            if op not in nxt or -1 < nxt[op] < i:             # -1: no such opener left
                nxt[op] = find(op, i)
        live = [(nxt[op], -len(op), op, cl) for op, cl in _DELIMS if nxt[op] >= 0]
        if not live:
            return out
        k, _, op, cl = min(live)
        e = find(cl, k + len(op))
        if e < 0 or (op == "$" and "\n" in text[k:e]):        # inline maths is one line
            if e < 0:
                nxt[op] = -1
            i = k + len(op)
            continue
        out.append((k, e + len(cl), text[k + len(op):e]))
        i = e + len(cl)


def _prose_count(text: str) -> int:
    """Words of prose in the text, counted up to 2 (callers only tell none, one and a sentence
    apart)."""
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
    """The answer a phrase or text holds: itself if it reads as maths, else its rightmost (first)
    candidate, looked into again when that is a prose span. Without any candidate: a word or two is
    a text answer ("Evelyn", "white"), a sentence is no answer (None), unless keep_text: a gold is
    an answer by definition, whole unless it reads as a solution ("(D) Alina", "125 miles",
    "np.arcsin(10/13)")."""
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
    # one word may be a mangled \\text
    return body if _prose_count(body) < 2 else (_math_of(body) or body)


def _anchored(text: str) -> str | None:
    """The value after the last "#### " or "answer is / answer: / réponse : / 答案：", up to the
    end of its sentence."""
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
    parts = re.split(r"\s(?:is|est|are|was|equals)\s", phrase)  # "The volume of $V$ is 120"
    if len(parts) > 1 and _prose_count(phrase):
        phrase = parts[-1]
    return _math_of(phrase, first=True)


def _extract(text: str, final_value: bool) -> str | None:
    if not isinstance(text, str) or not text.strip():
        return None
    if _PLAIN_NUMBER.fullmatch(text):  # the fast path: "-164", " 40\n"
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
    # "$\\frac{3}{4}$" -> "\\frac{3}{4}"
    if len(spans) == 1 and spans[0][0] == 0 and spans[0][1] == len(answer):
        answer = spans[0][2].strip()
    return _final_value(answer) if final_value else answer


def extract_answer(text: str) -> str | None:
    """The final answer a response states (a string, LaTeX kept), or None. A chain ending in a value
    is reduced to that value ("x = 5" -> "5", "3-5=-2" -> "-2"); an equation between unknowns is
    kept ("y = 2x + 1")."""
    try:
        return _extract(text, final_value=True)
    except Exception:                         # a bug, never the caller's problem: counted
        _count("error")
        return None


# ---- normalisation -------------------------------------------------------------------------------

# (pattern, literal replacement), in order
_REPLACE = [(re.compile(p), lambda m, r=r: r) for p, r in [
    (r"\\\$|\$|\\[\[\]()]", " "), (r'\\?"', ""),
    (r"\\(?:left|right|[bB]igg?[lr]?)\s*(?:\.|(?=[()\[\]|]|\\[{}|]))", ""),
    (r"\\(?:left|right)\s*\\[lr]?vert|\\[lr]?vert(?![A-Za-z])|\\mid(?![A-Za-z])", "|"),
    (r"\\(?:displaystyle|textstyle|limits|nonumber|noindent)(?![A-Za-z])", " "),
    (r"(?<!\\)\\! ?", ""),
    (r"(?<!\\)\\(?:q?quad|[,;: ])", " "), (r"~", " "), (r" ?\{ ?, ?\}", ","),
    (r"\\[dtc]frac", "\\frac"), (r"\\[dt]binom", "\\binom"),
    (r"\\(?:textnormal|textbf|textit|textrm|mbox|mathrm|mathbf|mathit|boldsymbol|operatorname)"
     r" ?\{", "\\text{"),
    (r"\^ ?\{ ?\\circ ?\}|\^ ?\\circ|\\circ|°|\\degree", ""),
    (r"\^ ?\{ ?\\prime ?\}|\^ ?\\prime|\\prime", "'"),
    (r"\\%|\\text\{ ?(?:percent|percentage|pct) ?\}"
     r"|(?<![A-Za-z])(?:percentage|percent|pct)(?![A-Za-z])", "%"),
    (r",? ?\\text\{ ?(?:and|or) ?\}", " ; "),
    (r"(?<![A-Za-z\\])(?:, ?)?(?:and|or)(?![a-z])", " ; "),
    (r"(?:\\in(?![A-Za-z])|∈) ?", " \\in "),
    (r"[−–]", "-"), (r"×|·", "*"), (r"÷", "/"), (r"≤", "<="), (r"≥", ">="),
    (r"≠", "!="), (r"≈", "\\approx "),
    (r"π", "\\pi "), (r"∞", "\\infty "), (r"±", "\\pm "), (r"√", "\\sqrt"),
]]
_UNIT_TEXT = re.compile(r"(?<=[\d}).]) ?\\text\{[^{}]*\}"   # "15\\text{ cm}^2"
                        r"(?: ?\^ ?\{?\d\}?)? ?$")
_UNIT_WORD = re.compile(r"[A-Za-z]{2,}\.?(?:\^\{?\d\}?)?")


def _strip_units(s: str) -> str:
    """Drop unit text after a value: "\\frac{1}{3} \\text{meters}", "35 cm", "0.06 yuan" (not
    "\\text{Evelyn}")."""
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
    """Canonical text of an extracted answer (LaTeX in, plainer LaTeX out). ParseError when it is
    too long."""
    if len(s) > MAX_ANSWER_CHARS:
        raise ParseError("answer too long")
    if "\\boxed" in s or "\\fbox" in s:
        s = ", ".join(c for _, _, c in reversed(_boxes(s))) or s
    s = " ".join(re.sub(r"[\x00-\x1f\x7f]", " ", s).split())   # control characters are spaces
    if "matrix" not in s and "array" not in s:
        s = re.sub(r"\\\\(?=[A-Za-z])", r"\\", s)   # JSON-escaped: "\\\\frac" -> "\\frac"
    for pattern, replacement in _REPLACE:
        s = pattern.sub(replacement, s)
    s = _strip_units(" ".join(s.split()))
    s = re.sub(r"\\text\{([^{}]*)\}", r"\1", s)
    s = re.sub(r"^[A-Za-z](?:_\{?\w+\}?)? ?\\in ", "", s)                 # "x \\in [0, 1)"
    return " ".join(s.split()).rstrip(" \\.;").lstrip(" ;")


def _readings(s: str) -> list[str]:
    """A normalised answer and the other readings of its commas and spaces: "7,425,000" is a number,
    "x = 1,000" holds one, "1,22" is 1.22 (decimal comma) or the list 1, 22, "1 000" is 1000. Inside
    brackets a comma separates."""
    if re.fullmatch(r"-?[1-9]\d{0,2}(?:[, ]\d{3})+(?:\.\d+)?", s) and not re.search(r", | ,", s):
        return [s.replace(",", "").replace(" ", "")]
    out = []
    if not re.search(r"[()\[\]{}]", s):
        t = re.sub(r"(?<![\d.,])[1-9]\d{0,2}(?:,\d{3})+(?![\d,])",
                   lambda m: m.group().replace(",", ""), s)
        out += [t] if t != s else []
    if re.fullmatch(r"-?\d+,\d+", s):
        out.append(s.replace(",", "."))
    return out + [s]


# ---- a predicted chain reduced to its value (extraction, with the parser of mathparse.py) --------

_SIMPLE_CHAIN = re.compile(r"(?:[\d\s+\-*/().]+|\s*[A-Za-z]\s*)=\s*(-?\d+(?:\.\d+)?)\s*")


def _final_value(answer: str) -> str:
    """A predicted chain reduced to its value: "x = 5" -> "5", "\\sqrt{4} = 2" -> "2",
    "a = b = c" -> "c", "x = 1/3 \\approx 0.33" -> "1/3"; kept when the value has unknowns or the
    equation relates unknowns."""
    if "=" not in answer and "approx" not in answer and "≈" not in answer:
        return answer
    if m := _SIMPLE_CHAIN.fullmatch(answer):   # the common "3+4*2=11" / "x = 5", without the parser
        return m.group(1)
    try:
        value = chain_value(normalize(answer))   # parsed by mathparse.py
    except (ParseError, ValueError, IndexError):
        return answer
    return answer if value is None else value


# ---- public API ----------------------------------------------------------------------------------

def _equivalent(pred: str, gold: str) -> tuple[bool, str | None]:
    """(verdict, why it is False: None, "unparseable" or "timeout")."""
    if (_PLAIN_NUMBER.fullmatch(pred) and _PLAIN_NUMBER.fullmatch(gold)
            and len(pred) + len(gold) < MAX_DIGITS):
        p, g = pred.strip(), gold.strip()                     # the fast path: two plain numbers
        return num_close(Fraction(p), Fraction(g),
                         len(p.partition(".")[2]) if "." in p else None), None
    try:
        p, g = normalize(pred), normalize(gold)
    except ParseError:
        return False, "unparseable"
    if not p or not g:
        return False, "unparseable"
    if (p.replace(" ", "") == g.replace(" ", "")
            or (p.lower() == g.lower() and re.fullmatch(r"[A-Za-z ]{2,}", p))):
        return True, None
    p_readings, g_readings = _readings(p), _readings(g)
    # exact fractions, then float probes that only reject
    for backend in (ExactBackend, ProbeBackend):
        try:
            verdict = compare_readings(p_readings, g_readings, backend)
            return bool(verdict), (None if verdict is not None else "unparseable")
        except NeedSymbolic:
            pass
        except (ParseError, ValueError, ArithmeticError, RecursionError):
            return False, "unparseable"
    _count("symbolic")
    answer = POOL.compare(p_readings, g_readings, SYMBOLIC_TIMEOUT_S)
    return answer == "1", {"1": None, "0": None, "timeout": "timeout"}.get(answer, "unparseable")


def is_equivalent(pred: str, gold: str) -> bool:
    """Whether two extracted answers are the same mathematical object (the rules are in the module
    docstring)."""
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
    """The letter A-E a response picks (lighteval's rules): its extracted answer; else, in prose,
    the first letter within 50 characters after an answer phrase, a letter opening the text
    ("B。不是 A"), or the last lone letter."""
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
    if re.search(r"[A-E]", gold_answer):   # a multiple-choice gold: "C", "(D) Alina", "\\text{E}"
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
    """Whether the response's final answer equals the gold (an answer, or a solution whose answer is
    extracted)."""
    try:
        verdict, why = _grade(response, gold)
    except Exception:                         # a bug, never the trainer's crash: counted as "error"
        verdict, why = False, "error"
    _count("graded")
    if why is not None:
        _count(why)
    return verdict


def reward(response: str, gold: str) -> float:
    """1.0 for a correct final answer, else 0.0."""
    return 1.0 if grade(response, gold) else 0.0


_INTEGER = re.compile(r"-?[0-9]+")


def _final_text(response: str) -> str:
    """What follows the response's last "=" (the whole response when it has none), stripped."""
    return response.rsplit("=", 1)[-1].strip() if isinstance(response, str) else ""


def _plain_integer(s: str) -> bool:
    """An integer literal -?[0-9]+ of at most MAX_DIGITS characters."""
    return len(s) <= MAX_DIGITS and _INTEGER.fullmatch(s) is not None


def grade_integer(response: str, gold: str) -> bool:
    """The stricter rule of a task whose answer is a plain integer (data.py's step-by-step task,
    grader): the text after the response's last "=" (the whole response when it has none),
    stripped, must be an integer literal -?[0-9]+ equal to the gold integer. "7+54-6=61-6=55" and
    " 55 " grade True for gold 55; an unreduced "61-6", "55.0" or "+55" grade False (unparseable).
    Counted in stats() as grade is."""
    tail, gold = _final_text(response), str(gold).strip()
    readable = _plain_integer(tail) and _plain_integer(gold)
    _count("graded")
    if not readable:
        _count("unparseable")
    return bool(readable) and int(tail) == int(gold)


def grade_fast(response: str, gold: str) -> bool:
    """grade's verdict, with its counts in stats(), read directly where the response and the gold
    are each, stripped, an integer literal -?[0-9]+ (under MAX_DIGITS characters together): there
    grade takes its own fast paths (equal strings; _extract's plain number; _equivalent's two plain
    numbers, equal only if exactly so) and its verdict is int(response) == int(gold), which is
    returned without the call. Anything else ("+56", "56.0", "7*8=56", "５６") goes to grade. The
    built-in arithmetic tasks' grader (`grader`), whose completions are integers; the agreement
    is tested on sampled rollouts and adversarial strings (tests/test_verify_fast.py)."""
    if isinstance(response, str) and isinstance(gold, str):
        answer, value = response.strip(), gold.strip()
        if (len(answer) + len(value) < MAX_DIGITS and _INTEGER.fullmatch(answer)
                and _INTEGER.fullmatch(value)):
            _count("graded")
            return int(answer) == int(value)
    return grade(response, gold)


def grade_number(response: str, gold: str) -> bool:
    """The instruct template's rule (a chat model asked for "only the number" of a built-in
    expression): the response's stated final answer (extract_answer: the last \\boxed{}, else "the
    answer is ...", else the final value of a chain, "1 + 4 = 5" -> "5"), stripped of a final
    ".", must be an integer literal -?[0-9]+ equal to the gold integer. Restating the question is
    not an answer: "The answer is 0+3-1.", "2 + 8 + 7 = 2 + 8 + 7" and "Who is 5*0?" (the 0 is an
    operand, _operand) grade False, though grade's value equality takes the first two (on
    SmolLM2-135M-Instruct's real completions, 5 of 56 greedy replies are such echoes:
    tests/data/smollm2_completions.jsonl). Counted in stats() as grade is."""
    answer = extract_answer(response) if isinstance(response, str) else None
    answer = (answer or "").strip().rstrip(".").strip()
    gold = str(gold).strip()
    readable = _plain_integer(answer) and _plain_integer(gold) and not _operand(response, answer)
    _count("graded")
    if not readable:
        _count("unparseable")
    return bool(readable) and int(answer) == int(gold)


_OPERATORS = "+-*/×·^"


def _operand(response: str, answer: str) -> bool:
    """Whether the stated number's last occurrence in the response is an operand: right after an
    operator ("Who is 5*0?" states no 0: it restates the question 5*0, and the last operand of
    x-x+7, x*0 or 0+0+7 equals its value) or right before one ("7-9 is wrong")."""
    i = response.rfind(answer)
    if i < 0:
        return False
    before = response[:i].rstrip()
    after = response[i + len(answer):].lstrip()
    prev, nxt = before[-1:], after[:1]
    return (prev != "" and prev in _OPERATORS) or (nxt != "" and nxt in _OPERATORS)


def grader(name: str, template: str | None = None):
    """The grader of prompt set `name` (data.py's names, a run's --train-data) under `template`
    (data.template_for's; None: the set's own, builtin for the built-in tasks), (response, gold) ->
    bool: grade_number on the built-in tasks under the instruct template (a chat model's replies:
    "4 * 5 = 20", "The answer is 20.", "\\boxed{20}" all read 20; an echo of the question does not),
    grade_integer on the step-by-step task's splits under the builtin template (data.STEPS_NAMES:
    its answer rule), grade_fast (grade, a plain integer read without the parser) on the other
    built-in tasks under the builtin template, grade (value equality of the stated final answer)
    for every other set and template."""
    template = template or data.template_for(name)
    if template == "instruct" and name in data.BUILTIN_NAMES:
        return grade_number
    if name in data.STEPS_NAMES and template == "builtin":
        return grade_integer
    return grade_fast if name in data.BUILTIN_NAMES and template == "builtin" else grade


# ---- the answer format: what --reward correct+format pays for ----------------------------------

def integer_form(response: str) -> bool:
    """The built-in tasks' answer form: the text after the last "=" (the whole response when it has
    none), stripped, is a plain integer -?[0-9]+ ("12", "7+54-6=61-6=55"; not "61-6", "55.0",
    "the answer is 55"). Whether the integer is right is the grader's business, not the form's."""
    return _plain_integer(_final_text(response))


def boxed_form(response: str) -> bool:
    """The benchmarks' answer form (the prompt asks for it: data.BOXED_INSTRUCTION): a \\boxed{...}
    (or \\fbox{...}) with its braces closed and something inside."""
    inner = data.last_boxed(response) if isinstance(response, str) else None
    return bool(inner and inner.strip())


def number_form(response: str) -> bool:
    """The instruct template's answer form (data.DIRECT_INSTRUCTION: "Reply with only the number"):
    the whole reply, stripped, is one plain integer -?[0-9]+ ("20", " -4\\n"; not "4*5 = 20",
    "20.", "The answer is 20")."""
    return isinstance(response, str) and _plain_integer(response.strip())


# The step-by-step task's partial credit, what --reward partial pays for beside the verdict.

MAX_STEP_CHARS = 200           # a "=" step longer than this is not read (the task's longest: 41)
_OPERAND = re.compile(r"\s*(-?[0-9]+)")
_OPERATOR = re.compile(r"\s*([-+*])")


def step_value(step: str) -> int | None:
    """The value of one step of a chain: integer literals -?[0-9]+ joined by + - *, spaces allowed
    between tokens, * before + and -, left to right:

        step = term (("+" | "-") term)*,   term = int ("*" int)*,   int = -?[0-9]+

    ("7+54-3*2-1" -> 54, "-17 + 3" -> -14, "5--3" -> 8). None when it is not one: empty, any other
    character, two operators or two numbers side by side, a leading + or a trailing operator, over
    MAX_STEP_CHARS characters. A hand-written scanner: nothing of the text is evaluated but its
    integers' + - * (a value has at most MAX_STEP_CHARS digits)."""
    if not isinstance(step, str) or len(step) > MAX_STEP_CHARS:
        return None
    total, term, sign, pos = 0, None, 1, 0
    while True:
        m = _OPERAND.match(step, pos)
        if m is None:
            return None
        term = int(m.group(1)) if term is None else term * int(m.group(1))
        pos = m.end()
        m = _OPERATOR.match(step, pos)
        if m is None:
            break
        pos = m.end()
        if m.group(1) != "*":                    # a term ends: add it, the next one's sign
            total += sign * term
            term = None
            sign = 1 if m.group(1) == "+" else -1
    return total + sign * term if not step[pos:].strip() else None


def step_share(response: str, gold: str) -> float:
    """The share of a response's steps that keep the gold value, what --reward partial adds to the
    verdict (allocation.shaped_reward):

        share = #{s in steps : step_value(s) == int(gold)} / #steps,   steps = response.split("=")

    Every step of a right chain keeps the value ("7+54-3*2-1=7+54-6-1=61-6-1=55-1=54" for gold 54:
    5 of 5); one wrong at step k of K that carries the error on keeps it k - 1 times. No "=": one
    step; a trailing "=" leaves an empty, wrong last step. 0 for an empty response, a gold that is
    not a plain integer, a response over MAX_RESPONSE_CHARS (not read) or not a string."""
    if not isinstance(response, str) or len(response) > MAX_RESPONSE_CHARS:
        return 0.0
    gold = str(gold).strip()
    if not _plain_integer(gold):
        return 0.0
    value = int(gold)
    steps = response.split("=")
    return sum(step_value(s) == value for s in steps) / len(steps)


def format_rule(name: str, template: str | None = None):
    """The answer form of prompt set `name` under `template` (None: the set's own, as grader),
    (response) -> bool: what the prompt asks for. The builtin template (prompts end in "=", the
    answer is "= <int>"): integer_form; instruct: number_form; plain and chat (they ask for a
    \\boxed{}): boxed_form."""
    template = template or data.template_for(name)
    return {"builtin": integer_form, "instruct": number_form}.get(template, boxed_form)


def grade_batch(responses: list[str], golds: list[str]) -> list[bool]:
    if len(responses) != len(golds):
        raise ValueError(f"{len(responses)} responses but {len(golds)} golds")
    return [grade(r, g) for r, g in zip(responses, golds)]


if __name__ == "__main__":
    for response, gold in [("-164", "-164"), ("3-5=-2", "-2"), ("The answer is 40.", "41"),
                           ("so the area is $\\boxed{\\dfrac{3}{4}}$.", "0.75"),
                           ("x = 1,000", "1000"),
                           ("$\\boxed{2\\sqrt{2}}$", "\\sqrt{8}"), ("$(x+1)^2$", "x^2+2x+1"),
                           ("\\boxed{(1, 2)}", "(2, 1)"),
                           ("\\boxed{3 \\pm \\sqrt{2}}", "\\{3-\\sqrt2, 3+\\sqrt2\\}"),
                           ("$[0, 1)$", "[0,1]"), ("I think it's (C).", "C"), ("$x > 5$", "5 < x"),
                           ("__import__('os').system('echo hi')", "0"), ("$9^{9^{9^{9}}}$", "1")]:
        print(f"{response!r:42} gold {gold!r:26} -> {grade(response, gold)}")
    print("stats:", ", ".join(f"{key} {value}" for key, value in stats().items()))
