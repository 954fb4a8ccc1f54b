"""The gates that say a mechanism acted, each failing and passing on hand-made runs; the pooled
claim over two settings' paired seeds; the pre-registered settings as defined; run reuse across
codes known to compute the same numbers; the CPU kind a run records; an analyse-only call that
trains and removes nothing. No training: hand-made runs and folders only."""
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import protocol  # noqa: E402  (where run_setting reads load: patched there)
import runs  # noqa: E402  (where run_train reads the same-code list: patched there)
from design import STRESS_SEEDS, Arm, Experiment, Setting  # noqa: E402
from papers import EXPERIMENTS  # noqa: E402
from papers.headroom_drift import (AGAINST_NAIVE, HD_ACTED, HD_FIRES, REPLAYS,  # noqa: E402
                                   headroom_drift)
from papers.pnpo import PNPO_LEARNS_LR  # noqa: E402
from papers.r2po import r2po_exp  # noqa: E402
from papers.replay import PRIORITIZED, PRIORITY_LIFT, replay  # noqa: E402
from papers.vigor import vigor  # noqa: E402
from protocol import Plan, Stopped, run_dir  # noqa: E402
from headline import headline_rows  # noqa: E402
from report import claim_cell, cpu_line, pairing, post_hoc_cell, write_pooled  # noqa: E402
from runs import KEPT, recorded_models, run_train  # noqa: E402
from verdicts import (NOT_ACTED, analyse, diagnostic_value, mechanism_acted, pooled,  # noqa: E402
                      predicate_keys)


def run(accs, seed, **means):
    """A hand-made reported run: evaluations at steps 0, 1, ...; its metrics keys' means."""
    return {"curve": [(i, 100 * i, i, float(i), a) for i, a in enumerate(accs)], "seed": seed,
            "stream": ["4", str(seed)], "means": means, "maxima": means, "minima": means,
            "last": means}


# ---- the gates ---------------------------------------------------------------------------------

def test_the_replay_gate_says_the_priority_acted_and_a_uniform_draw_fails_it():
    """PRIORITIZED: the replayed rollouts' mean |A| over the stored ones' at least PRIORITY_LIFT.
    A uniform draw replays the stored |A| (ratio 1, or below where a step replays nothing): it
    fails; a draw by |A| lifts it (2x): it passes; a run without the stored key: not logged."""
    key, predicate = PRIORITIZED
    assert PRIORITY_LIFT == 1.05
    uniform = [run([0.2], s, **{key: 0.49, "replay/abs_adv_stored": 0.5}) for s in range(3)]
    prioritized = [run([0.2], s, **{key: 1.0, "replay/abs_adv_stored": 0.5}) for s in range(3)]
    assert diagnostic_value(uniform, key, predicate) == pytest.approx(0.98)
    assert not mechanism_acted(uniform, key, predicate)
    assert diagnostic_value(prioritized, key, predicate) == pytest.approx(2.0)
    assert mechanism_acted(prioritized, key, predicate)
    older = [run([0.2], 0, **{key: 1.0})]
    assert diagnostic_value(older, key, predicate) is None
    assert not mechanism_acted(older, key, predicate)
    assert predicate_keys(key, predicate) == (key, "replay/abs_adv_stored")


def test_the_archived_replay_runs_pass_and_fail_the_priority_gate_as_they_should():
    """In the committed re-analysis of every tiny-model replay setting, prioritized replay's lift
    is about 2 and naive replay's about 1: the gate separates them."""
    key, predicate = PRIORITIZED
    for label in ("arith", "arith-s1", "steps"):
        path = ROOT / "bench" / "results" / "replay" / label / "summary.json"
        runs = json.loads(path.read_text())["runs"]
        assert mechanism_acted(runs["rollout-replay"], key, predicate), label
        assert not mechanism_acted(runs["naive-replay"], key, predicate), label
        assert diagnostic_value(runs["naive-replay"], key, predicate) < 1.02


