"""The house's shape, pinned: imports point one way (each module imports only modules on floors
below its own; the method files in methods/ above the spine, never the reverse), the spine names
no other paper, each method file can be removed and the rest still runs, no function below
run_setup.setup takes or stores train.py's `Args` (the flags are bound at the door), the algorithm's
modules keep lines to 100 characters and functions to 60 lines, the spine's four algorithm files
stay under SPINE_LINES together, and rollout.py under 300 lines. A change that breaks one of these
says so here."""
import ast
import dataclasses
import os

import pytest

import cli
import methods

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Bottom to top (../shared/DESIGN.md): plain machinery that imports no method (the math, the data,
# the verifier, collectives, checkpoints, metrics); the record and its batching (rollout.py); the
# engines (engine.py, vllm_engine.py), the replay and the eval; the method files (methods/, each a
# wing over the spine, and their registry); flags.py, which composes every owner's flags;
# memory.py, what the flags imply a run holds; the door that builds the run (run_setup.py);
# train.py.
FLOORS = [
    ("mathparse", "cli", "data", "grpo", "reward_fn"),
    ("mathcheck", "parallel"),
    ("verify", "checkpoint"),
    ("metrics",),
    ("rollout",),
    ("engine",),
    ("vllm_engine", "buffer", "eval", "logged"),
    ("methods",),
    ("flags",),
    ("memory",),
    ("run_setup",),
    ("train",),
]
FLOOR = {name: level for level, names in enumerate(FLOORS) for name in names}
# the method files, as the registry names them (a file it does not name fails the test below)
WINGS = [w for w in methods.WINGS if os.path.exists(os.path.join(ROOT, "methods", f"{w}.py"))]
SPINE = ("train.py", "rollout.py", "grpo.py", "buffer.py")      # the algorithm's four files
SPINE_LINES = 1900
ALGORITHM = ("train.py", "run_setup.py", "grpo.py", "buffer.py", "rollout.py", "engine.py",
             "logged.py",
             "metrics.py", "parallel.py", "flags.py", "memory.py", "cli.py", "reward_fn.py",
             *(f"methods/{w}.py" for w in WINGS), "methods/__init__.py")
# Where train.py's flags may be taken whole: the door (run_setup.setup, train.main; flags.py's
# bounds; cli.part, which cuts an owner's flags out of them) and the checkpoint's (de)serialiser,
# which writes them as args.json (it takes them as a dict). eval.py's own CLI has its own Args.
TAKE_ARGS = {("run_setup", "setup"), ("train", "main"), ("cli", "part"),
             ("flags", "torch_engine_needed"), ("flags", "check_args"), ("flags", "method_parts"),
             ("flags", "needs_initial"), ("flags", "_rules"), ("flags", "changed"),
             ("eval", "load_inputs"), ("eval", "main")}


def source(name: str) -> str:
    with open(os.path.join(ROOT, name)) as f:
        return f.read()


def project_imports(module: str) -> set[str]:
    """The project modules `module` (a top-level name, or methods.NAME) imports, by floor name (a
    method file counts as "methods")."""
    path = module.replace(".", "/") + ".py" if module.startswith("methods.") else module + ".py"
    out = set()
    for node in ast.walk(ast.parse(source(path))):
        if isinstance(node, ast.Import):
            out |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module.split(".")[0])
    return out & set(FLOOR)


def test_every_top_level_module_has_a_floor():
    modules = {f[:-3] for f in os.listdir(ROOT) if f.endswith(".py")} | {"methods"}
    assert modules == set(FLOOR)


def test_every_method_file_is_registered():
    assert not methods.unregistered(), "method files methods.WINGS does not name"


@pytest.mark.parametrize("module", sorted(set(FLOOR) - {"methods"}))
def test_imports_point_down(module):
    up = {m for m in project_imports(module) if FLOOR[m] >= FLOOR[module]}
    assert not up, f"{module}.py imports {sorted(up)}, which are not below it"


@pytest.mark.parametrize("wing", WINGS)
def test_a_method_file_imports_the_spine_alone(wing):
    """A wing imports modules below the methods' floor, never another wing, flags.py or
    train.py."""
    imports = project_imports(f"methods.{wing}")
    assert all(FLOOR[m] < FLOOR["methods"] for m in imports), (wing, sorted(imports))
    tree = ast.parse(source(f"methods/{wing}.py"))
    wings = [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))
             and "methods" in ast.unparse(n)]
    assert not wings, (wing, [ast.unparse(n) for n in wings])


def test_the_spine_reaches_the_methods_through_the_registry_alone():
    """Only flags.py, the door (run_setup.py) and train.py import `methods` (the registry), and no
    top-level module names a method file's module."""
    for f in sorted(os.listdir(ROOT)):
        if not f.endswith(".py"):
            continue
        imports = {ast.unparse(n) for n in ast.walk(ast.parse(source(f)))
                   if isinstance(n, (ast.Import, ast.ImportFrom)) and "methods" in ast.unparse(n)}
        allowed = {"import methods"} if f in ("flags.py", "run_setup.py", "train.py") else set()
        assert imports <= allowed, (f, imports)


@pytest.mark.parametrize("name", ALGORITHM)
def test_lines_at_most_100_characters(name):
    long = [i for i, line in enumerate(source(name).splitlines(), 1) if len(line) > 100]
    assert not long, f"{name}: lines over 100 characters: {long}"


@pytest.mark.parametrize("name", ALGORITHM)
def test_functions_at_most_60_lines(name):
    tree = ast.parse(source(name))
    long = [(n.name, n.end_lineno - n.lineno + 1) for n in ast.walk(tree)
            if isinstance(n, ast.FunctionDef) and n.end_lineno - n.lineno + 1 > 60]
    assert not long, f"{name}: functions over 60 lines: {long}"


