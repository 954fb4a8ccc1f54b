"""Metrics: one step's numbers, reduced exactly over micro-batches and ranks, the log line and rank
0's files.

    m = Metrics()
    m.add(COMBINE, {"reward/mean": 0.25}, rollouts=512)  # COMBINE: {"reward/mean": "mean rollouts"}
    row = m.reduce(world)                  # {key: weighted mean | sum | max | min} over all ranks

Each component declares once how each of its keys combines, in a COMBINE table beside the code
that makes them (`Metrics` lists the rules), adds its numbers with the counts they are weighted
by, and has its own fields of the step's log line (`LOG` format strings over its keys, or a
function where the keys vary): the loss (grpo.py, train.py), the replay buffer (buffer.py), the
method files (methods/), the evaluation (eval.py), the verifier's error counts (verify.py), the
engine's canary (engine.py), the rollouts of the step and the timings (`COMBINE` and `LOG`, here).
Nothing here knows another module's key names. docs/metrics.md lists every key.

Files (rank 0, under --out-dir): metrics.jsonl (one JSON object per step), samples.jsonl (a few
decoded rollouts per step), updates.jsonl (one line per optimizer step), and with --tensorboard the
same numbers as TensorBoard scalars.
"""
import json
import os
import sys
from dataclasses import dataclass

import torch
import torch.distributed as dist

import checkpoint
import grpo
import verify

@dataclass(frozen=True)
class LogFlags:
    # ---- eval and logs ---------------------------------------------------------------------------
    log_samples: int = 4
    """decoded rollouts written to samples.jsonl each step (rank 0's)"""
    tensorboard: bool = False
    """also write metrics.jsonl's numeric keys as TensorBoard scalars to out_dir/tensorboard
    (requirements-bench.txt)"""

    AT_LEAST_0 = ("log_samples",)


class Metrics:
    """One step's metrics in a form that combines exactly over micro-batches and ranks, each key as
    its rule in the COMBINE table of the module that makes it says:

        "mean W"      a mean weighted by the count W (one handed to `add`, or another key of its
                      values): sum_i w_i v_i / sum_i w_i over the parts with w_i > 0 (0 for none,
                      the value itself for one), so a mean of parts is the mean of all their items
        "mean"        the same, each part weighing 1
        "sum"         a total
        "max", "min"  an extreme; "max W": over the parts whose count W > 0 (none: no key)
        "weight"      a count other keys are weighted by, not logged itself
    A rule may be declared for a prefix ("eval/*": every key under eval/); a key with no rule is an
    error. `reduce(world)` gathers every rank's parts in one collective and returns {key: its
    value}, keys in the order rank 0 added them.

    A value or count may be a 0-dim tensor: it is kept as it is (detached) until `settle`, which
    reads every tensor of the step to the host in one copy a device. So the update never waits for
    the device between a forward and its backward to log a number (on CUDA, each float(tensor)
    would); `reduce` settles first. A tensor reads as float(tensor) would: its exact value."""

    def __init__(self):
        self.stats = {}            # key -> (kind, [(value, count or None), ...])

    def add(self, rules: dict, values: dict, **counts) -> None:
        """Add `values` ({key: number or 0-dim tensor}), each as its rule in `rules` (the COMBINE
        table of the module that makes the key) says; `counts` are the weights the rules name."""
        for key, value in values.items():
            found = rules.get(key, rules.get(key.split("/", 1)[0] + "/*"))  # or its prefix's
            if found is None:
                raise KeyError(f"metrics: no combine rule for {key!r}: declare it in the COMBINE "
                               "table of the module that makes it")
            kind, _, name = found.partition(" ")         # "mean tokens": ("mean", "tokens")
            if kind == "weight":
                continue
            if name:
                weight = counts[name] if name in counts else values[name]
            else:
                weight = 1 if kind == "mean" else None
            self.stats.setdefault(key, (kind, []))[1].append((_hold(value), _hold(weight)))

    def merge(self, other: "Metrics") -> None:
        """Add every entry of `other` (e.g. one optimizer step's metrics into the loop step's)."""
        for key, (kind, parts) in other.stats.items():
            self.stats.setdefault(key, (kind, []))[1].extend(parts)

    def settle(self) -> None:
        """Every tensor entry to its float, one device-to-host copy a device (a mean's parts all
        to floats); an extreme's parts with a count of 0 dropped, and a key left with none too."""
        floats = _to_floats([x for _, parts in self.stats.values() for part in parts
                             for x in part if isinstance(x, torch.Tensor)])

        def read(x):
            return floats[id(x)] if isinstance(x, torch.Tensor) else x
        for kind, parts in self.stats.values():
            if kind == "mean":
                parts[:] = [(float(read(v)), float(read(w))) for v, w in parts]
            else:
                parts[:] = [(read(v), read(w)) for v, w in parts if w is None or read(w)]
        self.stats = {k: entry for k, entry in self.stats.items() if entry[1]}

    def reduce(self, world: int) -> dict:
        return reduce_all([self], world)[0]


