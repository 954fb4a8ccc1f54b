"""bench/sequential.py and a group-sequential setting's runs (bench/protocol.py, Setting.looks):
the O'Brien-Fleming boundaries against the published constants, the runs stopping at the first
look where the primary claim crosses and not before, nothing read before the first look (an arm
left out of it named), a seed's arms made on one CPU kind (one_machine), and the pre-registered
draws setting read at its interim look and at its final one (every claim by Holm)."""
import dataclasses
import json
import re
import sys
from pathlib import Path

import pytest

from conftest import ROOT

sys.path.insert(0, str(Path(ROOT) / "bench"))
import protocol  # noqa: E402  (where run_setting reads load and stream: patched there)
import sequential  # noqa: E402
from design import Arm, Claim, Setting  # noqa: E402
from papers.replay import draw_gates, replay  # noqa: E402
from protocol import Plan, Stopped, run_dir, run_setting  # noqa: E402
from report import look_tables, per_run_table, write_progress, write_setting  # noqa: E402
from verdicts import analyse  # noqa: E402


def test_obrien_fleming_boundaries_are_the_published_constants():
    """Jennison & Turnbull (2000), Table 2.3, two-sided alpha 0.05 at equal looks: C_B(2) =
    1.977, C_B(5) = 2.040; the boundary at look k is C_B sqrt(K / k). Two looks at 10 and 20
    seeds: nominal p 0.0052 and 0.0480 (the issue's "about 0.005 and 0.048")."""
    two = sequential.obrien_fleming((10, 20))
    assert two[1] == pytest.approx(1.977, abs=1e-3)
    assert two[0] == pytest.approx(1.977 * 2 ** 0.5, abs=2e-3)
    assert sequential.obrien_fleming((1, 2, 3, 4, 5))[-1] == pytest.approx(2.040, abs=1e-3)
    p10, p20 = sequential.thresholds((10, 20))
    assert p10 == pytest.approx(0.0052, abs=1e-4) and p20 == pytest.approx(0.0480, abs=1e-4)
    # one look is the plain two-sided test
    assert sequential.thresholds((20,))[0] == pytest.approx(0.05, abs=1e-4)
    assert sequential.crosses(0.004, 0, (10, 20)) and not sequential.crosses(0.006, 0, (10, 20))
    assert sequential.crosses(0.04, 1, (10, 20)) and not sequential.crosses(None, 1, (10, 20))


ARMS = (Arm("a", ("--replay", "prioritized")), Arm("b", ()))


def _setting(seeds=(1, 2, 3, 4), looks=(2, 4)):
    return Setting("x", ("--steps", "2"), ARMS, "b", seeds=seeds,
                               claims=(Claim("a", 1),), shared_lr=1e-4, looks=looks,
                               one_machine=True)


def _fake(monkeypatch, finals, kind="this cpu", train=True):
    """Plan.run_all that makes each run's folder (done, cpu.txt, argv.json) unless there, and
    records which ran; load gives `finals[arm](seed)` as the run's final accuracy."""
    made = []

    def run_all(self, runs, split="report"):
        for _, d in runs:
            if (d / "done").exists():
                continue
            if not self.train:
                self.missing.add(d)
                continue
            d.mkdir(parents=True, exist_ok=True)
            for name, text in (("done", "1.0 s\n"), ("cpu.txt", kind + "\n"), ("argv.json", "[]")):
                (d / name).write_text(text)
            made.append(d)
        self.ran += [d for _, d in runs if d not in self.missing]

    def load(d, metric, *a):
        acc = finals[d.parent.parent.name](int(d.name[5:]))
        curve = [(0, 0, 0, 0.0, 0.1), (1, 8, 1, 1.0, acc), (2, 16, 2, 2.0, acc)]
        return {"final": acc, "curve": curve, "means": {}, "maxima": {}, "minima": {},
                "last": {}, "start": 0.1}
    monkeypatch.setattr(Plan, "run_all", run_all)
    monkeypatch.setattr(protocol, "load", load)
    monkeypatch.setattr(protocol, "stream", lambda argv: None)
    monkeypatch.setattr(protocol, "cpu_kind", lambda: kind)
    return made


