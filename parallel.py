"""The machinery around the algorithm: collectives, lockstep micro-batches, the non-finite step guard, step metrics
and the log line. train.py's loop uses these; a reader of the algorithm can take each at its docstring.

Every function works at world size 1 without a process group (plain `python train.py`), where a collective is the
identity. Under torchrun every rank must call the collectives here equally often and in the same order.
"""
import json
import math
import os

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

import checkpoint
import grpo
import rollout
from rollout import forward_logprobs, length_buckets, micro_batches


def print0(*args, **kw) -> None:
    """print() on rank 0 only."""
    if not dist.is_initialized() or dist.get_rank() == 0:
        print(*args, **kw)


def all_reduce(values: list[float], world: int, op=dist.ReduceOp.SUM) -> list[float]:
    """Element-wise reduction of a list of floats over ranks (float64)."""
    if world == 1:
        return values
    t = torch.tensor(values, dtype=torch.float64, device="cuda" if dist.get_backend() == "nccl" else "cpu")
    dist.all_reduce(t, op=op)
    return t.tolist()


# ---- lockstep forward/backward passes --------------------------------------------------------------------------------

def lockstep(micro_batches: list, model, pad_id: int, world: int, backward: bool):
    """Yield this rank's micro-batches, then make the passes it lacks: FSDP all-gathers parameters inside every
    forward and reduce-scatters gradients inside every backward, collectives that every rank must join equally often,
    so a rank with fewer micro-batches than another runs padding passes (a one-token forward, and a backward of
    0 * logits when `backward`: its gradient is exactly 0)."""
    n = int(all_reduce([float(len(micro_batches))], world, op=dist.ReduceOp.MAX)[0])
    yield from micro_batches
    device = next(model.parameters()).device
    for _ in range(n - len(micro_batches)):
        logits = model(input_ids=torch.full((1, 1), pad_id, device=device)).logits
        if backward:
            (logits.float().sum() * 0.0).backward()


def global_normaliser(micro_batches: list[dict], agg: str, max_len: int, world: int) -> float | None:
    """N of one optimizer step over every rank's micro-batches (grpo.loss_normaliser; every mode's N is a count, so
    the global N is the sum of the ranks' counts, floored at 1 once), or None when no rank has a rollout in it (then
    there is no optimizer step)."""
    n = sum(grpo.loss_normaliser(mb["completion_mask"], agg, max_len=max_len, floor=0) for mb in micro_batches)
    total, rollouts = all_reduce([n, float(len(micro_batches))], world)
    return max(total, 1.0) if rollouts else None


@torch.no_grad()
def lockstep_logprobs(model, rollouts: list, size: int, temperature: float, pad_id: int, world: int) -> list:
    """Each rollout's completion log-probs under `model` (rollout.forward_logprobs), in micro-batches of `size` run
    in lockstep with the other ranks: a list of floats per rollout, in the order of `rollouts` (micro-batches group
    rows by length: rollout.length_buckets says where each row came from)."""
    out, mbs = [None] * len(rollouts), micro_batches(rollouts, size, pad_id, next(model.parameters()).device)
    buckets = length_buckets(rollouts, size)
    for j, mb in enumerate(lockstep(mbs, model, pad_id, world, backward=False)):   # to the end: padding passes too
        logp = forward_logprobs(model, mb, temperature)[1]                                     # [b, T]
        for b, i in enumerate(buckets[j]):
            P, T = len(rollouts[i].prompt_ids), len(rollouts[i].completion_ids)
            out[i] = logp[b, P - 1:P - 1 + T].tolist()
    return out


def clip_gradients(model, max_norm: float) -> float:
    """Clip to max_norm (0 = no clip) by the global norm: on FSDP2's DTensor gradients clip_grad_norm_ reduces the
    per-shard norms over ranks, and returns the norm as a replicated DTensor."""
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm or float("inf"))
    return float(norm.full_tensor() if isinstance(norm, DTensor) else norm)


