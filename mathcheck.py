"""Verifier internals (the comparison and the sympy worker of verify.py): a reader of the RL code
(train.py, grpo.py, buffer.py, rollout.py) need not read further; the verifier's API is
verify.reward, verify.grade and verify.stats.

Whether two parsed answers (mathparse.py ASTs) denote the same object, for verify.py; and the worker
process that runs the sympy part.

    compare_readings(p_readings, g_readings, B) -> True | False | None
        (None: unparseable, nothing matched)
    POOL.compare(p_readings, g_readings, timeout) -> "1" | "0" | "u" | "timeout"
        (sympy, in the worker)
    num_close(p, g, p_decimals) -> bool
        (two numbers, the rule below)

One structural comparison (_match: relations, intervals, ± expansion, sequences, matrices) runs
with three backends for the leaves, cheapest first: ExactBackend (fractions; a rational AST is
decided here), ProbeBackend (complex floats at two points; it may only reject: 10% apart), and
SympyBackend (three random points, then sympy.simplify). A backend that cannot decide raises
NeedSymbolic and the caller (verify.py) moves to the next one.
Numbers are equal when exact (always so for two integers), within REL_TOL = 1e-9 (relative), or when
a prediction with d >= 2 decimals is the correct rounding of a gold that has no d-digit decimal form
(0.33 for 1/3, 2.6667 for 8/3, 3.1416 for pi). Equations are equal up to a non-zero factor,
inequalities up to a positive one.

sympy is imported only inside the worker process
(`python -c "import mathcheck; mathcheck._worker_main()"`, which imports this module and
mathparse.py, nothing else of the project), so `import verify` stays light. The worker runs under a
4 GiB address-space limit; the caller kills it after its budget and a pre-started spare takes over
(no signal.alarm, so it works from any thread). Bounds: an integer power over MAX_DIGITS digits, an
exponent over MAX_SYMBOLIC_EXPONENT on an unknown, a factorial over 450!, a binomial out of range:
ParseError before sympy sees them.
"""
import atexit
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

from mathparse import MAX_DIGITS, ParseError, is_name, parse, reduce_to_value

MAX_SYMBOLIC_EXPONENT = 1_000  # |n| in x^n when x has unknowns (an expansion would blow up)
REL_TOL = 1e-9                 # numeric equality: |a - b| <= REL_TOL * max(|a|, |b|)
                               # (two integers: exact)
WORKER_BOOT_TIMEOUT_S = 60.0   # python + sympy import of the first worker (a one-off, outside any
                               # comparison)


class NeedSymbolic(Exception):
    """An evaluator met something only sympy can decide."""


# ---- exact evaluation with fractions (the fast path, no sympy) -----------------------------------

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
            if v.denominator == 1 and 0 <= v <= 450:  # 450! has ~1000 digits
                return Fraction(math.factorial(int(v)))
            raise ParseError("factorial out of range")
        if _exact(node[2][1]) == 2 and v >= 0:        # a perfect square stays exact: \\sqrt{16} = 4
            root = Fraction(math.isqrt(v.numerator), math.isqrt(v.denominator))
            if root * root == v:
                return root
    raise NeedSymbolic


def _decimals(node: tuple) -> int | None:
    """Decimal places of a literal written as a decimal (the precision a prediction claims), else
    None."""
    while node[0] == "neg":
        node = node[1]
    return node[2] if node[0] == "n" else None


def num_close(p, g, p_decimals: int | None) -> bool:
    """p == g exactly; two integers only so (11111111101 is not 11111111100); else within REL_TOL,
    or p is g correctly rounded to p's d >= 2 decimals (with >= 2 significant digits) when g has no
    d-digit decimal form: 1/3 -> 0.33, but a gold 0.35 is not matched by 0.3 or 0.4, nor 16386.20 by
    16386.21."""
    if p == g:
        return True
    if (not (isinstance(p, Fraction) and isinstance(g, Fraction))
            or p.denominator == g.denominator == 1):
        return False
    if abs(p - g) <= Fraction(REL_TOL) * max(abs(p), abs(g)):
        return True
    if p_decimals and p_decimals >= 2 and (g * 10 ** p_decimals).denominator != 1:
        return (abs(p - g) <= Fraction(1, 2 * 10 ** p_decimals)
                and abs(p) >= Fraction(10) ** (1 - p_decimals))
    return False


