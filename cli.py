"""Command-line flags from a dataclass: one `--flag` per field, the string under the field as its
help, a `Literal[...]` type as its allowed values, and `# ---- title` comments in the class body as
the groups of --help. Used by train.py (flags.Args) and eval.py (eval.Args). Imports nothing heavy,
so `--help` answers at once.

A program whose flags have several owners composes them: `compose("Args", (RunFlags,
LossFlags, ...))` is one flat dataclass with every owner's fields in that order (one `--flag`
each, the owners' help texts and groups), and `part(args, LossFlags)` is the owner's own
frozen dataclass with the values of `args`: what the owner's code is built from.

    @dataclass
    class Args:
        # ---- objective
        ratio: Literal["token", "sequence"] = "token"
        \"\"\"importance weight\"\"\"
    # --ratio {token,sequence}, its help from the string under it, in the group "objective"
    args = cli.parse(Args, sys.argv[1:], description=__doc__)

The help texts are read from the source (ast); so is `code_without_prose`, a module's code with
its docstrings left out (what bench/runs.py hashes as the trainer's code, and what
tests/test_layout.py searches for names).
"""
import argparse
import ast
import dataclasses
import functools
import inspect
import os
import re
import shutil
import textwrap
import typing

GROUP_HEADER = re.compile(r"^\s*# -+ (.+?) -*$")
LONG_CHOICES = 60        # a longer list of a flag's values is shown in its help, not beside it
FIELD = re.compile(r"^\s*(\w+)\s*:")
HELP_WIDTH = 100         # --help's lines at most, however wide the terminal
ROOT = os.path.dirname(os.path.abspath(__file__))


def capped(formatter):
    """`formatter` (an argparse HelpFormatter class) wrapping at the terminal's width, but never
    past HELP_WIDTH characters."""
    def make(prog):
        columns = shutil.get_terminal_size().columns - 2       # argparse's own default
        return formatter(prog, width=min(columns, HELP_WIDTH))
    return make


def shown_default(value):
    """A default as --help shows it: a path inside the repository relative to it (the default
    --model is the checkout's absolute path, which tells a reader nothing), anything else as is."""
    if isinstance(value, str) and os.path.isabs(value) and value.startswith(ROOT + os.sep):
        return os.path.relpath(value, ROOT)
    return value


def shown_path(path: str, start: str | None = None) -> str:
    """A path as an error line names it: relative to the directory the user ran in (start: that
    directory, where it is not this process's) where that is shorter (a checkout's absolute path
    makes a line of 160-230 characters), else as given."""
    if not os.path.isabs(path):
        return path
    relative = os.path.relpath(path, start)
    return relative if len(relative) < len(path) else path


# an absolute path inside a line of text (not a URL's //host/..., not the middle of a relative path)
ABSOLUTE_PATH = re.compile(r"(?<![\w.~:/-])/[^\s'\",:;()\[\]]+")


def relative_paths(line: str) -> str:
    """`line` (an error) with each absolute path in it as shown_path names it: relative to where the
    user ran, where that is shorter."""
    return ABSOLUTE_PATH.sub(lambda m: shown_path(m.group(0)), line)


# a model's weights, one of these in its directory (transformers' names, sharded or not)
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")      # the Hugging Face Hub's org/name


def is_hub_id(model: str) -> bool:
    """Whether --model `model` names a model of the Hugging Face Hub (org/name, as
    Qwen/Qwen2.5-0.5B-Instruct), not a local directory: nothing of that path exists here, its first
    part included (assets/tiny-arith-typo is a local path mistyped)."""
    first = model.split("/")[0]
    return HUB_ID.fullmatch(model) is not None and not os.path.exists(first)


def model_problem(model: str) -> str:
    """What keeps --model `model` from loading, one line ("" when nothing does): train.py's and
    eval.py's words for it. A Hub id passes here (checkpoint.load_model fetches it, or says why it
    cannot); a local directory needs config.json and weights (WEIGHT_FILES)."""
    shown = shown_path(model)
    if is_hub_id(model):
        return ""
    if not os.path.isdir(model):
        return f"--model {shown}: no such directory (nor a Hub id, org/name)"
    if not os.path.isfile(os.path.join(model, "config.json")):
        return f"--model {shown}: no config.json in it: not a Hugging Face model directory"
    if not any(os.path.isfile(os.path.join(model, f)) for f in WEIGHT_FILES):
        return f"--model {shown}: no weights in it (model.safetensors or pytorch_model.bin)"
    return ""


def hub_unreachable(model_id: str) -> str:
    """The line for a Hub id that cannot be fetched here (no network, or HF_HUB_OFFLINE): fetch it
    where the Hub is reachable, then pass the directory."""
    return f"--model {model_id}: offline; hf download ID --local-dir DIR, then --model DIR"


def compose(name: str, owners: tuple, module: str, more_choices: dict | None = None) -> type:
    """One flat frozen dataclass `name` (defined in `module`) with the fields of every owner
    dataclass in `owners`, in order; `cls.owners` keeps them, for the help texts and groups. Two
    owners may not declare the same field. `more_choices` ({field: values}): values allowed beside
    a Literal field's own (a plug-in's: train.py's methods add to --ratio and --replay)."""
    fields, seen = [], set()
    for owner in owners:
        for f in dataclasses.fields(owner):
            if f.name in seen:
                raise TypeError(f"{name}: field {f.name!r} is declared by two owners")
            seen.add(f.name)
            fields.append((f.name, f.type, dataclasses.field(default=f.default)))
    cls = dataclasses.make_dataclass(name, fields, frozen=True)
    cls.__module__ = module
    cls.owners = tuple(owners)
    cls.more_choices = dict(more_choices or {})
    return cls


