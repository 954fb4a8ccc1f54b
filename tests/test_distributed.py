"""2 ranks under torchrun (gloo, CPU): one sharded update equals the 1-rank update over the same
global batch, the synced engine holds the full weights, and a non-finite loss on one rank skips the
step on both. (train.py itself under torchrun, killed and resumed: tests/test_checkpoint.py.)"""
import json
import os
import subprocess
import sys

import pytest

from conftest import cpu_env

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]


def torchrun(args, timeout=300):
    """CUDA hidden (cpu_env): gloo on the CPU whatever the machine has, as the tolerances below
    assume (with CUDA, rank 1 would go to cuda:1, absent on a one-GPU machine)."""
    return subprocess.run(TORCHRUN + args, cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env=cpu_env())


@pytest.mark.paths
def test_one_update_on_two_ranks_equals_one_rank(tmp_path):
    out = tmp_path / "result.json"
    proc = torchrun([os.path.join(ROOT, "tests", "dist_update.py"), str(out)])
    # all of stderr (a few kB): torchrun's failure summary alone is ~2 kB, so a 3 kB tail can lose
    # the failing rank's own traceback above it
    assert proc.returncode == 0, proc.stderr[-20000:]
    r = json.loads(out.read_text())
    # 2 ranks sum the step's terms in another order than 1 rank (and run other micro-batch shapes),
    # so every comparison is to rounding, relative to the quantity's scale (~1e-7 here): a real
    # difference, a rollout lost or the world-size factor missing, is ~1e-1 or more.
    steps = {"token-mean-clipped": 1, "token-mean-clipped-adamw": 1, "seq-mean-tis-2-epochs": 2,
             "sum-norm-kl": 2}
    for name, n_steps in steps.items():
        c = r[name]
        assert c["moved"] > 1e-3, name                      # the update did something...
        assert c["steps_1"] == c["steps_2"] == n_steps, (name, c)
        # ...with the same gradients on 2 ranks as on 1
        assert c["grad_diff"] <= 1e-4, (name, c)
        if name.endswith("adamw"):
            # g / (|g| + eps): an entry whose gradient is 0 up to rounding moves by anything up to
            # lr, whichever way this CPU's rounding falls; compare the entries whose gradient is
            # well above rounding (most of them)
            assert c["live_share"] > 0.3, (name, c)
            assert c["param_diff_live"] <= 1e-5, (name, c)
        else:
            # SGD: lr x the gradient difference, a few ulps
            assert c["param_diff"] <= 1e-5, (name, c)
        # the synced engine holds the full new weights: a copy
        assert c["engine_diff"] == 0.0, (name, c)
        assert c["tokens_1"] == c["tokens_2"] > 0           # every token counted once
        # the global norm, not a shard's; grad_diff compares the clipped gradients, this the scale
        # before the clip
        assert c["grad_norm_2"] == pytest.approx(c["grad_norm_1"], rel=1e-5)
        assert c["loss_2"] == pytest.approx(c["loss_1"], rel=1e-5)
    assert r["token-mean-clipped"]["grad_norm_1"] > 0.05   # max_grad_norm 0.05: clipping was active
    assert r["nan-on-rank-1"] == {"moved": 0.0, "skipped": 2.0}  # both ranks skipped, neither moved