class ExactBackend:
    value = staticmethod(_exact)
    equal = staticmethod(num_close)

    @staticmethod
    def relation_equal(p: tuple, g: tuple) -> bool:
        raise NeedSymbolic


# ---- float probes: reject a clear mismatch without the worker (a probe never says True) ----------

# (value of the first unknown, step to the next one)
_PROBE_AT = ((1.3719, 0.1731), (0.6183, 0.2173))
_PROBE_FUNCS = {"sin": cmath.sin, "cos": cmath.cos, "tan": cmath.tan,
                "sec": lambda z: 1 / cmath.cos(z), "csc": lambda z: 1 / cmath.sin(z),
                "cot": lambda z: 1 / cmath.tan(z), "arcsin": cmath.asin,
                "arccos": cmath.acos, "arctan": cmath.atan, "sinh": cmath.sinh, "cosh": cmath.cosh,
                "tanh": cmath.tanh, "exp": cmath.exp, "ln": cmath.log, "abs": abs}
_PROBE_OPS = {"+": complex.__add__, "*": complex.__mul__, "^": complex.__pow__}


def _probe(node: tuple, names: dict) -> list[complex]:
    """The AST's value at each probe point; NeedSymbolic for what floats cannot tell reliably
    (unknown constructs, magnitudes over 1e8 where cancellation could fake a difference)."""
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
        vals = [_PROBE_OPS[kind](a, b)
                for a, b in zip(_probe(node[1], names), _probe(node[2], names))]
    elif kind == "f" and node[1] in _PROBE_FUNCS and len(node[2]) == 1:
        vals = [_PROBE_FUNCS[node[1]](v) for v in _probe(node[2][0], names)]
    elif kind == "f" and node[1] == "sqrt":
        vals = [x ** (1 / n) for x, n in zip(_probe(node[2][0], names), _probe(node[2][1], names))]
    else:
        raise NeedSymbolic
    if not all(abs(v) < 1e8 for v in vals):
        raise NeedSymbolic
    return vals


class ProbeBackend:
    value = staticmethod(lambda node: node)

    @staticmethod
    def equal(p: tuple, g: tuple, p_decimals) -> bool:
        names = {}        # one shared unknown -> point assignment
        try:
            pairs = list(zip(_probe(p, names), _probe(g, names)))
        except (ArithmeticError, ValueError, TypeError):
            raise NeedSymbolic
        if any(abs(a - b) > 0.1 * max(abs(a), abs(b)) and max(abs(a), abs(b)) > 1e-6
               for a, b in pairs):
            return False  # 10% apart: no rounding rule can join them
        raise NeedSymbolic

    relation_equal = ExactBackend.relation_equal


# ---- sympy (only ever imported inside the worker process) ----------------------------------------

