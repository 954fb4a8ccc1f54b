"""train.py through the real loop, in subprocesses: weights change, replay happens, flags work, bad
input is one line. Also: the flags grouped by owner, as --help shows them; the verdict and the
shaped reward, set once each."""
import dataclasses
import io
import json
import math
import os
import subprocess
import sys
from contextlib import redirect_stderr, redirect_stdout

import pytest
import torch
from safetensors.torch import load_file

import cli
import flags
import methods
import train
from conftest import cpu_env

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL = os.path.join(ROOT, "assets", "tiny-arith")
SMALL = ["--prompts-per-step", "8", "--group-size", "4", "--max-new-tokens", "6",
         "--eval-size", "16", "--eval-every", "0", "--threads", "1"]


def run_train(args, tmp_path, timeout=240):
    """train.py with CUDA hidden (cpu_env): its accuracy is compared with eval.py's on the CPU."""
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "train.py"),
                           "--out-dir", str(out), *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=cpu_env())
    return proc, out


def read_metrics(out):
    with open(out / "metrics.jsonl") as f:
        return [json.loads(line) for line in f]


@pytest.mark.paths
def test_three_steps_change_weights_and_replay(tmp_path):
    proc, out = run_train(["--steps", "3", "--tau-max", "1", "--replay-ratio", "1.0",
                           "--lr", "1e-3", *SMALL], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    steps = [m for m in read_metrics(out) if m["step"] > 0]
    assert [m["step"] for m in steps] == [1, 2, 3]
    for key in ("reward/mean", "reward/zero_std_frac", "loss/policy", "loss/clip_frac",
                "replay/size", "replay/sampled", "replay/age_mean", "response/len_mean",
                "time/generate", "time/update", "time/step"):
        assert key in steps[0], key
    assert "eval/accuracy" in steps[-1]
    assert steps[0]["replay/sampled"] == 0       # nothing older than the first step exists
    for m in steps[1:]:                          # every later step replays, none older than tau_max
        assert m["replay/sampled"] > 0
        assert 1 <= m["replay/age_max"] <= 1
    before = load_file(os.path.join(MODEL, "model.safetensors"))
    after = load_file(str(out / "final" / "model.safetensors"))
    changed = [k for k in before if not torch.equal(before[k], after[k])]
    assert len(changed) == len(before)           # every tensor moved
    from transformers import AutoModelForCausalLM
    # the checkpoint loads in plain transformers
    AutoModelForCausalLM.from_pretrained(str(out / "final"))
    # `python eval.py` on the saved checkpoint gives the accuracy train.py logged (same prompts,
    # greedy, same length; on 1 thread as train.py's --threads 1: on another thread count a kernel
    # may sum in another order, moving a tie)
    ev = subprocess.run([sys.executable, os.path.join(ROOT, "eval.py"),
                         "--model", str(out / "final"), "--limit", "16", "--max-new-tokens", "6",
                         "--out", str(tmp_path / "eval")],
                        cwd=ROOT, capture_output=True, text=True, timeout=240,
                        env=cpu_env(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1"))
    assert ev.returncode == 0, ev.stderr[-3000:]
    summary = json.loads((tmp_path / "eval" / "summary.json").read_text())
    assert (summary["benchmarks"]["builtin"]["mean@k"]
            == pytest.approx(steps[-1]["eval/accuracy"], abs=1e-12))


# The objective's flags that no preset sets (tests/test_presets.py runs every preset, which
# covers GRPO, Dr. GRPO, GSPO, PNPO, mu-GRPO's suffix veto, M2PO, DAPO's extras and no replay):
# 2 steps each through train.main in process, and what each flag must show in the metrics.
FLAG_SETS = {
    "veto-trigger-token-sum": ["--veto-scope", "trigger", "--veto-threshold", "0.5",
                               "--agg", "seq-mean-token-sum"],
    "veto-response-dual-clip": ["--veto-scope", "response", "--veto-threshold", "0.5",
                                "--dual-clip", "3"],
    "kl-k3-tis": ["--kl-coef", "0.05", "--kl-estimator", "k3", "--tis-cap", "2"],
    "kl-k2-uniform-capacity": ["--kl-coef", "0.05", "--kl-estimator", "k2", "--replay", "uniform",
                               "--replay-capacity", "40"],
}


@pytest.mark.usefixtures("cpu_only")
@pytest.mark.parametrize("name", sorted(FLAG_SETS))
def test_flag_combinations_run(tmp_path, name):
    out = tmp_path / "run"
    with redirect_stdout(io.StringIO()), redirect_stderr(io.StringIO()):
        rc = train.main(["--steps", "2", *SMALL, "--save-every", "0", "--lr", "1e-2",
                         "--out-dir", str(out), *FLAG_SETS[name]])
    assert rc == 0
    rows = read_metrics(out)[1:]
    assert [m["step"] for m in rows] == [1, 2]
    assert all(math.isfinite(v) for m in rows for v in m.values() if isinstance(v, float))
    if name.startswith("veto"):            # a threshold of 0.5 fires on some A < 0 response
        assert max(m["loss/veto_frac"] for m in rows) > 0
    if name.startswith("kl"):
        assert rows[-1]["kl"] > 0          # the policy moved away from the reference
    if name == "kl-k2-uniform-capacity":
        assert rows[-1]["replay/size"] <= 40 and rows[-1]["replay/sampled"] > 0


def test_eval_benchmarks_are_logged(tmp_path):
    bench = tmp_path / "mini.jsonl"
    bench.write_text("".join(json.dumps({"question": q, "answer": a}) + "\n"
                             for q, a in [("2+3", "5"), ("4*2", "8"), ("9-7", "2")]))
    proc, out = run_train(["--steps", "1", *SMALL, "--eval-benchmarks", f"builtin,{bench}",
                           "--eval-k", "2", "--eval-temperature", "1.0",
                           "--prompt-template", "builtin"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    first, last = read_metrics(out)[0], read_metrics(out)[-1]
    for m in (first, last):
        assert 0 <= m["eval/builtin/mean@2"] <= 1 and 0 <= m["eval/mini/mean@2"] <= 1
        # c / (3 x 2)
        assert m["eval/mini/mean@2"] * 6 == pytest.approx(round(m["eval/mini/mean@2"] * 6))
    assert "mini/mean@2" in proc.stdout


@pytest.mark.parametrize("args, message", [
    (["--model", "/no/such/model"], "no such directory"),
    (["--tau-max", "-1"], "--tau-max"),
    (["--tau-max", "0"], "--tau-max 0 keeps only the step's own rollouts"),
    (["--group-size", "1"], "--group-size"),
    (["--train-data", "/no/such/file.jsonl"], "file.jsonl"),
    (["--ratio", "bogus"], "invalid choice"),
    (["--eval-benchmarks", "nosuchbench"], "nosuchbench"),
])
@pytest.mark.usefixtures("cpu_only")
def test_bad_input_is_one_clear_line(tmp_path, args, message):
    """In process (the subprocess below shows the real command line does the same): status 2 and
    one error line, from argparse or from main."""
    err = io.StringIO()
    with redirect_stdout(io.StringIO()), redirect_stderr(err):
        try:
            rc = train.main(["--steps", "1", "--out-dir", str(tmp_path / "run"), *args])
        except SystemExit as e:                    # argparse's error exits
            rc = e.code
    assert rc == 2 and message in err.getvalue()
    assert "Traceback" not in err.getvalue()
    lines = [ln for ln in err.getvalue().splitlines() if ln.startswith("error") or "error:" in ln]
    assert len(lines) == 1, err.getvalue()


@pytest.mark.usefixtures("cpu_only")
def test_an_error_names_paths_relative_to_where_the_user_ran(tmp_path, monkeypatch):
    """A path the user gave absolute (or the checkout's own) is named relative to the directory
    they ran in, where that is shorter: the line stays readable (a checkout's absolute paths made
    lines of 160-230 characters); a URL is left alone."""
    deep = tmp_path / ("a-folder-with-a-long-name-" * 4) / "inside"
    deep.mkdir(parents=True)
    (deep / "bad.jsonl").write_text('{"question": "1+1", "answer": "2"}\n{not json\n')
    monkeypatch.chdir(deep)
    err = io.StringIO()
    with redirect_stdout(io.StringIO()), redirect_stderr(err):
        rc = train.main(["--steps", "1", "--train-data", str(deep / "bad.jsonl"),
                         "--out-dir", str(tmp_path / "run")])
    assert rc == 2 and err.getvalue().startswith("error: bad.jsonl:2: "), err.getvalue()
    assert len(err.getvalue().strip()) <= 100
    url = "see https://huggingface.co/docs/x and /proc/cpuinfo"
    assert cli.relative_paths(url) == url.replace("/proc/cpuinfo", cli.shown_path("/proc/cpuinfo"))
    assert cli.relative_paths(f"x {deep}/y.py:3: z") == "x y.py:3: z"


def test_unreadable_data_file(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "1+1", "answer": "2"}\n{not json\n')
    proc, _ = run_train(["--steps", "1", "--train-data", str(bad)], tmp_path, timeout=120)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert "bad.jsonl" in proc.stderr and "2" in proc.stderr     # names the file and the line


# ---- the first screen: 100 characters wide, no progress bars, --help's groups at once -----------

def test_no_line_of_a_run_is_over_100_characters_and_no_progress_bar(tmp_path):
    """Many flags changed (the flags line wraps), an eval step with a benchmark (the step line
    wraps under its first " | "), a checkpoint saved: every line of stdout fits 100 characters, and
    transformers' bars for loading and writing weights are off."""
    proc, out = run_train(["--steps", "2", "--prompts-per-step", "4", "--group-size", "2",
                           "--max-new-tokens", "4", "--eval-size", "8", "--eval-every", "2",
                           "--eval-benchmarks", "builtin", "--threads", "1", "--seed", "3",
                           "--temperature", "0.9", "--lr", "1e-4"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert max(len(line) for line in lines) <= 100, proc.stdout
    assert any(line.startswith("world size 1 | 4 prompts x 2 completions") for line in lines)
    assert any(line.startswith("step    2 | reward") for line in lines)
    assert any(line.startswith("          | replay") for line in lines)         # its second line
    assert "Loading weights" not in proc.stderr and "Writing model shards" not in proc.stderr


def test_the_flags_shown_are_their_json_object():
    for changed in ({}, {"threads": 1}, {"seed": 3, "out_dir": "runs/x", "lr": 1e-4}):
        shown = flags.shown(changed)
        assert (shown == ["the defaults"] if not changed
                else json.loads(" ".join(shown)) == changed)


def test_help_shows_the_first_group_in_its_first_screen():
    env = {**os.environ, "COLUMNS": "100", "OMP_NUM_THREADS": "1"}
    p = subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), "--help"], cwd=ROOT,
                       env=env, capture_output=True, text=True, timeout=120)
    lines = p.stdout.splitlines()
    assert p.returncode == 0 and lines[0].startswith("usage: train.py [--preset NAME]")
    assert "run:" in lines[:60]                                    # `--help | head -60`
    presets = lines[lines.index("presets (--preset NAME):"):]
    assert len(presets) > len(flags.PRESETS) and max(map(len, presets)) <= 100


# ---- the flags, grouped by owner; a method's own flags carry its prefix --------------------------

# each owner's groups (flags.OWNERS), in their order: the spine's, each method file's (in the
# registry's order, methods.WINGS), then the engine's and the eval's
METHOD_GROUPS = tuple(dict.fromkeys(g for owner in methods.owners()
                                    for g in cli.field_groups(owner).values()))
GROUPS = ("run", "optimisation", "reward", "objective", "replay", "logged rollouts",
          *METHOD_GROUPS, "engine", "eval and logs")
# a method's flags: the prefix of their names, their group, the first word of their help
METHODS = {"vigor_": ("VIGOR", "VIGOR:"), "r2po_": ("R²PO", "R²PO:"),
           "hd_": ("Headroom-Drift", "Headroom-Drift:")}


def test_the_usage_line_points_to_help(capsys):
    """A bad flag prints argparse's usage line and its error: the usage line names --help for
    every flag (nothing follows it there)."""
    with pytest.raises(SystemExit) as e:
        flags.parse(["--no-such-flag"])
    usage, error = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and usage.endswith("(every flag: --help)"), usage
    assert "unrecognized arguments: --no-such-flag" in error


def test_every_flag_is_in_one_group_and_help_shows_the_groups():
    groups = cli.field_groups(flags.Args)
    assert set(groups) == {f.name for f in dataclasses.fields(flags.Args)}
    assert tuple(dict.fromkeys(groups.values())) == GROUPS       # each group once, in this order
    env = {**os.environ, "COLUMNS": "100", "OMP_NUM_THREADS": "1"}
    p = subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), "--help"], cwd=ROOT,
                       env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    titles, shown = [], {}                     # the group titles, and {flag: the title it is under}
    for line in p.stdout.splitlines():
        if line.endswith(":") and line[:-1] in GROUPS:
            titles.append(line[:-1])
        elif line.startswith("  --") and titles:
            shown[line.split()[0][2:].rstrip(",").replace("-", "_")] = titles[-1]  # bool: "--x,"
    assert titles == list(GROUPS) and shown == groups


def test_a_methods_own_flags_carry_its_prefix():
    """Every field named vigor_* / r2po_* / hd_* is in the VIGOR / R²PO / Headroom-Drift group, and
    every flag whose help says it is VIGOR's, R²PO's or Headroom-Drift's is named with that prefix;
    each method file's flags are in one group of their own."""
    groups, docs = cli.field_groups(flags.Args), cli.field_docs(flags.Args)
    for prefix, (group, word) in METHODS.items():
        named = {n for n in groups if n.startswith(prefix)}
        assert named and all(groups[n] == group for n in named), prefix
        assert {n for n, d in docs.items() if d.startswith(word)} == named, prefix
    assert {n for n, g in groups.items() if g in ("VIGOR", "R²PO")} == {
        n for n in groups if n.startswith(("vigor_", "r2po_"))} | {"allocation"}
    old = {"n_init", "n_step", "rollout_budget", "rollout_head", "rollout_head_rank", "headroom",
           "replay_groups", "drift_candidates", "drift_max"}
    assert not old & set(groups)                                  # the names before the prefixes
    for owner in methods.owners():
        assert len({groups[f.name] for f in dataclasses.fields(owner)}) == 1, owner
