"""Run under `torchrun --nproc-per-node 2 tests/dist_update.py OUT.json [MODEL_DIR]`
(tests/test_distributed.py does, on the tiny model; with MODEL_DIR, any Hugging Face model
directory, e.g. assets/smollm2-135m-instruct: the same comparison on a real model).

One call of train.update() (through tiny.update) on 2 ranks (FSDP2, gloo), each rank holding its own
share of a fixed list of 8 rollouts (3 on rank 0, 5 on rank 1: unequal token counts and micro-batch
counts), against the same call on 1 rank (an unsharded copy, world=1, in the same process) over all
8. Rank 0 writes, per configuration: the gradients each optimizer step applied (after clipping) on 2
ranks against 1, relative to the gradient's largest entry; the largest parameter difference between
the two, over every entry and over the entries whose 1-rank gradient is well above rounding; the
largest change from the initial weights (so "equal" cannot mean "nothing moved"); both gradient
norms (before clipping) and losses; and the largest difference between an engine synced from the
sharded model and the sharded model's own full parameters.
"""
import copy
import dataclasses
import json
import os
import random
import sys

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "assets"))
sys.path.insert(0, os.path.join(ROOT, "tests"))

import flags  # noqa: E402
import parallel  # noqa: E402
import run_setup  # noqa: E402
import train  # noqa: E402
from make_tiny_model import make_model, make_tokenizer  # noqa: E402
from engine import TorchEngine  # noqa: E402
from rollout import Rollout  # noqa: E402
from tiny import update  # noqa: E402

# SGD makes a parameter difference a gradient difference (times lr). AdamW divides each gradient
# entry by its own magnitude (g / (|g| + eps)), so an entry that is ~0 up to rounding moves by
# anything up to lr either way, depending on how rounding falls on this CPU's kernels: its
# parameters are compared only where the 1-rank gradient is well above rounding (LIVE), its
# gradients everywhere.
# an entry is live when |g| > LIVE * max |g| over the model (float32 rounding is ~1e-7 of that)
LIVE = 1e-3
CONFIGS = {
    # the global norm clips hard (max 0.05), micro-batches of 2: rank 0 runs 2, rank 1 runs 3 (one
    # padding pass)
    "token-mean-clipped": dict(agg="token-mean", max_grad_norm=0.05, micro_batch_size=2),
    "token-mean-clipped-adamw": dict(agg="token-mean", max_grad_norm=0.05,
                                     micro_batch_size=2, lr=1e-2),
    # per-sequence means, TIS (old log-probs recomputed in lockstep), two epochs, one rollout per
    # micro-batch
    "seq-mean-tis-2-epochs": dict(agg="seq-mean-token-mean", tis_cap=2.0, epochs=2,
                                  micro_batch_size=1, max_grad_norm=0.0),
    # Dr. GRPO's constant normaliser and the KL term to a reference
    "sum-norm-kl": dict(agg="seq-mean-token-sum-norm", kl_coef=0.1, epochs=2, max_grad_norm=1.0),
}


def rollouts(vocab: int) -> list[Rollout]:
    rng = random.Random(0)
    out = []
    for i in range(8):
        P, T = rng.randint(2, 6), rng.randint(1, 7)
        out.append(Rollout(prompt_id=i // 4,
                           prompt_ids=[rng.randrange(vocab - 2) for _ in range(P)],
                           completion_ids=[rng.randrange(vocab - 2) for _ in range(T)],
                           logprobs=[-rng.uniform(3.0, 6.0) for _ in range(T)],
                           advantage=rng.choice([-1.0, 1.0]) * rng.uniform(0.5, 1.5)))
    return out


def max_diff(named_a, named_b) -> float:
    b = dict(named_b)
    return max((t - b[n]).abs().max().item() for n, t in named_a)


def record_gradients(opt, model, steps: list):
    """`opt`, which now appends to `steps`, before each of its steps, {name: the full gradient it is
    about to apply} (after clipping). On FSDP2 each gradient is gathered (a collective): every rank
    steps or none does (StepGuard), and named_parameters() has the same order on every rank."""
    def hook(*_):
        steps.append(
            {n: (p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad).detach().clone()
             if p.grad is not None else torch.zeros(p.shape) for n, p in model.named_parameters()})
    opt.register_step_pre_hook(hook)
    return opt


