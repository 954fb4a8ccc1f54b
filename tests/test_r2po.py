"""R²PO (arXiv 2601.11960): the residual rollout head samples the training rollouts, the base
policy answers at eval. A zero head samples exactly the base model's tokens; the lora init is one
and moves from its first step, the official init barely; the engine's head log-probs are the
trainer's; the head phase moves only the head and the policy phase only the base;
eval ignores the head; the rarity advantage equals its formula by hand; checkpoints load in plain
transformers and keep the head in their rank files, and a resumed run equals a straight one."""
import copy
import io
import json
import os
import shutil
import sys
from contextlib import redirect_stderr, redirect_stdout
from types import SimpleNamespace

import pytest
import torch

import cli
import eval as eval_lib
import flags
import grpo
import metrics as metrics_lib
import rollout
import train
import vllm_engine
from conftest import cpu_env
from checkpoint import load_model
from data import Prompt
from engine import TorchEngine
from methods import r2po
from methods.r2po import R2PO, ResidualHead
from rollout import Rollout, Sampling
from tiny import run_of, update

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL = os.path.join(ROOT, "assets", "tiny-arith")
SHORT = ["--prompts-per-step", "8", "--group-size", "4", "--max-new-tokens", "6",
         "--eval-size", "16", "--threads", "1", "--preset", "r2po"]
# The CPU whatever the machine has (conftest): train.main in process under cpu_only, the torchrun
# subprocess under cpu_env(); resumed runs are compared with straight ones bit for bit.
pytestmark = pytest.mark.usefixtures("cpu_only")


@pytest.fixture
def tiny(tiny_model):
    torch.manual_seed(0)
    model, tok = tiny_model
    prompts = [Prompt(i, tok.encode(q)) for i, q in enumerate(["3+4=", "12-5=", "6*7=", "9+9="])]
    return model, tok, prompts


def head_of(model, rank=8, std=1e-6):
    """A head of the official init (both N(0, 1e-6²)) scaled to `std`: the tests' heads that
    change what is sampled."""
    head = ResidualHead(model.config.hidden_size, model.config.vocab_size, rank, "official")
    with torch.no_grad():
        for w in head.parameters():
            w.mul_(std / 1e-6)
    return head


def r2po_of(head, args, initial=None):
    """R2PO of `args` (flags.Args), as r2po.make builds it."""
    shared = r2po.Shared(args.eps_low, args.eps_high, args.agg, args.temperature,
                         args.max_new_tokens, args.micro_batch_size, args.micro_batch_tokens,
                         args.max_grad_norm, args.group_size)
    return R2PO(head, cli.part(args, r2po.Flags), shared, initial)


def mixed_head_rollouts(model, tok, prompts, args, std=0.05):
    """(a head of `std`, 32 rollouts sampled through it, scored by `args`), regrouped into 7
    groups of mixed verdicts (odd completion length = right), not 4 all-equal ones."""
    torch.manual_seed(0)
    head = head_of(model, std=std)
    engine = TorchEngine(model, tok)
    engine.logits_head = head
    sampling = Sampling(temperature=1.0, max_new_tokens=6, seed=0, use_head=True)
    rollouts = engine.generate(prompts * 4, 8, sampling)
    for i, r in enumerate(rollouts):
        r.prompt_id = i % 7
        r.correct = float(len(r.completion_ids) % 2)
    train.score(run_of(args), rollouts)
    return head, rollouts


def run(argv) -> int:
    with redirect_stdout(io.StringIO()), redirect_stderr(io.StringIO()):
        return train.main(argv)