def _hold(x):
    """A 0-dim tensor detached (no graph kept alive), anything else as it is."""
    return x.detach() if isinstance(x, torch.Tensor) else x


def _to_floats(tensors: list) -> dict:
    """{id(tensor): float(tensor)} of 0-dim tensors: per device, one stack in float64 (every
    float32, bfloat16 and integer count below 2**53 exactly) and one .tolist()."""
    by_device = {}
    for t in tensors:
        by_device.setdefault(t.device, []).append(t)
    out = {}
    for ts in by_device.values():
        values = torch.stack([t.to(torch.float64).reshape(()) for t in ts]).tolist()
        out.update(zip(map(id, ts), values))
    return out


def host_sum(tensors: list) -> float:
    """The sum of 0-dim tensors (a step's detached micro-batch losses) as a float, read after the
    last backward: one device-to-host copy, then added in float64 on the host; 0.0 for none."""
    return sum(torch.stack(tensors).tolist()) if tensors else 0.0


def reduce_all(metrics: list[Metrics], world: int) -> list[dict]:
    """Metrics.reduce of each of `metrics` (the same number on every rank), in one collective."""
    for m in metrics:
        m.settle()
    gathered = [[m.stats for m in metrics]]
    if world > 1:
        gathered = [None] * world
        dist.all_gather_object(gathered, [m.stats for m in metrics])
    return [_combine([rank[i] for rank in gathered]) for i in range(len(metrics))]


def _combine(parts: list[dict]) -> dict:
    out = {}
    for key in dict.fromkeys(k for p in parts for k in p):           # union, in first-seen order
        kind = next(p[key][0] for p in parts if key in p)
        values = [part for p in parts if key in p for part in p[key][1]]
        if kind == "mean":
            out[key] = _weighted_mean(values)
        elif kind == "sum":
            out[key] = sum(v for v, _ in values)
        else:
            out[key] = (max if kind == "max" else min)(v for v, _ in values)
    return out


def _weighted_mean(parts: list[tuple[float, float]]) -> float:
    parts = [(v, w) for v, w in parts if w > 0]
    if len(parts) <= 1:
        return parts[0][0] if parts else 0.0
    return sum(v * w for v, w in parts) / sum(w for _, w in parts)


# ---- the step's rollouts -------------------------------------------------------------------------

def diversity(rollouts: list) -> tuple[float, float]:
    """(distinct answers, distinct chains) of rollouts: the mean over groups of (distinct final
    answers) / (group size), an answer being verify.extract_answer's or the whole stripped text
    when it states none; and of (distinct stripped texts) / (group size), the worked chain and not
    only its answer (on 3-token answers it is about the first)."""
    answers: dict[int, list[str]] = {}
    chains: dict[int, list[str]] = {}
    for r in rollouts:
        answers.setdefault(r.prompt_id, []).append(verify.extract_answer(r.text) or r.text.strip())
        chains.setdefault(r.prompt_id, []).append(r.text.strip())
    return tuple(sum(len(set(a)) / len(a) for a in by.values()) / max(len(by), 1)
                 for by in (answers, chains))


