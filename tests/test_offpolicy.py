"""The off-policy seed methods (issue 12): Headroom-Drift group replay (buffer.GroupReplay, its
drift pass GroupReplay.drift), mu-GRPO's stage (one loop step, many optimizer steps, the engine at
the stage-start weights) and the presets.

    python -m pytest -q tests/test_offpolicy.py
"""
import copy
import dataclasses
import io
import json
import math
import os
import pickle
from contextlib import redirect_stderr, redirect_stdout

import pytest
import torch

import buffer
import checkpoint
import flags
import metrics
import parallel
import rollout
import train
from make_tiny_model import make_model, make_tokenizer
from rollout import Rollout

# train.main in process, on the CPU whatever the machine has (conftest's cpu_only): on CUDA it would
# run another precision and --engine auto would pick vLLM, not the runs these tests pin.
pytestmark = pytest.mark.usefixtures("cpu_only")
# as BASE's --threads 1: two cores are shared, and a 0.8M-parameter model needs no more
torch.set_num_threads(1)
BASE = ["--prompts-per-step", "8", "--group-size", "4", "--max-new-tokens", "6", "--eval-size", "8",
        "--threads", "1", "--eval-every", "0"]


def group(pid: int, version: int, rewards: list[float], completion=(5, 6, 7)) -> list[Rollout]:
    mean = sum(rewards) / len(rewards)
    return [Rollout(prompt_id=pid, prompt_ids=[1, 2], completion_ids=list(completion),
                    logprobs=[-1.0] * len(completion), reward=r, advantage=r - mean,
                    version=version) for r in rewards]


def own_logprobs(rollouts):
    """A policy forward that gives each rollout its own behaviour log-probs back: drift 0."""
    return [list(r.logprobs) for r in rollouts]


# ---- Headroom: ranking, storage, age -------------------------------------------------------------

def test_headroom_ranks_groups_and_all_equal_groups_are_never_stored():
    g_half, g_quarter, g_three = (group(0, 0, [1, 1, 0, 0]), group(1, 1, [1, 0, 0, 0]),
                                  group(2, 0, [1, 1, 1, 0]))
    for headroom, order in [
            ("variance", [0, 1, 2]),      # p(1-p): .25, then .1875 twice (newer version first)
            ("failure", [1, 0, 2]),       # 1 - p: .75, .5, .25
            ("abs-adv", [0, 1, 2])]:      # mean |A|: .5, .375, .375 (newer first)
        replay = buffer.GroupReplay(tau_max=4, headroom=headroom, groups=2, candidates=8,
                                    logprobs=own_logprobs)
        replay.add(g_half + g_three + group(3, 0, [1, 1, 1, 1]) + group(4, 0, [0, 0, 0, 0]), step=0)
        assert (replay.stats()["replay/unstored_groups"] == 2
                and replay.stats()["replay/stored_groups"] == 2)
        replay.add(g_quarter, step=1)
        assert [g[0].prompt_id for g in replay.candidates(step=2)] == order, headroom
        out = replay.sample(2, 0)
        # whole groups, top 2
        assert [r.prompt_id for r in out] == [order[0]] * 4 + [order[1]] * 4
        assert out[0] is (g_half + g_quarter + g_three)[order[0] * 4]  # stored as given, not copied
    assert buffer.GroupReplay(4).candidates(0) == []
    assert (len(replay) == 12
            and all(r.prompt_id not in (3, 4) for g in replay.candidates(9) for r in g))


def test_fresh_groups_are_not_candidates_and_age_eviction_at_tau_max():
    replay = buffer.GroupReplay(tau_max=2)
    replay.add(group(0, 0, [1, 0]), step=0)
    assert replay.candidates(0) == []                           # version == step: the fresh part
    assert len(replay.candidates(2)) == 1                       # age 2 == tau_max: still replayable
    assert replay.candidates(3) == [] and len(replay) == 0      # age 3: evicted
    assert replay.stats()["replay/evicted"] == 1