def test_the_runs_stop_at_the_first_look_where_the_primary_crosses(monkeypatch, tmp_path):
    """A primary far beyond its boundary at 2 seeds (Δ 0.4, SE 0.0005): seeds 3 and 4 never
    run, and the summary reads the look's two seeds; a primary that does not cross runs all four."""
    made = _fake(monkeypatch, {"a": lambda sd: 0.5 + 0.001 * sd, "b": lambda sd: 0.1})
    out = run_setting(_setting(), Plan(tmp_path / "one", 1, 1, False))
    assert sorted(d.name for d in made) == ["seed-1", "seed-1", "seed-2", "seed-2"]
    assert [r["seed"] for r in out["runs"]["a"]] == [1, 2]
    made = _fake(monkeypatch, {"a": lambda sd: 0.3 + 0.05 * (-1) ** sd, "b": lambda sd: 0.3})
    out = run_setting(_setting(), Plan(tmp_path / "two", 1, 1, False))
    assert len(made) == 8 and [r["seed"] for r in out["runs"]["b"]] == [1, 2, 3, 4]


def test_nothing_is_read_before_the_first_look(monkeypatch, tmp_path):
    """Analyse only, one seed of the first look's two complete: Stopped, with the count; with the
    first look complete and the second not, the read is the first look's seeds."""
    plan = Plan(tmp_path, 1, 1, False)
    _fake(monkeypatch, {"a": lambda sd: 0.3 + 0.05 * (-1) ** sd, "b": lambda sd: 0.3})
    run_setting(_setting(seeds=(1,), looks=()), plan)
    plan = Plan(tmp_path, 1, 1, False, train=False)
    with pytest.raises(Stopped, match="1 of 2 seeds complete before its first look"
                       ) as why:
        run_setting(_setting(), plan)
    progress = why.value.progress
    assert [r["seed"] for r in progress["runs"]["a"]] == [1] and progress["complete"] == 1
    text = write_progress(progress, tmp_path / "report", str(why.value))
    assert "In progress: setting x: 1 of 2 seeds" in text and "accuracy" not in text
    assert not (tmp_path / "report" / "summary.json").exists()
    run_setting(_setting(seeds=(1, 2, 3), looks=()),
                            Plan(tmp_path, 1, 1, False))
    out = run_setting(_setting(), Plan(tmp_path, 1, 1, False, train=False))
    assert [r["seed"] for r in out["runs"]["a"]] == [1, 2]


def test_an_arm_left_out_before_the_first_look_is_named(monkeypatch, tmp_path):
    """Analyse only, an arm of its own lr (own_lr) whose dev sweep is not in the archive: the
    progress the look waits on leaves it out and says so, instead of dropping it silently."""
    _fake(monkeypatch, {"a": lambda sd: 0.3, "b": lambda sd: 0.3, "c": lambda sd: 0.3})
    run_setting(_setting(seeds=(1,), looks=()), Plan(tmp_path, 1, 1, False))
    late = dataclasses.replace(_setting(), arms=(*ARMS, Arm("c", ("--replay", "nonzero"))),
                               own_lr=("c",))
    with pytest.raises(Stopped, match="1 of 2 seeds complete") as why:
        run_setting(late, Plan(tmp_path, 1, 1, False, train=False))
    assert why.value.progress["waiting"] == ["c"]
    text = write_progress(why.value.progress, tmp_path / "report", str(why.value))
    assert "Runs in progress: c (not in the archive yet)" in text


