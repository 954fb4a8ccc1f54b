"""Metrics: one step's numbers, reduced exactly over micro-batches and ranks, the log line and rank
0's files.

    m = Metrics()
    m.mean("reward/mean", 0.25, weight=512)  # a mean of 512 items; also m.total, m.max, m.min
    row = m.reduce(world)                    # {key: weighted mean | sum | max | min} over all ranks

Each component reports its own metrics, with the weight or kind that says how they combine:
grpo.policy_loss's token means (through train.micro_batch_loss), the replay buffers
(`buffer.report`), VIGOR's allocation (`vigor.vigor_generate`), R²PO (`r2po.R2PO`), the rollouts
of the step (`rollout_metrics`, here). Nothing here knows another module's key names;
docs/metrics.md lists them all.

Files (rank 0, under --out-dir): metrics.jsonl (one JSON object per step), samples.jsonl (a few
decoded rollouts per step), updates.jsonl (one line per optimizer step), and with --tensorboard the
same numbers as TensorBoard scalars.
"""
import json
import os

import torch
import torch.distributed as dist

import checkpoint
import grpo
import verify
from parallel import print0

class Metrics:
    """One step's metrics in a form that combines exactly over micro-batches and ranks: a mean with
    its weight (the number of items it averages: tokens, rollouts, prompts), a total, or an extreme.
    `reduce(world)` gathers every rank's entries in one collective and returns {key: weighted mean |
    sum | max | min}, keys in the order rank 0 added them. A weighted mean is sum_i w_i v_i / sum_i
    w_i over the parts with w_i > 0 (0 when there are none; the value itself when there is one), so
    a mean over micro-batches or ranks is the mean over all their items."""

    def __init__(self):
        # key -> (kind, [value, ...] or [(value, weight), ...])
        self.stats = {}

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
        """Add a dict of means over n tokens (0-dim tensors or floats); keys in `extremes` ({key:
        "min" | "max" | another key}) are extremes instead, kept only where n > 0 (a mean of no
        token is NaN), or means over the count that other key of `means` holds (which is then
        only a weight, not added)."""
        extremes = extremes or {}
        weights = {kind for kind in extremes.values() if kind not in ("min", "max")}
        for key, value in means.items():
            kind = extremes.get(key)
            if key in weights:
                continue
            if kind is None:
                self.mean(key, float(value), n)
            elif kind not in ("min", "max"):
                self.mean(key, float(value), float(means[kind]))
            elif n:
                (self.min if kind == "min" else self.max)(key, float(value))

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



# ---- the step's rollouts -------------------------------------------------------------------------

def distinct_answers(rollouts: list) -> float:
    """Rollout diversity, R²PO's measure: the mean over groups of (distinct final answers) / (group
    size); an answer is verify.extract_answer's, or the whole stripped text when it states none."""
    by_prompt: dict[int, list[str]] = {}
    for r in rollouts:
        answer = verify.extract_answer(r.text) or r.text.strip()
        by_prompt.setdefault(r.prompt_id, []).append(answer)
    return sum(len(set(a)) / len(a) for a in by_prompt.values()) / max(len(by_prompt), 1)


def rollout_metrics(m: Metrics, fresh: list, generated: list) -> None:
    """What was generated this step (every round: `generated`) and what of it went into the batch
    (`fresh`): the mean (shaped) reward, the share of zero-variance groups, lengths, truncation,
    the format-error rate, diversity."""
    rewards = torch.tensor([r.reward for r in generated])
    groups = torch.tensor([r.prompt_id for r in generated])
    n = len(generated)
    n_groups = len({r.prompt_id for r in generated})
    m.mean("reward/mean", rewards.mean().item(), n)
    m.mean("reward/zero_std_frac", grpo.zero_std_fraction(rewards, groups), n_groups)
    by_group: dict[int, list[float]] = {}
    for r in generated:
        by_group.setdefault(r.prompt_id, []).append(r.reward)
    flat = [g for g in by_group.values() if len(set(g)) == 1]       # every advantage exactly 0
    m.total("rollout/prompts_with_signal", len(by_group) - len(flat))
    m.total("rollout/zero_var_rollouts", sum(len(g) for g in flat))
    m.total("batch/fresh", len(fresh))
    m.total("rollout/generated", n)
    m.mean("response/len_mean", sum(len(r.completion_ids) for r in generated) / n, n)
    m.mean("response/truncated_frac", sum(r.truncated for r in generated) / n, n)
    # not in the task's answer form (verify.format_rule), whatever --reward pays for
    m.mean("rollout/format_error", sum(not r.formatted for r in generated) / n, n)
    # diversity within groups
    m.mean("rollout/distinct_answers", distinct_answers(generated), n_groups)


# ---- the log line and rank 0's files -------------------------------------------------------------

def log_line(m: dict) -> str:
    """The step's line on stdout, from the reduced metrics; a WARNING when the verifier had internal
    errors."""
    # R²PO's head phase: the head's loss
    loss = m.get("loss/policy", m.get("r2po/head_loss", 0.0))
    s = (f"step {m['step']:4d} | reward {m['reward/mean']:.3f} "
         f"| zero-std {m['reward/zero_std_frac']:.2f} "
         f"| loss {loss:+.4f} | clip {m.get('loss/clip_frac', 0):.3f} "
         f"| replay {m['replay/sampled']:3d}/{m['replay/size']:<5d} age {m['replay/age_mean']:.2f} "
         f"| len {m['response/len_mean']:.1f} | {m['time/step']:.2f}s")
    if "r2po/phase" in m:
        s += f" | r2po {'policy' if m['r2po/phase'] else 'head'} phase"
    s += "".join(f" | {k[5:]} {v:.3f}" for k, v in m.items() if k.startswith("eval/"))
    if m.get("verify/error") or m.get("verify/worker_restarts"):
        # a verifier bug would quietly zero rewards: say so on the line
        s += (f" | WARNING verifier: {m['verify/error']} internal errors, "
              f"{m['verify/worker_restarts']} worker restarts (see verify/* in metrics.jsonl)")
    return s


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


def write_logs(files, row: dict, rollouts: list = (), tokenizer=None, updates: list = ()) -> None:
    """Print the step's line (rank 0) and write it to metrics.jsonl, with a few decoded rollouts to
    samples.jsonl and each optimizer step's reduced metrics to updates.jsonl ({"step", "update":
    1.., loss/clip_frac, loss/veto_frac, ...}: in a mu-GRPO stage they change across its updates),
    and with --tensorboard every numeric key of the row as a scalar at x = row["step"]. Step 0 (the
    evaluation before training) prints its eval/* numbers only."""
    if row["step"] == 0:
        evals = [f"{k[5:]} {v:.3f}" for k, v in row.items() if k != "step"]
        print0("step    0 | " + " | ".join(evals))
    else:
        print0(log_line(row), flush=True)
    metrics_f, samples_f, updates_f, tb = files
    if metrics_f is None:
        return
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


def close_logs(files, row: dict, final: str | None) -> None:
    """Close rank 0's files; name the final checkpoint (out_dir/final) and the last eval numbers."""
    if files[0] is None:
        return
    for f in files:
        if f is not None:                                # the TensorBoard writer is None without it
            f.close()
    if final:
        evals = "".join(f" | {k[5:]} {v:.3f}" for k, v in row.items() if k.startswith("eval/"))
        print(f"final -> {final}{evals}")
