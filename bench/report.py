"""The report: a setting's results.md (the arms' table, the verdicts, the sweep), sweep.md, the
plots (bench/plots.py) and summary.json (write_setting). The README's headline table from every
summary.json: bench/headline.py. Numbers come from bench/verdicts.py's analyse; nothing here runs.
"""
import json
import statistics
import sys
from pathlib import Path

from design import EXTEND, Experiment
from plots import plots, swept
from protocol import code_line
from stats import mean_std
from verdicts import BUDGETS, PAR_MARGIN, TARGET_FRAC, VERDICT_RULE, analyse, pooled


def md_row(cells) -> str:
    """A markdown table row; a "|" inside a cell (|A|) escaped, so that it does not split it."""
    return "| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"


def fmt(x, spec: str) -> str:
    return "—" if x is None else format(x, spec)


def runs_mean(rs: list[dict], key: str) -> float | None:
    """The mean over runs of each run's mean over its steps of `key`; None where a run has none."""
    vals = [r["means"].get(key) for r in rs]
    return None if any(v is None for v in vals) else statistics.mean(vals)


def run_minutes(r: dict) -> float:
    """A run's wall time (its `done` file's seconds), in minutes."""
    return r["run_s"] / 60


def peak_gb(r: dict) -> float:
    """A run's peak resident memory, in GB (10^9 bytes)."""
    return r["peak_rss_kb"] / 1e6


def points(c: dict | None) -> str:
    """Δ [95% CI] of a comparison_json, in percentage points."""
    if c is None or c["delta"] is None:
        return "—"
    lo, hi = c["ci"]
    ci = "—" if lo is None else f"{100 * lo:+.1f}, {100 * hi:+.1f}"
    return f"{100 * c['delta']:+.1f} [{ci}]"


def pairing(c: dict | None) -> str:
    """paired / unpaired (Welch); a pooled claim's: the pairs it holds, setting by setting."""
    if c is None or c["paired"] is None:
        return "—"
    if c.get("settings"):
        held = ", ".join(f"{n} in {label}" for label, n in c["settings"].items())
        return f"paired over {sum(c['settings'].values())} pairs ({held})"
    return "paired" if c["paired"] else "unpaired (Welch)"


def claim_cell(c: dict) -> str:
    """"arm vs reference (metric)", with what the row shows where it is not the paper's claim
    (Claim.note) and the Δ of the arm beside it against the same reference (Claim.beside)."""
    metric = "" if c["metric"] == "final" else f" ({c['metric']})"
    text = f"{c['arm']} vs {c['against']}{metric}"
    if c.get("note"):
        text += f": {c['note']}"
    if c.get("beside"):
        text += f"; beside it {c['beside']['arm']} vs {c['against']} {points(c['beside'])}"
    return text


def claim_words(direction: int | None) -> str:
    return {1: "better", -1: "worse", 0: f"on par (±{100 * PAR_MARGIN:g})", None: "no claim"}[
        direction]


def time_cell(t: dict | None, spec: str) -> str:
    """x to target: the mean (≥ where seeds are censored: a lower bound) and reached k/n."""
    if t is None:
        return "—"
    return f"{mean_cell(t, spec)} ({t['reached']}/{t['n']})"


def mean_cell(t: dict, spec: str, scale: float = 1) -> str:
    """A time to target's mean / scale, "≥ " before it where it is a lower bound."""
    return ("≥ " if t["lower_bound"] else "") + format(t["mean"] / scale, spec)


def ratio_cell(t: dict | None) -> str:
    if t is None or t["ratio"] is None:
        return "—"
    return {"=": "", ">=": "≥ ", "<=": "≤ "}[t["bound"]] + f"{t['ratio']:.2f}"