def test_a_seed_s_arms_are_made_on_one_cpu_kind(monkeypatch, tmp_path):
    """one_machine: a seed whose arms finished on another kind is kept whole; a seed with one arm
    finished on another kind and one not yet made has that run made again here."""
    def made_on(arm, seed, kind):
        d = run_dir(tmp_path / "x", "report", arm, 1e-4, seed)
        d.mkdir(parents=True)
        for name, text in (("done", "1.0 s\n"), ("cpu.txt", kind + "\n"), ("argv.json", "[]")):
            (d / name).write_text(text)
        return d
    kept = [made_on("a", 1, "other"), made_on("b", 1, "other")]
    half = made_on("a", 2, "other")
    made = _fake(monkeypatch, {"a": lambda sd: 0.3 + 0.05 * (-1) ** sd, "b": lambda sd: 0.3})
    run_setting(_setting(seeds=(1, 2), looks=(2,)),
                            Plan(tmp_path, 1, 1, False))
    assert sorted((d.parent.parent.name, d.name) for d in made) == [("a", "seed-2"),
                                                                    ("b", "seed-2")]
    assert all((d / "cpu.txt").read_text() == "other\n" for d in kept)
    assert (half / "cpu.txt").read_text() == "this cpu\n"
    assert json.loads((half / "argv.json").read_text()) == []


def _claim(delta, se, direction=1, verdict="inconclusive (…)", n=10):
    return {"delta": delta, "se": se, "df": n - 1, "ci": [delta - 2.26 * se, delta + 2.26 * se],
            "n": n, "paired": True, "direction": direction, "verdict": verdict}


def test_read_stops_at_the_interim_only_where_the_primary_crosses_and_holm_reads_the_rest():
    """At 10 of (10, 20) seeds: a primary with p about 1e-4 stops the runs, and each claim is
    decided where its Holm-adjusted p (x3, x2, x1 in order) is below 0.0052; a primary with p
    about 0.03 goes on, and the secondaries are not decided; at the last look two p's of 0.033 are
    Holm p's of 0.066, undecided, and alone one decides; a claim whose mechanism did not act
    leaves the family."""
    strong, weak, against = _claim(0.05, 0.007), _claim(0.02, 0.008), _claim(-0.04, 0.006)
    q = sequential.read((10, 20), 10, [strong, weak, against])
    assert q["stops"] and q["threshold"] == pytest.approx(0.0052, abs=1e-4)
    assert q["holm_p"][0] == pytest.approx(3 * q["p"][0])        # the smallest p: x3
    assert q["words"][0] == "reproduced" and q["words"][2] == "contradicted"
    assert q["words"][1].startswith("inconclusive (Holm p")
    q = sequential.read((10, 20), 10, [_claim(0.02, 0.008), strong])
    assert not q["stops"] and q["words"][0].startswith("continues to 20 seeds")
    assert q["words"][1] == "not decided: the primary did not stop here"
    final = [_claim(0.02, 0.0087, n=20), _claim(0.02, 0.0087, n=20)]
    final = [{**c, "df": 19} for c in final]
    q = sequential.read((10, 20), 20, final)
    assert q["stops"] and 0.03 < q["p"][0] < 0.048 and q["holm_p"][0] > 0.048
    assert q["words"] == [q["words"][0]] * 2 and q["words"][0].startswith("inconclusive")
    q = sequential.read((10, 20), 20, [final[0], {**final[1],
                                                  "verdict": "not testable here: the mechanism "
                                                             "did not act"}])
    assert q["holm_p"] == [q["p"][0], None] and q["words"][0] == "reproduced"
    assert q["words"][1].startswith("not testable")
    with pytest.raises(ValueError, match="not a look"):
        sequential.read((10, 20), 12, final)


def _run(means):
    return {"means": means}


PRIORITIZED_RUN = {"replay/abs_adv_sampled": 0.87, "replay/abs_adv_stored": 0.17,
                   "replay/abs_adv_stored_nonzero": 0.70, "replay/sampled": 30,
                   "replay/sampled_nonzero": 30, "replay/size": 250, "replay/stored_nonzero": 55}


