"""README.md's flags table is train.py's flags: every flag, its default and its help text, in order.

    python tests/test_readme.py        # prints the table, to paste into README.md after changing a flag
"""
import dataclasses
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import flags  # noqa: E402
import train  # noqa: E402


def flag_rows() -> list[str]:
    docs = flags.field_docs(train.Args)
    rows = []
    for f in dataclasses.fields(train.Args):
        default = os.path.relpath(f.default, ROOT) if f.name in ("model", "data_dir") else f.default
        rows.append(f"| `--{f.name.replace('_', '-')}` | `{default}` | {docs[f.name].replace('|', chr(92) + '|')} |")
    return rows


def test_readme_flags_table_is_the_code():
    with open(os.path.join(ROOT, "README.md")) as f:
        readme = f.read().splitlines()
    start = readme.index("## Flags")
    end = next(i for i in range(start + 1, len(readme)) if readme[i].startswith("## "))
    table = [ln for ln in readme[start:end] if ln.startswith("| `--")]
    assert table == flag_rows(), "README.md's flags table is stale: regenerate it with python tests/test_readme.py"


if __name__ == "__main__":
    print("\n".join(flag_rows()))