def table(summary: dict, analysis: dict | None = None) -> str:
    """The tables of one setting's results.md: the arms, then every claim's verdict."""
    s, runs, chosen = summary["setting"], summary["runs"], summary["chosen"]
    a_ = analysis or analyse(summary)
    start, target = a_["start"], a_["target"]
    x_name = {"fresh": "fresh rollouts", "updates": "updates"}[s.x]
    verdicts = {c["arm"]: c for c in reversed(a_["comparisons"]) if c["against"] == s.baseline}
    head = (f"start (step 0, every run) {100 * start:.1f}%; target = start + {TARGET_FRAC:g} x "
            f"({s.baseline}'s gain) = {fmt(target and 100 * target, '.1f')}%. Final test acc: "
            "each run's mean of its last two evaluations, mean ± std over seeds. Δ: paired over "
            "the seeds both arms ran where they share the prompt stream (SE = sd(d) / sqrt(n), "
            "df = n - 1), else Welch's; 95% CI = Δ ± t(0.975, df) SE, in points. To target: per "
            "seed, where its curve first reaches the target (interpolated between evaluations); "
            "a seed that never does counts at its budget (censored), so the mean is a lower bound "
            "(≥) and the ratio to the baseline a bound (≥ where only the arm's seeds are "
            "censored, ≤ where only the baseline's, — where both). Accuracy at a budget: "
            f"interpolated at {', '.join(f'{100 * q:g}%' for q in BUDGETS)} of the baseline's "
            f"x-range ({a_['x_range']:,.0f} {x_name}), — past a run's end; Δ [95% CI] as above. "
            "AES: O1-Pruner's accuracy-efficiency score (eval.aes; 0 for the baseline, above 0 "
            "better) of the mean final accuracy and the mean response length of the last "
            "training step (sampled rollouts).")
    cols = ["arm", "lr", "seeds", "final test acc", f"Δ vs {s.baseline} [95% CI]", "SE", "df",
            "pairing", f"{x_name} to target (reached)", "ratio", "wall s to target (reached)",
            "ratio", *(f"acc {b['label']} ({b['x']:,.0f})" for b in a_["budgets"]), "verdict",
            "gain over step 0 [95% CI] (course)", "length start → end",
            f"AES vs {s.baseline}", "refreshes (= syncs)", "updates",
            "generate / update s",
            *(f"final {c}" for c, _ in s.finals), *(c for c, _ in s.diagnostics)]
    out = [head, "", md_row(cols), "|" + "---|" * len(cols)]
    for a in (a for a in s.arms if a.name in runs):         # a reading not chosen is not reported
        rs, e = runs[a.name], a_["arms"][a.name]
        d = e["delta"]
        avg = lambda key: statistics.mean(r[key] for r in rs if r.get(key) is not None) \
            if any(r.get(key) is not None for r in rs) else None                  # noqa: E731
        diag = [fmt(runs_mean(rs, k), ".3g") for _, k in s.diagnostics]
        lasts = []
        for _, k in s.finals:
            vals = [r["last"][k] for r in rs if r["last"].get(k) is not None]
            lasts.append(f"{100 * mean_std(vals)[0]:.1f} ± {100 * mean_std(vals)[1]:.1f}"
                         if vals else "—")
        at = []
        for b in a_["budgets"]:
            cell = e["at"][b["label"]]
            held = f" [{cell['n']}/{len(rs)} seeds]" if cell["n"] < len(rs) else ""
            at.append(fmt(cell["mean"] and 100 * cell["mean"], ".1f") + held + (
                f" ({points(cell['delta'])})" if cell["delta"] else ""))
        v = verdicts.get(a.name)
        word = "—" if v is None else v["verdict"] + (
            f" ({v['metric']})" if v["metric"] != "final" else "")
        cells = [a.name, f"{chosen[a.name]:g}", str(len(rs)),
                 f"{100 * e['final']['mean']:.1f} ± {100 * e['final']['std']:.1f}",
                 points(d), fmt(d and d["se"] and 100 * d["se"], ".2f"),
                 fmt(d and d["df"], ".3g"), pairing(d),
                 time_cell(e["to_target"], ",.0f"), ratio_cell(e["to_target"]),
                 time_cell(e["wall_to_target"], ".1f"), ratio_cell(e["wall_to_target"]), *at,
                 word, f"{points(e.get('gain'))} ({e.get('course', '—')})",
                 f"{fmt(avg('len_start'), '.1f')} → {fmt(avg('len_end'), '.1f')}",
                 fmt(e["aes"], "+.3f"),
                 fmt(avg("refreshes"), ".0f"), fmt(avg("updates"), ".0f"),
                 f"{fmt(avg('gen'), '.1f')} / {fmt(avg('upd'), '.1f')}", *lasts, *diag]
        out.append(md_row(cells))
    gate = a_.get("gate")
    if gate:
        out += ["", f"The learning gate: this setting's baseline {s.baseline} gained "
                    f"{points(gate['gain'])} points over its step-0 accuracy (paired over its "
                    f"seeds): {'it learns' if gate['learned'] else 'it does not learn'}. Each "
                    "claim reads its own two arms' courses (the gain column: learns, flat, "
                    "degrades): where its reference does not learn, its verdict says what it "
                    "shows instead (VERDICT_RULE)."]
    out += ["", cpu_line(runs)]
    out += ["", "Verdicts:", "", "| claim | metric | the paper claims | Δ [95% CI] | SE | df | "
            "pairing | mechanism acted | verdict | Holm (setting) |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for c in a_["comparisons"]:
        out.append(md_row([f"{c['arm']} vs {c['against']}", c["metric"],
                           claim_words(c["direction"]), points(c),
                           fmt(c["se"] and 100 * c["se"], ".2f"), fmt(c["df"], ".3g"),
                           pairing(c), acted_cell(c["diagnostic"]) + post_hoc_cell(c),
                           c["verdict"], c.get("holm", "—")]))
    return "\n".join(out) + "\n"


def sequential_table(analysis: dict) -> str:
    """A group-sequential setting's reading (bench/sequential.py): the look, each look's nominal
    p, and every claim's Δ, p, Holm-adjusted p and the rule's word; "" for another setting."""
    q = analysis.get("sequential")
    if not q:
        return ""
    looks = ", ".join(f"{n} seeds: p < {p:.4f}" for n, p in zip(q["looks"], q["nominal_p"]))
    crossed = q["primary_p"] is not None and q["primary_p"] < q["threshold"]
    where = ("the primary crossed: the runs stop here" if crossed else
             "the last look: the runs stop here, the primary not crossing" if q["stops"] else
             "the primary did not cross: the runs go on to the next look")
    out = ["", f"**The group-sequential rule** (bench/sequential.py, fixed before the runs): "
               f"O'Brien-Fleming nominal two-sided thresholds ({looks}) for the primary claim; "
               f"the secondaries read where the primary stops, Holm over the claims whose "
               f"mechanism acted, against that look's threshold. Read at look {q['look']} of "
               f"{len(q['looks'])} ({q['n']} complete seeds, every arm of each on one CPU kind): "
               f"{where}.", ""]
    return "\n".join(out) + "\n" + look_rows(analysis)


def look_rows(analysis: dict) -> str:
    """The table of sequential_table: every claim's role, Δ [95% CI], SE, df, p, Holm p, the rule's
    word at this look and the fixed-sample word beside it."""
    out = ["| claim | role | Δ [95% CI] | SE | df | p | Holm p | verdict (the rule) | "
           "fixed-sample word |", "|---|---|---|---|---|---|---|---|---|"]
    for c in analysis["comparisons"]:
        role = "primary" if c.get("primary") else "secondary"
        out.append(md_row([claim_cell(c), role, points(c),
                           fmt(c["se"] and 100 * c["se"], ".2f"), fmt(c["df"], ".3g"),
                           fmt(c.get("p"), ".2g"), fmt(c.get("holm_p"), ".2g"), c["verdict"],
                           c.get("unadjusted", "—")]))
    return "\n".join(out) + "\n"


def gates_table(analysis: dict) -> str:
    """Setting.arm_gates: what each arm's mechanism did over every step of every reported seed,
    each check with its value and whether it holds; "" where the setting has none."""
    rows = [(name, g) for name, e in analysis["arms"].items() for g in e.get("gates", [])]
    if not rows:
        return ""
    out = ["", "What each arm's draw did (every step of every reported seed; each check can "
               "fail):", "", "| arm | check | value | holds |", "|---|---|---|---|"]
    out += [md_row([name, g["check"], fmt(g["value"], ".3g"),
                    "yes" if g["holds"] else "**no**"]) for name, g in rows]
    return "\n".join(out) + "\n"


RUN_KEYS = (("replayed", "replay/sampled"), ("replayed A≠0", "replay/sampled_nonzero"),
            ("stored", "replay/size"), ("stored A≠0", "replay/stored_nonzero"),
            ("|A| replayed", "replay/abs_adv_sampled"), ("|A| stored", "replay/abs_adv_stored"),
            ("|A| stored A≠0", "replay/abs_adv_stored_nonzero"), ("loss tokens N", "loss/tokens"))


ARM_KEYS = (("loss tokens N", "loss/tokens", ",.0f"), ("clip frac", "loss/clip_frac", ".3f"),
            ("KL to behaviour", "loss/ppo_kl", ".3f"))


def arm_table(summary: dict, keys=ARM_KEYS) -> str:
    """A row per reported arm, the short form of results.md's tables: the final test accuracy
    (mean ± std over seeds), its gain over step 0 [95% CI], what its draw did (each arm gate's
    value and whether it holds), the mean over its runs of each key's mean over steps, and the
    range over its runs of wall time and peak memory."""
    cols = ["arm", "final test acc", "gain over step 0", "what its draw did (gate)",
            *(c for c, _, _ in keys), "wall", "peak RSS"]
    out = [md_row(cols), "|" + "---|" * len(cols)]
    for name, e in summary["arms"].items():
        rs = summary["runs"][name]
        gates = "; ".join(f"{g['check']}: {g['value']:.3g} "
                          f"({'holds' if g['holds'] else 'fails'})" for g in e.get("gates", []))
        means = [fmt(runs_mean(rs, k), spec) for _, k, spec in keys]
        wall = [run_minutes(r) for r in rs if r.get("run_s")]
        peak = [peak_gb(r) for r in rs if r.get("peak_rss_kb")]
        out.append(md_row([
            name, f"{100 * e['final']['mean']:.1f} ± {100 * e['final']['std']:.1f}",
            points(e.get("gain")), gates or "—", *means,
            f"{min(wall):.1f}-{max(wall):.1f} min" if wall else "—",
            f"{min(peak):.2f}-{max(peak):.2f} GB" if peak else "—"]))
    return "\n".join(out) + "\n"


def look_tables(summary: dict) -> str:
    """What docs/smollm2.md shows of a group-sequential setting's reading (`python
    bench/experiments.py --look DIR`): the claims at the look (look_rows), the arms (arm_table)
    and, where the setting reads it, what each arm spent to the baseline's final (spend_table)."""
    return look_rows(summary) + "\n" + arm_table(summary) + spend_table(summary)


def spend_table(analysis: dict) -> str:
    """Setting.spend, descriptive and never a verdict: per arm, the mean over seeds of its wall
    minutes and generated tokens until it first reaches its seed's baseline run's final accuracy
    (curves.spend_to_baseline), ≥ where some seeds never get there (counted at their run's end),
    with the seeds that reached it and the ratio to the baseline's mean (ratio_cell's bounds);
    "" where the setting does not read it."""
    spend = analysis.get("spend")
    if not spend:
        return ""
    base = spend["baseline"]
    out = ["", f"Spent to {base}'s final accuracy (descriptive, never a verdict): per seed, the "
               f"target is that seed's {base} run's final test accuracy; each arm's training wall "
               "time (the sum of time/step: evaluations not counted, on the seed's one machine, "
               "and slowed by whatever else ran beside it) and the completion tokens it "
               "generated (rollout/generated x response/len_mean, summed over steps) until its "
               "curve first reaches it (interpolated between evaluations). A seed that never does "
               "counts at its run's end: the mean is then a lower bound (≥).", "",
           md_row(["arm", "seeds that reach it", "wall min to it", "ratio", "tokens to it",
                   "ratio"]), "|---|---|---|---|---|---|"]

    for arm, by_x in spend["arms"].items():
        w, k = by_x["wall"], by_x["tokens"]
        out.append(md_row([arm, f"{w['reached']}/{w['n']}", mean_cell(w, ".1f", 60),
                           ratio_cell(w), mean_cell(k, ",.0f"), ratio_cell(k)]))
    return "\n".join(out) + "\n"


def per_run_table(runs: dict, keys=RUN_KEYS) -> str:
    """Per reported run: the means over its steps of `keys` (what the draw did: shares, the loss
    normaliser N, |A| replayed and stored; a setting's own run_columns), its wall time, peak
    memory and CPU kind; "" where no run logged the second key."""
    keys = keys or RUN_KEYS
    if not any(r["means"].get(keys[1][1]) is not None for rs in runs.values() for r in rs):
        return ""
    cols = ["arm", "seed", *(c for c, _ in keys), "wall min", "peak GB", "cpu"]
    out = ["", "Per run (means over its steps):", "", md_row(cols),
           "|" + "---|" * len(cols)]
    for name, rs in runs.items():
        for r in rs:
            wall = r.get("run_s") and run_minutes(r)
            peak = r.get("peak_rss_kb") and peak_gb(r)
            cells = [name, str(r.get("seed", "—")),
                     *(fmt(r["means"].get(k), ".3g") for _, k in keys),
                     fmt(wall, ".1f"), fmt(peak, ".2f"), r.get("cpu") or "not recorded"]
            out.append(md_row(cells))
    return "\n".join(out) + "\n"


def beside_lines(s, out: Path, analysis: dict) -> str:
    """Setting.beside: the same claims read on an archived setting's runs (its summary.json in
    OUT/../LABEL), reported beside this setting's as a secondary analysis, never pooled."""
    path = out.parent / s.beside / "summary.json"
    if not s.beside or not path.exists():
        return ""
    theirs = json.loads(path.read_text())["comparisons"]
    rows = [(c, t) for c in analysis["comparisons"] for t in theirs
            if (t["arm"], t["against"], t["metric"]) == (c["arm"], c["against"], c["metric"])]
    if not rows:
        return ""
    seeds = ", ".join(str(sd) for sd in json.loads(path.read_text())["arms"][
        rows[0][1]["arm"]]["seeds"])
    out = ["", f"Beside it, a secondary analysis never pooled into the rule's: the same claims on "
               f"the archived `{s.beside}` setting's runs (seeds {seeds}; their arms ran on "
               f"different CPU kinds, bench/results/replay/{s.beside}/results.md):", ""]
    out += [f"- {claim_cell(t)}: {points(t)}, {t['verdict']}" for _, t in rows]
    return "\n".join(out) + "\n"


def cpu_line(runs: dict) -> str:
    """Which CPU kinds the reported runs ran on (cpu.txt, protocol.cpu_kind): wall times and
    wall-to-target cells compare only within one kind."""
    kinds = [r.get("cpu") for rs in runs.values() for r in rs]
    known = sorted({k for k in kinds if k})
    unknown = sum(k is None for k in kinds)
    if unknown:          # "one kind" would be a claim about runs whose machine is not recorded
        return (f"Wall times: {len(kinds) - unknown} of {len(kinds)} runs recorded their CPU kind"
                + (f" ({'; '.join(known)})" if known else "") + f"; the other {unknown} were "
                "made before runs recorded it (cpu.txt): their machine is not known here "
                "(docs/results.md names the machines per setting), so their wall times compare "
                "only as far as the setting's note says.")
    if len(known) == 1:
        return "Wall times: every reported run on one CPU kind, " + known[0] + "."
    return (f"Wall times mix {len(known)} CPU kinds ({'; '.join(known)}): compare them within a "
            "kind only." if known else "Wall times:")


def waiting_line(summary: dict) -> str:
    """The arms whose runs are not in the archive yet (an analyse-only call), and those withheld
    at a look where the runs go on (Setting.interim_primary_only), said above the table: they are
    not in it, nor in any claim."""
    out = ""
    if summary.get("waiting"):
        out += (f"Runs in progress: {', '.join(summary['waiting'])} (not in the archive yet): not "
                "in the tables or the verdicts below until they finish.\n\n")
    if summary.get("withheld"):
        out += (f"Withheld at this look: {', '.join(summary['withheld'])}. Pre-registered: a look "
                "where the runs go on reads the primary claim's two arms alone; the others' "
                "accuracy and every secondary claim stay unread until the look that decides "
                "them.\n\n")
    return out


def write_pooled(p, summaries: dict[str, dict], out: Path, exp: Experiment | None = None) -> str:
    """OUT/pooled-<settings>/: summary.json (verdicts.pooled's comparison, for the headline) and
    results.md; returns the results.md text."""
    c = pooled(p, summaries)
    courses = ", ".join(f"{name} {kind}" for name, kind in c["courses"].items())
    out.mkdir(parents=True, exist_ok=True)
    text = (f"## {p.label}\n\n{c['arm']} against {c['against']}, final test accuracy, "
            f"{pairing(c)}: the settings' own paired seeds pooled (one claim, declared in its "
            f"experiment's Pooled). Δ {points(c)}, SE {fmt(c['se'] and 100 * c['se'], '.2f')}, "
            f"df {fmt(c['df'], '.3g')}; courses {courses}; "
            f"mechanism: {acted_cell(c['diagnostic'])}; verdict: **{c['verdict']}**."
            + (f" {p.post_hoc[0].upper()}{p.post_hoc[1:]}." if p.post_hoc else "")
            + ("" if not c["per_setting"] else " Beside it, each setting's own test and Holm "
               "over them: " + "; ".join(
                   f"{t['setting']} {points(t)}, p {t['p']:.2g}, Holm p {t['holm_p']:.2g}"
                   for t in c["per_setting"]) + ".")
            + "\n")
    (out / "results.md").write_text(text + "\n" + VERDICT_RULE + "\n")
    data = {"experiment": exp and exp.name, "paper": exp and exp.paper, "setting": p.label,
            "pooled": list(p.settings), "verdict_rule": VERDICT_RULE, "comparisons": [c]}
    (out / "summary.json").write_text(json.dumps(data, indent=1, default=str))
    return text


def dev_lr_means(summary: dict) -> dict:
    """{arm: {lr: mean final dev accuracy}} of summary["dev_lrs"] (a shared-lr setting's arms on
    its sweep_of setting's dev sweep; {} elsewhere), the lrs as strings (JSON's keys)."""
    return {name: {f"{lr:g}": statistics.mean(accs) for lr, accs in sorted(per.items())}
            for name, per in summary.get("dev_lrs", {}).items()}


def dev_lr_table(summary: dict) -> str:
    """A shared-lr setting's arms at every lr of its sweep_of setting's dev sweep (mean final dev
    accuracy, %), the shared lr marked: what the lr chosen by the baseline's collapse alone
    (stress_lr) costs each arm against its own best on dev. "" where there is none."""
    s, means = summary["setting"], dev_lr_means(summary)
    if not any(means.values()):
        return ""
    lrs = sorted({float(lr) for per in means.values() for lr in per}, reverse=True)
    out = ["", f"Each arm's mean final dev accuracy (%) at every lr of {s.sweep_of}'s dev sweep "
           f"(its seeds {', '.join(map(str, s.sweep_seeds))}); **the shared lr "
           f"{s.shared_lr:g}**, chosen where {s.baseline} is unstable on dev (stress_lr), not by "
           "any other arm; best: the arm's own best lr there.", "",
           "| arm | " + " | ".join(f"lr {lr:g}" for lr in lrs) + " | best |",
           "|---|" + "---|" * (len(lrs) + 1)]
    for name, per in means.items():
        cells = []
        for lr in lrs:
            v = per.get(f"{lr:g}")
            cell = "—" if v is None else f"{100 * v:.1f}"
            cells.append(f"**{cell}**" if lr == s.shared_lr else cell)
        best = max(per.items(), key=lambda kv: kv[1]) if per else None
        cells.append("—" if best is None else f"{100 * best[1]:.1f} at {best[0]}")
        out.append(md_row([name, *cells]))
    return "\n".join(out) + "\n"


def acted_cell(g: dict | None) -> str:
    """A claim's diagnostic: the key, its value against the predicate, whether it held, and
    whether it gates the claim (on par: reported, not a gate)."""
    if not g:
        return "—"
    value = "not logged" if g.get("value") is None else f"{g['value']:.3g}"
    gates = "" if g.get("gates", True) else " (reported, not a gate)"
    return f"{g['key']} {g['predicate']}: {value}, {'yes' if g['acted'] else 'no'}{gates}"


def post_hoc_cell(c: dict) -> str:
    """A claim's second diagnostic (Claim.post_hoc), beside its gate: its label, its reading and
    the word it would give; "" where there is none."""
    g = c.get("post_hoc")
    if not g:
        return ""
    label = g.get("label", "post hoc (defined after the runs, not the gate)")
    return f"; {label}: {acted_cell(g)} → {g['verdict']}"


def sweep_table(summary: dict) -> str:
    s = summary["setting"]
    if not swept(summary):
        return (f"No sweep runs here: every arm at the lr fixed before the test runs "
                f"({', '.join(f'{n} {lr:g}' for n, lr in summary['chosen'].items())}; the "
                f"setting's note above says where it was chosen).\n")
    grid = sorted({lr for d in summary["sweep"].values() for lr in d}, reverse=True)
    seeds = ", ".join(map(str, summary["sweep_seeds"]))
    out = [f"final eval/dev_accuracy (%), seeds {seeds}: mean (per seed); **chosen**; an lr past "
           f"the grid {', '.join(f'{x:g}' for x in summary['grid'])} was swept where the best was "
           f"at its edge (at most {EXTEND}); a choice still at the edge of what was swept is "
           f"marked (edge); — = not swept", "",
           "| arm | " + " | ".join(f"lr {lr:g}" for lr in grid) + " |",
           "|---|" + "---|" * len(grid)]
    for a in s.arms:
        cells = []
        mine = summary["sweep"][a.name]
        for lr in grid:
            if lr not in mine:
                cells.append("—")
                continue
            accs = mine[lr]
            cell = (f"{100 * statistics.mean(accs):.1f} ("
                    f"{', '.join(f'{100 * x:.1f}' for x in accs)})")
            if lr == summary["chosen"].get(a.name):
                edge = " (edge)" if lr in (min(mine), max(mine)) else ""
                cell = f"**{cell}**{edge}"
            cells.append(cell)
        out.append(md_row([a.name, *cells]))
    for group, pick in summary.get("picked", {}).items():
        rule = "the best mean final dev accuracy at its own chosen lr"
        if s.band:
            maxima = ", ".join(f"{n} {fmt(summary['band'][n], '.3g')}" for n in group)
            rule += f", among those whose {s.band[0]} stayed <= {s.band[1]:g} ({maxima})"
        out.append(f"\nReadings {'; '.join(group)}: **{pick}** reported ({rule}).")
        if (best := summary.get("also", {}).get(group)) is not None:
            out.append(f"The best on dev whatever {s.band[0]}: **{best}**, reported too (not "
                       f"the headline).")
    return "\n".join(out) + "\n"


def write_setting(summary: dict, out: Path, exp: Experiment | None = None) -> str:
    """OUT/<setting>/: results.md (the flags, the tables, VERDICT_RULE, the sweep), sweep.md,
    summary.json (the runs and analyse()'s every number, with the experiment's name and paper)
    and the plots; returns the text for the experiment's README (results.md less the rule)."""
    out.mkdir(parents=True, exist_ok=True)
    s = summary["setting"]
    analysis = analyse(summary)
    where = f", in {s.sweep_of} (the same runs)" if s.sweep_of else ""
    stress = ("" if s.shared_lr is None else f"{s.lr_note}\n\n" if s.lr_note else
              f"A stress setting: every arm at one shared lr {s.shared_lr:g} (stress_lr: where "
              f"{s.baseline} is unstable on {s.sweep_of or 'its'}'s dev sweep); only the "
              f"readings are swept, at that lr{where}.\n\n")
    text = (f"## {s.label}\n\n{stress}Common flags: `{' '.join(s.flags)}`"
            + (f"; sweep runs add `{' '.join(s.sweep)}`" if s.sweep and swept(summary) else "")
            + "\n\n"
            + "\n".join(f"- {a.name}: `{' '.join(a.flags)}`" for a in s.arms) + "\n\n"
            + code_line(summary.get("codes")) + waiting_line(summary)
            + table(summary, analysis) + sequential_table(analysis) + gates_table(analysis)
            + beside_lines(s, out, analysis) + spend_table(analysis)
            + per_run_table(summary["runs"], s.run_columns)
            + dev_lr_table(summary))
    sweep = "\nThe sweep:\n\n" + sweep_table(summary)
    (out / "results.md").write_text(text + "\n" + VERDICT_RULE + "\n" + sweep)
    (out / "sweep.md").write_text(sweep_table(summary))
    data = {"experiment": exp and exp.name, "paper": exp and exp.paper, "setting": s.label,
            "baseline": s.baseline, "verdict_rule": VERDICT_RULE, "par_margin": PAR_MARGIN,
            **analysis,
            "chosen": summary["chosen"], "picked": {" | ".join(g): p for g, p in
                                                    summary["picked"].items()},
            "also": {" | ".join(g): p for g, p in summary.get("also", {}).items()},
            "band": summary["band"], "codes": summary.get("codes"),
            "shared_lr": s.shared_lr, "dev_lrs": dev_lr_means(summary),
            "waiting": summary.get("waiting", []), "withheld": summary.get("withheld", []),
            "sweep": {n: {str(k): v for k, v in d.items()}
                                                   for n, d in summary["sweep"].items()},
            "runs": summary["runs"]}
    (out / "summary.json").write_text(json.dumps(data, indent=1, default=str))
    if not plots(summary, out):
        print(f"no accuracy.png or sweep.png in {out}: matplotlib is not installed "
              "(pip install -r requirements-bench.txt, then rerun: finished runs are reused)",
              file=sys.stderr)
    return text + sweep



def write_progress(progress: dict, out: Path, why: str) -> str:
    """OUT/<setting>/results.md and sweep.md of a group-sequential setting before its first look
    (protocol.Stopped's progress): the flags, the arms, its lr choices and sweep, and what each
    finished report run's draw did (per_run_table; no accuracy: nothing reads it before the
    look), the arms left out because their runs are not in the archive named (waiting_line);
    returns the text for the experiment's README."""
    out.mkdir(parents=True, exist_ok=True)
    s = progress["setting"]
    lrs = ", ".join(f"{name} {lr:g}" for name, lr in progress["chosen"].items())
    text = (f"## {s.label}\n\n{s.lr_note}\n\nCommon flags: `{' '.join(s.flags)}`; sweep runs add "
            f"`{' '.join(s.sweep)}`\n\n"
            + "\n".join(f"- {a.name}: `{' '.join(a.flags)}`" for a in s.arms) + "\n\n"
            + code_line(progress.get("codes")) + waiting_line(progress)
            + f"In progress: {why}. The lrs: {lrs}. Seeds {s.seeds[0]}-{s.seeds[-1]}, looks at "
              f"{' and '.join(map(str, s.looks))} complete seeds.\n"
            + per_run_table(progress["runs"], s.run_columns))
    sweep = "\nThe sweep:\n\n" + sweep_table(progress)
    (out / "results.md").write_text(text + sweep)
    (out / "sweep.md").write_text(sweep_table(progress))
    (out / "summary.json").unlink(missing_ok=True)          # no reading before the first look
    return text + sweep