# how the step's rollout numbers and its timings combine (Metrics): means over the rollouts or the
# groups generated, counts summed over ranks, a stage's seconds the slowest rank's
COMBINE = {"reward/mean": "mean rollouts", "reward/zero_std_frac": "mean groups",
           "rollout/prompts_with_signal": "sum", "rollout/zero_var_rollouts": "sum",
           "batch/fresh": "sum", "rollout/generated": "sum",
           "response/len_mean": "mean rollouts", "response/truncated_frac": "mean rollouts",
           "rollout/format_error": "mean rollouts",
           "rollout/distinct_answers": "mean groups", "rollout/distinct_chains": "mean groups",
           "time/*": "max"}


def rollout_metrics(fresh: list, generated: list) -> Metrics:
    """What was generated this step (every round: `generated`) and what of it went into the batch
    (`fresh`): the mean (shaped) reward, the share of zero-variance groups, lengths, truncation,
    the format-error rate, diversity."""
    rewards = torch.tensor([r.reward for r in generated])
    groups = grpo.group_ids(generated)
    n = len(generated)
    n_groups = len({r.prompt_id for r in generated})
    flat = grpo.flat_groups(rewards, groups)                         # every advantage exactly 0
    n_flat = len(set(groups[flat].tolist()))
    answers, chains = diversity(generated)             # within groups
    m = Metrics()
    m.add(COMBINE, {
        "reward/mean": rewards.mean().item(),
        # the share of groups, rounded to float32 as a mean of their flags
        "reward/zero_std_frac": float(torch.tensor(n_flat / n_groups)),
        "rollout/prompts_with_signal": n_groups - n_flat,
        "rollout/zero_var_rollouts": int(flat.sum()),
        "batch/fresh": len(fresh),
        "rollout/generated": n,
        "response/len_mean": sum(len(r.completion_ids) for r in generated) / n,
        "response/truncated_frac": sum(r.truncated for r in generated) / n,
        # not in the task's answer form (verify.format_rule), whatever --reward pays for
        "rollout/format_error": sum(not r.formatted for r in generated) / n,
        "rollout/distinct_answers": answers,
        "rollout/distinct_chains": chains,
    }, rollouts=n, groups=n_groups)
    return m


# ---- the log line and rank 0's files -------------------------------------------------------------

# rollout_metrics' fields of the log line: the mean reward, the zero-variance share, the mean length
LOG = ("reward {reward/mean:.3f}", "zero-std {reward/zero_std_frac:.2f}",
       "len {response/len_mean:.1f}")


def fields(row: dict, parts) -> list[str]:
    """The log line's fields of the reduced metrics `row`: each of `parts` is a component's field,
    a format string over its keys ("loss {loss/policy:+.4f}", left out when the row lacks a key:
    a step without that part), or a function row -> [field, ...] where the keys vary."""
    out = []
    for part in parts:
        if callable(part):
            out += part(row)
            continue
        try:
            out.append(part.format_map(row))
        except KeyError:
            pass
    return out


WIDTH = 100      # the longest line of a run's own output (a single longer field aside)


def wrap(parts: list[str], sep: str = " | ", go_on: str = "") -> str:
    """`parts` joined by `sep`, going on in a new line that starts with `go_on` wherever the next
    part would take a line past WIDTH characters; a part is never split."""
    lines = [parts[0]]
    for part in parts[1:]:
        if len(lines[-1]) + len(sep) + len(part) > WIDTH:
            lines.append(go_on + part)
        else:
            lines[-1] += sep + part
    return "\n".join(lines)


