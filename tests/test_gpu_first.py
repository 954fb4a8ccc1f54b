"""ops/gpu_first.sh, the first GPU lease's probe, checked on the CPU: the script parses, its steps'
timeouts sum under nine minutes, every step it names is one of ops/gpu_first.py's, the train.py
command lines it runs are good flags, and the parts the CPU can run cheaply run: GSPO's step on
the tiny model (its first update's clip is 0 here, where engine and trainer are both autocast),
the canary's snippet at toy sizes, and the readers of the estimate's log and the smoke's
summary."""
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

import flags
from conftest import cpu_env

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "ops" / "gpu_first.sh"
sys.path.insert(0, str(ROOT / "ops"))
import gpu_first  # noqa: E402

LIMIT = 540        # seconds: nine minutes of a lease's fifteen, the machine's start apart


def script_lines() -> list[str]:
    return [line for line in SCRIPT.read_text().splitlines()
            if line.strip() and not line.lstrip().startswith("#")]


def test_the_script_parses():
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)


def test_every_step_has_a_timeout_and_they_sum_under_nine_minutes():
    """Each step runs under `timeout N` (the smoke) or `probe N` (ops/gpu_first.py's steps, which
    runs them under timeout N); nothing else runs a command that could take long."""
    code = "\n".join(script_lines())
    limits = [int(n) for n in re.findall(r"^probe (\d+) ", code, re.M)]
    limits += [int(n) for n in re.findall(r"\btimeout (\d+) ", code)]
    assert len(limits) == 6, limits
    assert sum(limits) < LIMIT, (limits, sum(limits))


def test_the_steps_it_names_are_gpu_first_py_s():
    code = "\n".join(script_lines())
    named = re.findall(r"^probe \d+ (\w+)", code, re.M)
    assert named == ["versions", "gspo", "canary", "estimate", "smoke"]
    for name in named:
        assert hasattr(gpu_first, name) or name == "smoke"
    proc = subprocess.run([sys.executable, str(ROOT / "ops" / "gpu_first.py")],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "usage" in proc.stderr


@pytest.mark.parametrize("argv", [gpu_first.gspo_argv("/tmp/x"),
                                  gpu_first.estimate_argv("assets/tiny-arith", "/tmp/x")])
def test_its_train_py_command_lines_are_good_flags(argv):
    flags.check_args(flags.parse(argv))


def test_gspo_s_step_runs_on_the_cpu_and_its_first_update_clips_nothing_here(tmp_path):
    """On the CPU --precision bf16 puts TorchEngine and the trainer under the same autocast: the
    first update's ratio is exactly 1 (on CUDA the engine stays fp32: the probe's question)."""
    out = tmp_path / "gspo"
    cmd = [sys.executable, str(ROOT / "train.py"), *gpu_first.gspo_argv(str(out)),
           "--threads", "1"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env=cpu_env(OMP_NUM_THREADS="1"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = gpu_first.gspo_lines(out)
    assert lines[0].startswith("Q1 ") and "first update clip_frac 0.000" in lines[0]
    assert "| predicted: " in lines[0] and "logprob_floor" in lines[1]


def test_the_canary_snippet_runs_at_toy_sizes():
    shape = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=50)
    peaks = gpu_first.canary_peaks(shape, "cpu", rollouts=2, prompt=5, completion=4)
    assert set(peaks) == {"logprob_diff", "logprob_floor"}
    assert all(p["extra_peak_gib"] is None and p["seconds"] >= 0 for p in peaks.values())


def test_the_estimate_s_line_reads_the_job_s_log():
    log = ("world size 1 | 16 prompts x 8 completions per rank per step | micro-batches of at "
           "most 7067 padded tokens | device cuda:0\nmemory about 40.7 GiB a rank\n"
           'gpu_smoke result: {"name": "make_model", "params": 494032768}\n'
           'gpu_smoke result: {"name": "auto", "rc": 0, "peak_allocated_gib": 31.25}\n')
    [text] = gpu_first.estimate_lines(log)
    assert ("micro-batch 7067 tokens, estimate 40.7 GiB, measured peak 31.25 GiB | predicted: "
            "7067 tokens") in text
    assert "measured peak ? GiB" in gpu_first.estimate_lines("")[0]


def test_the_smoke_s_line_reads_its_summary(tmp_path):
    steps = [{"name": "env", "status": "PASS", "failed": []},
             {"name": "torchrun_one_rank", "status": "SKIP", "failed": []},
             {"name": "model_05b", "status": "FAIL", "failed": ["fsdp: exit 1"]}]
    (tmp_path / "summary.json").write_text(json.dumps({"steps": steps}))
    [text] = gpu_first.smoke_lines(tmp_path)
    assert "env PASS, model_05b FAIL (fsdp: exit 1) | predicted: PASS each" in text