class SympyBackend:
    """The leaves as sympy objects: numbers exact, expressions equal when three random points agree
    and otherwise when sympy.simplify says so. Built only inside the worker process (_worker_main):
    sympy is imported in the methods that use it, so importing this module never loads it."""

    def __init__(self):
        import sympy

        self.funcs = {"sin": sympy.sin, "cos": sympy.cos, "tan": sympy.tan, "sec": sympy.sec,
                      "csc": sympy.csc, "cot": sympy.cot, "arcsin": sympy.asin,
                      "arccos": sympy.acos, "arctan": sympy.atan, "sinh": sympy.sinh,
                      "cosh": sympy.cosh, "tanh": sympy.tanh, "exp": sympy.exp, "ln": sympy.log,
                      "abs": sympy.Abs, "floor": sympy.floor, "ceil": sympy.ceiling}
        self.consts = {"pi": sympy.pi, "E": sympy.E, "I": sympy.I, "oo": sympy.oo}

    @staticmethod
    def _is_matrix(x) -> bool:
        import sympy
        return isinstance(x, sympy.MatrixBase)

    @staticmethod
    def _checked(v):
        if v.is_Rational and max(abs(v.p), v.q).bit_length() > 3.33 * MAX_DIGITS:
            raise ParseError("number too large")
        return v

    def _power(self, base, exp):
        import sympy
        if (self._is_matrix(exp)
                or self._is_matrix(base) and not (exp.is_Integer and 0 <= exp <= 20)):
            raise ParseError("matrix power")
        if exp.is_Number and base.is_Rational and base not in (0, 1, -1):
            if abs(float(exp)) * math.log10(max(abs(base.p), base.q, 2)) > MAX_DIGITS:
                raise ParseError("power too large")  # 9^{9^{9^9}} never reaches sympy.Pow
        if exp.is_Number and abs(exp) > MAX_SYMBOLIC_EXPONENT and base.free_symbols:
            raise ParseError("exponent too large")
        return base ** int(exp) if self._is_matrix(base) else self._checked(sympy.Pow(base, exp))

    def _function(self, name, args):
        import sympy
        if any(self._is_matrix(a) for a in args) and name != "det":
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
        return self.funcs[name](*args)

    def value(self, node):
        import sympy
        kind = node[0]
        if kind == "n":
            return sympy.Rational(node[1].numerator, node[1].denominator)
        if kind == "s":
            return sympy.Symbol(node[1])
        if kind == "c":
            return self.consts[node[1]]
        if kind == "neg":
            return -self.value(node[1])
        if kind in ("+", "*"):
            a, b = self.value(node[1]), self.value(node[2])
            return self._checked(a + b if kind == "+" else a * b)
        if kind == "/":
            b = self.value(node[2])
            if self._is_matrix(b):
                raise ParseError("division by a matrix")
            return self._checked(1 / b)
        if kind == "^":
            return self._power(self.value(node[1]), self.value(node[2]))
        if kind == "mat":
            return sympy.ImmutableMatrix([[self.value(c) for c in row] for row in node[1]])
        if kind == "sum":
            return sympy.Sum(self.value(node[4]),
                             (sympy.Symbol(node[1]), self.value(node[2]), self.value(node[3])))
        if kind == "f":
            return self._function(node[1], [self.value(a) for a in node[2]])
        raise ParseError(f"not an expression: {kind}")

    @staticmethod
    def _numeric(expr) -> complex | None:
        import sympy
        v = sympy.N(expr, 30)
        return complex(v) if v.is_number and v.is_finite else None

    def equal(self, p, g, p_decimals) -> bool:
        import sympy
        if self._is_matrix(p) or self._is_matrix(g):
            return (self._is_matrix(p) and self._is_matrix(g) and p.shape == g.shape
                    and all(self.equal(a, b, None) for a, b in zip(p, g)))
        if p == g:
            return True
        if p.is_Rational and g.is_Rational:
            return num_close(Fraction(p.p, p.q), Fraction(g.p, g.q), p_decimals)
        if any(x.has(sympy.oo, -sympy.oo, sympy.zoo, sympy.nan) for x in (p, g)):
            return False
        if p.free_symbols or g.free_symbols:
            return self._is_zero(p - g)
        a, b = self._numeric(p), self._numeric(g)
        if a is None or b is None:
            return False
        if abs(a - b) <= REL_TOL * max(abs(a), abs(b)):
            return True
        return bool(p_decimals and p_decimals >= 2 and p.is_Rational and abs(b.imag) < 1e-12
                    and abs(a.real - b.real) <= 0.5 * 10 ** -p_decimals
                    and abs(a) >= 10 ** (1 - p_decimals))

    def _is_zero(self, d) -> bool:
        """d == 0 for all values of its unknowns: three random points decide; sympy.simplify settles
        the rest."""
        import sympy
        unknowns = sorted(d.free_symbols, key=str)
        if len(unknowns) > 20:
            raise ParseError("too many unknowns")
        if d.has(sympy.Sum):
            return False  # unequal sums (equal ones matched as trees)
        verdicts = set()
        for start, step in ((1.3719, 0.1731), (0.6183, 0.2173), (2.2361, 0.0917)):
            point = {s: sympy.Rational(round((start + step * j) * 10 ** 4), 10 ** 4)
                     for j, s in enumerate(unknowns)}
            v = self._numeric(d.xreplace(point))
            verdicts.add(None if v is None else abs(v) <= 1e-12)
        if verdicts == {True}:
            return True
        return False not in verdicts and sympy.simplify(d) == 0

    def relation_equal(self, p: tuple, g: tuple) -> bool:
        """Two-sided relations as (op, d), d = lhs - rhs, op in <, <=, =, !=: equal when the ops
        agree and d_p / d_g is a constant, positive for inequalities (x > 5 == 5 < x == -x < -5;
        2x+4y-3 = 0 == y = 3/4 - x/2)."""
        import sympy
        (op_p, d_p), (op_g, d_g) = self._relation_form(p), self._relation_form(g)
        if op_p != op_g:
            return False
        if d_p == d_g or (op_p in ("=", "!=") and d_p == -d_g):
            return True
        ratio = sympy.cancel(sympy.together(d_p / d_g))
        if ratio.free_symbols or not ratio.is_number or ratio == 0:
            return False
        return op_p in ("=", "!=") or bool(ratio > 0)

    def _relation_form(self, node):
        op, (lhs, rhs) = node[1][0], node[2]
        a, b = self.value(lhs), self.value(rhs)
        if self._is_matrix(a) or self._is_matrix(b):
            raise ParseError("matrix relation")
        if op in (">", ">="):
            return ("<" if op == ">" else "<=", b - a)
        return ("=" if op == "~" else op, a - b)


