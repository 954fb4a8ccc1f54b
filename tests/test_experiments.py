"""bench/experiments.py: the protocol's pieces on hand-built numbers, what each experiment holds
equal, and `python bench/compare.py --experiment NAME --quick` end to end for every experiment."""
import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT as _ROOT, Beside, beside, cpu_env

ROOT = Path(_ROOT)

sys.path.insert(0, str(ROOT / "bench"))
import experiments  # noqa: E402  (run_experiment, the entry point)
import protocol  # noqa: E402  (where run_setting reads load and stream: patched there)
from curves import to_target  # noqa: E402
from design import ACTED, REPORT_SEEDS, STRESS_SEEDS, Arm, Setting  # noqa: E402
from papers import EXPERIMENTS  # noqa: E402
from papers.r2po import R2PO_BAND, R2PO_MOVES, R2PO_STRESS_LR  # noqa: E402
from papers.replay import (EQUAL_UPDATE, FILTERED, LARGER_UPDATE, PRIORITIZED,  # noqa: E402
                           WEIGHTED)
from protocol import (Plan, choose, choose_reading, past_edge, reported_readings,  # noqa: E402
                      run_dir, run_setting, slug, stress_lr)
from runs import (KEPT, base_model_hash, pack_runs, run_train, slow_bf16,  # noqa: E402
                  unpack_runs)
from verdicts import VERDICT_RULE  # noqa: E402
from papers.headroom_drift import AGAINST_NAIVE  # noqa: E402


def flag(argv, name):
    """The last value of --name in argv (argparse: the last one wins)."""
    return [argv[i + 1] for i, a in enumerate(argv) if a == name][-1]


def test_choose_takes_the_best_mean_and_ties_go_to_the_larger_lr():
    assert choose({3e-4: [0.5, 0.3], 1e-4: [0.45, 0.45], 3e-5: [0.1, 0.2]}) == 1e-4
    assert choose({3e-4: [0.4, 0.5], 1e-4: [0.5, 0.4], 3e-5: [0.2, 0.2]}) == 3e-4
    assert choose({3e-4: [0.0, 0.1], 1e-4: [0.3, 0.3], 3e-5: [0.3, 0.3]}) == 1e-4


def test_to_target_interpolates_the_crossing_and_censors_at_the_budget():
    runs = [{"curve": [(0, 0, 0, 0.0, 0.5), (1, 10, 4, 1.0, 0.55), (2, 20, 8, 2.0, 0.7)]},
            {"curve": [(0, 0, 0, 0.0, 0.5), (1, 10, 4, 1.5, 0.65), (2, 20, 8, 3.0, 0.8)]},
            {"curve": [(0, 0, 0, 0.0, 0.5), (1, 10, 4, 1.0, 0.5)]}]
    # 10 + (0.6 - 0.55) / 0.15 x 10 = 13.33; 0 + 0.1 / 0.15 x 10 = 6.67; never: censored at 10
    t = to_target(runs, 0.6, "fresh")
    assert t.mean == pytest.approx(10.0) and (t.reached, t.n) == (2, 3)
    t = to_target(runs, 0.6, "updates")          # 5.33, 2.67, 4
    assert t.mean == pytest.approx(4.0) and (t.reached, t.n) == (2, 3)
    t = to_target(runs, 0.9, "fresh")            # every run at its budget
    assert t.mean == pytest.approx(50 / 3) and t.reached == 0