def log_line(row: dict, parts=()) -> str:
    """The step's line on stdout: "step N", then the fields of `parts` (`fields`), in order; past
    WIDTH characters it goes on in a second line, under the first " | ". "" where `parts` show
    nothing (step 0 with no eval: --eval-size 0), which write_logs does not print."""
    head = f"step {row['step']:4d}"
    shown = fields(row, parts)
    return wrap([head, *shown], go_on=" " * len(head) + " | ") if shown else ""


def status(text: str, rank: int = 0, stream=None) -> None:
    """What a long step is doing now, on a terminal only: `text` on one line of stderr that the
    next status or log line overwrites ("\r", cleared to the end); nothing where stderr is not a
    terminal (a log file, a pipe, a test), and nothing on ranks other than 0."""
    stream = sys.stderr if stream is None else stream
    if rank == 0 and stream.isatty():
        stream.write(f"\r\x1b[K{text}" if text else "\r\x1b[K")
        stream.flush()


# updates: one line per optimizer step
LOG_FILES = ("metrics.jsonl", "samples.jsonl", "updates.jsonl")


def open_logs(out_dir: str, rank: int, start: int, tensorboard: bool = False):
    """(metrics.jsonl, samples.jsonl, updates.jsonl, TensorBoard writer or None) on rank 0,
    continued after step `start` on resume; Nones elsewhere. The writer (--tensorboard) writes to
    out_dir/tensorboard and drops the steps that metrics.jsonl drops: after `start` on resume, every
    earlier one in a fresh run (SummaryWriter's purge_step)."""
    if rank != 0:
        return (None,) * (len(LOG_FILES) + 1)
    os.makedirs(out_dir, exist_ok=True)
    writer = None
    if tensorboard:
        # an optional dependency (requirements-bench.txt), checked by flags.check_args
        from torch.utils.tensorboard import SummaryWriter
        purge = start + 1 if start else 0
        writer = SummaryWriter(os.path.join(out_dir, "tensorboard"), purge_step=purge)
    files = tuple(checkpoint.open_log(os.path.join(out_dir, name), start) for name in LOG_FILES)
    return (*files, writer)


def write_logs(files, row: dict, line: str, rollouts: list = (), tokenizer=None,
               updates: list = ()) -> None:
    """Print the step's `line` and write its metrics `row` to metrics.jsonl, with a few
    decoded rollouts to samples.jsonl and each optimizer step's reduced metrics to updates.jsonl
    ({"step", "update": 1.., loss/clip_frac, ratio/max, ...}: over many updates of one batch they
    change across its updates), and with --tensorboard every numeric key of the row as a scalar
    at x = row["step"]."""
    metrics_f, samples_f, updates_f, tb = files
    if metrics_f is None:                              # not rank 0 (open_logs)
        return
    status("")                                         # the step's status line, cleared
    if line:
        print(line, flush=True)
    metrics_f.write(json.dumps(row) + "\n")
    metrics_f.flush()
    # the same numbers as metrics.jsonl, a curve per key
    if tb is not None:
        for key, value in row.items():
            if key != "step" and isinstance(value, (int, float)):
                tb.add_scalar(key, value, global_step=row["step"])
        tb.flush()
    for j, u in enumerate(updates):
        updates_f.write(json.dumps({"step": row["step"], "update": j + 1, **u}) + "\n")
    updates_f.flush()
    for r in rollouts:
        sample = {"step": row["step"], "prompt": tokenizer.decode(r.prompt_ids),
                  "completion": r.text, "answer": r.answer, "correct": r.correct,
                  "reward": r.reward, "advantage": r.advantage}
        samples_f.write(json.dumps(sample) + "\n")
    samples_f.flush()


def close_logs(files, last_line: str | None = None) -> None:
    """Close rank 0's files, then print `last_line` (train.py's: the final checkpoint and the last
    eval numbers)."""
    if files[0] is None:
        return
    for f in files:
        if f is not None:                                # the TensorBoard writer is None without it
            f.close()
    if last_line:
        print(last_line)
