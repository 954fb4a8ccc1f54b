"""rollout.py: collate alignment, engine log-probs equal the trainer's, sampling and weight sync."""
import os
import types

import pytest
import torch

from make_tiny_model import make_model, make_tokenizer
from checkpoint import load_model
from data import Prompt
from engine import TorchEngine
from rollout import Rollout, Sampling, collate, forward_logprobs
from tiny import decided_prefix


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    tok = make_tokenizer()
    return make_model(len(tok), seed=0).eval(), tok


def _prompts(tok, texts):
    return [Prompt(i, tok.encode(t), "0") for i, t in enumerate(texts)]


def test_collate_aligns_completion_with_next_token_positions():
    r1 = Rollout(0, [5, 6, 7], [8, 9], [-0.5, -0.25], advantage=1.5)
    r2 = Rollout(1, [5], [4, 3, 2], [-1.0, -2.0, -3.0], advantage=-1.0)
    b = collate([r1, r2], pad_id=99)
    assert b["input_ids"].tolist() == [[5, 6, 7, 8, 9], [5, 4, 3, 2, 99]]
    assert b["attention_mask"].tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]]
    # position t predicts input_ids[t + 1]: r1's completion tokens sit at 3, 4 -> predicted from
    # positions 2, 3
    assert b["completion_mask"].tolist() == [[0, 0, 1, 1], [1, 1, 1, 0]]
    assert b["old_logprobs"].tolist() == [[0, 0, -0.5, -0.25], [-1.0, -2.0, -3.0, 0]]
    assert b["advantages"].tolist() == [1.5, -1.0]


def test_collate_keeps_only_positions_that_predict_a_completion_token(tiny):
    """Prompts of 3 and 2 tokens: the per-token tensors start at s = 2 - 1 (the shortest prompt's
    last token), and forward_logprobs computes logits there alone, equal to the full forward's
    (lm_head on fewer rows: float32 rounding of one matmul, ~1e-7)."""
    from rollout import completion_slice, first_predicting
    model, tok = tiny
    r1 = Rollout(0, [5, 6, 7], [8, 9], [-0.5, -0.25])
    r2 = Rollout(1, [5, 6], [4, 3, 2], [-1.0, -2.0, -3.0])
    b = collate([r1, r2], pad_id=tok.pad_token_id)
    assert first_predicting([r1, r2]) == 1
    assert b["completion_mask"].tolist() == [[0, 1, 1], [1, 1, 1]]
    assert b["behaviour_logprobs"][0, completion_slice(r1, 1)].tolist() == [-0.5, -0.25]
    assert b["behaviour_logprobs"][1, completion_slice(r2, 1)].tolist() == [-1.0, -2.0, -3.0]
    with torch.no_grad():
        logits, logp = forward_logprobs(model, b, 1.0)
        full = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits
    assert logits.shape == (2, 3, full.shape[-1])
    assert torch.allclose(logits, full[:, 1:-1], atol=1e-5)
    want = full[:, 1:-1].log_softmax(-1).gather(-1, b["input_ids"][:, 2:, None])[..., 0]
    assert torch.allclose(logp, want, atol=1e-5)


def _mixed_lengths():
    """Rollouts of total lengths 3, 20, 4, 19, 5, 18 (long and short alternate), each with its own
    tokens."""
    return [Rollout(k, [1 + k] * 2, [10 + k] * n, [-0.1 * (k + 1)] * n, advantage=k - 2.5)
            for k, n in enumerate((1, 18, 2, 17, 3, 16))]


def test_micro_batches_group_rollouts_by_length():
    """Consecutive chunks of 2 pad every short rollout to a long one's length; length buckets pair
    short with short. Every rollout sits in exactly one micro-batch, whole, with its own behaviour
    log-probs and advantage."""
    from rollout import length_buckets, micro_batches
    rs = _mixed_lengths()
    mbs = micro_batches(rs, 2, 0, "cpu")
    consecutive = [collate(rs[i:i + 2], 0) for i in range(0, len(rs), 2)]
    pads = [sum(mb["attention_mask"].numel() - int(mb["attention_mask"].sum()) for mb in m)
            for m in (mbs, consecutive)]
    # lengths (3, 4) (5, 18) (19, 20) vs (3, 20) (4, 19) (5, 18)
    assert pads == [1 + 13 + 1, 17 + 15 + 13]
    assert length_buckets(rs, 2) == [[0, 2], [4, 5], [3, 1]] and len(mbs) == 3
    rows = {}
    for mb in mbs:
        for ids, att, lp, adv in zip(mb["input_ids"], mb["attention_mask"],
                                     mb["behaviour_logprobs"], mb["advantages"]):
            k = int(ids[0]) - 1
            assert k not in rows                                            # at most once ...
            rows[k] = (ids[att.bool()].tolist(), lp[lp != 0].tolist(), float(adv))
    assert rows == {k: (r.prompt_ids + r.completion_ids, pytest.approx(r.logprobs), r.advantage)
                    for k, r in enumerate(rs)}                                      # ... and all


