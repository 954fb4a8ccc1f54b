"""The house's shape, pinned: imports point one way (each module imports only modules on floors
below its own), no function below train.setup takes or stores train.py's `Args` (the flags are bound
at the door), the algorithm's modules keep lines to 100 characters and functions to 60 lines, and
rollout.py stays under 460 lines. A change that breaks one of these says so here."""
import ast
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Bottom to top (../shared/DESIGN.md): plain machinery that imports no method (the math, the data,
# the verifier, collectives, checkpoints, metrics); the record, its batching and the engine
# (rollout.py); the method objects, each bound from its own flags (the replay, the engines, the
# objective, the allocation and VIGOR, R²PO) and the eval; flags.py, which composes every owner's
# flags (so the eval's, too, sit below it); train.py.
FLOORS = [
    ("mathparse", "cli", "data", "grpo", "reward_fn"),
    ("mathcheck", "parallel"),
    ("verify", "checkpoint"),
    ("metrics",),
    ("rollout",),
    ("vllm_engine", "buffer", "vigor", "objective", "allocation", "r2po", "eval"),
    ("flags",),
    ("train",),
]
FLOOR = {name: level for level, names in enumerate(FLOORS) for name in names}
ALGORITHM = ("train.py", "grpo.py", "buffer.py", "rollout.py", "r2po.py", "metrics.py",
             "parallel.py", "flags.py", "vigor.py", "cli.py", "objective.py", "allocation.py",
             "reward_fn.py")
# Where train.py's flags may be taken whole: the door (train.setup, train.main; flags.py's bounds,
# sizes and memory check; cli.part, which cuts an owner's flags out of them) and
# the checkpoint's (de)serialiser, which writes them as args.json (it takes them as a dict).
# eval.py's own CLI has its own Args.
TAKE_ARGS = {("train", "setup"), ("train", "main"), ("cli", "part"), ("flags", "check_args"),
             ("flags", "fits_machine"),
             ("flags", "_rules"), ("flags", "sizes"), ("flags", "changed"),
             ("flags", "micro_batch_tokens"), ("flags", "update_memory"),
             ("flags", "check_sizes"), ("eval", "load_inputs"), ("eval", "main")}


def source(name: str) -> str:
    with open(os.path.join(ROOT, name)) as f:
        return f.read()


def project_imports(module: str) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(source(module + ".py"))):
        if isinstance(node, ast.Import):
            out |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module.split(".")[0])
    return out & set(FLOOR)


def test_every_top_level_module_has_a_floor():
    modules = {f[:-3] for f in os.listdir(ROOT) if f.endswith(".py")}
    assert modules == set(FLOOR)


@pytest.mark.parametrize("module", sorted(FLOOR))
def test_imports_point_down(module):
    up = {m for m in project_imports(module) if FLOOR[m] >= FLOOR[module]}
    assert not up, f"{module}.py imports {sorted(up)}, which are not below it"


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


def test_rollout_py_under_460_lines():
    # 450 until TorchEngine's group-shared prefill (each prompt prefilled once) added its lines
    assert len(source("rollout.py").splitlines()) < 460


def _takes_args(fn) -> bool:
    params = fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs
    return any(a.arg == "args" or (a.annotation is not None and "Args" in ast.unparse(a.annotation))
               for a in params)


# the verifier's insides never see a flag; their `args` are a function's arguments
FENCED = ("mathparse", "mathcheck")


@pytest.mark.parametrize("module", sorted(set(FLOOR) - set(FENCED)))
def test_no_function_below_setup_takes_or_stores_args(module):
    """A function that takes `args` (or anything annotated Args) is one of TAKE_ARGS; no attribute,
    field or record stores it (self.x = args, a field annotated Args)."""
    tree = ast.parse(source(module + ".py"))
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