def test_headroom_drifts_gate_reads_its_selection_against_naive_replays_draw():
    """Against naive replay, Headroom-Drift's gate reads the replayed |A| over what naive replay
    replays on the same seeds (its reference arm's runs), at least HD_LIFT: a selection by
    headroom (higher |A|) passes, one that replays what a uniform draw does fails, whatever its
    own drift gate did (hd_changed_frac 0: the old gate's "did not act"); its row against GRPO
    reads whether it replays rollouts that carry gradient. A run of the reference without the
    key: not logged."""
    (arith, *_) = headroom_drift(False).settings
    vs_naive = next(c for c in arith.claims if c.against == "naive-replay")
    vs_grpo = next(c for c in arith.claims if c.direction and not c.against)
    key, predicate = vs_naive.acted
    assert vs_naive.acted == AGAINST_NAIVE and vs_grpo.acted == REPLAYS
    naive = [run([0.2], s, **{key: 0.30}) for s in range(3)]
    ranked = [run([0.2], s, **{key: 0.60, "replay/hd_changed_frac": 0.0}) for s in range(3)]
    same = [run([0.2], s, **{key: 0.30, "replay/hd_changed_frac": 0.2}) for s in range(3)]
    assert mechanism_acted(ranked, key, predicate, naive)
    assert diagnostic_value(ranked, key, predicate, naive) == pytest.approx(2.0)
    assert not mechanism_acted(same, key, predicate, naive)
    assert diagnostic_value(ranked, key, predicate, [run([0.2], 0)]) is None
    assert predicate_keys(key, predicate) == (key, key)
    assert mechanism_acted(ranked, *vs_grpo.acted)
    assert not mechanism_acted([run([0.2], 0, **{key: 0.0})], *vs_grpo.acted)
    assert vs_naive.post_hoc == ("replay/hd_changed_frac", "mean > 0.01")


def test_smollm2s_reuse_gate_can_fail():
    """Naive replay against GRPO on the real model: reuse acted where the replayed rollouts carry
    gradient (mean |A| replayed above ACTED), not merely where something was replayed: a run that
    replays only A = 0 rollouts fails it."""
    (s,) = [s for s in replay(False).settings if s.label == "smollm2"]
    (reuse,) = [c for c in s.claims if c.arm == "naive-replay"]
    assert reuse.acted == ("replay/abs_adv_sampled", "mean > 0.01")
    assert mechanism_acted([run([0.2], 0, **{"replay/abs_adv_sampled": 0.15,
                                                         "replay/sampled": 31.0})], *reuse.acted)
    zeros = [run([0.2], 0, **{"replay/abs_adv_sampled": 0.0, "replay/sampled": 31.0})]
    assert not mechanism_acted(zeros, *reuse.acted)
    assert mechanism_acted(zeros, *reuse.post_hoc)       # the old gate passed it


def test_vigors_registered_gate_decides_and_the_post_hoc_reading_is_beside_it():
    """Every VIGOR reading's gate is the registered "largest group > 8"; the 2x-prompt reading
    (even share 4) shows "> 4" beside it, labelled post hoc: at a largest group of 6.4 the
    verdict is not testable and the post hoc word is the one the CI gives."""
    steps = next(s for s in vigor(False).settings if s.label == "steps")
    assert {c.acted for c in steps.claims if c.direction} == {("vigor/group_size_max", "mean > 8")}
    twice = next(c for c in steps.claims if c.arm.endswith("2x prompts"))
    assert twice.post_hoc == ("vigor/group_size_max", "mean > 4")
    assert "post hoc" in twice.post_hoc_label
    base = [run([0.25, 0.3, 0.3], sd, **{"vigor/group_size_max": 8.0}) for sd in range(5)]
    arm = [run([0.25, 0.3 + 0.001 * sd, 0.3 + 0.001 * sd], sd,
               **{"vigor/group_size_max": 6.4}) for sd in range(5)]
    summary = {"setting": Setting("s", (), (Arm("fixed G=8", ()), Arm(twice.arm, ())),
                                              "fixed G=8", claims=(twice,)),
               "runs": {"fixed G=8": base, twice.arm: arm}}
    (c,) = [c for c in analyse(summary)["comparisons"] if c["arm"] == twice.arm]
    assert c["verdict"] == NOT_ACTED
    assert c["post_hoc"]["acted"] and not c["post_hoc"]["verdict"].startswith("not testable")
    assert "post hoc" in post_hoc_cell(c)


def test_r2pos_kl_is_gated_per_token_and_shown_per_chain():
    """R²PO's gate reads the head's KL in nats a token (ACTED); beside it the same per chain, the
    per-token KL times the mean sampled length: 7.5e-4 a token over 29 tokens is 0.022 a chain,
    above 0.01, while the gate says it did not act."""
    (arith, *_) = r2po_exp(False).settings
    c = next(c for c in arith.claims if c.headline)
    runs = [run([0.2], 0, **{"r2po/head_kl_current": 7.5e-4, "response/len_mean": 29.0})]
    assert not mechanism_acted(runs, *c.acted)
    assert diagnostic_value(runs, *c.post_hoc) == pytest.approx(0.02175)
    assert mechanism_acted(runs, *c.post_hoc) and "per chain" in c.post_hoc_label


