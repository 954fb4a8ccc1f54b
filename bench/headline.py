"""The README's headline table (headline_rows, headline_table) and docs/results.md's every claim
and stress lrs, from every archived summary.json (bench/report.py writes them); nothing here
runs. `python bench/experiments.py --headline` prints it."""
import json
from pathlib import Path

from papers import EXPERIMENTS
from report import claim_cell, claim_words, md_row, pairing, points


def headline_rows(results_dir: Path, every: bool = False) -> tuple[list[list[str]], list[Path]]:
    """(rows, skipped): a row [paper, setting, arm vs reference, the paper's claim, Δ [95% CI],
    pairing, verdict, Holm verdict] per headline claim (Claim.headline; a setting without one: its
    first claim with a direction), or with `every` per claim with a direction, of every
    RESULTS_DIR/*/**/summary.json (the experiments in EXPERIMENTS' order, then by path); skipped:
    the summary.json files without comparisons (written before verdicts were)."""
    rows, skipped = [], []
    for path, data in summaries(results_dir):
        if "comparisons" not in data:
            skipped.append(path)
            continue
        directed = [c for c in data["comparisons"] if c["direction"] is not None]
        if not every:
            directed = [c for c in directed if c.get("headline")] or directed[:1]
        for c in directed:
            rows.append([data.get("paper") or path.parent.parent.name, data["setting"],
                         claim_cell(c), claim_words(c["direction"]),
                         points(c), pairing(c), c["verdict"], c.get("holm", "—")])
    return rows, skipped


def summaries(results_dir: Path) -> list[tuple[Path, dict]]:
    """Every RESULTS_DIR/*/**/summary.json, the experiments in EXPERIMENTS' order, then by path."""
    order = {name: i for i, name in enumerate(EXPERIMENTS)}
    paths = sorted(Path(results_dir).glob("*/**/summary.json"),
                   key=lambda p: (order.get(p.relative_to(results_dir).parts[0], len(order)), p))
    return [(path, json.loads(path.read_text())) for path in paths]


def lr_text(lr: float | str) -> str:
    """An lr as the docs write it: 1e-4, 3e-5, 2e-5."""
    mantissa, exponent = f"{float(lr):.0e}".split("e")
    return f"{mantissa}e{int(exponent)}"


def stress_lr_rows(results_dir: Path) -> list[list[str]]:
    """A row [experiment, setting, arm, its mean final dev accuracy at every lr of the dev sweep
    (the shared lr in bold), its best there, the shared lr's cost against that best] per arm of
    every shared-lr setting whose summary.json has dev_lrs: the shared lr was chosen by the
    baseline's collapse alone (stress_lr), and this is what it costs each arm."""
    rows = []
    for path, data in summaries(results_dir):
        shared = data.get("shared_lr")
        for arm, per in (data.get("dev_lrs") or {}).items():
            if not per:
                continue
            cells = [f"**{lr_text(k)}: {100 * v:.1f}**" if float(k) == shared
                     else f"{lr_text(k)}: {100 * v:.1f}"
                     for k, v in sorted(per.items(), key=lambda kv: float(kv[0]))]
            best_lr, best = max(per.items(), key=lambda kv: kv[1])
            best_lr = lr_text(best_lr)
            at = per.get(f"{shared:g}")
            cost = "—" if at is None else f"{100 * (at - best):+.1f}"
            rows.append([data.get("experiment") or path.parent.parent.name,
                         f"{data['setting']} (shared lr {lr_text(shared)})", arm,
                         ", ".join(cells), f"{100 * best:.1f} at {best_lr}", cost])
    return rows


def headline_table(results_dir: Path, every: bool = False) -> str:
    """The README's headline table (markdown) from the experiments' summary.json files: paper,
    setting, arm vs baseline, what the paper claims, Δ [95% CI] in points (final test accuracy
    unless the claim names another metric), paired or unpaired (Welch), the verdict; a row per
    headline claim, or with `every` per claim (docs/results.md's); then, beside the stress rows,
    every arm of each shared-lr setting at every lr of its dev sweep (stress_lr_rows)."""
    text = headline_markdown(headline_rows(results_dir, every)[0])
    stress = stress_lr_rows(results_dir)
    if not stress:
        return text
    intro = ("\nThe stress rows' shared lr, each arm on its setting's dev sweep: mean final dev "
             "accuracy (%) at the shared lr against its own best lr there. The shared lr was "
             "chosen by the baseline alone: where it is unstable on dev (stress_lr; R²PO's "
             "arith-stress: the lr every arm chose, its stress the head's lr), by no other "
             "arm.\n\n")
    if not every:                      # the README's: a row per setting, its intro there
        by_setting = {}
        for row in stress:
            at = row[3].split("**")[1].split(": ")[1] if "**" in row[3] else "—"
            by_setting.setdefault((row[0], row[1]), []).append(f"{row[2]} {at} (best {row[4]})")
        text += "\n| experiment | setting | each arm at the shared lr (its best on dev) |\n"
        text += "|---|---|---|\n"
        return text + "".join(md_row([e, s, "; ".join(cells)]) + "\n"
                              for (e, s), cells in by_setting.items())
    text += intro
    text += ("| experiment | setting | arm | dev accuracy by lr (the shared lr in bold) | its best "
             "| shared lr's cost (points) |\n|---|---|---|---|---|---|\n")
    return text + "".join(md_row(row) + "\n" for row in stress)


def headline_markdown(rows: list[list[str]]) -> str:
    out = ["| paper | setting | arm vs baseline | the paper claims | Δ [95% CI] | paired? | "
           "verdict | Holm (setting) |", "|---|---|---|---|---|---|---|---|"]
    out += [md_row(r) for r in rows]
    return "\n".join(out) + "\n"
