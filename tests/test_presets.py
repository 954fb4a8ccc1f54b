"""The presets, one per paper (flags.PRESETS): explicit flags win over a preset's, every preset
names real flags with their types and allowed values, and every preset runs 2 steps end to end (its
flags saved in args.json).

    python -m pytest -q tests/test_presets.py
"""
import dataclasses
import json
import math
import os

import pytest
import torch

import checkpoint
import cli
import flags
from tiny import run_main

# train.main in process, on the CPU whatever the machine has (conftest's cpu_only): on CUDA it would
# run another precision and --engine auto would pick vLLM, not the runs these tests pin.
pytestmark = pytest.mark.usefixtures("cpu_only")
# as BASE's --threads 1: two cores are shared, and a 0.8M-parameter model needs no more
torch.set_num_threads(1)
BASE = ["--prompts-per-step", "8", "--group-size", "4", "--max-new-tokens", "6", "--eval-size", "8",
        "--threads", "1", "--eval-every", "0"]


def test_preset_flags_are_overridden_by_explicit_flags():
    a = flags.parse(["--preset", "gspo", "--eps-low", "0.1"])
    assert (a.ratio, a.eps_low, a.eps_high, a.mini_batches) == ("gspo", 0.1, 4e-4, 4)
    # explicit values equal to the plain defaults win too, in any order
    a = flags.parse(["--replay", "prioritized", "--preset", "grpo", "--eps-high", "0.28"])
    assert ((a.replay, a.eps_high, a.eps_low, a.agg)
            == ("prioritized", 0.28, 0.2, "seq-mean-token-mean"))
    plain = flags.parse([])
    assert plain == flags.Args()
    # the defaults but the lr its experiment chose on dev
    assert dataclasses.replace(flags.parse(["--preset", "rollout-replay"]),
                               preset="none", lr=plain.lr) == plain


def test_presets_carry_their_experiments_lr_and_say_so():
    """A preset sets only what it changes: one without an lr runs at the default (drgrpo has no
    experiment). A preset's lr is its experiment's dev choice (flags.py's note above PRESETS), and
    the one-line description (--help, docs/methods.md) states it; a preset named after an
    experiment with results (bench/results/NAME) carries one."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    experiments = set(os.listdir(os.path.join(root, "bench", "results")))
    for name, (text, values) in flags.PRESETS.items():
        if "lr" not in values:
            assert name not in experiments, name
            continue
        assert values["lr"] < flags.Args().lr, name          # 3e-4 collapses these methods
        assert f"lr {values['lr']:.0e}".replace("e-0", "e-") in text, name
    assert flags.parse(["--preset", "dapo"]).lr == 3e-5
    assert flags.parse(["--preset", "dapo", "--lr", "3e-4"]).lr == 3e-4     # explicit wins


def test_the_pnpo_preset_is_the_experiments_pnpo_reading():
    """--preset pnpo is the reported PNPO arm of bench/experiments.py's pnpo at 4 epochs at its
    chosen lr (the committed summary.json's): the same flags once parsed, the experiment's common
    flags (task, sizes) given to both."""
    import sys
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path.insert(0, os.path.join(root, "bench"))
    from papers import EXPERIMENTS
    s = EXPERIMENTS["pnpo"](False).settings[0]
    arm = next(a for a in s.arms if a.name == "pnpo e4 x 4")
    with open(os.path.join(root, "bench", "results", "pnpo", "steps", "summary.json")) as f:
        lr = json.load(f)["chosen"][arm.name]
    method = {"--replay", "--agg", "--mini-batches"}          # what the preset must set itself
    pairs = list(zip(s.flags[::2], s.flags[1::2]))
    task = [x for k, v in pairs if k not in method for x in (k, v)]
    assert len(task) < len(s.flags)
    theirs = flags.parse([*s.flags, *arm.flags, "--lr", f"{lr:g}"])
    ours = flags.parse([*task, "--preset", "pnpo"])
    assert dataclasses.replace(ours, preset="none") == theirs


def test_presets_name_real_flags_with_their_types():
    fields = {f.name: f for f in dataclasses.fields(flags.Args)}
    for name, (text, values) in flags.PRESETS.items():
        assert text and "\n" not in text
        for k, v in values.items():
            assert k in fields and type(v) is type(fields[k].default), (name, k)
            choices = cli.choices(flags.Args, k)
            assert choices is None or v in choices, (name, k, v)


SHRINK = {"mu-grpo": ["--mini-batches", "4"],                 # 64 updates > the 32 rollouts of BASE
          "r2po": ["--r2po-schedule", "1,1"]}                   # a head step, then a policy step


@pytest.mark.parametrize("name", list(flags.PRESETS))
def test_every_preset_runs_end_to_end(name, tmp_path):
    rc, rows, updates = run_main([*BASE, "--preset", name, "--steps", "2", *SHRINK.get(name, [])],
                                 tmp_path / "run")
    assert rc == 0 and len(rows) == 2
    assert len(updates) == sum(r.get("stage/updates", 0) for r in rows) > 0
    assert all(math.isfinite(v) for r in rows for v in r.values() if isinstance(v, float))
    with open(os.path.join(checkpoint.step_dir(str(tmp_path / "run" / "checkpoints"), 2),
                           "args.json")) as f:
        saved = json.load(f)
    assert saved["preset"] == name and all(saved[k] == v for k, v in flags.PRESETS[name][1].items()
                                           if k not in ("steps", "prompts_per_step", "eval_every",
                                                        "mini_batches", "r2po_schedule"))
    if name == "grpo":              # on-policy, one epoch: 0 by construction (the preset says so)
        assert "loss is 0" in flags.PRESETS[name][0]
        assert all(abs(r["loss/policy"]) < 1e-6 for r in rows), [r["loss/policy"] for r in rows]
    if name == "headroom-drift":
        assert rows[1]["replay/drift_candidates"] > 0 and "replay/headroom_mean" in rows[1]
        assert "replay/headroom_stored_mean" in rows[1]

