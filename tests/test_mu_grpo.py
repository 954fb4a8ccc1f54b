"""mu-GRPO's stage (arXiv 2605.17570): one loop step of many optimizer steps, each on the stored
advantages and behaviour log-probs, with the engine held at the stage-start weights and synced only
after the stage. Its veto is methods.mu_grpo.veto_mask (tests/test_grpo.py) and its preset runs with
the others (tests/test_presets.py).

    python -m pytest -q tests/test_mu_grpo.py
"""
import copy

import pytest
import torch

import engine as engine_lib
import flags
import metrics
import rollout
import train
from make_tiny_model import make_model, make_tokenizer
from rollout import Rollout
from tiny import run_main, update

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


# ---- mu-GRPO: one stage = one loop step of many optimizer steps ----------------------------------

def test_mu_grpo_stage_uses_stored_advantages_and_behaviour_logprobs_with_the_engine_at_stage_start(
        monkeypatch):
    tok = make_tokenizer()
    model = make_model(len(tok), seed=0)
    engine = engine_lib.TorchEngine(model, tok)                    # its own copy: the behaviour policy
    stage = [r for p in range(8) for r in group(p, 0, [1.0, 0.0, 0.0, 1.0])]
    for i, r in enumerate(stage):
        r.logprobs = [-0.5 - 0.01 * i, -1.0, -1.5]              # distinct behaviour log-probs
    stored = copy.deepcopy(stage)
    engine_start = {k: v.clone() for k, v in engine.model.state_dict().items()}
    a = flags.Args(mini_batches=4, eps_low=1.0, eps_high=4.0, veto_scope="suffix", lr=1e-2)
    seen, real_loss = [], train.micro_batch_loss

    def spy(run, mb, normaliser):
        assert all(torch.equal(v, engine_start[k]) for k, v in engine.model.state_dict().items())
        seen.append({k: mb[k].clone()
                     for k in ("advantages", "behaviour_logprobs", "old_logprobs")})
        return real_loss(run, mb, normaliser)
    monkeypatch.setattr(train, "micro_batch_loss", spy)
    per_update, before = [], copy.deepcopy(model.state_dict())
    m = update(model, None, torch.optim.AdamW(model.parameters(), lr=a.lr), stage, [], a,
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
    events, real_loss, real_load = [], train.micro_batch_loss, engine_lib.TorchEngine.load_weights
    monkeypatch.setattr(train, "micro_batch_loss",
                        lambda *a: events.append("loss") or real_loss(*a))
    monkeypatch.setattr(engine_lib.TorchEngine, "load_weights",
                        lambda self, w: events.append("sync") or real_load(self, w))
    rc, rows, updates = run_main([*BASE, "--preset", "mu-grpo", "--mini-batches", "4",
                                  "--steps", "2"], tmp_path / "run")
    # 4 updates, then the sync
    assert rc == 0 and "".join(e[0] for e in events) == "llll" "s" "llll" "s"
    assert ([r["stage/updates"] for r in rows] == [4, 4]
            and [(u["step"], u["update"]) for u in updates]
            == [(s, j) for s in (1, 2) for j in (1, 2, 3, 4)])