def metrics(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


# ---- the head and the engine ---------------------------------------------------------------------

def test_rarity_advantages_by_hand():
    """u = 1 / (how many in the group share the reward), then GRPO's standardisation of u. Group 0:
    1 right of 8, u = [1, 1/7 x 7], mean 1/4, Bessel var = (0.75² + 7 (1/7 - 1/4)²) / 7
    = 0.0918367, so A = 0.75 / 0.303046 = 2.474874 and -0.107143 / 0.303046 = -0.353553. Groups 1
    (2 of 4) and 2 (4 of 4) have equal u: exactly 0."""
    r = torch.tensor([1.0] + [0.0] * 7 + [1.0, 1.0, 0.0, 0.0] + [1.0] * 4)
    g = torch.tensor([0] * 8 + [5] * 4 + [9] * 4)
    a = r2po.rarity_advantages(r, g)
    assert a[0].item() == pytest.approx(2.474874, abs=1e-5)
    assert a[1:8].tolist() == pytest.approx([-0.353553] * 7, abs=1e-5)
    assert a[8:].tolist() == [0.0] * 8
    # three outcomes in one group (shaped rewards): counts 1, 2, 3 -> u = 1, 1/2, 1/2, 1/3, 1/3, 1/3
    a = r2po.rarity_advantages(torch.tensor([0.5, 1.0, 1.0, 0.0, 0.0, 0.0]),
                               torch.zeros(6, dtype=torch.long))
    u = torch.tensor([1, 1 / 2, 1 / 2, 1 / 3, 1 / 3, 1 / 3], dtype=torch.float64)
    assert a.tolist() == pytest.approx(((u - u.mean()) / (u.std() + 1e-6)).tolist(), abs=1e-6)


def test_rarity_advantages_of_four_outcome_classes_by_hand():
    """The official reward (correct ±1 plus format +1.25 / -1) has four outcome classes: 2.25
    (right, in form), 0.25 (wrong, in form), 0 (right, not in form), -2 (wrong, not in form).
    A group of 8 with counts 2, 1, 3, 2: u = [1/2, 1/2, 1, 1/3, 1/3, 1/3, 1/2, 1/2], sum 4, mean
    1/2; deviations 0 (x4), +1/2, -1/6 (x3), so the Bessel var = (1/4 + 3/36) / 7 = 1/21, std =
    0.2182179; A = 0.5 / (0.2182179 + 1e-6) = 2.291277 for the lone 0.25, -(1/6) / (0.2182179 +
    1e-6) = -0.763759 for the three 0s, and 0 (u equal to the mean) for the four others."""
    r = torch.tensor([2.25, 2.25, 0.25, 0.0, 0.0, 0.0, -2.0, -2.0])
    a = r2po.rarity_advantages(r, torch.zeros(8, dtype=torch.long))
    expected = [0.0, 0.0, 2.291277, -0.763759, -0.763759, -0.763759, 0.0, 0.0]
    assert a.tolist() == pytest.approx(expected, abs=1e-5)


def test_zero_head_samples_exactly_the_base_models_tokens(tiny):
    model, tok, prompts = tiny
    engine = TorchEngine(model, tok)
    # --r2po-head-init lora: W2 = 0, the residual is exactly 0
    engine.logits_head = ResidualHead(model.config.hidden_size, model.config.vocab_size, 8, "lora")
    s = dict(temperature=1.0, max_new_tokens=6, seed=3)
    base = engine.generate(prompts, 8, Sampling(**s))
    headed = engine.generate(prompts, 8, Sampling(**s, use_head=True))
    assert [r.completion_ids for r in headed] == [r.completion_ids for r in base]
    assert [r.logprobs for r in headed] == [r.logprobs for r in base]
    assert [r.head_logprobs for r in headed] == [r.logprobs for r in base]
    assert all(r.head_logprobs is None for r in base)
    assert len({tuple(r.completion_ids) for r in base}) > 4         # sampled, not one greedy answer
    engine.logits_head = None                       # use_head without a head: refused, not ignored
    with pytest.raises(ValueError, match="logits_head"):
        engine.generate(prompts, 1, Sampling(**s, use_head=True))


@pytest.mark.paths
def test_head_changes_sampling_and_the_trainer_scores_it_as_the_engine_did(tiny):
    """A large head samples other tokens; r2po.head_forward (the trainer's) gives the engine's
    log-probs under both heads to float precision: the head phase's ratio starts at 1, the policy
    phase's base ratio too."""
    model, tok, prompts = tiny
    engine = TorchEngine(model, tok)
    torch.manual_seed(1)
    engine.logits_head = head_of(model, std=0.3)
    s = dict(temperature=1.0, max_new_tokens=6, seed=3)
    base = engine.generate(prompts, 8, Sampling(**s))
    headed = engine.generate(prompts, 8, Sampling(**s, use_head=True))
    assert [r.completion_ids for r in headed] != [r.completion_ids for r in base]
    batch = rollout.collate(headed, tok.pad_token_id, [r.head_logprobs for r in headed])
    base_logp, head_logp = r2po.head_forward(model, engine.logits_head, batch, 1.0)
    mask = batch["completion_mask"].bool()
    # the engine's cached, left-padded passes against one forward: float32 rounding (~1e-6) of
    # log-probs of order 1 through the head's two matmuls; a wrong head or position is ~1e-1 off
    assert torch.allclose(base_logp[mask], batch["behaviour_logprobs"][mask], atol=1e-4)
    assert torch.allclose(head_logp[mask], batch["old_logprobs"][mask], atol=1e-4)
    assert (head_logp[mask] - base_logp[mask]).abs().max() > 0.1          # the two policies differ


def test_vllm_engine_refuses_the_head_and_flags_say_so():
    with pytest.raises(ValueError, match="--engine torch"):
        vllm_engine.VLLMEngine.generate(object(), [Prompt(0, [1])], 1, Sampling(use_head=True))
    # r2po.make refuses an engine without a logits head (vLLM's), at the door
    assert not hasattr(vllm_engine.VLLMEngine, "logits_head")
    with pytest.raises(ValueError, match="needs --engine torch"):
        run_of(flags.parse(["--preset", "r2po"]), engine=SimpleNamespace(close=lambda: None))
    for bad in ("1", "1,0", "a,b", "-1,2"):
        with pytest.raises(ValueError, match="--r2po-schedule"):
            flags.check_args(flags.parse(["--preset", "r2po", f"--r2po-schedule={bad}"]))


def test_head_inits_lora_starts_at_the_base_official_is_the_official_codes(tiny):
    """--r2po-head-init lora (the default, the preset's): W1 ~ N(0, 2/d), W2 = 0, so the rollout
    log-probs are the base's bit for bit; official: both N(0, 1e-6²), the head as it was made
    before the flag. Both draw from the global generator after nn.Linear's own draws, the same
    path, so the same seed gives the same draws, scaled. The stds are sample stds of n >= 98 x 64
    = 6272 normals, whose relative standard error is 1/sqrt(2n) <= 0.9%: 5% is 5.6 of them."""
    model, tok, prompts = tiny
    d, V = model.config.hidden_size, model.config.vocab_size
    heads = {}
    for init in r2po.HEAD_INITS:
        torch.manual_seed(0)
        heads[init] = ResidualHead(d, V, 64, init)
    lora, official = heads["lora"], heads["official"]
    assert lora.w1.weight.std().item() == pytest.approx((2 / d) ** 0.5, rel=0.05)
    assert torch.equal(lora.w2.weight, torch.zeros(V, 64))
    assert all(w.std().item() == pytest.approx(1e-6, rel=0.05) for w in official.parameters())

    # official, by hand: the head's init until --r2po-head-init, bit for bit
    torch.manual_seed(0)
    w1, w2 = torch.nn.Linear(d, 64, bias=False), torch.nn.Linear(64, V, bias=False)
    for w in (w1.weight, w2.weight):
        torch.nn.init.normal_(w, std=1e-6)
    assert torch.equal(official.w1.weight, w1.weight) and torch.equal(official.w2.weight, w2.weight)
    # lora's W1: the same draws at std sqrt(2/d) (float32 rounding of the scaling)
    assert torch.allclose(lora.w1.weight * (1e-6 / (2 / d) ** 0.5), w1.weight, rtol=1e-5, atol=0)

    # the residual is exactly 0: the rollout log-probs are the base's, bitwise
    base = TorchEngine(model, tok).generate(prompts, 4, Sampling(temperature=1.0, seed=3,
                                                                 max_new_tokens=6))
    batch = rollout.collate(base, tok.pad_token_id)
    base_logp, head_logp = r2po.head_forward(model, lora, batch, 1.0)
    assert torch.equal(head_logp, base_logp)

    # the flag reaches the head through r2po.make (at the door); the default is lora; the door
    # hands the head slot to the engine, and the checkpoints keep it once (the step slot's state)
    def made(**kw):
        run = run_of(flags.Args(r2po_head="residual", r2po_kl_anchor="current", **kw))
        assert run.engine.logits_head is run.slots["head"] is run.slots["step"].head
        assert "head" not in run.state and "step" in run.state
        return run.slots["head"]
    assert torch.equal(made().w2.weight, torch.zeros(V, 64))
    assert made(r2po_head_init="official").w2.weight.std().item() == pytest.approx(1e-6, rel=0.05)
    assert flags.parse(["--preset", "r2po"]).r2po_head_init == "lora"


def test_lora_head_moves_from_its_first_step_the_official_one_barely(tiny):
    """One head step at head lr 1e-4 (the long task's dev choice), each init from seed 0, on the
    same rollouts (sampled from a head of std 1e-6, so both ratios start at 1): lora's W2 gradient
    is dL/dz's size, Adam moves W2 by about the lr and the head's output by about the lr too;
    official's factors have gradients near Adam's eps (1e-8), the product barely moves (as lr²:
    the ratio falls as 1 / lr, about 340 at 1e-3). Measured on this CPU: mean |change of the
    residual| 1.4e-3 (lora) against 4.2e-7 (official)."""
    model, tok, prompts = tiny
    args = flags.Args(r2po_head="residual", r2po_head_lr=1e-4, r2po_kl_anchor="current")
    _, rollouts = mixed_head_rollouts(model, tok, prompts, args, std=1e-6)
    batch = rollout.collate(rollouts, tok.pad_token_id)
    with torch.no_grad():
        out, _ = rollout.completion_logits(model, batch, output_hidden_states=True)
    T = batch["completion_mask"].shape[1]
    h = out.hidden_states[-1][:, -(T + 1):-1]                       # [B, T, d] what the head sees
    mask = batch["completion_mask"].bool()
    moved = {}
    for init in r2po.HEAD_INITS:
        torch.manual_seed(0)
        head = ResidualHead(model.config.hidden_size, model.config.vocab_size, 64, init)
        with torch.no_grad():
            before = head(h)                                                        # [B, T, V]
        m = r2po_of(head, args).head_step(model, rollouts, tok.pad_token_id, 1).reduce(1)
        assert m["r2po/head_groups_used"] > 0
        with torch.no_grad():
            moved[init] = (head(h) - before)[mask].abs().mean().item()
    assert moved["lora"] > 0.1 * args.r2po_head_lr
    assert moved["lora"] > 1e3 * moved["official"]


def test_head_parameters_stay_under_a_tenth_of_the_model(tiny):
    model = tiny[0]
    n_model = sum(p.numel() for p in model.parameters())
    head = head_of(model, rank=flags.Args().r2po_head_rank)
    n_head = sum(p.numel() for p in head.parameters())
    assert n_head == 64 * (model.config.hidden_size + model.config.vocab_size)
    assert n_head < 0.1 * n_model
    assert 64 * (896 + 151_936) < 0.1 * 494_032_768                   # Qwen2.5-0.5B's d, V and size


# ---- the two phases ------------------------------------------------------------------------------

def test_phases_follow_the_schedule():
    def phases(args):
        return r2po_of(ResidualHead(4, 4, 1, "lora"), args)

    args = flags.Args(r2po_head="residual", r2po_schedule="2,3")
    assert [phases(args).phase(s) for s in range(7)] == ["head"] * 2 + ["policy"] * 3 + ["head"] * 2
    assert r2po.make(r2po.Flags(), None, None) == {}                # no head: no slot filled
    assert phases(flags.Args(r2po_head="residual", r2po_schedule="0,1")).phase(5) == "policy"


def test_head_phase_moves_only_the_head_and_policy_phase_only_the_base(tiny):
    model, tok, prompts = tiny
    model.train()
    args = flags.Args(r2po_head="residual", lr=1e-2, r2po_head_lr=1e-2)
    head, rollouts = mixed_head_rollouts(model, tok, prompts, args)
    method = r2po_of(head, args, initial=copy.deepcopy(model).eval().requires_grad_(False))
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    base0 = {n: p.detach().clone() for n, p in model.named_parameters()}
    head0 = {n: p.detach().clone() for n, p in head.named_parameters()}

    m = method.head_step(model, rollouts, tok.pad_token_id, 1).reduce(1)
    assert all(torch.equal(p, base0[n]) for n, p in model.named_parameters())
    assert all(not torch.equal(p, head0[n]) for n, p in head.named_parameters())
    assert m["r2po/head_groups_used"] > 0 and m["r2po/head_kl"] > 0

    head1 = {n: p.detach().clone() for n, p in head.named_parameters()}
    update(model, None, opt, rollouts, [], args, step=1, pad_id=tok.pad_token_id)
    assert all(torch.equal(p, head1[n]) for n, p in head.named_parameters())
    assert not all(torch.equal(p, base0[n]) for n, p in model.named_parameters())


def test_head_kl_anchor_initial_stays_on_the_loaded_model_current_follows_the_base(tiny):
    """--r2po-kl-anchor initial: the head step's KL is to the model as loaded, even after the
    base's weights change; current: to the base as it is now. The head is copied for each head
    step, so every step sees the same head."""
    model, tok, prompts = tiny
    head, rollouts = mixed_head_rollouts(model, tok, prompts, flags.Args())
    initial = copy.deepcopy(model).eval().requires_grad_(False)   # what make loads from --model

    def head_kls(anchor):
        args = flags.Args(r2po_head="residual", r2po_kl_anchor=anchor)
        method = r2po_of(copy.deepcopy(head), args, initial if anchor == "initial" else None)
        m = method.head_step(model, rollouts, tok.pad_token_id, 1).reduce(1)
        return m["r2po/head_kl"], m["r2po/head_kl_current"]

    # The base unchanged: the same weights under two forwards (the base's with hidden states, the
    # copy's without), which other kernels may round differently: float32 log-probs of |log p| <
    # 10 off by |delta| < 1e-6 each. k3'(d) = 1 - exp(-d) ~ d and mean d² ~ 2 KL, so the KL moves
    # by at most 1e-6 sqrt(2 KL) (Cauchy-Schwarz): ~3e-8 at this KL (~4e-4), ~7e-5 relative. (On
    # this CPU the two are bit for bit equal; the perturbation below moves the KL 1000-fold.)
    kl, kl_current = head_kls("initial")
    assert kl > 0 and kl == pytest.approx(kl_current, rel=0, abs=1e-6 * (2 * kl) ** 0.5)

    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():                                         # the base moves, the copy not
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=gen))
    kl_initial, kl_now = head_kls("initial")
    kl_cur, kl_cur_now = head_kls("current")
    assert kl_cur == kl_cur_now                       # current: the KL to the base as it is now
    assert kl_now == pytest.approx(kl_cur, rel=1e-5)  # both anchors' runs score the moved base
    assert abs(kl_initial - kl_now) > 0.1 * kl_now    # initial: not the moved base
    assert abs(kl_now - kl_current) > 0.1 * kl_current          # which did move

    # initial, by hand: k3 KL(pi_rollout || pi_initial) over the tokens of the groups used, in
    # one batch (head_step's micro-batches are by length: float32 summation order, rel 1e-5)
    adv = r2po.rarity_advantages(torch.tensor([r.reward for r in rollouts]),
                                 grpo.group_ids(rollouts)).tolist()
    live = {r.prompt_id for r, a in zip(rollouts, adv) if a != 0}
    batch = rollout.collate([r for r in rollouts if r.prompt_id in live], tok.pad_token_id)
    with torch.no_grad():
        _, logp = r2po.head_forward(model, head, batch, 1.0)
        initial_logp = rollout.forward_logprobs(initial, batch, 1.0)[1]
    mask = batch["completion_mask"]
    by_hand = ((grpo.kl_penalty(logp, initial_logp, "k3") * mask).sum() / mask.sum()).item()
    assert kl_initial == pytest.approx(by_hand, rel=1e-5)


