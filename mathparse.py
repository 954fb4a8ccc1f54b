"""Verifier internals (the answer parser of verify.py): a reader of the RL code (train.py, grpo.py,
buffer.py, rollout.py) need not read further; the verifier's API is verify.reward, verify.grade and
verify.stats.

The tokenizer and recursive-descent parser of verify.py: one normalised answer (text) becomes an AST
of tuples. Nothing is evaluated and nothing is executed: no eval/exec/sympify, only re and this
grammar.

    parse(s) -> tuple               raises ParseError on text it cannot read or that exceeds a bound
    chain_value(s) -> str | None    the side of a chain "a = b = c" that is its value
                                    (verify.py's extraction)

The node kinds are listed in _Parser's docstring. The node helpers is_name and reduce_to_value are
shared with the comparison (mathcheck.py).

Bounds, each a ParseError: nesting over MAX_DEPTH (checked before any recursion), tokens over
MAX_TOKENS, a number literal or its exponent over MAX_DIGITS digits, more than MAX_ITEMS items or
matrix rows.
"""
import re
from fractions import Fraction

MAX_TOKENS = 2_000             # per parsed answer
MAX_DEPTH = 40                 # bracket nesting and parser recursion
MAX_DIGITS = 1_000             # digits of a number literal, or estimated digits of a power /
                               # factorial / product
MAX_ITEMS = 64                 # elements of a list / set / tuple, rows of a matrix, joined boxes


class ParseError(ValueError):
    """Text this parser cannot read, or that exceeds a bound."""


# ---- tokenizer and parser: text becomes tuples, nothing is evaluated -----------------------------

_TOKEN = re.compile(r"""
    (?P<env>\\(?:begin|end)\s*\{[A-Za-z]+\*?\})
  | (?P<num>(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+(?![A-Za-z(]))?)
  | (?P<cmd>\\[A-Za-z]+)
  | (?P<op><=|>=|!=|=<|=>|\\\\|\\[{}|%]|[-+*/^_=<>()\[\]{}|,;:!'&%])
  | (?P<word>[A-Za-z]+)
  | (?P<ws>\s+)""", re.X)
_RELOPS = {"=": "=", "<": "<", ">": ">", "<=": "<=", ">=": ">=", "=<": "<=", "=>": ">=", "!=": "!=",
           "\\le": "<=", "\\leq": "<=", "\\leqslant": "<=", "\\ge": ">=", "\\geq": ">=",
           "\\geqslant": ">=", "\\lt": "<", "\\gt": ">", "\\ne": "!=", "\\neq": "!=",
           "\\approx": "~"}
_FUNCS = {"sin", "cos", "tan", "sec", "csc", "cot", "arcsin", "arccos", "arctan", "sinh", "cosh",
          "tanh", "log", "ln", "lg", "exp"}
