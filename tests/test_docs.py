"""The documentation is the code's: docs/flags.md is `python train.py --help`, every relative link
in the docs resolves to a file of the repository, docs/methods.md names only train.py's flags, and
no doc cites an issue number.

    python tests/test_docs.py --write      # regenerate docs/flags.md after changing a flag or its
                                           # help text
    python -m pytest -q tests/test_docs.py

The help is taken at COLUMNS=100, so argparse wraps it the same everywhere, with the repository's
absolute path removed from the defaults (`--model`'s default is a path inside the repository). The
comparison ignores how lines are wrapped: that path's length, which differs between checkouts, moves
argparse's line breaks.
"""
import functools
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FLAGS_MD = ROOT / "docs" / "flags.md"
REGENERATE = "python tests/test_docs.py --write"
HEADER = f"""# Flags of train.py

This page is `python train.py --help` (at `COLUMNS=100`), pinned by `tests/test_docs.py`: after
changing a flag, regenerate it with `{REGENERATE}`. What each method's
preset sets: [methods.md](methods.md).
"""
FENCE = "```"


def doc_files() -> list[Path]:
    """README.md, docs/*.md, bench/README.md and ops/README.md: the documentation a reader of the
    repository has."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "bench" / "README.md",
            ROOT / "ops" / "README.md"]


@functools.lru_cache(maxsize=1)
def help_text() -> str:
    """`python train.py --help`, run from the repository root, the repository's path removed."""
    env = dict(os.environ, COLUMNS="100", NO_COLOR="1", PYTHON_COLORS="0", OMP_NUM_THREADS="1")
    env.pop("FORCE_COLOR", None)
    out = subprocess.run([sys.executable, "train.py", "--help"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, f"python train.py --help failed:\n{out.stderr}"
    return out.stdout.replace(str(ROOT) + os.sep, "").rstrip() + "\n"


def flags_page(help_out: str) -> str:
    return f"{HEADER}\n{FENCE}text\n{help_out}{FENCE}\n"


def flags_block(page: str) -> str:
    """The text of docs/flags.md's one ```text block."""
    m = re.search(r"^```text\n(.*?)^```$", page, re.S | re.M)
    assert m, f"docs/flags.md has no ```text block: regenerate it with {REGENERATE}"
    return m.group(1)


def _words(text: str) -> list[str]:
    return text.split()


def test_flags_md_is_train_help():
    page = FLAGS_MD.read_text(encoding="utf-8")
    want = help_text()
    have = flags_block(page)
    if _words(have) != _words(want):
        first = next((i for i, (a, b) in enumerate(zip(_words(have), _words(want))) if a != b),
                     min(len(_words(have)), len(_words(want))))
        context = " ".join(_words(want)[max(0, first - 8):first + 8])
        raise AssertionError(
            f"docs/flags.md is not `python train.py --help` (first difference near: {context!r}): "
            f"regenerate it with {REGENERATE}")


LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")


def _prose(text: str) -> str:
    """The text outside fenced code blocks (links in code are not links)."""
    return re.sub(r"^```.*?^```[ \t]*$", "", text, flags=re.S | re.M)


def relative_links(path: Path) -> list[str]:
    links = LINK.findall(_prose(path.read_text(encoding="utf-8")))
    return [t for t in links
            if not re.match(r"[a-z][a-z0-9+.-]*:", t, re.I) and not t.startswith("#")]


def test_relative_links_resolve():
    broken = []
    for doc in doc_files():
        for target in relative_links(doc):
            resolved = (doc.parent / target.split("#", 1)[0]).resolve()
            if not resolved.exists():
                broken.append(f"{doc.relative_to(ROOT)}: {target} (no such file)")
            elif ROOT != resolved and ROOT not in resolved.parents:
                broken.append(f"{doc.relative_to(ROOT)}: {target} (outside the repository)")
    assert not broken, "broken relative links:\n" + "\n".join(broken)


ISSUE_NUMBER = re.compile(r"\bissues?\s+#?\d+|#\d+", re.I)


def test_no_issue_numbers():
    """A reader has only the repository: an issue number is a pointer to nothing."""
    found = []
    for doc in doc_files():
        for n, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), 1):
            found += [f"{doc.relative_to(ROOT)}:{n}: {m.group(0)!r}"
                      for m in ISSUE_NUMBER.finditer(line)]
    assert not found, "issue numbers in the docs:\n" + "\n".join(found)


def test_methods_md_names_only_train_flags():
    """Every `--flag` in docs/methods.md is one of train.py's (a renamed flag shows here), the
    command that regenerates docs/flags.md aside."""
    known = set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", help_text()))
    text = (ROOT / "docs" / "methods.md").read_text(encoding="utf-8").replace(REGENERATE, "")
    used = set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", text))
    assert not used - known, (
        f"docs/methods.md names flags train.py does not have: {sorted(used - known)}")


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit(f"usage: {REGENERATE}   (or: python -m pytest -q tests/test_docs.py)")
    FLAGS_MD.parent.mkdir(exist_ok=True)
    FLAGS_MD.write_text(flags_page(help_text()), encoding="utf-8")
    print(f"wrote {FLAGS_MD.relative_to(ROOT)}")