def test_pnpos_gate_says_the_prefix_acted():
    """PNPO's diagnostic is the share of tokens whose exact prefix ratio is beyond e^+-1 (where
    normalising a prefix can change anything), at ACTED: near-on-policy prefixes fail it, a
    prefix far off-policy passes; it is not the clip-differs share, which any off-policy update
    passes."""
    s = EXPERIMENTS["pnpo"](False).settings[0]
    (acted,) = {c.acted for c in s.claims if c.direction is not None}
    key, predicate = acted
    assert acted == ("ratio/far_prefix_frac", "mean > 0.01")
    near = [run([0.2], i, **{key: 0.0002, "ratio/gspo_differs_frac": 0.1}) for i in range(3)]
    far = [run([0.2], i, **{key: 0.035, "ratio/gspo_differs_frac": 0.1}) for i in range(3)]
    assert not mechanism_acted(near, key, predicate)
    assert mechanism_acted(far, key, predicate)


# ---- the pooled claim ---------------------------------------------------------------------------

def setting_summary(shift, seeds, acted=2.0):
    """A setting's summary.json as write_setting writes it, for two arms: naive ends at 0.40 +
    0.01 i, prioritized `shift` above it on every seed."""
    runs, arms = {}, {}
    for name, d in (("naive-replay", 0.0), ("rollout-replay", shift)):
        finals = [0.40 + 0.01 * i + d for i in range(len(seeds))]
        runs[name] = [run([0.2, f, f], sd, **{"replay/abs_adv_sampled": acted if d else 0.5,
                                              "replay/abs_adv_stored": 0.5 if d else 0.5})
                      for sd, f in zip(seeds, finals)]
        arms[name] = {"seeds": list(seeds), "final": {"per_seed": finals}}
    return {"runs": runs, "arms": arms}


def test_the_pooled_claim_pairs_every_seed_of_both_settings():
    """+2 points on 10 seeds of one setting, +1 on 10 of the other: Δ +1.5 paired over the 20
    pairs (n 20, df 19), reproduced; the diagnostic over both settings' runs; the pairs per
    setting recorded for the headline's pairing cell."""
    (p,) = EXPERIMENTS["replay"](False).pooled
    assert p.settings == ("arith", "arith-s1") and p.claim.against == "naive-replay"
    assert p.claim.acted == PRIORITIZED and p.claim.headline
    summaries = {"arith": setting_summary(0.02, range(100, 110)),
                 "arith-s1": setting_summary(0.01, range(100, 110))}
    c = pooled(p, summaries)
    assert c["delta"] == pytest.approx(0.015) and c["n"] == 20 and c["df"] == 19 and c["paired"]
    assert c["settings"] == {"arith": 10, "arith-s1": 10}
    assert c["verdict"] == c["holm"] == "reproduced" and c["diagnostic"]["acted"]
    assert pairing(c) == "paired over 20 pairs (10 in arith, 10 in arith-s1)"
    summaries["arith"] = setting_summary(0.02, range(100, 110), acted=0.5)   # a uniform draw
    summaries["arith-s1"] = setting_summary(0.01, range(100, 110), acted=0.5)
    assert pooled(p, summaries)["verdict"] == NOT_ACTED


def test_the_pooled_row_is_written_and_read_by_the_headline(tmp_path):
    (p,) = EXPERIMENTS["replay"](False).pooled
    summaries = {"arith": setting_summary(0.02, range(100, 110)),
                 "arith-s1": setting_summary(0.01, range(100, 110))}
    exp = Experiment("replay", "the replay paper", "", "", ())
    write_pooled(p, summaries, tmp_path / "replay" / "pooled-arith-arith-s1", exp)
    (row,) = headline_rows(tmp_path)[0]
    assert row[:3] == ["the replay paper", "arith + arith-s1 (pooled)",
                       "rollout-replay vs naive-replay: post hoc: pooled after both settings' "
                       "results were seen"]
    assert row[5].startswith("paired over 20 pairs") and row[6] == "reproduced"