def test_each_draw_gate_holds_on_its_draw_and_fails_on_a_hand_made_one():
    """draw_gates (bench/papers/replay.py): the priority's lift over the stored mean >= 1.05; the
    nonzero draw replays no A = 0 and lifts |A| near 1 over the stored A != 0; naive replay's A != 0
    share near the stored one. Each fails where its draw did not do that."""
    gates = draw_gates

    def holds(arm, means):
        return [g[2] for g in gates(arm, [_run(means)])]
    assert holds("rollout-replay", PRIORITIZED_RUN) == [True]
    assert holds("rollout-replay", {**PRIORITIZED_RUN, "replay/abs_adv_sampled": 0.175}) == [False]
    nonzero = {**PRIORITIZED_RUN, "replay/abs_adv_sampled": 0.69}
    assert holds("nonzero-replay", nonzero) == [True, True]
    assert holds("nonzero-replay", {**nonzero, "replay/sampled_nonzero": 29.5}) == [False, True]
    assert holds("nonzero-replay", {**nonzero, "replay/abs_adv_sampled": 0.87}) == [True, False]
    naive = {**PRIORITIZED_RUN, "replay/abs_adv_sampled": 0.15, "replay/sampled_nonzero": 6.8}
    assert holds("naive-replay", naive) == [True]                 # 0.227 against 0.22
    assert holds("naive-replay", {**naive, "replay/sampled_nonzero": 30}) == [False]
    assert holds("naive-replay", {**naive, "replay/sampled_nonzero": None}) == [False]
    assert gates("grpo", [_run(naive)]) == []


def _hand_made_runs(arms_finals, n):
    """A run per arm and seed whose final accuracy is arms_finals[arm](seed), with a prioritized
    draw's diagnostics, for analyse()."""
    out = {}
    for arm, final in arms_finals.items():
        out[arm] = []
        for sd in range(n):
            acc = final(sd)
            curve = [(0, 0, 0, 0.0, 0.08, 0.0), (30, 1920, 30, 1.0, acc, 28_800.0),
                     (40, 2560, 40, 2.0, acc, 38_400.0)]
            out[arm].append({"curve": curve, "final": acc, "start": 0.08, "seed": sd,
                             "stream": ["8", str(sd)], "means": dict(PRIORITIZED_RUN),
                             "maxima": {}, "minima": {}, "last": {}, "len_start": 15.0,
                             "len_end": 13.0, "refreshes": 40, "updates": 40, "fresh": 2560,
                             "wall": 2.0, "gen": 1.0, "upd": 1.0, "run_s": 1800.0,
                             "peak_rss_kb": 5_900_000, "cpu": "one kind"})
    return out


def test_the_draws_setting_is_read_by_the_rule_and_its_report_says_so(tmp_path):
    """analyse() on the pre-registered setting at its interim look: the primary (prioritized vs
    naive) far past its boundary stops the runs and every claim gets the rule's word; the report
    writes the rule's table, the draw gates and the per-run table."""
    (s,) = [s for s in replay(False).settings if s.label == "smollm2-draws"]
    runs = _hand_made_runs({"naive-replay": lambda sd: 0.12 + 0.002 * (sd % 3),
                            "rollout-replay": lambda sd: 0.17 + 0.002 * (sd % 2),
                            "nonzero-replay": lambda sd: 0.15 + 0.003 * (sd % 2)}, 10)
    summary = {"setting": s, "runs": runs, "chosen": {a.name: 2e-5 for a in s.arms},
               "sweep": {a.name: {} for a in s.arms}, "grid": s.grid, "sweep_seeds": (0,),
               "picked": {}, "also": {}, "band": {}}
    a = analyse(summary)
    q = a["sequential"]
    assert q["look"] == 1 and q["stops"]
    words = {(c["arm"], c["against"]): c["verdict"] for c in a["comparisons"]}
    assert words[("rollout-replay", "naive-replay")] == "reproduced"
    assert words[("rollout-replay", "nonzero-replay")] == "reproduced"
    assert words[("nonzero-replay", "naive-replay")] == "reproduced"
    text = write_setting(summary, tmp_path / "smollm2-draws")
    assert "The group-sequential rule" in text and "| primary |" in text
    assert "(10 complete seeds, every arm of each on one CPU kind): the primary crossed" in text
    assert "What each arm's draw did" in text and "Per run (means over its steps)" in text
    assert "the \\|A\\| weighting" in text           # a "|" in a cell is escaped: one cell
    for table in re.findall(r"(?:^\|.*\n)+", text, flags=re.M):
        widths = {len(re.split(r"(?<!\\)\|", row)) for row in table.splitlines()}
        assert len(widths) == 1, f"a row's cells do not match its header's:\n{table}"
    # docs/smollm2.md's short form (report.look_tables): the claims at the look and a row per arm,
    # each gate's word from its value (naive's A != 0 share here is the prioritized draw's: 4.5x
    # the stored share, so its gate fails), a key no run logged a dash, the ranges over the runs;
    # read from the summary.json that write_setting wrote, as `experiments.py --look` reads it
    short = look_tables(json.loads((tmp_path / "smollm2-draws" / "summary.json").read_text()))
    assert short.startswith("| claim | role |") and "| primary |" in short
    rows = {row.split(" | ")[0][2:]: row for row in short.splitlines() if "-replay |" in row}
    assert "stored in [0.9, 1.11]: 4.55 (fails)" in rows["naive-replay"]
    assert "stored >= 1.05: 5.12 (holds)" in rows["rollout-replay"]
    assert "| — | — | — | 30.0-30.0 min | 5.90-5.90 GB |" in rows["nonzero-replay"]


