"""A tiny task for the trainer's distributed and checkpoint tests, independent of the shipped
assets/tiny-arith.

`make_digit_task(dir)` writes a random-initialised tiny model (assets/make_tiny_model.py's
architecture), briefly trained to answer "d=" with one digit and EOS, and a JSONL prompt set of such
copy questions. A purely random model almost never earns a reward, so every group would have zero
variance, every advantage would be 0 and a training step would not move the weights: tests of resume
and of sharded updates would then pass vacuously. After 60 supervised steps the model answers with
*some* digit, right about a third of the time, so groups of 4 have reward variance.
"""
import json
import os

import torch

from make_tiny_model import make_model, make_tokenizer  # assets/ (on the path: tests/conftest.py)

DIGITS = [str(d) for d in range(10)]


def make_digit_task(out: str, steps: int = 60, seed: int = 0) -> tuple[str, str]:
    """(model directory, data path) under `out`."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)         # small matmuls: more threads only contend for the shared cores
    torch.manual_seed(seed)
    tok = make_tokenizer()
    model = make_model(len(tok), seed)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        q = torch.randint(0, 10, (64,), generator=g).tolist()
        # "d=" -> "e<eos>" with e = d half the time: learns the format fast, the copy only partly
        a = [d if torch.rand(1, generator=g) < 0.5 else int(torch.randint(0, 10, (1,), generator=g))
             for d in q]
        # [64, 4]
        ids = torch.tensor([tok.encode(f"{d}={e}") + [tok.eos_token_id] for d, e in zip(q, a)])
        labels = ids.clone()
        labels[:, :2] = -100                                       # loss on the answer and EOS only
        loss = model(input_ids=ids, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    torch.set_num_threads(threads)
    model_dir, data_path = os.path.join(out, "digit-model"), os.path.join(out, "digits.jsonl")
    model.save_pretrained(model_dir, safe_serialization=True)
    tok.save_pretrained(model_dir)
    with open(data_path, "w") as f:
        for i in range(200):
            f.write(json.dumps({"question": str(i % 10), "answer": str(i % 10)}) + "\n")
    return model_dir, data_path


# The smallest run of train.py on that task (2 ranks split 4 prompts into 2 + 2).
SMALL = ["--prompts-per-step", "4", "--group-size", "4", "--max-new-tokens", "4",
         "--eval-size", "8", "--eval-every", "0", "--threads", "1", "--prompt-template", "builtin",
         "--lr", "3e-3", "--replay-ratio", "1", "--tau-max", "2"]


# ---- greedy decoding on two paths: where rounding cannot decide ----------------------------------

# Two greedy decoders (a batch and a single row, KV cache and a full forward, another CPU kind's
# kernels) compute the same logits to about 1e-6; where the top two logits are closer than this,
# rounding may pick either token and both paths are right.
GREEDY_MARGIN = 1e-4


@torch.no_grad()
def decided_prefix(model, prompt_ids: list[int], completion_ids: list[int],
                   margin: float = GREEDY_MARGIN) -> int:
    """How many leading tokens of a greedy completion are decided by more than `margin` (top-1
    minus top-2 logit at each position, from one forward of prompt + completion): two greedy paths
    must agree on that many tokens; after the first near-tie they may part."""
    ids = torch.tensor([prompt_ids + completion_ids])
    logits = model(input_ids=ids).logits[0, len(prompt_ids) - 1:-1].float()       # [T, V]
    top2 = logits.topk(2, dim=-1).values                                           # [T, 2]
    close = ((top2[:, 0] - top2[:, 1]) <= margin).tolist()
    return close.index(True) if True in close else len(completion_ids)


# ---- the run from a flat Args, as the door builds it (for tests of one piece) --------------------

def memory_asked(args):
    """What `args` ask of the memory (memory.Asked), bound as run_setup.setup binds them."""
    import cli
    import flags
    import run_setup
    return run_setup.memory_asked({owner: cli.part(args, owner) for owner in flags.OWNERS},
                                  flags.needs_initial(args))


def setup(args, *, rank: int = 0, world: int = 1, device: str = "cpu", shard=None):
    """run_setup.setup(args) with what train.main hands it (train.shard_model or `shard`,
    train.STEPS): the run_setup.Run every step function takes."""
    import run_setup
    import train
    return run_setup.setup(args, rank=rank, world=world, device=device,
                           shard=shard or train.shard_model, steps=train.STEPS)


def run_of(args, model=None, *, opt=None, initial=None, engine=None, rank: int = 0,
           world: int = 1, device: str = "cpu"):
    """The run the door builds from `args` (flags.Args; the model and data of args.model, the tiny
    one by default, its first screen swallowed): the run_setup.Run every step function takes, the
    method files' slots filled from `args`. With `model`, that policy in place of the one loaded,
    used as given (not sharded here: the caller shards it if it must, dist_update.py), with `opt`
    (AdamW at --lr over it by default, as the door makes it) and `initial` (the KL reference; by
    default the model as loaded when --kl-coef > 0); with `engine`, that engine in place of
    TorchEngine, also the one the slots are made with."""
    import contextlib
    import io
    from unittest import mock
    import run_setup
    real_load = run_setup.load_inputs

    def load_inputs(*a, **kw):
        resume, loaded, tok, prompts = real_load(*a, **kw)
        return resume, loaded if model is None else model, tok, prompts

    with contextlib.ExitStack() as stack:
        stack.enter_context(contextlib.redirect_stdout(io.StringIO()))
        stack.enter_context(mock.patch.object(run_setup, "load_inputs", load_inputs))
        if engine is not None:
            stack.enter_context(mock.patch.object(run_setup, "TorchEngine", lambda m, tok: engine))
        run = setup(args, rank=rank, world=world, device=device,
                    shard=None if model is None else (lambda m, device: m))
    if opt is not None:
        run.opt = opt
    if initial is not None:
        run.initial = initial
    return run


def update(model, initial, opt, fresh, replayed, args, *, step: int, pad_id: int,
           world: int = 1, guard=None, per_update=None):
    """train.update of `model` with `opt` (and `initial`, the KL reference) under the flags of
    `args` (flags.Args), on a run the door builds (run_of) with an engine that never generates
    (it takes a head: the door hands it R²PO's; its sleep does nothing); `guard` a fresh
    parallel.StepGuard by default."""
    import types
    import parallel
    import train
    run = run_of(args, model, opt=opt, initial=initial,
                 engine=types.SimpleNamespace(logits_head=None, sleep=lambda **_: None,
                                              serves_as_old=lambda precision: True),
                 world=world)
    if pad_id != run.tok.pad_token_id:           # another tokenizer than args.model's: its pad
        run.tok = types.SimpleNamespace(pad_token_id=pad_id)
        run.batching = run.batching._replace(pad_id=pad_id)
    metrics, updates = train.update(run, fresh, replayed, step=step,
                                    guard=guard or parallel.StepGuard(args.max_bad_steps))
    if per_update is not None:
        per_update += updates
    return metrics


def run_main(argv, out):
    """train.main in process with its output swallowed: (exit status, the metrics.jsonl rows after
    step 0, the updates.jsonl rows)."""
    import io
    import json
    from contextlib import redirect_stderr, redirect_stdout
    import train
    with redirect_stdout(io.StringIO()), redirect_stderr(io.StringIO()):
        rc = train.main([*argv, "--out-dir", str(out)])
    read = lambda name: [json.loads(ln) for ln in open(out / name)]   # noqa: E731
    return rc, read("metrics.jsonl")[1:], read("updates.jsonl")
