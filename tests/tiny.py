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


# ---- the run's objects from a flat Args, as train.setup binds them (for tests of one piece) ------

def objective_of(args, pad_id: int, ref_model=None, world: int = 1, device: str = "cpu"):
    """objective.Objective of `args` (flags.Args), as train.setup builds it."""
    import cli
    import objective
    batching = objective.Batching(args.micro_batch_size, args.micro_batch_tokens, pad_id, device)
    return objective.Objective(cli.part(args, objective.Flags), temperature=args.temperature,
                               max_len=args.max_new_tokens, batching=batching,
                               ref_model=ref_model, world=world)


def update(model, ref_model, opt, fresh, replayed, args, *, step: int, pad_id: int,
           world: int = 1, guard=None, per_update=None):
    """train.update with the objective and the optimisation flags of `args` (flags.Args)."""
    import cli
    import flags
    import train
    return train.update(model, objective_of(args, pad_id, ref_model, world), opt, fresh, replayed,
                        cli.part(args, flags.OptimFlags), step=step, seed=args.seed,
                        pad_id=pad_id, world=world, guard=guard, per_update=per_update)


def allocation_of(args, engine, rank: int = 0, world: int = 1):
    """allocation.Allocation of `args` (flags.Args) on `engine`, as train.setup builds it."""
    import allocation
    import cli
    import train
    import verify
    import vigor
    from rollout import Sampling
    vigor_flags, vig = cli.part(args, vigor.Flags), None
    if args.allocation == "vigor":
        budget = vigor_flags.budget(args.prompts_per_step, args.group_size) // world
        vig = vigor.Vigor(vigor_flags, budget)
    return allocation.Allocation(
        cli.part(args, allocation.Flags), engine=engine, group_size=args.group_size,
        per_rank=args.prompts_per_step // world, vigor=vig,
        sampling=Sampling(args.temperature, args.top_p, args.max_new_tokens,
                          use_head=args.r2po_head != "none"),
        seed_of=lambda step, round_: train.sampling_seed(args.seed, rank, step, round_),
        grader=verify.grader(args.train_data), form=verify.format_rule(args.train_data))


def score(rollouts, args):
    """allocation.score of `args` (flags.Args)."""
    import allocation
    import cli
    import vigor
    vig = vigor.Vigor(cli.part(args, vigor.Flags), 0) if args.allocation == "vigor" else None
    return allocation.score(rollouts, cli.part(args, allocation.Flags),
                            max_len=args.max_new_tokens, vigor=vig)


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