def test_kl_anchor_flag_is_in_help_and_a_bad_value_is_one_line():
    out = io.StringIO()
    with redirect_stdout(out), pytest.raises(SystemExit) as done:
        train.main(["--help"])
    assert done.value.code == 0 and "--r2po-kl-anchor {initial,current}" in out.getvalue()
    assert flags.Args().r2po_kl_anchor == "initial"                      # the official code's
    err = io.StringIO()
    with redirect_stderr(err), redirect_stdout(io.StringIO()), pytest.raises(SystemExit) as done:
        train.main(["--r2po-kl-anchor", "bogus"])
    lines = [ln for ln in err.getvalue().splitlines() if "error:" in ln]
    assert done.value.code == 2 and len(lines) == 1 and "invalid choice" in lines[0]
    assert "Traceback" not in err.getvalue()


@pytest.mark.paths
def test_eval_does_not_depend_on_the_head(tiny):
    model, tok, _ = tiny
    sets = eval_lib.train_eval_sets(32, "", 1, 0.0, "auto", flags.Args().data_dir, "builtin")
    results = []
    # bitwise: eval samples without the head, so both make the same computations
    for head in (None, head_of(model, std=0.5)):
        engine = TorchEngine(model, tok)
        engine.logits_head = head
        eval_lib.evaluate_shard(engine, tok, sets, m := metrics_lib.Metrics(), top_p=1.0, seed=0,
                                max_new_tokens=6)
        results.append(m.reduce(1))
    assert results[0] == results[1] and "eval/accuracy" in results[0]


