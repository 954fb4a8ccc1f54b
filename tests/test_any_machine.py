"""conftest's helpers for a suite that runs on any machine: a missing ../shared skips with its path
in the reason; cpu_env() hides CUDA from a subprocess; cpu_only hides it in process, so train.py's
set-up takes the CPU and TorchEngine (on a GPU machine these are the checks that matter; on the
CPU they hold trivially)."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, SHARED, cpu_env, require_shared


def test_a_missing_shared_path_skips_naming_it():
    with pytest.raises(pytest.skip.Exception, match="no-such-dir"):
        require_shared("no-such-dir")
    # next to the repository, unless SHARED_DIR stands in for it (a fresh clone's run without it)
    assert SHARED == Path(os.environ.get("SHARED_DIR") or Path(ROOT).parent / "shared")


def test_cpu_env_hides_cuda_from_a_subprocess():
    env = cpu_env(OMP_NUM_THREADS="1")
    assert env["CUDA_VISIBLE_DEVICES"] == "" and env["OMP_NUM_THREADS"] == "1"
    code = "import torch; print(torch.cuda.is_available(), torch.cuda.device_count())"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=120, check=True).stdout
    assert out.split() == ["False", "0"]


def test_cpu_only_gives_train_py_the_cpu(cpu_only, monkeypatch):
    import torch

    import run_setup
    import vllm_engine
    monkeypatch.delenv("RANK", raising=False)
    assert not torch.cuda.is_available()
    assert run_setup.setup_distributed() == (0, 1, "cpu")
    assert vllm_engine.engine_kind("auto") == "torch"