# ---- structural comparison (the same code runs with every backend) -------------------------------

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
    return (isinstance(node, tuple) and bool(node)
            and (node[0] == "pm" or any(_has_pm(x) for x in node[1:])))


def _is_equation(node: tuple) -> bool:
    return node[0] == "rel" and len(node[1]) == 1 and node[1][0] == "="


def _as_interval(node: tuple):
    """a < x <= b (x a name) as the interval (a, b]; None for other relations."""
    if node[0] != "rel" or len(node[1]) != 2 or not is_name(node[2][1]):
        return None
    (o1, o2), (a, _, b) = node[1], node[2]
    if {o1, o2} <= {"<", "<="}:
        return ("iv", a, b, o1 == "<=", o2 == "<=")
    if {o1, o2} <= {">", ">="}:
        return ("iv", b, a, o2 == ">=", o1 == ">=")
    return None


def _match(p: tuple, g: tuple, B) -> bool:
    """Whether the prediction's AST p denotes the gold's AST g, with backend B for the leaves."""
    if _is_equation(p) and _is_equation(g) and not (is_name(p[2][0]) and is_name(g[2][0])):
        return B.relation_equal(p, g)                         # y = 3/4 - x/2 vs 2x + 4y - 3 = 0
    p, g = reduce_to_value(p, pred=True), reduce_to_value(g, pred=False)
    if _has_pm(p) or _has_pm(g):
        pv, gv = _expand_pm(p), _expand_pm(g)
        p, g = (("set", tuple(pv)) if len(pv) > 1 else pv[0],
                ("set", tuple(gv)) if len(gv) > 1 else gv[0])
    kp, kg = p[0], g[0]
    if kp == "text" or kg == "text":
        return p == g
    if kp == "rel" or kg == "rel":
        if kp == kg:
            if len(p[1]) == len(g[1]) == 1:
                return "=" not in p[1] + g[1] and B.relation_equal(p, g)
            return p[1] == g[1] and all(_match(a, b, B) for a, b in zip(p[2], g[2]))
        p, g = ((_as_interval(p) or p) if kp == "rel" else p,
                (_as_interval(g) or g) if kg == "rel" else g)
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
    # against a tuple a set or list keeps its written order
    if kp in ("tuple", "ratio") or kg in ("tuple", "ratio"):
        return (len(a) == len(b) and (kp == kg or {kp, kg} <= {"tuple", "set", "list"})
                and all(_match(x, y, B) for x, y in zip(a, b)))
    return (all(any(_match(x, y, B) for y in b) for x in a)
            and all(any(_match(x, y, B) for x in a) for y in b))


