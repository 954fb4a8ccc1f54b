"""README.md is the front door: the two set-up commands every newcomer runs, verbatim, the test
command the one CI runs, and short enough to read (the long tables live in docs/, checked by
tests/test_docs.py)."""
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SETUP_COMMANDS = (
    "pip install -r requirements.txt && python train.py",
    "pip install -r requirements.txt && python -m pytest -q",
)
MAX_LINES = 220


def readme() -> str:
    return (ROOT / "README.md").read_text(encoding="utf-8")


def test_readme_has_the_setup_commands():
    lines = [line.split("#", 1)[0].strip() for line in readme().splitlines()]
    for command in SETUP_COMMANDS:
        assert command in lines, f"README.md lost its set-up command {command!r}"


def test_readme_test_command_is_what_ci_runs():
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert "python -m pip install -q -r requirements.txt" in [line.strip() for line in ci]
    assert "python -m pytest -q" in [line.strip() for line in ci], (
        ".ci/run no longer runs README's test command")


def test_readme_is_short():
    n = len(readme().splitlines())
    assert n < MAX_LINES, (
        f"README.md has {n} lines: keep it a front door (< {MAX_LINES}), move detail to docs/")
