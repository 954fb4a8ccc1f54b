"""bench/: each script runs at tiny sizes and prints (or draws) what its docstring promises. The PNG
tests skip with the reason where matplotlib is absent (the main CI venv installs only
requirements.txt), except under REQUIRE_BENCH=1 (.ci/run's stage with requirements-bench.txt), where
a missing dependency fails them; the rest needs nothing else."""
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import cpu_env

ROOT = Path(__file__).resolve().parents[1]

REQUIRE_BENCH = os.environ.get("REQUIRE_BENCH") == "1"


def needs(module: str):
    """Skip where `module` (an optional dependency, requirements-bench.txt) is not installed, with
    the reason; under REQUIRE_BENCH=1 never: the test runs and fails."""
    return pytest.mark.skipif(importlib.util.find_spec(module) is None and not REQUIRE_BENCH,
                              reason=f"{module} is not installed (requirements-bench.txt)")


HAS_MPL = importlib.util.find_spec("matplotlib") is not None
needs_mpl = needs("matplotlib")
TINY = ["--prompts-per-step", "4", "--group-size", "4", "--micro-batch-size", "8", "--threads", "1"]


def run(*args, timeout=120) -> str:
    """A bench script with CUDA hidden (cpu_env): compare.py and step_time.py run train.py's set-up,
    which takes CUDA (and, --engine auto, vLLM) where present; these checks are the CPU's."""
    p = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True,
                       timeout=timeout, env=cpu_env())
    assert p.returncode == 0, p.stdout + p.stderr
    return p.stdout


def fake_run(tmp_path: Path) -> Path:
    """A metrics.jsonl in train.py's form: step 0 eval, then steps with every key plot_run draws."""
    rows = [{"step": 0, "eval/accuracy": 0.3}]
    for s in range(1, 6):
        rows.append({"step": s, "reward/mean": 0.2 + 0.05 * s, "reward/zero_std_frac": 0.4,
                     "loss/clip_frac": 0.05, "loss/veto_frac": 0.0,
                     "replay/age_mean": min(s - 1, 2.5), "replay/age_max": min(s - 1, 4),
                     "replay/size": 512 * min(s, 5), "response/len_mean": 2.7,
                     "response/truncated_frac": 0.0, "time/generate": 0.1, "time/update": 0.4,
                     "time/step": 0.5, **({"eval/accuracy": 0.3 + 0.02 * s} if s % 5 == 0 else {})})
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return tmp_path


def test_plot_run_reads_series_without_matplotlib(tmp_path):
    import plot_run
    rows = plot_run.load_metrics(str(fake_run(tmp_path)))
    assert plot_run.series(rows, "eval/accuracy") == ([0, 5], [0.3, 0.4])
    assert plot_run.series(rows, "replay/size")[0] == [1, 2, 3, 4, 5]
    with pytest.raises(FileNotFoundError, match="metrics.jsonl"):
        plot_run.load_metrics(str(tmp_path / "nope"))


def test_plot_run_without_matplotlib_says_so_in_one_line(tmp_path, monkeypatch, capsys):
    import plot_run
    monkeypatch.setitem(sys.modules, "matplotlib", None)          # import matplotlib -> ImportError
    assert plot_run.main([str(fake_run(tmp_path))]) == 2
    err = capsys.readouterr().err.strip()
    assert err == plot_run.MISSING_MPL and "requirements-bench.txt" in err
    assert not (tmp_path / "curves.png").exists()


@needs_mpl
def test_plot_run_writes_png_next_to_the_run(tmp_path):
    out = run("bench/plot_run.py", str(fake_run(tmp_path)))
    png = tmp_path / "curves.png"
    assert (f"wrote {png}" in out and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
            and png.stat().st_size > 10_000)


@pytest.mark.paths
def test_step_time_splits_a_real_step_and_checks_bucketing(cpu_only):
    """In process on the CPU (cpu_only): --engine auto would be vLLM where CUDA and vllm are."""
    import step_time
    m = step_time.measure(TINY, warmup=2, repeats=1, consecutive=True)
    assert m["fresh"] == 16 and m["replayed"] == 8              # replay ratio 0.5 after the warm-up
    assert (all(m[p] > 0 for p in step_time.PARTS)
            and m["step"] == pytest.approx(sum(m[p] for p in step_time.PARTS)))
    assert m["micro_batches"] == 3 and m["real_tokens"] > 0 and m["padded_tokens"] >= 0
    assert m["padded_tokens"] <= m["consec_padded_tokens"]      # sorting by length never pads more
    # same gradient up to rounding: float32 micro-batches of other shapes, ~1e-7 relative
    assert m["consec_grad_max_abs_diff"] <= 1e-6 + 1e-4 * m["grad_max_abs"]
    text = step_time.report(m)
    for needle in ("generate", "score", "sample+store", "update", "sync", "completion tokens/s",
                   "real tokens/s", "padded share", "update / bare =", "consecutive micro-batches",
                   "max |diff|"):
        assert needle in text


def test_step_time_cli_on_the_long_completion_task():
    """The second built-in task's flags pass through to train.py's set-up (it trains on
    builtin_steps' train split)."""
    out = run("bench/step_time.py", "--warmup", "1", "--repeats", "1", "--", *TINY, "--train-data",
              "builtin_steps", "--model", "assets/tiny-steps", "--max-new-tokens", "24")
    assert ("padded share" in out and "update / bare" in out and "target <= 15%" in out
            and "builtin_steps" in out)