def sum_gradients(module, world: int) -> None:
    """Sum a replicated (not sharded) module's gradients over ranks, in place (R²PO's head: its loss is already
    divided by the global normaliser, so the sum is the step's gradient)."""
    if world > 1:
        for p in module.parameters():
            if p.grad is None:           # this rank had no rollout in the step: it still joins every all-reduce
                p.grad = torch.zeros_like(p)
            dist.all_reduce(p.grad)


def full_parameters(model):
    """(name, full tensor) for every parameter, in named_parameters() order (the same on every rank, layer by
    layer), one at a time: a sharded parameter is all-gathered (DTensor.full_tensor(), a collective every rank joins
    in this order) only when the consumer asks for it, so at most one full tensor is alive beyond the model."""
    for name, p in model.named_parameters():
        with torch.no_grad():
            t = p.full_tensor() if isinstance(p, DTensor) else p.detach()
        yield name, t


# ---- the non-finite guard --------------------------------------------------------------------------------------------

class NonFiniteError(RuntimeError):
    pass


class StepGuard:
    """A non-finite loss or gradient norm never reaches the weights: that optimizer step is skipped on every rank
    (gradients dropped), logged and counted; `max_bad` skips in a row raise NonFiniteError, which ends the run
    before anything of that state is saved, so the last good checkpoint stays the newest."""

    def __init__(self, max_bad: int):
        self.max_bad, self.skipped, self.in_row = max_bad, 0, 0

    def allow(self, loss: float, grad_norm: float, world: int, step: int) -> bool:
        bad = all_reduce([float(not (math.isfinite(loss) and math.isfinite(grad_norm)))], world,
                         op=dist.ReduceOp.MAX)[0]        # one rank's inf loss is everyone's skipped step
        if not bad:
            self.in_row = 0
            return True
        self.skipped += 1
        self.in_row += 1
        print0(f"step {step + 1}: non-finite loss {loss} or gradient norm {grad_norm}: optimizer step skipped "
               f"({self.in_row} in a row, {self.skipped} in all)", flush=True)
        if self.in_row >= self.max_bad:
            raise NonFiniteError(f"{self.in_row} optimizer steps in a row had a non-finite loss or gradient norm "
                                 f"(step {step + 1}); stopping. The newest checkpoint predates them.")
        return False


# ---- step metrics ------------------------------------------------------------------------------------------------

class Metrics:
    """One step's metrics in a form that combines exactly over micro-batches and ranks: a mean with its weight (the
    number of items it averages: tokens, rollouts, prompts), a total, or an extreme. `reduce(world)` gathers every
    rank's entries in one collective and returns {key: weighted mean | sum | max | min}, keys in the order rank 0
    added them. A weighted mean is sum_i w_i v_i / sum_i w_i over the parts with w_i > 0 (0 when there are none; the
    value itself when there is one), so a mean over micro-batches or ranks is the mean over all their items."""

    def __init__(self):
        self.stats = {}                                   # key -> (kind, [value, ...] or [(value, weight), ...])

    def _add(self, key: str, kind: str, value) -> None:
        self.stats.setdefault(key, (kind, []))[1].append(value)

    def mean(self, key: str, value: float, weight: float) -> None:
        """Add a mean `value` of `weight` items."""
        self._add(key, "mean", (float(value), float(weight)))

    def total(self, key: str, value) -> None:
        self._add(key, "sum", value)

    def max(self, key: str, value) -> None:
        self._add(key, "max", value)

    def min(self, key: str, value) -> None:
        self._add(key, "min", value)

    def token_means(self, means: dict, n: float, extremes: dict | None = None) -> None:
        """Add a dict of means over n tokens (0-dim tensors or floats); keys in `extremes` ({key: "min" | "max"})
        are extremes instead, kept only where n > 0 (a mean of no token is NaN)."""
        for key, value in means.items():
            if key not in (extremes or {}):
                self.mean(key, float(value), n)
            elif n:
                (self.min if extremes[key] == "min" else self.max)(key, float(value))

    def merge(self, other: "Metrics") -> None:
        """Add every entry of `other` (e.g. one optimizer step's metrics into the loop step's)."""
        for key, (kind, values) in other.stats.items():
            self.stats.setdefault(key, (kind, []))[1].extend(values)

    def reduce(self, world: int) -> dict:
        return reduce_all([self], world)[0]