def test_the_post_hoc_pooled_row_carries_holm_over_the_per_setting_tests(tmp_path):
    """The pooled row was defined after its settings' results: it says so, and beside it each
    setting's own test of the claim with its p and Holm over them (p 0.01 and 0.04: Holm 0.02
    and 0.04)."""
    (p,) = replay(False).pooled
    assert p.post_hoc
    summaries = {"arith": setting_summary(0.02, range(100, 110)),
                 "arith-s1": setting_summary(0.01, range(100, 110))}
    for label, delta, se in (("arith", 0.02, 0.0062), ("arith-s1", 0.01, 0.0042)):
        summaries[label]["comparisons"] = [
            {"arm": "rollout-replay", "against": "naive-replay", "metric": "final",
             "delta": delta, "se": se, "df": 9, "ci": [delta - 2.26 * se, delta + 2.26 * se],
             "n": 10, "paired": True}]
    c = pooled(p, summaries)
    (a, b) = c["per_setting"]
    assert a["p"] == pytest.approx(0.0104, abs=1e-3) and b["p"] == pytest.approx(0.041, abs=2e-3)
    assert a["holm_p"] == pytest.approx(2 * a["p"]) and b["holm_p"] == pytest.approx(b["p"])
    text = write_pooled(p, summaries, tmp_path / "pooled")
    assert "Post hoc: pooled after both settings' results were seen." in text
    assert "each setting's own test and Holm over them: arith +2.0" in text


# ---- the headline rows are the abstracts' comparisons --------------------------------------------

def test_headroom_drifts_headline_is_against_naive_replay_and_grpos_row_says_what_it_shows():
    for s in EXPERIMENTS["headroom-drift"](False).settings:
        heads = [c for c in s.claims if c.headline]
        assert heads and all((c.against or s.baseline) == "naive-replay" for c in heads), s.label
        for c in s.claims:
            if c.direction is not None and (c.against or s.baseline) == "grpo (replay recipe)":
                assert c.note == "replay's effect" and c.beside == "naive-replay"


def test_a_rows_note_and_the_arm_beside_it_are_in_its_cell():
    c = {"arm": "hd", "against": "grpo", "metric": "final", "note": "replay's effect",
         "beside": {"arm": "naive-replay", "delta": 0.03, "ci": [0.01, 0.05]}}
    assert claim_cell(c) == ("hd vs grpo: replay's effect; beside it naive-replay vs "
                                         "grpo +3.0 [+1.0, +5.0]")


# ---- the pre-registered settings ---------------------------------------------------------------

def test_pnpo_where_gspo_learns_is_defined_as_pre_registered():
    """lr 5e-5, between GSPO's dev choice and the stress lr; GSPO e4 and PNPO's two readings at
    4 epochs; the dev gate on GSPO; 10 paired seeds; final and peak, the peak the headline; the
    far-prefix gate."""
    settings = {s.label: s for s in EXPERIMENTS["pnpo"](False).settings}
    s, stress = settings["steps-5e-5"], settings["steps-stress"]
    assert s.shared_lr == PNPO_LEARNS_LR == 5e-5
    committed = json.loads((ROOT / "bench" / "results" / "pnpo" / "steps" / "summary.json")
                           .read_text())
    assert committed["chosen"]["gspo e4 x 4"] == 3e-5 < s.shared_lr < stress.shared_lr == 1e-4
    assert [a.name for a in s.arms] == ["gspo e4 x 4", "pnpo e4 x 4", "pnpo-geo e4 x 4"]
    assert s.baseline == s.dev_gate == "gspo e4 x 4"
    assert s.readings == (("pnpo e4 x 4", "pnpo-geo e4 x 4"),)
    assert s.sweep_seeds == (0, 1) and s.seeds == STRESS_SEEDS and len(s.seeds) == 10
    assert {(c.arm, c.metric, c.headline) for c in s.claims} == {
        (n, m, m == "peak") for n in s.readings[0] for m in ("peak", "final")}
    assert all(c.against == "gspo e4 x 4" and c.direction == 1
               and c.acted == ("ratio/far_prefix_frac", "mean > 0.01") for c in s.claims)
    assert {a.name: a.flags for a in s.arms}.items() <= {a.name: a.flags
                                                         for a in stress.arms}.items()