@pytest.mark.paths
def test_lockstep_logprobs_come_back_in_input_order(tiny):
    """rollout.lockstep_logprobs runs length-bucketed micro-batches but returns each rollout's
    completion log-probs at its own index: the same as a forward of that rollout alone."""
    from rollout import lockstep_logprobs
    model, tok = tiny
    rs = _mixed_lengths()
    got = lockstep_logprobs(model, rs, 2, 0.7, tok.pad_token_id, 1)
    with torch.no_grad():
        alone = [forward_logprobs(model, collate([r], tok.pad_token_id), 0.7)[1][0].tolist()
                 for r in rs]
    assert [len(g) for g in got] == [len(r.completion_ids) for r in rs]
    # a bucket of 2 rows against one row: another padded shape, float32 rounding (~1e-6 on
    # log-probs of order 1); a row given another's log-probs is off by ~1e-1
    for g, a in zip(got, alone):
        assert g == pytest.approx(a, abs=1e-5)


@pytest.mark.paths
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_engine_logprobs_equal_trainer_logprobs(tiny, temperature):
    """Behaviour log-probs recorded during KV-cache sampling (left-padded prompts) equal the
    trainer's full forward (right-padded) under the same weights and temperature: otherwise every
    ratio is biased from the first step."""
    model, tok = tiny
    engine = TorchEngine(model, tok)
    # different lengths: padding matters
    prompts = _prompts(tok, ["1+2=", "13*17-4=", "7=", "19-3*2="])
    rs = engine.generate(prompts, 3, Sampling(temperature=temperature, max_new_tokens=10, seed=3))
    assert len(rs) == 12 and [r.prompt_id for r in rs] == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]
    b = collate(rs, tok.pad_token_id)
    with torch.no_grad():
        logp = forward_logprobs(model, b, temperature)[1]
    diff = ((logp - b["old_logprobs"]) * b["completion_mask"]).abs().max().item()
    # KV cache and left padding against one right-padded forward: float32 rounding, ~1e-6; a
    # wrong position or temperature is off by ~1e-2 or more
    assert diff <= 1e-5
    assert b["completion_mask"].sum() > 12            # real completions, not empty ones


@pytest.mark.paths
def test_greedy_is_argmax_and_deterministic_sampling(tiny):
    model, tok = tiny
    engine = TorchEngine(model, tok)
    prompts = _prompts(tok, ["3+4=", "12-5*2="])
    g = engine.generate(prompts, 1, Sampling(temperature=0, max_new_tokens=5))
    ids = torch.tensor([prompts[0].ids])
    with torch.no_grad():
        first = model(input_ids=ids).logits[0, -1].argmax().item()
    # the engine's left-padded batch and this one row: the first token is decided by more than
    # rounding (tiny.decided_prefix), so both paths must pick it
    assert decided_prefix(model, prompts[0].ids, g[0].completion_ids) >= 1
    assert g[0].completion_ids[0] == first
    s = Sampling(temperature=1.0, max_new_tokens=6, seed=11)
    a, b = engine.generate(prompts, 4, s), engine.generate(prompts, 4, s)
    assert [r.completion_ids for r in a] == [r.completion_ids for r in b]
    c = engine.generate(prompts, 4, Sampling(temperature=1.0, max_new_tokens=6, seed=12))
    assert [r.completion_ids for r in a] != [r.completion_ids for r in c]


class _EosAtPosition(torch.nn.Module):
    """A fake causal LM that emits token 5 until absolute position `stop`, then EOS: known
    completion lengths."""
    def __init__(self, vocab, eos, stop):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))
        self.vocab, self.eos, self.stop = vocab, eos, stop

    def forward(self, input_ids, attention_mask, position_ids, use_cache, logits_to_keep, cache):
        logits = torch.full((*input_ids.shape, self.vocab), -30.0)
        nxt = torch.where(position_ids + 1 >= self.stop, self.eos, 5)          # [B, t]
        logits.scatter_(-1, nxt[..., None], 30.0)
        return types.SimpleNamespace(logits=logits, cache=cache)


def test_stop_at_eos_and_truncation(tiny):
    _, tok = tiny
    eos = tok.eos_token_id
    engine = TorchEngine(_EosAtPosition(len(tok), eos, stop=5), tok)
    prompts = [Prompt(0, [1, 2], "x"), Prompt(1, [1, 2, 3, 4], "y"),
               Prompt(2, [1, 2, 3, 4, 5, 6], "z")]
    rs = engine.generate(prompts, 1, Sampling(temperature=1.0, max_new_tokens=4))
    # a token at absolute position p is 5 if p < 5 else EOS; prompts of 2, 4, 6 tokens start at
    # positions 2, 4, 6
    assert [r.completion_ids for r in rs] == [[5, 5, 5, eos], [5, eos], [eos]]
    assert [r.truncated for r in rs] == [False, False, False]
    assert all(len(r.logprobs) == len(r.completion_ids) for r in rs)
    rs = engine.generate(prompts[:1], 1, Sampling(temperature=1.0, max_new_tokens=2))
    assert rs[0].completion_ids == [5, 5] and rs[0].truncated
    assert rs[0].text == "%%" and rs[0].answer == "x"      # id 5 is chr(32 + 5)