def test_bench_buffer_times_the_buffer_s_sample_against_a_loop():
    """The default mode: the buffer's sample (train.py's call) and the naive loop draw as many
    rollouts, and both are timed."""
    out = run("bench/bench_buffer.py", "--n", "3000", "--k", "100", "--repeats", "1")
    lines = out.splitlines()
    assert lines[0].startswith("n=3000 stored (after eviction ") and ", k=100," in lines[0]
    assert [line.split()[0] for line in lines[1:]] == ["RolloutReplay.sample", "naive", "speed-up"]


def test_bench_buffer_overhead_table():
    out = run("bench/bench_buffer.py", "--overhead", "--sizes", "1000,20000",
              "--step-seconds", "1.5", "--repeats", "2")
    assert ("512 fresh rollouts per step, replay ratio 0.5 (sample 256)" in out
            and "training step 1500 ms" in out)
    rows = [line.split() for line in out.splitlines()[2:]]
    assert [int(r[0]) // 1000 for r in rows] == [1, 20] and all(r[-1].endswith("%") for r in rows)


def test_compare_quick_runs_train_py_and_writes_the_table(tmp_path):
    out = run("bench/compare.py", "--quick", "--methods", "grpo,rollout-replay", "--jobs", "2",
              "--out", str(tmp_path), "--", "--steps", "2", "--prompts-per-step", "4",
              "--group-size", "4", "--eval-size", "20", "--eval-every", "1", timeout=240)
    assert "4 runs (2 methods x 2 seeds)" in out                          # --quick: seeds 0,1
    table = (tmp_path / "results.md").read_text()
    assert "| method | seeds | final accuracy |" in table
    assert ("target accuracy = start + 0.9 x (grpo's final mean - start)" in table
            or "no target: grpo's" in table)
    rows = {line.split(" | ")[0].strip("| "): line for line in table.splitlines()
            if line.startswith("| ") and "method" not in line}
    # AES of the baseline against itself
    assert set(rows) == {"grpo", "rollout-replay"} and "+0.000" in rows["grpo"]
    for method in ("grpo", "rollout-replay"):
        for seed in (0, 1):
            assert (tmp_path / method / f"seed-{seed}" / "metrics.jsonl").exists()
    assert (tmp_path / "compare.png").exists() == (HAS_MPL or REQUIRE_BENCH)


@needs_mpl
def test_experiment_plots_draw_every_seed_where_the_setting_asks(tmp_path):
    """Setting.seed_curves: seeds.png beside accuracy.png and sweep.png (the real model's setting:
    5 seeds, each seed's curve in every arm); the other settings draw no seeds.png."""
    sys.path.insert(0, str(ROOT / "bench"))
    from design import Arm, Setting
    from report import plots

    def curve(accs):
        return [(i, 64 * i, i, float(i), a) for i, a in enumerate(accs)]
    arms = (Arm("grpo", ()), Arm("replay", ()))
    runs = {name: [{"seed": 100 + i, "curve": curve([0.1, 0.12 + shift + 0.01 * i])}
                   for i in range(3)] for name, shift in (("grpo", 0.0), ("replay", 0.02))}
    for seeds, out in ((True, tmp_path / "with"), (False, tmp_path / "without")):
        s = Setting("smollm2", (), arms, "grpo", seed_curves=seeds)
        summary = {"setting": s, "runs": runs, "chosen": {"grpo": 1e-4, "replay": 2e-5},
                   "sweep": {"grpo": {1e-4: [0.1]}, "replay": {2e-5: [0.1]}}}
        out.mkdir()
        assert plots(summary, out)
        assert (out / "accuracy.png").exists() and (out / "seeds.png").exists() == seeds


def test_a_setting_without_sweep_runs_says_so_and_draws_no_sweep(tmp_path):
    """smollm2's lr was fixed on sweeps kept outside the archive (Setting.lr_note): no runs to
    draw, so sweep.md says where the lr came from instead of an empty table, and no sweep.png (an
    empty plot) is drawn beside accuracy.png."""
    sys.path.insert(0, str(ROOT / "bench"))
    from design import Arm, Setting
    from report import plots, sweep_table, swept
    arms = (Arm("grpo", ()), Arm("replay", ()))
    s = Setting("smollm2", (), arms, "grpo", shared_lr=2e-5)
    summary = {"setting": s, "chosen": {"grpo": 2e-5, "replay": 2e-5},
               "sweep": {"grpo": {}, "replay": {}}, "sweep_seeds": [0], "grid": [2e-5],
               "runs": {name: [{"seed": 100, "curve": [(0, 0, 0, 0.0, 0.1), (1, 64, 1, 1.0, 0.2)]}]
                        for name in ("grpo", "replay")}}
    assert not swept(summary)
    text = sweep_table(summary)
    assert text.startswith("No sweep runs here") and "grpo 2e-05, replay 2e-05" in text
    assert "|" not in text
    summary["sweep"]["grpo"] = {2e-5: [0.1]}
    assert swept(summary) and "| grpo |" in sweep_table(summary)
    if HAS_MPL:
        summary["sweep"]["grpo"] = {}
        assert plots(summary, tmp_path)
        assert (tmp_path / "accuracy.png").exists() and not (tmp_path / "sweep.png").exists()


def test_compare_help_lines_are_at_most_100_characters():
    p = subprocess.run([sys.executable, "bench/compare.py", "--help"], cwd=ROOT, text=True,
                       capture_output=True, timeout=120, env=cpu_env(COLUMNS="100"))
    assert p.returncode == 0 and max(map(len, p.stdout.splitlines())) <= 100, p.stdout