def test_state_round_trip():
    replay = buffer.GroupReplay(tau_max=3, headroom="failure", groups=1, candidates=2,
                                logprobs=own_logprobs)
    for step in range(3):
        replay.add(group(step, step, [1, 0, 0]) + group(10 + step, step, [1, 1, 0]), step)
    replay.sample(2, 0)
    sd = replay.state_dict()
    buf = io.BytesIO()
    torch.save(sd, buf)
    buf.seek(0)
    for loaded in (torch.load(buf, weights_only=True), pickle.loads(pickle.dumps(sd))):
        other = buffer.GroupReplay(tau_max=3, headroom="failure", groups=1, candidates=2,
                                   logprobs=own_logprobs)
        other.load_state_dict(loaded)
        assert other.stats() == replay.stats()
        assert other.sample(3, 0) == copy.deepcopy(replay).sample(3, 0)
    with pytest.raises(ValueError, match="headroom"):
        buffer.GroupReplay(tau_max=3).load_state_dict(sd)


# ---- Drift: gating through the real drift pass, and its bounded cost -----------------------------

def _policy_groups(model, n_groups: int, size: int = 4) -> list[list[Rollout]]:
    """Groups whose behaviour log-probs are the model's own now (drift 0)."""
    gs = [group(p, 0, [1.0, 0.0] * (size // 2), completion=(5 + p % 3, 6, 7))
          for p in range(n_groups)]
    flat = [r for g in gs for r in g]
    for r, lp in zip(flat, parallel.lockstep_logprobs(model, flat, 64, 1.0, 0, 1)):
        r.logprobs = lp
    return gs


def test_drift_gate_skips_then_replays_when_the_policy_returns_and_candidates_bound_the_forwards():
    tok = make_tokenizer()
    model = make_model(len(tok), seed=0).eval()
    a = train.Args(micro_batch_size=4, hd_drift_frac=0.25)         # one forward pass per group of 4
    drift_max = buffer.drift_limit(a.hd_drift_frac, a.eps_low, a.eps_high)   # as train.setup: 0.056

    def policy_logprobs(rollouts):                                # as train.setup gives the buffer
        return parallel.lockstep_logprobs(model, rollouts, a.micro_batch_size, a.temperature,
                                          tok.pad_token_id, 1)
    replay = buffer.GroupReplay(tau_max=9, groups=2, candidates=3, drift_max=drift_max,
                                logprobs=policy_logprobs)
    replay.add([r for g in _policy_groups(model, 5) for r in g], step=0)
    calls = []
    model.register_forward_hook(lambda *_: calls.append(1))

    assert len(replay.sample(1, 0)) == 8 and len(calls) == 3    # 5 stored, 3 candidates: 3 forwards
    s = replay.stats()
    assert (s["replay/groups"] == 2 and s["replay/drift_candidates"] == 3
            and s["replay/drift_mean"] < 1e-5)
    start = copy.deepcopy(model.state_dict())
    with torch.no_grad():
        model.model.embed_tokens.weight.mul_(3.0)                           # the policy moves away
    assert replay.sample(2, 0) == [] and len(calls) == 6    # all candidates gated, still 3 forwards
    s = replay.stats()
    assert s["replay/drift_gated_frac"] == 1.0 and s["replay/drift_mean"] > drift_max
    assert s["replay/groups"] == 0
    assert len(replay) == 20                                                # skipped, not deleted
    model.load_state_dict(start)                                            # ... and returns
    assert len(replay.sample(3, 0)) == 8 and replay.stats()["replay/drift_gated_frac"] == 0.0
    calls.clear()
    assert replay.sample(0, 0) == [] and calls == []         # nothing eligible: no forward (1 rank)


def test_drift_is_the_mean_over_rollouts_of_the_absolute_mean_log_ratio():
    """D(g) = mean_i |mean_t (log pi_theta - log pi_behaviour)|, from the `logprobs` forward given
    at construction: 0 for the rollouts' own log-probs, per group, one forward for all groups."""
    gs = [group(0, 0, [1.0, 0.0]), group(1, 0, [1.0, 0.0, 0.0])]
    shifts = {id(gs[0][0]): [0.3, 0.3, 0.3], id(gs[0][1]): [-0.6, 0.0, 0.0],      # |.3|, |-.2|
              id(gs[1][0]): [0.5, -0.5, 0.0], id(gs[1][1]): [0.0] * 3, id(gs[1][2]): [-0.9] * 3}
    calls = []

    def shifted(rollouts):
        calls.append(len(rollouts))
        return [[lp + d for lp, d in zip(r.logprobs, shifts[id(r)])] for r in rollouts]
    drift = buffer.GroupReplay(tau_max=2, logprobs=shifted).drift(gs)
    assert drift == [pytest.approx((0.3 + 0.2) / 2), pytest.approx((0.0 + 0.0 + 0.9) / 3)]
    assert calls == [5]
    assert buffer.GroupReplay(tau_max=2, logprobs=own_logprobs).drift(gs) == [0.0, 0.0]
    with pytest.raises(ValueError, match="logprobs"):
        buffer.GroupReplay(tau_max=2).sample(1, 0)          # no forward given: no drift gate


# ---- mu-GRPO: one stage = one loop step of many optimizer steps ----------------------------------

def test_mu_grpo_stage_uses_stored_advantages_and_behaviour_logprobs_with_the_engine_at_stage_start(
        monkeypatch):
    tok = make_tokenizer()
    model = make_model(len(tok), seed=0)
    engine = rollout.TorchEngine(model, tok)                    # its own copy: the behaviour policy
    stage = [r for p in range(8) for r in group(p, 0, [1.0, 0.0, 0.0, 1.0])]
    for i, r in enumerate(stage):
        r.logprobs = [-0.5 - 0.01 * i, -1.0, -1.5]              # distinct behaviour log-probs
    stored = copy.deepcopy(stage)
    engine_start = {k: v.clone() for k, v in engine.model.state_dict().items()}
    a = train.Args(mini_batches=4, eps_low=1.0, eps_high=4.0, veto_scope="suffix", lr=1e-2)
    seen, real_loss = [], train.micro_batch_loss

    def spy(model_, ref, mb, args, normaliser, metrics):
        assert all(torch.equal(v, engine_start[k]) for k, v in engine.model.state_dict().items())
        seen.append({k: mb[k].clone()
                     for k in ("advantages", "behaviour_logprobs", "old_logprobs")})
        return real_loss(model_, ref, mb, args, normaliser, metrics)
    monkeypatch.setattr(train, "micro_batch_loss", spy)
    per_update, before = [], copy.deepcopy(model.state_dict())
    m = train.update(model, None, torch.optim.AdamW(model.parameters(), lr=a.lr), stage, [], a,
                     step=0, pad_id=tok.pad_token_id, world=1, per_update=per_update).reduce(1)
    assert m["stage/updates"] == 4 and len(per_update) == 4 and len(seen) == 4
    for j, mb in enumerate(seen):                       # update j: rollouts 8j .. 8j + 7, as stored
        want = rollout.collate(stored[8 * j:8 * j + 8], tok.pad_token_id)
        for k in mb:
            assert torch.equal(mb[k], want[k]), (j, k)
    assert stage == stored                              # nothing written back to the rollouts
    # the policy did move
    assert any(not torch.equal(v, before[k]) for k, v in model.state_dict().items())
    # sync comes after
    assert all(torch.equal(v, engine_start[k]) for k, v in engine.model.state_dict().items())
    rows = metrics.reduce_all(per_update, 1)
    assert all("loss/clip_frac" in r and "loss/veto_frac" in r for r in rows)


def test_stage_loop_syncs_the_engine_only_after_the_stage(monkeypatch, tmp_path):
    events, real_loss, real_load = [], train.micro_batch_loss, rollout.TorchEngine.load_weights
    monkeypatch.setattr(train, "micro_batch_loss",
                        lambda *a: events.append("loss") or real_loss(*a))
    monkeypatch.setattr(rollout.TorchEngine, "load_weights",
                        lambda self, w: events.append("sync") or real_load(self, w))
    rc, rows, updates = run(["--preset", "mu-grpo", "--mini-batches", "4", "--steps", "2"],
                            tmp_path)
    # 4 updates, then the sync
    assert rc == 0 and "".join(e[0] for e in events) == "llll" "s" "llll" "s"
    assert ([r["stage/updates"] for r in rows] == [4, 4]
            and [(u["step"], u["update"]) for u in updates]
            == [(s, j) for s in (1, 2) for j in (1, 2, 3, 4)])


# ---- presets -------------------------------------------------------------------------------------

def test_preset_flags_are_overridden_by_explicit_flags():
    a = flags.parse(train.Args, ["--preset", "gspo", "--eps-low", "0.1"], presets=flags.PRESETS)
    assert (a.ratio, a.eps_low, a.eps_high, a.mini_batches) == ("gspo", 0.1, 4e-4, 4)
    # explicit values equal to the plain defaults win too, in any order
    a = flags.parse(train.Args,
                    ["--replay", "prioritized", "--preset", "grpo", "--eps-high", "0.28"],
                    presets=flags.PRESETS)
    assert ((a.replay, a.eps_high, a.eps_low, a.agg)
            == ("prioritized", 0.28, 0.2, "seq-mean-token-mean"))
    plain = flags.parse(train.Args, [], presets=flags.PRESETS)
    assert plain == train.Args()
    assert dataclasses.replace(flags.parse(train.Args, ["--preset", "rollout-replay"],
                                           presets=flags.PRESETS),
                               preset="none") == plain


def test_presets_name_real_flags_with_their_types():
    fields = {f.name: f for f in dataclasses.fields(train.Args)}
    for name, (text, values) in flags.PRESETS.items():
        assert text and "\n" not in text
        for k, v in values.items():
            assert k in fields and type(v) is type(fields[k].default), (name, k)
            choices = flags.choices(train.Args, k)
            assert choices is None or v in choices, (name, k, v)


def run(argv, tmp_path):
    out = tmp_path / "run"
    with redirect_stdout(io.StringIO()), redirect_stderr(io.StringIO()):
        rc = train.main([*BASE, "--out-dir", str(out), *argv])
    read = lambda name: [json.loads(ln) for ln in open(out / name)]   # noqa: E731
    return rc, read("metrics.jsonl")[1:], read("updates.jsonl")


SHRINK = {"mu-grpo": ["--mini-batches", "4"],                 # 64 updates > the 32 rollouts of BASE
          "r2po": ["--r2po-schedule", "1,1"]}                   # a head step, then a policy step


@pytest.mark.parametrize("name", list(flags.PRESETS))
def test_every_preset_runs_end_to_end(name, tmp_path):
    rc, rows, updates = run(["--preset", name, "--steps", "2", *SHRINK.get(name, [])], tmp_path)
    assert rc == 0 and len(rows) == 2
    assert len(updates) == sum(r.get("stage/updates", 0) for r in rows) > 0
    assert all(math.isfinite(v) for r in rows for v in r.values() if isinstance(v, float))
    with open(os.path.join(checkpoint.step_dir(str(tmp_path / "run" / "checkpoints"), 2),
                           "args.json")) as f:
        saved = json.load(f)
    assert saved["preset"] == name and all(saved[k] == v for k, v in flags.PRESETS[name][1].items()
                                           if k not in ("steps", "prompts_per_step", "eval_every",
                                                        "mini_batches", "r2po_schedule"))
    if name == "headroom-drift":
        assert rows[1]["replay/drift_candidates"] > 0 and "replay/headroom_mean" in rows[1]
        assert "replay/headroom_stored_mean" in rows[1]
