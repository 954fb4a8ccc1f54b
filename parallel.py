"""The machinery of running the algorithm on many ranks: collectives, lockstep forward/backward
passes, the step's global loss normaliser, gradient helpers and the non-finite step guard.
train.py's loop uses these; a reader of the algorithm can take each at its docstring.

Every function works at world size 1 without a process group (plain `python train.py`), where a
collective is the identity. Under torchrun every rank must call the collectives here equally often
and in the same order.
"""
import json
import math
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor

import cli
import grpo


def print0(*args, **kw) -> None:
    """print() on rank 0 only."""
    if not dist.is_initialized() or dist.get_rank() == 0:
        print(*args, **kw)


def all_reduce(values: list[float], world: int, op=dist.ReduceOp.SUM) -> list[float]:
    """Element-wise reduction of a list of floats over ranks (float64)."""
    if world == 1:
        return values
    device = "cuda" if dist.get_backend() == "nccl" else "cpu"
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=op)
    return t.tolist()


def all_gather_cat(t: torch.Tensor, world: int) -> torch.Tensor:
    """Every rank's 1-D tensor (lengths may differ), concatenated in rank order, on the CPU of
    every rank (a threshold over the step's values needs the values themselves, not their sum)."""
    if world == 1:
        return t.cpu()
    parts = [None] * world
    dist.all_gather_object(parts, t.cpu())
    return torch.cat(parts)


# ---- bad input found mid-run: every rank stops at once, the cause said once ----------------------

class RanksStopped(ValueError):
    """Bad input found mid-run on some rank (its own error's message, and which rank): raised on
    every rank at once by stop_together, so main prints it on rank 0 only and every rank exits 2."""


def stop_together(error: Exception | None, world: int) -> None:
    """Every rank calls this at the same point of the step, with the bad-input error its own work
    there ended in (held, not raised: a rank that raised alone would leave the others waiting in
    the step's next collective, which gloo ends in a traceback), or None. When no rank has one it
    returns; otherwise every rank raises RanksStopped with the first failing rank's message. One
    rank, no process group: `error` itself is raised."""
    if world == 1:
        if error is not None:
            raise error
        return
    if not all_reduce([float(error is not None)], world, op=dist.ReduceOp.MAX)[0]:
        return                                     # the usual case: one small collective
    messages = [None] * world
    dist.all_gather_object(messages, None if error is None else str(error))
    rank, message = next((r, m) for r, m in enumerate(messages) if m is not None)
    raise RanksStopped(f"{message} (rank {rank} of {world}; every rank stopped)")