def test_the_spine_s_four_files_under_spine_lines():
    lines = sum(len(source(f).splitlines()) for f in SPINE)
    assert lines <= SPINE_LINES, f"{SPINE}: {lines} lines, more than {SPINE_LINES}"


def test_rollout_py_under_300_lines():
    # the record, its batching and the trainer's forward; the engine and the canary: engine.py
    assert len(source("rollout.py").splitlines()) < 300


def _takes_args(fn) -> bool:
    params = fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs
    return any(a.arg == "args" or (a.annotation is not None and "Args" in ast.unparse(a.annotation))
               for a in params)


# the verifier's insides never see a flag; their `args` are a function's arguments
FENCED = ("mathparse", "mathcheck")


@pytest.mark.parametrize("module", sorted(set(FLOOR) - set(FENCED) - {"methods"})
                         + [f"methods.{w}" for w in WINGS])
def test_no_function_below_setup_takes_or_stores_args(module):
    """A function that takes `args` (or anything annotated Args) is one of TAKE_ARGS; no attribute,
    field or record stores it (self.x = args, a field annotated Args)."""
    tree = ast.parse(source(module.replace(".", "/") + ".py"))
    takes = {n.name for n in ast.walk(tree)
             if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and _takes_args(n)}
    assert not {(module, name) for name in takes} - TAKE_ARGS, (module, sorted(takes))
    stores = [ast.unparse(n) for n in ast.walk(tree)
              if (isinstance(n, ast.Assign) and isinstance(n.value, ast.Name)
                  and n.value.id == "args" and any(isinstance(t, ast.Attribute)
                                                   for t in n.targets))
              or (isinstance(n, ast.AnnAssign) and "Args" in ast.unparse(n.annotation))]
    assert not stores, (module, stores)


def test_the_args_check_catches_a_function_that_takes_them():
    """The check above is not vacuous: it sees a helper that takes the flags whole, and one that
    keeps them."""
    tree = ast.parse("def f(model, args):\n    pass\nclass R:\n    def __init__(self, args):\n"
                     "        self.args = args\n")
    assert {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)
            and _takes_args(n)} == {"f", "__init__"}


# ---- the spine names no other paper -------------------------------------------------------------

PAPERS = ("r2po", "r²po", "vigor", "dapo", "gspo", "pnpo", "m2po", "headroom", "drift",
          "mu-grpo", "mu_grpo", "drgrpo", "dr. grpo", "veto", "overlong", "dynamic_sampling",
          "rarity", "residual head")


def code_without_prose(path: str) -> str:
    """The module's code as ast.unparse writes it, with every docstring left out (and so every
    comment, which ast drops): the reading the trainer's code hash takes (cli.code_without_prose,
    bench/runs.py)."""
    return cli.code_without_prose(source(path))


# a method's flag that is an ordinary word the spine uses for its own (a local `adv`): the
# method's values name it instead ("drgrpo")
ORDINARY = {"adv", "allocation"}


def wing_words() -> set[str]:
    """What names a method in code: its flags (--vigor-top, ...), its presets and the values it
    adds to a spine flag (gspo, headroom-drift, ...); ORDINARY words aside."""
    words = set()
    for wing in methods.loaded():
        owner = getattr(wing, "Flags", None)
        words |= {f.name for f in dataclasses.fields(owner)} if owner else set()
        words |= set(getattr(wing, "PRESETS", {}))
        words |= {v for values in getattr(wing, "CHOICES", {}).values() for v in values}
    return words - ORDINARY


@pytest.mark.parametrize("name", sorted(f for f in os.listdir(ROOT) if f.endswith(".py")))
def test_the_spine_names_no_other_paper(name):
    """No top-level module's code (its docstrings and comments aside) names another paper, a
    method file's flag, preset or choice: a string, a name or an attribute. The method files in
    methods/ hold them."""
    code = code_without_prose(name)
    low = code.lower()
    assert not [p for p in PAPERS if p in low], (name, [p for p in PAPERS if p in low])
    tree = ast.parse(code)
    used = ({n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
            | {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
            | {n.arg for n in ast.walk(tree) if isinstance(n, ast.keyword) and n.arg}
            | {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant)
               and isinstance(n.value, str)})
    assert not used & wing_words(), (name, sorted(used & wing_words()))


def test_the_paper_check_sees_a_paper():
    """The check above is not vacuous: a string, an attribute and a keyword that name a method."""
    words = wing_words()
    assert {"gspo", "vigor_top", "headroom-drift", "m2po_tau"} <= words
    code = "x = run.vigor_top; f(m2po_tau=1); k = 'gspo'"
    tree = ast.parse(code)
    used = ({n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
            | {n.arg for n in ast.walk(tree) if isinstance(n, ast.keyword) and n.arg}
            | {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant)})
    assert used & words == {"vigor_top", "m2po_tau", "gspo"}


def test_train_py_s_docstring_is_a_short_contract_that_starts_with_grpo_and_replay():
    doc = ast.get_docstring(ast.parse(source("train.py")), clean=False)
    assert len(doc.splitlines()) <= 25
    assert doc.startswith("GRPO with rollout-level, advantage-prioritized experience replay")


def test_the_experiment_harness_files_under_600_lines():
    """bench/'s harness is split by job (design, protocol, runs, verdicts, report, plots,
    headline, ...): no file of it grows past 600 lines."""
    bench = os.path.join(ROOT, "bench")
    long = {f: n for f in sorted(os.listdir(bench)) if f.endswith(".py")
            and (n := len(source(os.path.join("bench", f)).splitlines())) > 600}
    assert not long, long