# ---- end to end: the loop, the checkpoint, resume ------------------------------------------------

@pytest.mark.paths
def test_r2po_preset_trains_saves_and_resumes_exactly(tmp_path):
    """`--preset r2po` with the schedule '1,1' on the built-in task: the phases alternate in
    metrics.jsonl; the checkpoint is a plain transformers model, the head and its optimizer in
    its rank file (the step slot's state); 4 steps straight equal 2 + resume 2, bitwise (the same
    computations in the same order, every state restored exactly)."""
    a, b = tmp_path / "a", tmp_path / "b"
    argv = SHORT + ["--r2po-schedule", "1,1", "--steps", "4", "--save-every", "2",
                    "--eval-every", "2"]
    assert run(argv + ["--out-dir", str(a)]) == 0
    ma = metrics(a)
    assert [m["r2po/phase"] for m in ma[1:]] == [0.0, 1.0, 0.0, 1.0]
    assert all("r2po/head_kl" in m and "loss/policy" not in m for m in ma[1::2])
    assert all("loss/policy" in m and "r2po/head_kl" not in m for m in ma[2::2])
    assert all(0 < m["rollout/distinct_answers"] <= 1 for m in ma[1:])
    assert all(0 < m["r2po/base_distinct_answers"] <= 1 for m in (ma[2], ma[4]))

    ckpt = a / "checkpoints" / "step_000004"
    from transformers import AutoModelForCausalLM
    hf = AutoModelForCausalLM.from_pretrained(str(ckpt))     # no custom code, the head file ignored
    assert ({n for n, _ in hf.named_parameters()}
            == {n for n, _ in load_model(MODEL)[0].named_parameters()})
    saved = head_saved(ckpt)
    assert set(saved) == {"w1.weight", "w2.weight"} and saved["w2.weight"].shape == (98, 64)
    head = ResidualHead(128, 98, 64, "lora")
    head.load_state_dict(saved)                                    # round-trips into the module
    assert all(torch.equal(p, saved[n]) for n, p in head.state_dict().items())
    assert saved["w2.weight"].abs().max() > 1e-4         # trained: it started at 0 (init lora)

    (b / "checkpoints").mkdir(parents=True)
    shutil.copytree(a / "checkpoints" / "step_000002", b / "checkpoints" / "step_000002")
    assert run(argv + ["--out-dir", str(b), "--resume", "auto"]) == 0
    no_time = lambda m: {k: v for k, v in m.items() if not k.startswith("time/")}   # noqa: E731
    assert [no_time(m) for m in ma[3:]] == [no_time(m) for m in metrics(b)]
    hb = head_saved(b / "checkpoints" / "step_000004")
    assert all(torch.equal(saved[n], hb[n]) for n in saved)
    # the head alone, beside the checkpoint: no trainer state needed to load it
    from safetensors.torch import load_file
    alone = load_file(b / "checkpoints" / "step_000004" / r2po.HEAD_FILE)
    assert alone.keys() == hb.keys() and all(torch.equal(alone[n], hb[n]) for n in hb)