def test_the_draws_setting_at_its_final_look_reads_every_claim_with_holm(tmp_path):
    """analyse() on the pre-registered setting at its final look (20 complete seeds): a primary
    that never crosses still stops there (the last look), is inconclusive with its CI, and the
    secondaries are read, each by its Holm-adjusted p against 0.048: nonzero far above naive is
    reproduced, prioritized far below nonzero contradicted; the report says look 2 of 2."""
    (s,) = [s for s in replay(False).settings if s.label == "smollm2-draws"]

    def naive(sd):
        return 0.12 + 0.002 * (sd % 3)
    runs = _hand_made_runs({"naive-replay": naive,
                            "rollout-replay": lambda sd: naive(sd) + (0.004 if sd % 2 else -0.003),
                            "nonzero-replay": lambda sd: naive(sd) + 0.03 + 0.002 * (sd % 2)}, 20)
    summary = {"setting": s, "runs": runs, "chosen": {a.name: 2e-5 for a in s.arms},
               "sweep": {a.name: {} for a in s.arms}, "grid": s.grid, "sweep_seeds": (0,),
               "picked": {}, "also": {}, "band": {}}
    a = analyse(summary)
    q = a["sequential"]
    assert (q["look"], q["n"], q["stops"]) == (2, 20, True)
    assert q["threshold"] == pytest.approx(0.048, abs=1e-3) and q["primary_p"] > 0.3
    words = {(c["arm"], c["against"]): c["verdict"] for c in a["comparisons"]}
    assert words[("rollout-replay", "naive-replay")].startswith("inconclusive (Holm p")
    assert words[("rollout-replay", "nonzero-replay")] == "contradicted"
    assert words[("nonzero-replay", "naive-replay")] == "reproduced"
    assert all(c["n"] == 20 and c["df"] == 19 for c in a["comparisons"])
    text = write_setting(summary, tmp_path / "smollm2-draws")
    assert "Read at look 2 of 2 (20 complete seeds" in text
    assert "the last look: the runs stop here, the primary not crossing." in text
    assert "not decided" not in text and "continues to" not in text