def test_top_p_keeps_only_the_nucleus(tiny):
    from engine import sample_token
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    gen = torch.Generator().manual_seed(0)
    s = Sampling(temperature=1.0, top_p=0.7)
    toks = {sample_token(logits, s, gen)[0].item() for _ in range(300)}
    assert toks == {0, 1}                   # 0.5 + 0.3 reaches 0.7; 2 and 3 are outside the nucleus


def test_load_weights_syncs_and_rejects_partial(tiny):
    model, tok = tiny
    engine = TorchEngine(model, tok)
    new = {n: p.detach() + 0.01 for n, p in model.named_parameters()}
    engine.load_weights(new.items())
    for n, p in engine.model.named_parameters():
        assert torch.equal(p, new[n])
    assert not torch.equal(dict(model.named_parameters())["lm_head.weight"]
                           if "lm_head.weight" in new else next(model.parameters()),
                           next(engine.model.parameters()))
    with pytest.raises(ValueError, match="not updated"):
        engine.load_weights(list(new.items())[:2])


def test_load_model_errors(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_model(str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="config.json"):
        load_model(str(tmp_path))


def test_the_module_demos_print_no_bar_and_fit_100_characters():
    """`python engine.py` loads the tiny model without transformers' weight-loading bar, and
    `python buffer.py`'s lines (its stats wrapped) fit 100 characters."""
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for demo in ("engine.py", "buffer.py"):
        p = subprocess.run([sys.executable, demo], cwd=root, env=env, capture_output=True,
                           text=True, timeout=120)
        assert p.returncode == 0 and "Loading" not in p.stderr and "it/s" not in p.stderr, demo
        assert max(map(len, p.stdout.splitlines())) <= 100, demo


def test_the_canary_in_passes_of_the_token_budget_reads_as_in_one():
    """engine.logprob_diff and logprob_floor in forward passes of at most max_tokens positions
    (the update's micro-batch budget: the canary's peak is one micro-batch's) give the one-pass
    value: exactly where one pass holds them all, to float rounding in several."""
    import engine
    from make_tiny_model import make_model, make_tokenizer
    tok = make_tokenizer()
    model = make_model(len(tok), seed=0).eval()
    rs = [Rollout(k, tok.encode(f"{k}*{7 * k}="), tok.encode("12345"[:n]), [-0.5 - 0.1 * k] * n)
          for k, n in enumerate((5, 1, 4, 2, 3))]
    longest = max(len(r.prompt_ids) + len(r.completion_ids) for r in rs)
    assert len(engine._passes(model, rs, tok.pad_token_id, 2 * longest)) >= 3
    for f in (engine.logprob_diff, engine.logprob_floor):
        whole = f(model, rs, 1.0, tok.pad_token_id)
        assert f(model, rs, 1.0, tok.pad_token_id, max_tokens=10_000) == whole
        several = f(model, rs, 1.0, tok.pad_token_id, max_tokens=2 * longest)
        if f is engine.logprob_diff:        # fp32 over other batch shapes: float rounding alone
            assert several == pytest.approx(whole, rel=1e-5)
        else:                               # bf16 rounds by the batch's shape: only its scale
            assert 0 < several < 10 * whole


def test_the_canary_collates_once_and_reads_as_its_two_functions(monkeypatch):
    """engine.canary under bf16 autocast collates the step's first rollouts once for both of its
    numbers (it collated them twice), each the value logprob_diff and logprob_floor give."""
    import engine
    from make_tiny_model import make_model, make_tokenizer
    tok = make_tokenizer()
    model = make_model(len(tok), seed=0).eval()
    rs = [Rollout(k, tok.encode(f"{k}*{7 * k}="), tok.encode("12345"[:n]), [-0.5 - 0.1 * k] * n)
          for k, n in enumerate((5, 1, 4, 2, 3))]
    calls = []
    collate = engine.collate
    monkeypatch.setattr(engine, "collate", lambda *a: calls.append(1) or collate(*a))
    out = engine.canary(model, rs, 1.0, tok.pad_token_id, "autocast-bf16")
    assert len(calls) == 1
    assert out == {"rollout/logprob_diff": engine.logprob_diff(model, rs, 1.0, tok.pad_token_id),
                   "rollout/logprob_floor": engine.logprob_floor(model, rs, 1.0,
                                                                 tok.pad_token_id)}
    assert engine.canary(model, [], 1.0, tok.pad_token_id, "autocast-bf16") == {
        "rollout/logprob_diff": 0.0, "rollout/logprob_floor": 0.0}