def head_saved(ckpt, rank: int = 0) -> dict:
    """The head's weights a checkpoint keeps in a rank's file (the step slot's state)."""
    state = torch.load(ckpt / "trainer" / f"rank_{rank:05d}.pt", weights_only=True)
    return state["step"]["head"]


def test_resume_of_a_run_without_head_is_refused(tmp_path):
    a = tmp_path / "a"
    assert run(["--steps", "1", "--prompts-per-step", "4", "--group-size", "2", "--eval-size", "8",
                "--threads", "1", "--out-dir", str(a)]) == 0
    err = io.StringIO()
    with redirect_stdout(io.StringIO()), redirect_stderr(err):
        rc = train.main(SHORT + ["--steps", "2", "--out-dir", str(a), "--resume", "auto"])
    assert (rc == 2 and "keeps no step state" in err.getvalue()
            and "Traceback" not in err.getvalue())


def test_distinct_answers_by_hand():
    def r(pid, text):
        return Rollout(prompt_id=pid, prompt_ids=[1], completion_ids=[2], logprobs=[0.0], text=text)
    rs = [r(0, "7"), r(0, "7"), r(0, "8"), r(0, "The answer is 8"), r(1, "5"), r(1, "5")]
    assert metrics_lib.diversity(rs)[0] == pytest.approx((2 / 4 + 1 / 2) / 2)