def reduce_all(metrics: list[Metrics], world: int) -> list[dict]:
    """Metrics.reduce of each of `metrics` (the same number on every rank), in one collective."""
    gathered = [[m.stats for m in metrics]]
    if world > 1:
        gathered = [None] * world
        dist.all_gather_object(gathered, [m.stats for m in metrics])
    return [_combine([rank[i] for rank in gathered]) for i in range(len(metrics))]


def _combine(parts: list[dict]) -> dict:
    out = {}
    for key in dict.fromkeys(k for p in parts for k in p):           # union, in first-seen order
        kind = next(p[key][0] for p in parts if key in p)
        values = [v for p in parts if key in p for v in p[key][1]]
        if kind == "mean":
            out[key] = _weighted_mean(values)
        elif kind == "sum":
            out[key] = sum(values)
        else:
            out[key] = (max if kind == "max" else min)(values)
    return out


def _weighted_mean(parts: list[tuple[float, float]]) -> float:
    parts = [(v, w) for v, w in parts if w > 0]
    if len(parts) <= 1:
        return parts[0][0] if parts else 0.0
    return sum(v * w for v, w in parts) / sum(w for _, w in parts)


def step_metrics(m: Metrics, fresh, generated, replay, gen: Metrics, canary: float | None, seconds: dict) -> None:
    """What was generated (all rounds; `gen`: VIGOR's numbers), what went into the batch, the replay buffer's state
    after this step, the engine-trainer log-prob gap when it was measured, and the wall time of the step's parts."""
    m.merge(gen)
    if canary is not None:
        m.mean("rollout/logprob_diff", canary, 1)
    for key, value in seconds.items():
        m.max(f"time/{key}", value)
    rewards = torch.tensor([r.reward for r in generated])
    n, n_groups = len(generated), len({r.prompt_id for r in generated})
    m.mean("reward/mean", rewards.mean().item(), n)
    m.mean("reward/zero_std_frac", grpo.zero_std_fraction(rewards, torch.tensor([r.prompt_id for r in generated])),
           n_groups)
    m.total("batch/fresh", len(fresh))
    m.total("rollout/generated", n)
    m.mean("response/len_mean", sum(len(r.completion_ids) for r in generated) / n, n)
    m.mean("response/truncated_frac", sum(r.truncated for r in generated) / n, n)
    m.mean("rollout/distinct_answers", rollout.distinct_answers(generated), n_groups)   # diversity within groups
    s = replay.stats() if replay is not None else {"replay/size": 0, "replay/sampled": 0, "replay/age_mean": 0.0}
    for key, value in s.items():
        if key in ("replay/age_mean", "replay/abs_adv_sampled"):
            m.mean(key, value, s["replay/sampled"])
        elif key == "replay/headroom_mean":                            # Headroom-Drift: over the replayed groups
            m.mean(key, value, s["replay/groups"])
        elif key in ("replay/drift_mean", "replay/drift_gated_frac"):   # ... over the drift pass's candidates
            m.mean(key, value, s["replay/drift_candidates"])
        elif key == "replay/abs_adv_stored":
            m.mean(key, value, s["replay/size"])
        elif key == "replay/age_max":
            m.max(key, value)
        else:
            m.total(key, value)


