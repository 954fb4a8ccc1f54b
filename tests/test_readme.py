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


HEADLINE = ("<!-- python bench/experiments.py --headline -->", "<!-- end of the headline table -->")


def between(text: str, markers: tuple[str, str], page: str) -> str:
    """What a page holds between a generated block's two markers, stripped."""
    assert markers[0] in text and markers[1] in text, f"{page} lost its markers {markers}"
    return text.split(markers[0], 1)[1].split(markers[1], 1)[0].strip()


def test_readme_and_results_page_headline_tables_are_generated():
    """The headline tables of README.md and docs/results.md are what `python bench/experiments.py
    --headline` (README: the headline claims) and `--headline --every-claim` (docs/results.md)
    print from the committed bench/results/*/**/summary.json, not written by hand."""
    import sys
    sys.path.insert(0, str(ROOT / "bench"))
    from headline import headline_table
    for page, every in (("README.md", False), ("docs/results.md", True)):
        want = headline_table(ROOT / "bench" / "results", every).strip()
        text = (ROOT / page).read_text(encoding="utf-8")
        got = between(text, HEADLINE, page)
        assert got == want, f"{page}'s headline table is stale: run bench/experiments.py --headline"


LOOK = ("<!-- python bench/experiments.py --look bench/results/replay/smollm2-draws -->",
        "<!-- end of the look's tables -->")


def test_smollm2_page_look_tables_are_generated():
    """docs/smollm2.md's tables of the pre-registered draws (the claims at their look, a row per
    arm) are what `python bench/experiments.py --look bench/results/replay/smollm2-draws` prints
    from the committed summary.json, not written by hand."""
    import json
    import sys
    sys.path.insert(0, str(ROOT / "bench"))
    from report import look_tables
    summary = ROOT / "bench" / "results" / "replay" / "smollm2-draws" / "summary.json"
    want = look_tables(json.loads(summary.read_text())).strip()
    text = (ROOT / "docs" / "smollm2.md").read_text(encoding="utf-8")
    got = between(text, LOOK, "docs/smollm2.md")
    assert got == want, "docs/smollm2.md's look tables are stale: run bench/experiments.py --look"


READING = (r"calls\s+(\d+)\s+project\s+functions\s+within\s+3\s+calls\s+of\s+`train\(\)`,\s+in\s+"
           r"(\d+)\s+files\s+with\s+(\d+)\s+file\s+switches;\s+the\s+four\s+files\s+are\s+"
           r"([\d,]+)\s+lines")


def test_readme_reading_path_is_what_trace_step_prints(tmp_path):
    """README's reading path (the functions one default step opens within 3 calls of train(), in
    how many files, with how many file switches, and the spine's four files' lines) is what
    `python bench/trace_step.py` counts now: a refactor that moves them says so here."""
    import re
    import sys
    sys.path.insert(0, str(ROOT / "bench"))
    import trace_step
    order, _ = trace_step.trace(3, str(tmp_path / "run"))
    switches = sum(a[0] != b[0] for a, b in zip(order, order[1:]))
    lines = sum(len((ROOT / name).read_text().splitlines()) for name in trace_step.SPINE)
    found = re.search(READING, readme())
    assert found, "README.md lost its reading-path sentence"
    said = [int(g.replace(",", "")) for g in found.groups()]
    assert said == [len(order), len({f for f, _ in order}), switches, lines], (
        "README's reading path is stale: `python bench/trace_step.py` prints "
        f"{len(order)} functions, {len({f for f, _ in order})} files, {switches} switches, "
        f"{lines} lines")
