"""ops/gpu_smoke.sh (the wrapper that runs ops/gpu_smoke.py) rehearsed on the CPU:
`SMOKE_TOY=1` runs every step of the first GPU session's script at toy sizes (CUDA hidden, gloo, a
toy-shaped random model for model_05b), and its summary lists every step with its status, wall
time and numbers. The test that runs it takes about a minute of CPU time: the same commands as on
the GPU, at toy sizes."""
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from conftest import Beside, beside

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "ops" / "gpu_smoke.sh"
STEPS = ["env", "one_process", "torchrun_one_rank", "fsdp_variants", "model_05b", "suite_on_cuda"]


def smoke(out: Path, **env) -> subprocess.CompletedProcess:
    e = {k: v for k, v in os.environ.items() if k != "ONLY"}
    e.update(SMOKE_TOY="1", OUT=str(out), PYTHON=sys.executable, CUDA_VISIBLE_DEVICES="",
             OMP_NUM_THREADS="1", SMOKE_BUDGET="900", **env)
    return Beside.run(["bash", str(SCRIPT)], cwd=ROOT, env=e, timeout=900)


def toy_rehearsal(out: Path) -> tuple[subprocess.CompletedProcess, Path]:
    """Every step at toy sizes into out: (process, out). The suite runs it beside its other tests
    (conftest.Beside)."""
    return smoke(out), out


BESIDE = {"toy_smoke": toy_rehearsal}


@pytest.fixture(scope="module")
def toy_smoke(request, tmp_path_factory):
    return beside(request, "toy_smoke", tmp_path_factory)


def summary(out: Path) -> dict:
    return {s["name"]: s for s in json.loads((out / "summary.json").read_text())["steps"]}


def test_toy_rehearsal_passes_every_step(toy_smoke):
    proc, tmp_path = toy_smoke
    steps = summary(tmp_path)
    assert list(steps) == STEPS
    md = (tmp_path / "summary.md").read_text()
    assert all(f"| {name} | " in md and f"## {name}: " in md for name in STEPS)
    bad = {n: s["failed"] + s["notes"] for n, s in steps.items()
           if s["status"] != "PASS" and n != "suite_on_cuda"}
    assert not bad, f"{bad}\n{proc.stdout[-3000:]}\n{proc.stderr[-2000:]}"
    assert steps["suite_on_cuda"]["status"] == "SKIP"          # the GPU machine's step
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert all(s["seconds"] is not None and s["seconds"] >= 0 for s in steps.values())

    env = steps["env"]["numbers"]
    assert env["torch"] and env["cuda_available"] is False and "vllm" in env
    one = steps["one_process"]["numbers"]
    assert one["device"] == "cpu" and one["world"] == 1
    # fp32 = fp32
    assert len(one["logprob_diff"]) == 3 and all(0 <= d < 1e-3 for d in one["logprob_diff"])
    assert one["gen_tok_s"] > 0 and one["update_tok_s"] > 0 and len(one["time_step_s"]) == 3
    run = steps["torchrun_one_rank"]["numbers"]
    assert (run["metrics_steps"] == [0, 1, 2, 3, 4]
            and run["resume_line"].endswith("step_000003 at step 3"))
    assert run["final"] == "step_000004" and run["max_w_change_step3_to_4"] > 0
    assert run["first"]["world"] == 1 and len(run["first"]["loss/grad_norm"]) == 3
    var = steps["fsdp_variants"]["numbers"]
    assert all(len(var[v]["time_step_s"]) == 2 for v in ("kl", "tis", "grad_ckpt", "r2po"))
    assert var["kl"]["kl"][-1] > 0 and var["r2po"]["r2po/phase"] == [0.0, 1.0]
    big = steps["model_05b"]["numbers"]
    assert big["model"]["vocab_size"] == 98 and big["model"]["params"] > 0     # the toy shape
    for name in ("one", "fsdp"):
        assert (big[name]["gen_tok_s"] > 0 and big[name]["update_tok_s"] > 0
                and len(big[name]["time_step_s"]) == 2)
        assert big[name]["max_rss_mib"] > 0

    # what comes back from a device machine's $OUT: at most 8 files; the runs' folder is gone
    assert sorted(os.listdir(tmp_path)) == ["logs.tar.gz", "summary.json", "summary.md"]
    with tarfile.open(tmp_path / "logs.tar.gz") as t:
        names = t.getnames()
    assert any(n.endswith("one_process/train.log") for n in names)
    assert any(n.endswith("model_05b/one/metrics.jsonl") for n in names)
    assert not any(n.endswith((".safetensors", ".pt", ".distcp")) for n in names)


def test_only_lists_every_step_and_runs_the_named(tmp_path):
    proc = smoke(tmp_path, ONLY="suite_on_cuda")            # toy: this one SKIPs, so nothing trains
    assert proc.returncode == 0, proc.stderr
    steps = summary(tmp_path)
    assert list(steps) == STEPS and {s["status"] for s in steps.values()} == {"SKIP"}
    assert steps["env"]["notes"] == ["not selected (ONLY=suite_on_cuda)"]
    proc = smoke(tmp_path, ONLY="env,bogus")
    assert proc.returncode == 2 and "no step 'bogus'" in proc.stderr