def log_line(m: dict) -> str:
    """The step's line on stdout, from the reduced metrics; a WARNING when the verifier had internal errors."""
    loss = m.get("loss/policy", m.get("r2po/head_loss", 0.0))        # R²PO's head phase: the head's loss
    s = (f"step {m['step']:4d} | reward {m['reward/mean']:.3f} | zero-std {m['reward/zero_std_frac']:.2f} "
         f"| loss {loss:+.4f} | clip {m.get('loss/clip_frac', 0):.3f} | replay {m['replay/sampled']:3d}/"
         f"{m['replay/size']:<5d} age {m['replay/age_mean']:.2f} | len {m['response/len_mean']:.1f} "
         f"| {m['time/step']:.2f}s")
    if "r2po/phase" in m:
        s += f" | r2po {'policy' if m['r2po/phase'] else 'head'} phase"
    s += "".join(f" | {k[5:]} {v:.3f}" for k, v in m.items() if k.startswith("eval/"))
    if m.get("verify/error") or m.get("verify/worker_restarts"):   # a verifier bug would quietly zero rewards
        s += (f" | WARNING verifier: {m['verify/error']} internal errors, {m['verify/worker_restarts']} worker "
              f"restarts (see verify/* in metrics.jsonl)")
    return s


# ---- rank 0's files ------------------------------------------------------------------------------------------------

LOG_FILES = ("metrics.jsonl", "samples.jsonl", "updates.jsonl")   # updates.jsonl: one line per optimizer step


def open_logs(out_dir: str, rank: int, start: int, tensorboard: bool = False):
    """(metrics.jsonl, samples.jsonl, updates.jsonl, TensorBoard writer or None) on rank 0, continued after step
    `start` on resume; Nones elsewhere. The writer (--tensorboard) writes to out_dir/tensorboard and drops the steps
    that metrics.jsonl drops: after `start` on resume, every earlier one in a fresh run (SummaryWriter's purge_step)."""
    if rank != 0:
        return (None,) * (len(LOG_FILES) + 1)
    os.makedirs(out_dir, exist_ok=True)
    writer = None
    if tensorboard:              # an optional dependency (requirements-bench.txt), checked by flags.check_args
        from torch.utils.tensorboard import SummaryWriter
        writer = SummaryWriter(os.path.join(out_dir, "tensorboard"), purge_step=start + 1 if start else 0)
    return (*(checkpoint.open_log(os.path.join(out_dir, name), start) for name in LOG_FILES), writer)


def write_logs(files, row: dict, rollouts: list = (), tokenizer=None, updates: list = ()) -> None:
    """Print the step's line (rank 0) and write it to metrics.jsonl, with a few decoded rollouts to samples.jsonl
    and each optimizer step's reduced metrics to updates.jsonl ({"step", "update": 1.., loss/clip_frac,
    loss/veto_frac, ...}: in a mu-GRPO stage they change across its updates), and with --tensorboard every numeric
    key of the row as a scalar at x = row["step"]. Step 0 (the evaluation before training) prints its eval/* numbers
    only."""
    if row["step"] == 0:
        print0("step    0 | " + " | ".join(f"{k[5:]} {v:.3f}" for k, v in row.items() if k != "step"))
    else:
        print0(log_line(row), flush=True)
    metrics_f, samples_f, updates_f, tb = files
    if metrics_f is None:
        return
    metrics_f.write(json.dumps(row) + "\n")
    metrics_f.flush()
    if tb is not None:                                   # the same numbers as metrics.jsonl, one curve per key
        for key, value in row.items():
            if key != "step" and isinstance(value, (int, float)):
                tb.add_scalar(key, value, global_step=row["step"])
        tb.flush()
    updates_f.writelines(json.dumps({"step": row["step"], "update": j + 1, **u}) + "\n" for j, u in enumerate(updates))
    updates_f.flush()
    samples_f.writelines(json.dumps({"step": row["step"], "prompt": tokenizer.decode(r.prompt_ids),
                                     "completion": r.text, "answer": r.answer, "reward": r.reward,
                                     "advantage": r.advantage}) + "\n" for r in rollouts)
    samples_f.flush()


def close_logs(files, row: dict, final: str | None) -> None:
    """Close rank 0's files; name the final checkpoint (out_dir/final) with the last eval numbers."""
    if files[0] is None:
        return
    for f in files:
        if f is not None:                                # the TensorBoard writer is None without --tensorboard
            f.close()
    if final:
        print(f"final -> {final}" + "".join(f" | {k[5:]} {v:.3f}" for k, v in row.items() if k.startswith("eval/")))