def record_error(message: str) -> None:
    """Under torchrun, `message` (one line) as this process's elastic error record, so torchrun's
    failure summary shows it in place of "error_file: <N/A>" and a link about tracebacks; nothing
    without torchrun (no TORCHELASTIC_ERROR_FILE)."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if path:
        with open(path, "w") as f:
            json.dump({"message": message, "timestamp": int(time.time())}, f)


def fail(message: str, code: int, *, every_rank: bool = False) -> int:
    """A run that ends on an error: `message` (one line) to stderr, on rank 0 only (the same on
    every rank) or with `every_rank` on this one (found by this rank alone), recorded for torchrun
    (record_error, on every rank); returns the exit status `code`. Absolute paths in it are named
    relative to where the user ran (cli.relative_paths)."""
    message = cli.relative_paths(message)
    if every_rank:
        print(message, file=sys.stderr)
    else:
        print0(message, file=sys.stderr)
    record_error(message)
    return code


# ---- lockstep forward/backward passes ------------------------------------------------------------

def lockstep(micro_batches: list, model, pad_id: int, world: int, backward: bool,
             followers: tuple = ()):
    """Yield this rank's micro-batches, then make the passes it lacks: FSDP all-gathers parameters
    inside every forward and reduce-scatters gradients inside every backward, collectives that every
    rank must join equally often, so a rank with fewer micro-batches than another runs padding
    passes (a one-token forward, and a backward of 0 * logits when `backward`: its gradient is
    exactly 0). `followers`: frozen models the caller runs a no-grad forward of on every
    micro-batch, after the model's forward and before its backward (a sharded KL reference): each
    joins the padding passes too, in that order (the collectives of every rank must pair up), and
    is resharded at the end."""
    n = int(all_reduce([float(len(micro_batches))], world, op=dist.ReduceOp.MAX)[0])
    yield from micro_batches
    device = next(model.parameters()).device
    for _ in range(n - len(micro_batches)):
        ids = torch.full((1, 1), pad_id, device=device)
        logits = model(input_ids=ids).logits
        with torch.no_grad():            # where the caller's pass runs them: before the backward
            for frozen in followers:
                frozen(input_ids=ids)
        if backward:
            (logits.float().sum() * 0.0).backward()
    for frozen in followers:
        reshard(frozen)


def forward_passes(micro_batches: list, model, pad_id: int, world: int, followers: tuple = ()):
    """`lockstep` for passes without a backward through `model` (no-grad scoring, or a head trained
    on a frozen base), then `reshard`: without a backward FSDP2's root keeps its gathered
    parameters. Iterate it to the end."""
    yield from lockstep(micro_batches, model, pad_id, world, backward=False, followers=followers)
    reshard(model)


def global_normaliser(micro_batches: list[dict], agg: str, max_len: int,
                      world: int) -> float | None:
    """N of one optimizer step over every rank's micro-batches (grpo.loss_normaliser; every mode's N
    is a count, so the global N is the sum of the ranks' counts, floored at 1 once), or None when no
    rank has a rollout in it (then there is no optimizer step)."""
    n = sum(grpo.loss_normaliser(mb["completion_mask"], agg, max_len=max_len, floor=0)
            for mb in micro_batches)
    total, rollouts = all_reduce([n, float(len(micro_batches))], world)
    return max(total, 1.0) if rollouts else None


def reshard(model) -> None:
    """Under FSDP2, free the gathered parameters a no-grad forward left behind: without a backward
    the root keeps its full (bf16 on CUDA) parameters until the next one. A no-op unsharded."""
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()


def clip_gradients(model, max_norm: float) -> float:
    """Clip to max_norm (0 = no clip) by the global norm: on FSDP2's DTensor gradients
    clip_grad_norm_ reduces the per-shard norms over ranks, and returns the norm as a replicated
    DTensor."""
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm or float("inf"))
    return float(norm.full_tensor() if isinstance(norm, DTensor) else norm)


def sum_gradients(module, world: int) -> None:
    """Sum a replicated (not sharded) module's gradients over ranks, in place (a method's head: its
    loss is already divided by the global normaliser, so the sum is the step's gradient)."""
    if world > 1:
        for p in module.parameters():
            # this rank had no rollout in the step: it still joins every all-reduce
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            dist.all_reduce(p.grad)


def full_parameters(model):
    """(name, full tensor) for every parameter, in named_parameters() order (the same on every rank,
    layer by layer), one at a time: a sharded parameter is all-gathered (DTensor.full_tensor(), a
    collective every rank joins in this order) only when the consumer asks for it, so at most one
    full tensor is alive beyond the model."""
    for name, p in model.named_parameters():
        with torch.no_grad():
            t = p.full_tensor() if isinstance(p, DTensor) else p.detach()
        yield name, t


# ---- the non-finite guard ------------------------------------------------------------------------

class NonFiniteError(RuntimeError):
    pass


class StepGuard:
    """A non-finite loss or gradient norm never reaches the weights: that optimizer step is skipped
    on every rank (gradients dropped), logged and counted; `max_bad` skips in a row raise
    NonFiniteError, which ends the run before anything of that state is saved, so the last good
    checkpoint stays the newest."""

    def __init__(self, max_bad: int):
        self.max_bad = max_bad
        self.skipped = 0               # optimizer steps skipped in all
        self.in_row = 0                # ... in a row, up to now

    def allow(self, loss: float, grad_norm: float, world: int, step: int) -> bool:
        # one rank's inf loss is everyone's skipped step
        finite = math.isfinite(loss) and math.isfinite(grad_norm)
        bad = all_reduce([float(not finite)], world, op=dist.ReduceOp.MAX)[0]
        if not bad:
            self.in_row = 0
            return True
        self.skipped += 1
        self.in_row += 1
        print0(f"step {step + 1}: non-finite loss {loss} or gradient norm {grad_norm}: "
               f"optimizer step skipped "
               f"({self.in_row} in a row, {self.skipped} in all)", flush=True)
        if self.in_row >= self.max_bad:
            raise NonFiniteError(f"{self.in_row} optimizer steps in a row had a non-finite loss "
                                 f"or gradient norm (step {step + 1}); stopping. The newest "
                                 f"checkpoint predates them.")
        return False
