"""2 ranks under torchrun (gloo, CPU): one sharded update equals the 1-rank update over the same global batch, the
synced engine holds the full weights, and a non-finite loss on one rank skips the step on both.
(train.py itself under torchrun, killed and resumed: tests/test_checkpoint.py.)"""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]


def torchrun(args, timeout=300):
    return subprocess.run(TORCHRUN + args, cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def test_one_update_on_two_ranks_equals_one_rank(tmp_path):
    out = tmp_path / "result.json"
    proc = torchrun([os.path.join(ROOT, "tests", "dist_update.py"), str(out)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(out.read_text())
    for name in ("token-mean-clipped", "token-mean-clipped-adamw", "seq-mean-tis-2-epochs", "sum-norm-kl"):
        c = r[name]
        assert c["moved"] > 1e-3, name                      # the update did something...
        assert c["param_diff"] <= 1e-5, (name, c)           # ...and the same thing on 2 ranks as on 1
        assert c["engine_diff"] <= 1e-5, (name, c)          # the synced engine holds the full new weights
        assert c["tokens_1"] == c["tokens_2"] > 0           # every token counted once
        assert c["grad_norm_2"] == pytest.approx(c["grad_norm_1"], rel=1e-5)   # the global norm, not a shard's
        assert c["loss_2"] == pytest.approx(c["loss_1"], rel=1e-5)
    assert r["token-mean-clipped"]["grad_norm_1"] > 0.05     # max_grad_norm 0.05: clipping was active
    assert r["nan-on-rank-1"] == {"moved": 0.0, "skipped": 2.0}   # both ranks skipped, neither moved
