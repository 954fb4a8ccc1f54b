"""What every test module shares: the import paths (the repository's flat modules, assets/ for
make_tiny_model, bench/ for the benchmark scripts, tests/ for tiny.py) and the built-in tiny model.

    def test_something(tiny_model):
        model, tok = tiny_model          # a fresh copy of assets/tiny-arith, fp32, on the CPU
"""
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY_MODEL = os.path.join(ROOT, "assets", "tiny-arith")

for path in (os.path.join(ROOT, "tests"), os.path.join(ROOT, "bench"), os.path.join(ROOT, "assets"), ROOT):
    if path not in sys.path:
        sys.path.insert(0, path)


@pytest.fixture
def tiny_model():
    """(model, tokenizer) of the shipped tiny model, loaded anew for each test (0.8M parameters: a test
    may train it)."""
    from rollout import load_model
    return load_model(TINY_MODEL)