def grad_diff(steps_1: list, steps_2: list) -> float:
    """The largest gradient difference of any step, relative to the largest 1-rank gradient entry of
    that step (the step counts are compared by the test)."""
    return max((max((g2[n] - g).abs().max().item() for n, g in g1.items())
                / max(g.abs().max().item() for g in g1.values())
                for g1, g2 in zip(steps_1, steps_2)), default=float("inf"))


def live_diff(named_a, named_b, grads: dict) -> tuple[float, float]:
    """(the largest difference on the live entries of `grads`, the live share of all entries)."""
    b, cut = dict(named_b), LIVE * max(g.abs().max().item() for g in grads.values())
    diffs, live, total = [0.0], 0, 0
    for n, t in named_a:
        mask = grads[n].abs() > cut
        live, total = live + int(mask.sum()), total + mask.numel()
        if mask.any():
            diffs.append((t - b[n])[mask].abs().max().item())
    return max(diffs), live / total


def main(out_path: str, model_dir: str | None = None) -> None:
    torch.set_num_threads(1)
    rank, world, device = run_setup.setup_distributed()
    assert world == 2, "run with torchrun --nproc-per-node 2"
    if model_dir:
        from checkpoint import load_model
        base, tok = load_model(model_dir, "cpu")
    else:
        tok = make_tokenizer()
        base = make_model(len(tok), seed=0)
    batch = rollouts(len(tok))
    local = batch[:3] if rank == 0 else batch[3:]
    results = {}
    for name, overrides in CONFIGS.items():
        a = dataclasses.replace(flags.Args(), **{"lr": 0.5, **overrides})
        make_opt = torch.optim.AdamW if name.endswith("adamw") else torch.optim.SGD
        init = {n: p.detach().clone() for n, p in base.named_parameters()}
        ref_model = copy.deepcopy(base).eval().requires_grad_(False) if a.kl_coef else None
        one, g1, g2 = copy.deepcopy(base).train(), [], []
        opt1 = record_gradients(make_opt(one.parameters(), lr=a.lr), one, g1)
        m1 = update(one, ref_model, opt1, batch, [], a, step=0,
                          pad_id=tok.pad_token_id, world=1)
        two = train.shard_model(copy.deepcopy(base), device).train()
        opt2 = record_gradients(make_opt(two.parameters(), lr=a.lr), two, g2)
        m2 = update(two, ref_model, opt2, local, [], a, step=0,
                          pad_id=tok.pad_token_id, world=world)
        m1, m2 = m1.reduce(1), m2.reduce(world)
        engine = TorchEngine(base, tok)
        engine.load_weights(parallel.full_parameters(two))    # weight sync, gathered layer by layer
        full_two = list(parallel.full_parameters(two))
        # live entries by the first step's gradient: asserted for the one-step AdamW configuration
        # only
        live, live_share = (live_diff(full_two, one.named_parameters(), g1[0]) if g1
                            else (float("inf"), 0.0))
        results[name] = {"param_diff": max_diff(full_two, one.named_parameters()),
                         "param_diff_live": live, "live_share": live_share, "steps_1": len(g1),
                         "steps_2": len(g2), "grad_diff": grad_diff(g1, g2),
                         "moved": max_diff(one.named_parameters(), init.items()),
                         "engine_diff": max_diff(engine.model.named_parameters(), full_two),
                         "grad_norm_1": m1["loss/grad_norm"], "grad_norm_2": m2["loss/grad_norm"],
                         "loss_1": m1["loss/policy"], "loss_2": m2["loss/policy"],
                         "tokens_1": m1["loss/tokens"], "tokens_2": m2["loss/tokens"]}
    # A NaN advantage on rank 1 only: the skip is decided for both ranks, so no rank's weights move.
    a = flags.Args(lr=1e-2, max_bad_steps=5)
    two = train.shard_model(copy.deepcopy(base), device).train()
    bad = (local if rank == 0
           else [dataclasses.replace(local[0], advantage=float("nan"))] + local[1:])
    guard = parallel.StepGuard(a.max_bad_steps)
    update(two, None, torch.optim.AdamW(two.parameters(), lr=a.lr), bad, [], a, step=0,
                 pad_id=tok.pad_token_id, world=world, guard=guard)
    results["nan-on-rank-1"] = {"moved": max_diff(list(parallel.full_parameters(two)),
                                                  base.named_parameters()),
                                "skipped": parallel.all_reduce([float(guard.skipped)], world)[0]}
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump(results, f, indent=1)
    dist.barrier()               # no rank tears gloo down while the other still has work in flight
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:3])