@pytest.mark.parametrize("quick", [False, True])
def test_mu_grpo_holds_updates_rollouts_per_update_and_fresh_rollouts_equal(quick):
    for s in EXPERIMENTS["mu-grpo"](quick).settings:
        seen = set()
        for arm in s.arms:
            argv = [*s.flags, *arm.flags]
            steps, prompts = int(flag(argv, "--steps")), int(flag(argv, "--prompts-per-step"))
            mu, group = int(flag(argv, "--mini-batches")), int(flag(argv, "--group-size"))
            rollouts = prompts * group
            seen.add((steps * mu, rollouts // mu, steps * rollouts))     # U, M, fresh
            assert rollouts % mu == 0
        assert len(seen) == 1, (s.label, seen)
        assert {flag([*s.flags, *a.flags], "--steps") for a in s.arms} == {
            str(seen.pop()[0] // 4), "4"}                                 # mu = 4 and mu = U / 4


def test_pnpo_holds_everything_but_the_ratio_clip_and_epochs():
    """4 mini-batches a step in every arm (every update after the first off-policy), at 1 and 4
    epochs: the token, GSPO, exact cumulative ratio and PNPO's two readings (chosen on dev); the
    claims carry the far-prefix diagnostic."""
    s, stress, _ = EXPERIMENTS["pnpo"](False).settings
    assert flag(list(s.flags), "--mini-batches") == "4"
    ratios = {flag(list(a.flags), "--ratio") for a in s.arms}
    assert ratios == {"token", "gspo", "pnpo", "pnpo-geo", "cumulative"}
    assert {flag(list(a.flags), "--epochs") for a in s.arms} == {"1", "4"}
    for a in s.arms:
        assert set(a.flags[::2]) <= {"--ratio", "--eps-low", "--eps-high", "--epochs"}
    assert s.readings == (("pnpo e1 x 4", "pnpo-geo e1 x 4"), ("pnpo e4 x 4", "pnpo-geo e4 x 4"))
    on_gspo = {(c.arm, c.metric): c.direction for c in s.claims if c.against.startswith("gspo")}
    assert on_gspo == {("pnpo e1 x 4", "final"): 0, ("pnpo-geo e1 x 4", "final"): 0,
                       ("pnpo e4 x 4", "final"): 1, ("pnpo-geo e4 x 4", "final"): 1,
                       ("pnpo e4 x 4", "peak"): 1, ("pnpo-geo e4 x 4", "peak"): 1}
    # the headline is the abstract's: the peak at 4 epochs against GSPO's
    assert {(c.arm, c.against, c.metric) for c in s.claims if c.headline} == {
        ("pnpo e4 x 4", "gspo e4 x 4", "peak"), ("pnpo-geo e4 x 4", "gspo e4 x 4", "peak")}
    assert all(c.acted == ("ratio/far_prefix_frac", "mean > 0.01")
               for c in s.claims if c.direction is not None)
    assert [a.name for a in stress.arms] == [a.name for a in s.arms if a.name.endswith("e4 x 4")]
    assert stress.readings == (("pnpo e4 x 4", "pnpo-geo e4 x 4"),)
    assert stress.flags == s.flags and stress.sweep == s.sweep      # the dev sweep's runs


PRE_REGISTERED = {"pnpo": ("steps-5e-5",), "headroom-drift": ("steps-gate",)}


def test_every_claim_names_reported_arms_and_every_setting_evaluates_often():
    """Each claim's arm and reference are arms of its setting; a run evaluates at least every 5
    steps (the real model every 10: a 500-prompt evaluation there costs what 2 training steps do,
    and its verdict reads the evaluations at 30 and 40 either way); the replay comparison runs 10
    paired seeds (on the real model 5), the stress and pre-registered settings 10, the rest
    REPORT_SEEDS; the real model's draws (group-sequential) its 20 fresh seeds 105-124, its
    compute setting 125-144."""
    for name, make in EXPERIMENTS.items():
        for s in make(False).settings:
            names = {a.name for a in s.arms}
            for c in s.claims:
                assert c.arm in names and (c.against or s.baseline) in names, (name, c)
            for a in s.arms:
                argv = [*s.flags, *a.flags]
                most = 10 if s.label.startswith("smollm2") else 5
                assert int(flag(argv, "--eval-every")) <= most, (name, a.name)
            if s.label == "smollm2-draws":
                assert s.seeds == tuple(range(105, 125)) and s.looks == (10, 20)
                continue
            if s.label == "smollm2-compute":
                assert s.seeds == tuple(range(125, 145)) and s.looks == (10, 20)
                continue
            ten = ((name == "replay" and s.label != "smollm2") or s.label.endswith("-stress")
                   or s.label in PRE_REGISTERED.get(name, ()))
            assert len(s.seeds) == (10 if ten else 5), (name, s.label)
            assert s.seeds[:5] == REPORT_SEEDS


def test_the_new_readings_and_controls_are_there():
    (dapo,) = EXPERIMENTS["dapo"](False).settings
    control = next(a for a in dapo.arms if a.name == "grpo 16 updates")
    assert flag([*dapo.flags, *control.flags], "--mini-batches") == "16"
    arith, steps, _ = EXPERIMENTS["mu-grpo"](False).settings
    deltas = {flag([*steps.flags, *a.flags], "--veto-threshold") for a in steps.arms
              if a.name.startswith("mu-grpo")}
    assert deltas == {"1e-2", "1e-3", "1e-4"} and len(steps.readings[0]) == 3
    grpo4 = next(a for a in steps.arms if a.name == "grpo mu=4")
    argv = [*steps.flags, *grpo4.flags]
    assert int(flag(argv, "--steps")) * int(flag(argv, "--mini-batches")) == 256     # U
    vigor_steps = EXPERIMENTS["vigor"](False).settings[1]
    assert flag(list(vigor_steps.flags), "--reward") == "partial"
    assert any("top-k" in n for n in vigor_steps.readings[0])
    hd_steps = EXPERIMENTS["headroom-drift"](False).settings[1]
    for a in hd_steps.arms[2:]:                        # one candidate pool: every eligible group
        argv = [*hd_steps.flags, *a.flags]
        pool = int(flag(argv, "--prompts-per-step")) * int(flag(argv, "--tau-max"))
        assert int(flag(argv, "--tau-max")) == 16 and int(flag(argv, "--hd-candidates")) == pool
    r2 = {s.label: s for s in EXPERIMENTS["r2po"](False).settings}
    for label in ("arith", "steps"):              # arith-stress: the head's lr alone, no official
        official = next(a for a in r2[label].arms if a.name == "r2po (official policy phase)")
        assert flag(list(official.flags), "--kl-coef") == "0.04"
    assert flag(list(r2["steps"].flags), "--reward") == "partial+format"   # outcome classes


def every_quick_protocol(base: Path) -> dict:
    """`compare.py --experiment NAME --quick` for every experiment, one after another (one
    thread), each into base/quick-NAME: {name: (process, folder)}. The suite runs it beside its
    other tests (conftest.Beside)."""
    out = {}
    for name in EXPERIMENTS:
        folder = base / f"quick-{name}"
        folder.mkdir()
        cmd = [sys.executable, "bench/compare.py", "--experiment", name, "--quick", "--out",
               str(folder)]
        out[name] = (Beside.run(cmd, cwd=ROOT, env=cpu_env(OMP_NUM_THREADS="1")), folder)
    return out


BESIDE = {"quick_runs": every_quick_protocol}


@pytest.fixture(scope="module")
def quick_runs(request, tmp_path_factory):
    """every_quick_protocol's {name: (process, folder)}, run beside the suite."""
    return beside(request, "quick_runs", tmp_path_factory)


@pytest.mark.parametrize("name", list(EXPERIMENTS))
def test_experiment_quick_runs_the_protocol_end_to_end(name, quick_runs):
    proc, tmp_path = quick_runs[name]
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    readme = (tmp_path / "README.md").read_text()
    assert "**Claim**" in readme and "**Held equal**" in readme
    for s in EXPERIMENTS[name](True).settings:
        results = (tmp_path / s.label / "results.md").read_text()
        sweep = (tmp_path / s.label / "sweep.md").read_text()
        for arm in s.arms:
            assert f"| {arm.name} |" in results and f"| {arm.name} |" in sweep
        rows = [line for line in sweep.splitlines()
                if line.startswith("| ") and "| arm |" not in line]
        assert [row.count("**") for row in rows] == [2] * len(s.arms)   # one chosen lr per arm
        arm = slug(s.arms[0].name)
        dev = tmp_path / "runs" / s.label / "sweep" / arm / "lr-3e-05" / "seed-0" / "metrics.jsonl"
        (test,) = (tmp_path / "runs" / s.label / "report" / arm).glob(
            f"lr-*/seed-{REPORT_SEEDS[0]}")                  # at its chosen lr
        dev_rows = [json.loads(line) for line in open(dev)]
        test_rows = [json.loads(line) for line in open(test / "metrics.jsonl")]
        assert any("eval/dev_accuracy" in r for r in dev_rows)           # the sweep sees dev
        assert not any("eval/accuracy" in r for r in dev_rows)           # and never test
        assert any("eval/accuracy" in r for r in test_rows)
        assert not any("eval/dev_accuracy" in r for r in test_rows)
        summary = json.loads((tmp_path / s.label / "summary.json").read_text())
        for group in s.readings:      # one reading of each method reported, the dev's choice
            report = tmp_path / "runs" / s.label / "report"
            reported = [n for n in group if (report / slug(n)).exists()]
            pick = summary["picked"][" | ".join(group)]
            best = summary["also"].get(" | ".join(group))     # outside the band, beside it
            assert sorted(reported) == sorted(n for n in (pick, best) if n)
            assert f"**{pick}** reported" in sweep
            assert all(f"| {n} |" not in results.split("The sweep:")[0]
                       for n in group if n not in reported)
        if os.environ.get("REQUIRE_BENCH") == "1" or _has_mpl():
            assert (tmp_path / s.label / "accuracy.png").exists()


def _has_mpl() -> bool:
    try:
        import matplotlib  # noqa: F401
        return True
    except ImportError:
        return False


def test_unknown_experiment_is_one_line(tmp_path):
    proc = subprocess.run([sys.executable, "bench/compare.py", "--experiment", "nope"], cwd=ROOT,
                          env=cpu_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "unknown experiment 'nope'" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert Path(ROOT, "bench", "experiments.py").exists()


def test_past_edge_sweeps_one_more_half_decade_where_the_best_is_at_an_edge():
    assert past_edge({3e-4: [0.1], 1e-4: [0.2], 3e-5: [0.3]}) == 1e-5
    assert past_edge({3e-4: [0.3], 1e-4: [0.2], 3e-5: [0.1]}) == 1e-3
    assert past_edge({1e-4: [0.1], 3e-5: [0.1], 1e-5: [0.3]}) == 3e-6
    assert past_edge({3e-4: [0.1], 1e-4: [0.3], 3e-5: [0.1]}) is None   # interior


def test_choose_reading_takes_the_best_dev_accuracy_within_the_band():
    sweep = {"a": {1e-4: [0.4, 0.4]}, "b": {1e-4: [0.5, 0.5], 3e-5: [0.7, 0.7]},
             "c": {3e-5: [0.6, 0.6]}}
    chosen = {"a": 1e-4, "b": 1e-4, "c": 3e-5}          # each at its own chosen lr
    assert choose_reading(("a", "b", "c"), sweep, chosen) == "c"
    band = {"a": 0.01, "b": 0.05, "c": 0.5}
    assert choose_reading(("a", "b", "c"), sweep, chosen, band, 0.1) == "b"
    # none inside the band: the one nearest to it
    assert choose_reading(("a", "c"), sweep, chosen, {"a": 0.3, "c": 0.2}, 0.1) == "c"
    tie = {"a": {1e-4: [0.5]}, "b": {1e-4: [0.5]}}
    assert choose_reading(("b", "a"), tie, {"a": 1e-4, "b": 1e-4}) == "b"


def test_the_best_dev_reading_is_reported_beside_the_band_s_pick():
    """Where the band excludes the best reading on dev, both are reported: the band's pick with
    the headline, the best beside it; without a band, or when the band keeps the best, one."""
    sweep = {"a": {1e-4: [0.4]}, "b": {1e-4: [0.5]}, "c": {3e-5: [0.6]}}
    chosen = {"a": 1e-4, "b": 1e-4, "c": 3e-5}
    group = ("a", "b", "c")
    banded = Setting("x", (), (), "a", readings=(group,), band=("kl", 0.1))
    picked, also = reported_readings(banded, sweep, chosen,
                                                 {"a": 0.01, "b": 0.05, "c": 0.5})
    assert picked == {group: "b"} and also == {group: "c"}
    picked, also = reported_readings(banded, sweep, chosen,
                                                 {"a": 0.01, "b": 0.05, "c": 0.05})
    assert picked == {group: "c"} and also == {}
    free = Setting("x", (), (), "a", readings=(group,))
    assert reported_readings(free, sweep, chosen, {}) == ({group: "c"}, {})


def test_the_archive_is_packed_after_every_finished_run(tmp_path, monkeypatch):
    """A session stopped in the middle of a setting keeps the runs it finished: the plan packs
    OUT/runs.tar.gz again after each one."""
    import train

    def fake_main(argv):
        out = Path(argv[argv.index("--out-dir") + 1])
        if "3e-5" in argv:
            raise KeyboardInterrupt        # the session stops during the second run
        (out / "metrics.jsonl").write_text('{"step": 0, "eval/accuracy": 0.5}\n')
        return 0

    monkeypatch.setattr(train, "main", fake_main)
    runs, archive = tmp_path / "runs", tmp_path / "out" / "runs.tar.gz"
    plan = Plan(runs, 1, 1, True, archive=archive)
    with pytest.raises(KeyboardInterrupt):
        plan.run_all([(["--lr", lr], runs / "arith" / "sweep" / lr) for lr in ("1e-4", "3e-5")])
    fresh = tmp_path / "clone"
    assert unpack_runs(archive, fresh) == 1
    assert (fresh / "arith" / "sweep" / "1e-4" / "done").exists()


def _budget(argv):
    budget = int(flag(argv, "--vigor-budget")) if "--vigor-budget" in argv else 0
    return budget or int(flag(argv, "--prompts-per-step")) * int(flag(argv, "--group-size"))


@pytest.mark.parametrize("quick", [False, True])
def test_vigor_arms_spend_the_same_rollouts_per_step(quick):
    for s in EXPERIMENTS["vigor"](quick).settings:
        assert len({(_budget([*s.flags, *a.flags]), flag([*s.flags, *a.flags], "--steps"))
                    for a in s.arms}) == 1
        screened = [a for a in s.arms if "2x prompts" in a.name]
        prompts = int(flag(list(s.flags), "--prompts-per-step"))
        assert screened and all(int(flag([*s.flags, *a.flags], "--prompts-per-step"))
                                == 2 * prompts for a in screened)
        assert len(s.readings) == 1 and len(s.readings[0]) >= 2


@pytest.mark.parametrize("quick", [False, True])
def test_r2po_arms_hold_policy_updates_or_loop_steps_equal(quick):
    for s in EXPERIMENTS["r2po"](quick).settings:
        r2 = [a for a in s.arms if "--r2po-schedule" in a.flags]
        grpo = {a.name: int(flag([*s.flags, *a.flags], "--steps")) for a in s.arms
                if a not in r2 and "official" not in a.name}
        for a in r2:
            argv = [*s.flags, *a.flags]
            h, p = map(int, flag(argv, "--r2po-schedule").split(","))
            steps = int(flag(argv, "--steps"))
            assert steps % (h + p) == 0
            assert sorted(grpo.values()) == [steps // (h + p) * p, steps]   # updates, rollouts
        rewards = {flag([*s.flags, *a.flags], "--reward") for a in s.arms}
        assert rewards == {"partial+format" if s.label == "steps" else "correct+format"}
        if s.label != "arith-stress":    # one reading, no band: its own test below
            assert s.band and s.readings == (tuple(a.name for a in r2
                                                   if "official" not in a.name),)


def test_headroom_drift_holds_the_fresh_stream_and_reports_mean_at_k_on_five_seeds():
    s = EXPERIMENTS["headroom-drift"](False).settings[0]
    for key in ("--steps", "--prompts-per-step"):
        assert len({flag([*s.flags, *a.flags], key) for a in s.arms}) == 1
    prompts = int(flag(list(s.flags), "--prompts-per-step"))
    for a in s.arms:                  # replayed: at most 0.5 x fresh, as naive replay's ratio
        argv = [*s.flags, *a.flags]
        if "headroom-drift" in argv:
            assert int(flag(argv, "--hd-groups")) == prompts // 2
        elif "naive-replay" in argv:
            assert a.name == "naive-replay"
    assert flag(list(s.report_flags), "--eval-temperature") == "1.0"
    assert int(flag(list(s.report_flags), "--eval-k")) >= 8 and len(s.seeds) >= 5


def test_a_run_is_reused_only_at_the_same_lr_and_flags(tmp_path, monkeypatch):
    """The lr is part of every run's folder (a reported run at 3e-5 is not reused when the choice
    moves to 1e-5), and a finished run whose recorded flags differ runs again."""
    a = run_dir(tmp_path, "report", "grpo mu=4", 3e-5, 100)
    b = run_dir(tmp_path, "report", "grpo mu=4", 1e-5, 100)
    assert a != b and a.parent.name == "lr-3e-05" and b.name == "seed-100"
    calls = []

    def fake_main(argv):
        calls.append(argv)
        return 0

    import train
    monkeypatch.setattr(train, "main", fake_main)
    run_train(["--lr", "3e-05"], a, threads=1, in_process=True)
    run_train(["--lr", "3e-05"], a, threads=1, in_process=True)    # reused
    assert len(calls) == 1 and (a / "done").exists()
    run_train(["--lr", "3e-05", "--hd-groups", "16"], a, threads=1, in_process=True)
    assert len(calls) == 2 and "--hd-groups" in calls[-1]                     # flags changed


def test_a_run_is_not_reused_when_the_base_model_was_remade(tmp_path, monkeypatch):
    """The base weights' sha256 is recorded beside the flags (model.sha256): a finished run of a
    model directory whose model.safetensors has changed since runs again; the same bytes are
    reused."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "model.safetensors").write_bytes(b"old weights")
    calls = []

    def fake_main(argv):
        calls.append(argv)
        return 0

    import train
    monkeypatch.setattr(train, "main", fake_main)
    argv = ["--model", str(model), "--lr", "1e-4"]
    run = tmp_path / "run"
    run_train(argv, run, threads=1, in_process=True)
    old = (run / "model.sha256").read_text().strip()
    assert len(old) == 64 and old == base_model_hash(argv)
    run_train(argv, run, threads=1, in_process=True)              # same bytes
    assert len(calls) == 1
    (model / "model.safetensors").write_bytes(b"new weights, remade")
    run_train(argv, run, threads=1, in_process=True)              # remade: runs
    assert len(calls) == 2 and (run / "model.sha256").read_text().strip() != old
    assert base_model_hash(["--lr", "1e-4"]) == ""                # no --model


def test_unknown_setting_is_one_line():
    proc = subprocess.run([sys.executable, "bench/compare.py", "--experiment", "dapo",
                           "--setting", "nope"], cwd=ROOT, env=cpu_env(), capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode != 0 and "has no setting 'nope'" in proc.stderr
    assert "arith" in proc.stderr and "Traceback" not in proc.stderr


def test_one_setting_runs_and_the_readme_keeps_the_others(tmp_path, monkeypatch):
    """--setting arith runs only that setting; the experiment's README takes the long task's table
    from its results.md (without the verdict rule, which the README states once)."""
    ran = []
    monkeypatch.setattr(experiments, "run_setting", lambda s, plan: ran.append(s.label) or s)
    monkeypatch.setattr(experiments, "write_setting", lambda s, out, exp: f"## {s.label} (new)\n")
    (tmp_path / "steps").mkdir()
    (tmp_path / "steps" / "results.md").write_text(
        "## steps (earlier)\n\n" + VERDICT_RULE + "\n")
    text = experiments.run_experiment("replay", tmp_path, runs=tmp_path / "runs", only="arith")
    assert ran == ["arith"]
    assert "## arith (new)" in text and "## steps (earlier)" in text
    assert text.count(VERDICT_RULE) == 1
    (tmp_path / "steps" / "results.md").unlink()
    text = experiments.run_experiment("replay", tmp_path, runs=tmp_path / "runs", only="arith")
    assert "## steps\n\nNot run yet: `python bench/compare.py --experiment replay --setting steps" \
        in text


def test_finished_runs_travel_in_the_results_archive(tmp_path, monkeypatch):
    """OUT/runs.tar.gz keeps each finished run's flags, base-model hash and metrics; a fresh clone
    unpacks the runs it lacks and reuses them, not training them again."""
    calls = []

    def fake_main(argv):
        calls.append(argv)
        out = Path(argv[argv.index("--out-dir") + 1])
        (out / "metrics.jsonl").write_text('{"step": 0, "eval/accuracy": 0.5}\n')
        (out / "samples.jsonl").write_text("{}\n")
        return 0

    import train
    monkeypatch.setattr(train, "main", fake_main)
    runs, archive = tmp_path / "runs", tmp_path / "out" / "runs.tar.gz"
    done = [run_train(["--lr", lr], runs / "arith" / "sweep" / lr, threads=1,
                                  in_process=True) for lr in ("1e-4", "3e-5")]
    pack_runs(done, runs, archive)
    packed = archive.read_bytes()
    time.sleep(1.1)                                       # a later second: gzip's time stamp
    pack_runs(done, runs, archive)
    assert archive.read_bytes() == packed                 # a rerun leaves the archive as it was
    fresh = tmp_path / "clone"
    assert unpack_runs(archive, fresh) == 2
    run = fresh / "arith" / "sweep" / "1e-4"
    assert sorted(p.name for p in run.iterdir()) == sorted(KEPT)   # no samples
    assert unpack_runs(archive, fresh) == 0                       # all there
    run_train(["--lr", "1e-4"], run, threads=1, in_process=True)
    assert len(calls) == 2                                                    # reused
    assert unpack_runs(tmp_path / "none.tar.gz", fresh) == 0


STRESS = {"mu-grpo": "steps", "pnpo": "steps", "headroom-drift": "steps"}   # stress: dev setting


def test_each_stress_setting_is_at_the_lr_the_rule_gives_on_the_committed_dev_sweep():
    """A stress setting (shared_lr) runs every arm at stress_lr of its dev-lr setting's baseline
    sweep (the committed summary.json's): the smallest lr above the chosen one where the baseline's
    mean final dev accuracy is STRESS_DROP below; its arms, flags and sweep are the dev setting's,
    so the readings are chosen on the same sweep runs; 10 seeds; the learning gate is its own."""
    assert stress_lr({3e-5: [0.37], 1e-4: [0.33], 3e-4: [0.1]}) == 3e-4
    assert stress_lr({3e-5: [0.37], 1e-4: [0.31]}) == 1e-4
    assert stress_lr({3e-5: [0.37], 1e-4: [0.35]}) is None
    for name, dev_label in STRESS.items():
        settings = {s.label: s for s in EXPERIMENTS[name](False).settings}
        stress, dev = settings["steps-stress"], settings[dev_label]
        assert stress.sweep_of == dev_label
        assert stress.flags == dev.flags and stress.baseline == dev.baseline
        assert {a.name: a.flags for a in stress.arms}.items() <= \
            {a.name: a.flags for a in dev.arms}.items()
        assert stress.seeds == STRESS_SEEDS and len(stress.seeds) == 10
        committed = ROOT / "bench" / "results" / name / dev_label / "summary.json"
        if committed.exists():
            sweep = json.loads(committed.read_text())["sweep"][dev.baseline]
            assert stress.shared_lr == stress_lr(
                {float(lr): accs for lr, accs in sweep.items()}), name


def test_r2pos_stress_setting_is_the_head_lr_that_moves_at_every_arms_dev_lr():
    """R²PO's stress is its head's lr, not the policy's: arith's arms at the policy lr every arm
    chose on arith's committed dev sweep, the head at R2PO_MOVES (whose head KL on that sweep left
    the band, > 0.1), no band, no readings to sweep again, 10 seeds."""
    settings = {s.label: s for s in EXPERIMENTS["r2po"](False).settings}
    stress, arith = settings["arith-stress"], settings["arith"]
    assert stress.sweep_of == "arith" and stress.band is None
    assert stress.readings == () and stress.seeds == STRESS_SEEDS
    assert {a.name: a.flags for a in stress.arms}.items() <= \
        {a.name: a.flags for a in arith.arms}.items()
    (head,) = [a for a in stress.arms if a.name.startswith("r2po")]
    assert flag([*stress.flags, *head.flags], "--r2po-head-lr") == R2PO_MOVES
    assert [c.arm for c in stress.claims if c.headline] == [head.name]
    committed = json.loads((ROOT / "bench" / "results" / "r2po" / "arith" / "summary.json")
                           .read_text())
    assert set(committed["chosen"].values()) == {R2PO_STRESS_LR}
    assert committed["band"][head.name] > R2PO_BAND


def test_every_mechanism_diagnostic_is_one_predicate_form():
    """Every claim's diagnostic reads a metrics key's mean over every step of every reported seed
    ("mean > X"); the stabilisers' shares (veto, PNPO's far prefixes, Headroom-Drift's selection)
    and R²PO's head KL at ACTED; the replay priority's: the lift of |A| it draws over what is
    stored (PRIORITIZED), or, on the real model's draws, over the stored A != 0 ones (WEIGHTED),
    and the filter's: a share of A = 0 among the stored (FILTERED); Headroom-Drift's selection
    against naive replay's draw (AGAINST_NAIVE); a replay against GRPO: the replayed |A| above
    ACTED (REPLAYS)."""
    shares = {"loss/veto_frac", "ratio/far_prefix_frac", "replay/hd_changed_frac",
              "r2po/head_kl_current", "replay/abs_adv_sampled"}
    for name, make in experiments.EXPERIMENTS.items():
        for s in make(False).settings:
            for c in s.claims:
                if c.acted in (WEIGHTED, FILTERED):
                    assert s.label == "smollm2-draws"
                elif c.acted in (EQUAL_UPDATE, LARGER_UPDATE):
                    assert s.label == "smollm2-compute"
                elif c.acted == AGAINST_NAIVE:
                    assert name == "headroom-drift" and c.against == "naive-replay"
                elif c.acted and c.acted[1].startswith("mean / "):     # the priority's lift
                    assert c.acted == PRIORITIZED
                elif c.acted:
                    agg, op, rhs = c.acted[1].split()
                    assert (agg, op) == ("mean", ">"), (name, c)
                    if c.acted[0] in shares:
                        assert float(rhs) == ACTED, (name, c)


def test_a_bf16_setting_is_refused_where_the_cpu_emulates_bf16():
    """A setting under --precision bf16 (the real model's, as it was first defined): on a CPU
    without bf16 instructions (no avx512_bf16, no amx_bf16 in /proc/cpuinfo) and no CUDA it is not
    run, with the reason; with either flag it runs, and a setting in fp32 (smollm2 now) runs
    anywhere."""
    (smollm2,) = [s for s in EXPERIMENTS["replay"](False).settings if s.label == "smollm2"]
    bf16 = dataclasses.replace(smollm2, flags=smollm2.flags + ("--precision", "bf16"))
    avx2 = "flags\t\t: fpu sse2 avx avx2 fma"
    assert "avx512_bf16" in slow_bf16(bf16, avx2)
    assert slow_bf16(bf16, avx2 + " avx512f avx512_bf16") == ""
    assert slow_bf16(bf16, avx2 + " amx_bf16 amx_tile") == ""
    assert "--precision" not in smollm2.flags
    assert slow_bf16(smollm2, avx2) == ""


def test_smollm2_naive_arm_differs_from_prioritized_by_the_draw_alone():
    """The real model's naive-replay arm (issue: priority or reuse) parses to the prioritized arm's
    flags but for the replay draw: the same tau_max, replay ratio, recipe and seed stream."""
    import flags as train_flags
    (s,) = [s for s in EXPERIMENTS["replay"](False).settings if s.label == "smollm2"]
    arms = {a.name: a for a in s.arms}
    assert set(arms) == {"grpo (replay recipe)", "naive-replay", "rollout-replay"}
    parsed = {name: dataclasses.asdict(train_flags.parse(
        [*s.flags, *arms[name].flags, "--lr", "2e-5", "--seed", "100"]))
        for name in ("naive-replay", "rollout-replay")}
    differ = {k for k in parsed["naive-replay"]
              if parsed["naive-replay"][k] != parsed["rollout-replay"][k]}
    assert differ == {"replay", "preset"}
    assert (parsed["naive-replay"]["replay"], parsed["rollout-replay"]["replay"]) == (
        "uniform", "prioritized")
    assert s.own_lr == ("naive-replay",) and s.shared_lr == 2e-5
    assert set(s.grid) >= {1e-5, 2e-5, 5e-5} and s.sweep_seeds == (0,) and s.dev_size == 200


def test_an_own_lr_arm_is_swept_beside_a_shared_lr(monkeypatch, tmp_path):
    """Under shared_lr, an arm of own_lr is swept on the grid (past its edge on the ladder) and
    runs at its own choice; the others run at shared_lr and sweep nothing."""
    arms = (Arm("grpo", ()), Arm("naive", ("--replay", "uniform")))
    s = Setting("x", ("--steps", "2"), arms, "grpo", grid=(5e-5, 2e-5),
                            ladder="1-2-5", sweep_seeds=(0,), seeds=(100,), shared_lr=2e-5,
                            own_lr=("naive",))
    dev = {5e-5: 0.1, 2e-5: 0.3, 1e-5: 0.2}       # 2e-5 best at the grid's edge: 1e-5 swept too
    jobs = []
    monkeypatch.setattr(Plan, "run_all",
                        lambda self, runs, split="report": jobs.extend((split, d) for _, d in runs))

    def fake_load(d, metric, *a):
        lr = float(d.parent.name[3:])
        acc = dev[lr] if "sweep" in d.parts else 0.5
        return {"final": acc, "maxima": {}, "curve": [(0, 0, 0, 0.0, acc)]}
    monkeypatch.setattr(protocol, "load", fake_load)
    monkeypatch.setattr(protocol, "stream", lambda argv: None)
    for arm in arms:
        d = run_dir(tmp_path / "x", "report", arm.name, 2e-5, 100)
        d.mkdir(parents=True)
        (d / "argv.json").write_text("[]")
    out = run_setting(s, Plan(tmp_path, 1, 1, False))
    swept = sorted(d.parent.name for split, d in jobs if split == "sweep")
    assert swept == ["lr-1e-05", "lr-2e-05", "lr-5e-05"]
    assert all("naive" in d.parts for split, d in jobs if split == "sweep")
    assert out["chosen"] == {"grpo": 2e-5, "naive": 2e-5}
    assert out["sweep"]["grpo"] == {} and set(out["sweep"]["naive"]) == set(dev)
