"""The house's shape, pinned: imports point one way (each module imports only modules on floors
below its own), the algorithm's modules keep lines to 100 characters and functions to 60 lines,
and rollout.py stays under 450 lines. A change that breaks one of these says so here."""
import ast
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Bottom to top. R²PO's head step is a distributed optimizer step of its own, so r2po.py sits above
# the machinery it uses (parallel.py, metrics.py); buffer.py, vigor.py and vllm_engine.py need only
# rollout.py.
FLOORS = [
    ("mathparse", "cli", "data", "grpo", "checkpoint"),
    ("mathcheck",),
    ("verify", "rollout"),
    ("parallel", "vllm_engine", "buffer", "vigor"),
    ("metrics",),
    ("r2po",),
    ("flags", "eval"),
    ("train",),
]
FLOOR = {name: level for level, names in enumerate(FLOORS) for name in names}
ALGORITHM = ("train.py", "grpo.py", "buffer.py", "rollout.py", "r2po.py", "metrics.py",
             "parallel.py", "flags.py", "vigor.py", "cli.py")


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


def test_rollout_py_under_450_lines():
    assert len(source("rollout.py").splitlines()) < 450