def test_an_interim_look_that_goes_on_reads_the_primarys_arms_alone(monkeypatch, tmp_path):
    """Setting.interim_primary_only (smollm2-compute): at a look where the primary does not cross,
    the arms outside the primary claim are withheld (not in the runs, the claims or the report,
    which names them); at the look that decides, every arm is read."""
    three = (*ARMS, Arm("c", ("--replay", "none")))
    finals = {"a": lambda sd: 0.3 + 0.05 * (-1) ** sd, "b": lambda sd: 0.3, "c": lambda sd: 0.2}
    _fake(monkeypatch, finals)

    def setting(**kw):
        return dataclasses.replace(_setting(**kw), arms=three, interim_primary_only=True,
                                   claims=(Claim("a", 1), Claim("c", 1, against="a")))
    run_setting(setting(seeds=(1, 2), looks=()), Plan(tmp_path, 1, 1, False))
    out = run_setting(setting(), Plan(tmp_path, 1, 1, False, train=False))
    assert sorted(out["runs"]) == ["a", "b"] and out["withheld"] == ["c"]
    text = write_setting(out, tmp_path / "report")
    assert "Withheld at this look: c." in text
    assert "c vs a" not in text and "| c |" not in text
    out = run_setting(setting(), Plan(tmp_path, 1, 1, False))           # the final look: all
    assert sorted(out["runs"]) == ["a", "b", "c"] and out["withheld"] == []


def test_the_compute_settings_gates_read_the_update_tokens():
    """smollm2-compute's claim 2 (replay vs GRPO-96) holds its gate where the two updates' tokens
    are within 10% either way and is not testable where they are not; claim 3 (GRPO-96 vs GRPO-64)
    where GRPO-96's update is at least 1.3x GRPO-64's."""
    from papers.replay import GRPO_64, GRPO_96, compute_gates
    (s,) = [s for s in replay(False).settings if s.label == "smollm2-compute"]
    tokens = {GRPO_64: 880.0, "rollout-replay": 1280.0, GRPO_96: 1320.0}

    def read(tokens):
        runs = _hand_made_runs({GRPO_64: lambda sd: 0.13 + 0.01 * (sd % 3),
                                "rollout-replay": lambda sd: 0.15 + 0.01 * (sd % 2),
                                GRPO_96: lambda sd: 0.14 + 0.01 * (sd % 2)}, 20)
        for arm, rs in runs.items():
            for r in rs:
                r["means"] = {**r["means"], "loss/tokens": tokens[arm], "batch/fresh":
                              96 if arm == GRPO_96 else 64}
        summary = {"setting": s, "runs": runs, "chosen": {a.name: 2e-5 for a in s.arms},
                   "sweep": {a.name: {} for a in s.arms}, "grid": s.grid, "sweep_seeds": (0,),
                   "picked": {}, "also": {}, "band": {}}
        a = analyse(summary)
        return {(c["arm"], c["against"]): c for c in a["comparisons"]}, a
    claims, a = read(tokens)
    assert claims[("rollout-replay", GRPO_96)]["diagnostic"]["acted"]
    assert claims[("rollout-replay", GRPO_96)]["diagnostic"]["value"] == pytest.approx(1280 / 1320)
    assert claims[(GRPO_96, GRPO_64)]["diagnostic"]["acted"]
    assert [g["holds"] for g in a["arms"][GRPO_96]["gates"]] == [True, True]
    # the descriptive spend to GRPO-64's final, seed by seed: every arm reaches it at step 30
    # here (28,800 tokens, 1 s), as GRPO-64 does, except where its seed's final is below it
    spend = a["spend"]["arms"]
    assert a["spend"]["baseline"] == GRPO_64 and set(spend) == {a.name for a in s.arms}
    assert spend[GRPO_64]["tokens"]["reached"] == 20
    assert spend[GRPO_64]["tokens"]["mean"] == pytest.approx(28_800)
    # its per-run table in its own diagnostics' columns (Setting.run_columns)
    runs = _hand_made_runs({GRPO_64: lambda sd: 0.13}, 1)
    runs[GRPO_64][0]["means"]["batch/fresh"] = 64
    per_run = per_run_table(runs, s.run_columns)
    assert "| update tokens N | fresh |" in per_run and "draw ESS" in per_run
    claims, _ = read({**tokens, GRPO_96: 1500.0})                      # 1280 / 1500 = 0.85
    assert claims[("rollout-replay", GRPO_96)]["verdict"].startswith("not testable here")
    assert compute_gates("rollout-replay", [_run({**PRIORITIZED_RUN, "loss/tokens": 1.0})])[1][2]