@functools.lru_cache(maxsize=4096)
def _parse_or_text(s: str) -> tuple:
    try:
        return parse(s)
    except (ParseError, ValueError, IndexError, ArithmeticError, RecursionError):
        return ("text", re.sub(r"[\s{}]", "", s).lower())


def compare_readings(p_readings: list[str], g_readings: list[str], B) -> bool | None:
    """True or False; None when some answer could not be parsed and nothing matched; NeedSymbolic
    from B."""
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


# ---- the symbolic worker process -----------------------------------------------------------------

def _worker_main() -> None:
    """The worker's loop: one JSON request per line on stdin, one verdict per line on stdout ("1",
    "0", "u")."""
    try:
        import resource
        # a runaway expansion fails here, not the host
        resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
    except (ImportError, ValueError, OSError):
        pass
    backend = SympyBackend()
    for p, g in (("(x+1)^2", "x^2+2x+1"), ("\\sqrt{2}", "1.41"), ("x > 1", "1 < x"),
                 ("\\sin(y)^2", "1-\\cos(y)^2")):
        compare_readings([p], [g], backend)  # sympy's lazy imports happen now, not in a timed call
    sys.modules["sympy"].simplify(sys.modules["sympy"].Symbol("x") ** 2 - 1)
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    for line in sys.stdin:
        try:
            request = json.loads(line)
            verdict = compare_readings(request["p"], request["g"], backend)
        except Exception:                    # sympy failing on odd input is a False, not a crash
            verdict = None
        sys.stdout.write({True: "1", False: "0", None: "u"}[verdict] + "\n")
        sys.stdout.flush()


class _Worker:
    """A python process running _worker_main (a fresh interpreter: no fork of the caller's threads
    or state)."""

    def __init__(self):
        code = ("import sys; sys.path.insert(0, sys.argv[1]); "
                "import mathcheck; mathcheck._worker_main()")
        self.proc = subprocess.Popen(
            [sys.executable, "-c", code, os.path.dirname(os.path.abspath(__file__))],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        self.ready, self.buf = False, b""

    def readline(self, deadline: float) -> str | None:
        """The next line the worker writes, or None at the deadline (time.monotonic()) or when it
        has exited. What is read after the deadline is late, whatever select saw: on a loaded
        machine this process can be descheduled between computing the wait and entering it, and
        a budget is a budget."""
        fd = self.proc.stdout.fileno()
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return None
            if time.monotonic() > deadline:
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
    """The active worker and a pre-started spare. A worker over its budget is killed and the spare,
    already booted, takes over; a new spare boots in the background. A replacement still booting
    makes a call a timeout rather than a wait, so no call blocks for much more than
    2 * SYMBOLIC_TIMEOUT_S (the very first boot excepted)."""

    def __init__(self):
        self.lock, self.active, self.spare, self.pid, self.booted = (
            threading.Lock(), None, None, None, False)
        self.restarts = 0  # workers killed or found dead (verify.stats())

    def compare(self, p_readings: list[str], g_readings: list[str], timeout: float) -> str:
        with self.lock:
            if self.pid != os.getpid():  # in a forked child: never share the parent's pipes
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
            deadline = time.monotonic() + timeout  # the budget starts before the request is sent
            try:
                worker.proc.stdin.write(
                    (json.dumps({"p": p_readings, "g": g_readings}) + "\n").encode())
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
            self.restarts += 1
        self.active = None

    def close(self) -> None:
        with self.lock:
            for worker in (self.active, self.spare):
                if worker is not None and self.pid == os.getpid():
                    worker.kill()
            self.active = self.spare = None


POOL = _WorkerPool()
atexit.register(POOL.close)