def test_distinct_chains_by_hand():
    """Two worked chains that end on one answer are one answer but two chains."""
    def r(pid, text):
        return Rollout(prompt_id=pid, prompt_ids=[1], completion_ids=[2], logprobs=[0.0], text=text)
    rs = [r(0, "2+3*4=2+12=14"), r(0, "2+3*4=5*4=14"), r(0, " 2+3*4=2+12=14"), r(0, "9"),
          r(1, "5"), r(1, "5")]
    assert metrics_lib.diversity(rs)[0] == pytest.approx((2 / 4 + 1 / 2) / 2)
    assert metrics_lib.diversity(rs)[1] == pytest.approx((3 / 4 + 1 / 2) / 2)


def test_r2po_runs_under_torchrun_on_two_ranks(tmp_path):
    """A subprocess under torchrun (2 ranks, gloo): the head is replicated, its gradients summed
    over ranks, the base forward passes in lockstep; both phases run and the checkpoint's rank
    files hold one head."""
    import subprocess
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           os.path.join(ROOT, "train.py"), *SHORT, "--r2po-schedule", "1,1", "--steps", "2",
           "--eval-every", "0", "--seed", "3", "--out-dir", str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300, env=cpu_env())
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = metrics(out)
    assert [m["r2po/phase"] for m in rows[1:]] == [0.0, 1.0]
    # seed 3: groups to learn from
    assert rows[1]["r2po/head_groups_used"] > 0 and rows[1]["r2po/head_loss"] != 0
    assert rows[1]["rollout/generated"] == 32                       # 8 prompts x 4 over both ranks
    heads = [head_saved(out / "checkpoints" / "step_000002", rank) for rank in (0, 1)]
    assert all(torch.equal(heads[0][n], heads[1][n]) for n in heads[0])    # replicated