def test_headroom_drift_where_its_gate_acts_is_defined_as_pre_registered():
    """The reading whose gate fires on dev, against naive replay, each at its own dev lr chosen on
    the long task's archived dev sweep (the same flags, so the same runs), the diagnostic's bound
    fixed first, 10 paired seeds."""
    settings = {s.label: s for s in EXPERIMENTS["headroom-drift"](False).settings}
    s, steps = settings["steps-gate"], settings["steps"]
    assert [a.name for a in s.arms] == ["naive-replay", "hd current p(1-p), gate 0.5"]
    assert s.baseline == "naive-replay" and s.shared_lr is None and s.sweep_of == "steps"
    assert s.flags == steps.flags and s.readings == () and s.seeds == STRESS_SEEDS
    assert {a.name: a.flags for a in s.arms}.items() <= {a.name: a.flags
                                                         for a in steps.arms}.items()
    (c,) = s.claims
    assert (c.arm, c.against, c.direction, c.headline) == (HD_FIRES, "", 1, True)
    assert c.acted == ("replay/hd_changed_frac", f"mean > {HD_ACTED:g}")
    assert c.post_hoc == AGAINST_NAIVE and s.one_machine
    committed = json.loads((ROOT / "bench" / "results" / "headroom-drift" / "steps" /
                            "summary.json").read_text())
    assert committed["chosen"]["naive-replay"] == 3e-5
    assert committed["chosen"][HD_FIRES] == 1e-4


def test_a_dev_gate_that_fails_stops_the_setting_before_any_report_run(monkeypatch, tmp_path):
    """Setting.dev_gate: its arm is swept at the shared lr beside the readings; where its mean
    final dev accuracy is below its start the setting stops (protocol.Stopped, saying so) and
    no report run is asked for; where it holds, the report runs follow."""
    arms = (Arm("gspo", ()), Arm("pnpo", ()), Arm("geo", ()))
    s = Setting("x", (), arms, "gspo", readings=(("pnpo", "geo"),), shared_lr=5e-5,
                dev_gate="gspo", sweep_seeds=(0, 1), seeds=(100,))
    jobs = []
    monkeypatch.setattr(Plan, "run_all",
                        lambda self, runs, split="report": jobs.extend((split, d) for _, d in runs))
    end = {"gspo": 0.2}

    def fake_load(d, metric, *a):
        arm = d.parts[-3]
        acc = end.get(arm, 0.3)
        return {"final": acc, "maxima": {}, "curve": [(0, 0, 0, 0.0, 0.25), (1, 1, 1, 1.0, acc)]}
    monkeypatch.setattr(protocol, "load", fake_load)
    monkeypatch.setattr(protocol, "stream", lambda argv: None)
    with pytest.raises(Stopped, match="stops after dev, as pre-registered: gspo"):
        protocol.run_setting(s, Plan(tmp_path, 1, 1, False))
    assert {split for split, _ in jobs} == {"sweep"}
    assert sorted({d.parts[-3] for _, d in jobs}) == ["geo", "gspo", "pnpo"]
    end["gspo"] = 0.3                                   # it learns on dev: on to the report
    for arm in ("gspo", "pnpo"):
        d = run_dir(tmp_path / "x", "report", arm, 5e-5, 100)
        d.mkdir(parents=True, exist_ok=True)
        (d / "argv.json").write_text("[]")
    out = protocol.run_setting(s, Plan(tmp_path, 1, 1, False))
    assert "report" in {split for split, _ in jobs} and set(out["runs"]) == {"gspo", "pnpo"}


# ---- run reuse ---------------------------------------------------------------------------------

def test_runs_of_a_code_listed_as_computing_the_same_numbers_are_reused(tmp_path, monkeypatch):
    """bench/results/same_code.json lists code hashes shown to compute the same numbers: a
    finished run made by any hash of the current one's class (both ways, transitively) is reused
    as the current code's, and its results say so; a run of another code runs again."""
    listed = tmp_path / "same_code.json"
    listed.write_text(json.dumps({
        "new": {"same_as": "old", "check": "python bench/same_metrics.py A B: 0 differences"},
        "old": "older", "other": "unrelated"}))
    monkeypatch.setattr(runs, "SAME_CODE", listed)
    assert runs.same_code("new") == {"new", "old", "older"}
    assert runs.same_code("older") == {"new", "old", "older"}
    assert runs.same_code("alone") == {"alone"}
    committed = json.loads((ROOT / "bench" / "results" / "same_code.json").read_text())
    assert all(set(e) == {"same_as", "check", "evidence"} and "same_metrics" in e["check"]
               and {"runs", "metrics", "machine", "archived", "covers_not"} <= set(e["evidence"])
               for e in committed.values())            # each equality names the check that shows it
    monkeypatch.setattr(runs, "code_hash", lambda: "new")
    monkeypatch.setattr(protocol, "code_hash", lambda: "new")
    calls = []

    def fake_main(argv):
        calls.append(argv)
        Path(argv[argv.index("--out-dir") + 1], "metrics.jsonl").write_text("{}\n")
        return 0
    import train
    monkeypatch.setattr(train, "main", fake_main)
    for made_by, reused in (("older", True), ("unrelated", False), ("", False)):
        d = tmp_path / f"run-{made_by or 'unrecorded'}"
        d.mkdir()
        (d / "done").write_text("1.0 s\n")
        (d / "argv.json").write_text(json.dumps(["--lr", "1e-4"]))
        (d / "code.sha256").write_text(made_by + "\n")
        before = len(calls)
        run_train(["--lr", "1e-4"], d, threads=1, in_process=True)
        assert (len(calls) == before) == reused, made_by
    line = protocol.code_line({"current": "new", "runs": {"older": 3, "new": 1},
                               "same": ["older"]})
    assert "3 by older (computes the same numbers as the current code" in line