_GREEK = {"alpha", "beta", "gamma", "delta", "epsilon", "varepsilon", "zeta", "eta", "theta",
          "vartheta", "iota", "kappa", "lambda", "mu", "nu", "xi", "rho", "sigma", "tau", "upsilon",
          "phi", "varphi", "chi", "psi", "omega",
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
    """Recursive descent, loosest first: relation chain, \\cup, ratio (:), sum (+ - ±), term
    (* / and implicit product), unary minus, power (right-assoc), postfix (! ' % _), atom. Nodes are
    tuples: ("n", Fraction, decimals) ("s", name) ("c", pi|E|I|oo) ("+"|"*"|"^", a, b) ("/", 1, b)
    ("neg", a) ("pm", a, b) ("f", name, args) ("sum", var, lo, hi, body) ("mat", rows)
    ("base", digits, base) ("tuple"|"set"|"list"|"ratio"|"union", items)
    ("iv", lo, hi, closed_lo, closed_hi) ("rel", ops, exprs) ("text", s)."""

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
            node = (("+", node, rhs) if op == "+" else ("+", node, ("neg", rhs)) if op == "-"
                    else ("pm", node, rhs))
        return node

    def starts_atom(self) -> bool:
        kind, text = self.peek()
        return (kind in ("num", "word") or text in ("(", "\\{") or text in _ATOM_CMDS
                or text.startswith("\\begin") or (text == "|" and not self.in_abs))

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
            node = (inner if text == "+" else ("neg", inner) if text == "-"
                    else ("pm", ("n", Fraction(0), None), inner))
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
                self.take()  # a percent sign is dropped (hendrycks, NeMo)
            elif text == "'" and node[0] == "s":
                self.take()
                node = ("s", node[1] + "'")
            elif text == "_" and node[0] in ("s", "n"):
                self.take()
                sub = self.raw_group()
                if node[0] == "s":
                    # a subscript is part of a name: a_{37}, F_{n-k-1}
                    node = ("s", f"{node[1]}_{sub}")
                elif sub.isdigit() and _is_integer(node):
                    # a numeral in base n, kept as written: 204_5
                    node = ("base", str(node[1]), sub)
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
        if len(text) > 2:   # a word is text, not a product of its letters
            raise ParseError(f"word {text!r}")
        if len(text) == 2:  # "xy" is x*y
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
            if (kind == "env" and text == f"\\end{{{env}}}" and rows
                    and len({len(r) for r in rows}) == 1):
                return (("f", "det", (("mat", tuple(rows)),)) if env == "vmatrix"
                        else ("mat", tuple(rows)))
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


def is_name(node: tuple) -> bool:
    """A left side that only names the answer: x, f(x), |AB|, (p, q), V_1:V_2, \\frac{NO}{BO}; no
    numbers, no sums."""
    kind = node[0]
    if kind == "s":
        return True
    if kind == "n":
        return node == _ONE                                   # the 1 of a parsed "/"
    if kind in ("*", "/"):
        return all(is_name(x) for x in node[1:]) and any(x != _ONE for x in node[1:])
    if kind in ("tuple", "ratio"):
        return all(is_name(x) for x in node[1])
    return kind == "f" and node[1] == "abs" and is_name(node[2][0])


def _has_unknowns(node) -> bool:
    if not isinstance(node, tuple) or not node:
        return False
    return node[0] in ("s", "sum") or any(_has_unknowns(x) for x in node[1:])


def parse(s: str) -> tuple:
    """The AST of one normalised answer. A top-level ',' or ';' makes a bare list; groups of
    assignments separated by ';' or 'and' ("p=5, q=2; p=7, q=2") make a list of tuples of their
    values."""
    depth = peak = 0
    for ch in s:  # reject deep nesting before any recursion
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
    return (_Parser(flat[0]).item() if len(flat) == 1
            else ("list", tuple(_Parser(p).item() for p in flat)))


def _assigned(tokens: list) -> list | None:
    """The value tokens of "name = value", else None."""
    parts = _split_top(tokens, {"="})
    if len(parts) == 2 and parts[0] and parts[1] and is_name(_Parser(parts[0]).item()):
        return parts[1]
    return None


def reduce_to_value(node: tuple, pred: bool):
    """"name = value" -> value on either side; a prediction's chain -> its last side, or the exact
    side before a "\\approx"; unchanged when that side has unknowns or a two-sided equation relates
    unknowns ("a + 3z = 0")."""
    if node[0] != "rel" or any(op not in ("=", "~") for op in node[1]):
        return node
    ops, exprs = node[1], node[2]
    if len(exprs) == 2 and exprs[0] is not None and is_name(exprs[0]) and (pred or ops[0] == "="):
        return exprs[1]
    if not pred:
        return node
    exact = [k for k in range(1, len(exprs)) if ops[k - 1] == "="]
    k = exact[-1] if exact else 0
    if exprs[k] is None or is_name(exprs[k]):
        k = len(exprs) - 1
    if exprs[k] is None or _has_unknowns(exprs[k]):
        return node
    if k and len(exprs) == 2 and exprs[0] is not None and _has_unknowns(exprs[0]):
        return node
    return exprs[k]


def chain_value(s: str) -> str | None:
    """The side of a normalised chain that is its value, as text, a space only where one is needed:
    "x = 5" -> "5", "\\sqrt{4} = 2" -> "2", "a = b = c" -> "c", "x = 1/3 \\approx 0.33" -> "1/3".
    None when s is no such chain, the value has unknowns or the equation relates unknowns. A side
    that does not parse is no value, but the others still count ("\\lim_{x \\to 0} ... = 1" -> "1").
    ParseError when s cannot be tokenized."""
    tokens = _tokenize(s)
    sides = _split_top(tokens, {"=", "\\approx"})
    if len(sides) < 2 or len(_split_top(tokens, {",", ";"})) > 1 or not all(sides):
        return None
    ops = [t for _, t in tokens if t in ("=", "\\approx")]
    if len(ops) != len(sides) - 1:                            # an "=" inside brackets: \\sum_{k=0}
        return None
    trees = []
    for side in sides:
        try:
            trees.append(_Parser(side).item())
        except (ParseError, ValueError, IndexError):
            trees.append(None)
    node = reduce_to_value(("rel", tuple("=" if op == "=" else "~" for op in ops), tuple(trees)),
                           pred=True)
    if node is None or node[0] == "rel" or _has_unknowns(node):
        return None
    out = ""
    for _, t in sides[trees.index(node)]:                     # tokens back to text
        spaced = out and (out[-1].isalnum() and t[0].isalnum() or out[-1].isdigit() and t[0] == ".")
        out += " " + t if spaced else t
    return out