def part(args, owner):
    """The owner's own dataclass, with the values `args` (a composed dataclass) holds for its
    fields."""
    return owner(**{f.name: getattr(args, f.name) for f in dataclasses.fields(owner)})


def _owners(cls) -> tuple:
    return getattr(cls, "owners", (cls,))


def code_without_prose(source: str) -> str:
    """A module's code as ast.unparse writes it, every docstring left out (and so every comment,
    which ast drops)."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (isinstance(body, list) and body and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)):
            node.body = body[1:] or [ast.Pass()]
    return ast.unparse(tree)


def field_docs(cls) -> dict[str, str]:
    """The string literal under each dataclass field, whitespace folded, which becomes its --help
    text (of a composed class: each owner's)."""
    docs = {}
    for owner in _owners(cls):
        docs.update(_own_docs(owner))
    return docs


@functools.cache           # a class's source is parsed once a process (each parse reads its file)
def _own_docs(cls) -> dict[str, str]:
    body = ast.parse(inspect.getsource(cls)).body[0].body
    docs = {}
    for a, b in zip(body, body[1:]):
        documented = isinstance(b, ast.Expr) and isinstance(b.value, ast.Constant)
        if isinstance(a, ast.AnnAssign) and documented:
            docs[a.target.id] = " ".join(b.value.value.split())
    return docs


def field_groups(cls) -> dict[str, str]:
    """{field: the title of the `# ---- title` comment above it in its owner's class body, or
    ''}."""
    groups = {}
    for owner in _owners(cls):
        groups.update(_own_groups(owner))
    return groups


@functools.cache
def _own_groups(cls) -> dict[str, str]:
    names = {f.name for f in dataclasses.fields(cls)}
    groups, title = {}, ""
    for line in inspect.getsource(cls).splitlines():
        header = GROUP_HEADER.match(line)
        field = FIELD.match(line)
        if header:
            title = header.group(1)
        elif field and field.group(1) in names and field.group(1) not in groups:
            groups[field.group(1)] = title
    return groups


def choices(cls, name: str, hints: dict | None = None) -> tuple | None:
    """The allowed values of a `Literal[...]` field (and its `more_choices`), else None; hints:
    typing.get_type_hints(cls), where the caller has them."""
    hint = (hints or typing.get_type_hints(cls))[name]
    if typing.get_origin(hint) is not typing.Literal:
        return None
    return typing.get_args(hint) + tuple(getattr(cls, "more_choices", {}).get(name, ()))


def build_parser(cls, description: str = "", formatter=argparse.RawDescriptionHelpFormatter,
                 presets: dict | None = None, usage: str | None = None) -> argparse.ArgumentParser:
    """The parser of `parse`: one argument per field, in argparse groups by the class's headers;
    `usage` (None: argparse's own, every flag) the first line of --help; every line wrapped at
    HELP_WIDTH characters at most (the presets' too), the defaults as shown_default shows them."""
    epilog = None
    if presets:
        lines = [textwrap.fill(text, HELP_WIDTH, initial_indent=f"  {name:15s} ",
                               subsequent_indent=" " * 18) for name, (text, _) in presets.items()]
        epilog = "presets (--preset NAME):\n" + "\n".join(lines)
    ap = argparse.ArgumentParser(description=description, formatter_class=capped(formatter),
                                 epilog=epilog, usage=usage)
    docs, groups, sections = field_docs(cls), field_groups(cls), {}
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        title = groups.get(f.name, "")
        if title not in sections:
            sections[title] = ap.add_argument_group(title) if title else ap
        # argparse %-formats help strings: a literal % must be doubled
        help_text = f"{docs[f.name]} (default: {shown_default(f.default)!r})".replace("%", "%%")
        kw = dict(default=f.default, help=help_text, choices=choices(cls, f.name, hints))
        if kw["choices"] and len(",".join(map(str, kw["choices"]))) > LONG_CHOICES:
            kw["metavar"] = "NAME"                  # the list goes into the help, wrapped
            kw["help"] += f"; one of {', '.join(map(str, kw['choices']))}"
        if isinstance(f.default, bool):
            kw["action"] = argparse.BooleanOptionalAction
        elif isinstance(f.default, tuple):         # a list of strings: --flag A [B ...]
            kw.update(nargs="+", type=str, metavar="VALUE")
        else:
            kw["type"] = type(f.default)
        sections[title].add_argument("--" + f.name.replace("_", "-"), **kw)
    return ap


def parse(cls, argv=None, description: str = "", formatter=argparse.RawDescriptionHelpFormatter,
          presets: dict | None = None, usage: str | None = None):
    """An instance of the flags dataclass `cls` from the command line; bools are --flag / --no-flag.
    A bad value (unknown choice, not a number) ends in argparse's one `error:` line and exit status
    2. With `presets` ({name: (description, {field: value})}, `cls` has a `preset` field): the
    command line is parsed twice, the second time with the chosen preset's values as the defaults,
    so a flag given explicitly wins over its preset."""
    ap = build_parser(cls, description, formatter, presets, usage)
    ns = ap.parse_args(argv)
    if presets and ns.preset in presets:
        ap.set_defaults(**presets[ns.preset][1])
        ns = ap.parse_args(argv)
    # a list's values as a tuple, the type of its default (the frozen flags stay hashable)
    return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in vars(ns).items()})