def test_a_run_records_its_cpu_kind():
    avx512 = "model name\t: AMD EPYC 9R14\nflags\t\t: fpu avx2 avx512f avx512bw\n"
    avx2 = "model name\t: AMD EPYC 7R13 Processor\nflags\t\t: fpu avx2 fma\n"
    assert runs.cpu_kind(avx512) == "AMD EPYC 9R14, AVX-512"
    assert runs.cpu_kind(avx2) == "AMD EPYC 7R13 Processor, no AVX-512"
    assert runs.cpu_kind("") == "unknown"
    assert "cpu.txt" in KEPT
    made = {"a": [{"cpu": "X, AVX-512"}, {"cpu": "Y, no AVX-512"}], "b": [{"cpu": None}]}
    line = cpu_line(made)
    assert "2 of 3 runs recorded their CPU kind (X, AVX-512; Y, no AVX-512)" in line
    assert "the other 1 were made before" in line
    # one recorded kind beside runs of no recorded kind is not "every run on one kind"
    one = cpu_line({"a": [{"cpu": "X, AVX-512"}], "b": [{"cpu": None}]})
    assert "one CPU kind" not in one and "1 of 2 runs recorded" in one
    assert "one CPU kind, X, AVX-512." in cpu_line({"a": [{"cpu": "X, AVX-512"}]})
    two = cpu_line({"a": [{"cpu": "X, AVX-512"}, {"cpu": "Y, no AVX-512"}]})
    assert "mix 2 CPU kinds" in two


def test_an_analyse_only_call_trains_and_removes_nothing(tmp_path, monkeypatch):
    """train False: a finished run of another code is neither rerun nor removed; a missing run
    is not made; both come back None (the plan lists them as missing)."""
    import train
    monkeypatch.setattr(train, "main", lambda argv: pytest.fail("trained"))
    stale = tmp_path / "stale"
    stale.mkdir()
    (stale / "done").write_text("1.0 s\n")
    (stale / "code.sha256").write_text("another code\n")
    assert run_train([], stale, threads=1, in_process=True, train=False) is None
    assert (stale / "done").exists()
    absent = tmp_path / "absent"
    plan = Plan(tmp_path, 1, 1, True, train=False)
    plan.run_all([([], absent), ([], stale)])
    assert plan.missing == {absent, stale} and not absent.exists() and plan.ran == []


def test_an_analyse_only_call_reads_runs_whose_base_model_is_not_here(tmp_path, monkeypatch):
    """train False and the run's --model not on this machine: the run is read as its
    model.sha256 records (a fresh clone checks the archive's verdicts without making the model).
    recorded_models is what run_experiment checks first: the setting's runs must record one base
    model."""
    import train
    monkeypatch.setattr(train, "main", lambda argv: pytest.fail("trained"))
    argv = ["--model", "assets/no-such-model", "--steps", "1"]
    made = tmp_path / "setting" / "report" / "arm" / "seed-100"
    made.mkdir(parents=True)
    (made / "done").write_text("1.0 s\n")
    (made / "argv.json").write_text(json.dumps(argv))
    (made / "model.sha256").write_text("aaaa\n")
    (made / "code.sha256").write_text(runs.code_hash() + "\n")
    assert run_train(argv, made, threads=1, in_process=True, train=False) == made
    assert recorded_models(tmp_path / "setting") == {"aaaa"}
    other = tmp_path / "setting" / "report" / "arm" / "seed-101"
    other.mkdir(parents=True)
    (other / "done").write_text("1.0 s\n")
    (other / "model.sha256").write_text("bbbb\n")
    assert recorded_models(tmp_path / "setting") == {"aaaa", "bbbb"}
