"""Rollouts from elsewhere: the rollout record on disk (`grpo-rollout/1`, docs/rollouts.md), read
and checked (`load`), a pool of their own that the loop draws from as it draws from the replay
buffer (`LoggedPool`), and this run's fresh rollouts saved in the same form (`Saver`).

    python train.py --steps 3 --save-rollouts --out-dir runs/a        # runs/a/rollouts.jsonl
    python train.py --rollouts-from runs/a/rollouts.jsonl --steps 3 --out-dir runs/b   # mixed
    python train.py --rollouts-from runs/a/rollouts.jsonl --prompts-per-step 0 --out-dir runs/c
    python logged.py runs/a/rollouts.jsonl [MODEL_DIR]    # a file checked, what it holds

The record: one JSON object a row (JSONL; Parquet with pyarrow), `"format": "grpo-rollout/1"`, the
token ids of prompt and completion, the behaviour log-prob of each completion token, the reward
and verdict, the group (prompt_id, version), the sampling settings, the model and a fingerprint of
the tokenizer's vocabulary (`record`). Another engine's rollouts are the same record.

How logged rollouts train (rules of this module, not of a paper):
- advantage: A_i = (r_i - mean_g r) / (std_g r + 1e-6) over its group g (the rows of one file with
  one prompt_id and version: grpo.grpo_advantages), from the file's rewards r when every row has
  one, else from the run's own verifier and reward on the row's text and answer (the first screen
  says which); set once, at load, as a fresh rollout's is.
- ratio: rho_t = pi_theta(y_t) / pi_logged(y_t): the logged log-probs are the behaviour policy,
  the ratio's denominator (a row without them is refused, never given a ratio of 1).
- draw: each step every rank draws k = --logged-per-step / world rows of its share of the groups
  (`split`), P(j) ∝ |A_j| (prioritized: a row with A = 0 is never drawn) or uniform, without
  replacement; they join the batch beside the replayed rollouts.
- gap (the row's drift from the current policy; "gap" in the code, which keeps "drift" for a
  method's name): g_j = (1/T_j) sum_t |log pi_theta(y_jt) - logged_jt| of each drawn row, by the
  trainer's forward before the update (engine.logprob_diff's measure, a row at a time); a row
  with g_j > --logged-max-gap leaves the pool unused (0 = no bound).
- uses: a row leaves the pool once used --logged-uses times. An empty pool draws nothing.
"""
import hashlib
import json
import math
import os
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

import data
import grpo
from rollout import Rollout

FORMAT = "grpo-rollout/1"
SAMPLING = ("temperature", "top_p", "max_new_tokens")     # the sampling settings of a record
LOAD_CANARY = 16                                           # rows of each file the load canary reads


@dataclass(frozen=True)
class Flags:
    # ---- logged rollouts -------------------------------------------------------------------------
    save_rollouts: bool = False
    """append every step's fresh rollouts to out_dir/rollouts.jsonl (rollouts.rank_K.jsonl a rank
    under torchrun) in the grpo-rollout/1 record (docs/rollouts.md); --resume auto first cuts it
    to the steps before the checkpoint"""
    rollouts_from: tuple = ()
    """logged rollouts to train on, FILE [FILE ...] (.jsonl; .parquet with pyarrow), in a pool of
    their own (logged.py); with --prompts-per-step 0 the run trains on them alone"""
    logged_per_step: int = 64
    """logged rows drawn into each step's batch, over all ranks"""
    logged_uses: int = 1
    """times a logged row is used before it leaves the pool"""
    logged_max_gap: float = 1.0
    """a drawn logged row leaves the pool unused when its mean |log pi_theta - logged log-prob| per
    token exceeds this (0 = no bound)"""
    logged_draw: Literal["prioritized", "uniform"] = "prioritized"
    """how logged rows are drawn: P ∝ |A| (rows with A = 0 never) or uniform"""

    AT_LEAST_1 = ("logged_uses",)
    AT_LEAST_0 = ("logged_per_step", "logged_max_gap")


# ---- the record ----------------------------------------------------------------------------------

def fingerprint(tok) -> str:
    """The tokenizer's fingerprint: sha256 of its vocabulary (token -> id, sorted), 16 hex
    digits."""
    vocab = json.dumps(sorted(tok.get_vocab().items()), ensure_ascii=False)
    return hashlib.sha256(vocab.encode("utf-8")).hexdigest()[:16]


def record(r: Rollout, meta: dict) -> dict:
    """Rollout r as a grpo-rollout/1 row; `meta`: the sampling settings, model and tokenizer."""
    return {"format": FORMAT, "prompt_id": r.prompt_id, "version": r.version,
            "prompt_ids": r.prompt_ids, "completion_ids": r.completion_ids,
            "logprobs": r.logprobs, "text": r.text, "answer": r.answer, "correct": r.correct,
            "formatted": r.formatted, "reward": r.reward, "advantage": r.advantage,
            "truncated": r.truncated, **meta}


def rollout_of(row: dict) -> Rollout:
    """The Rollout of a checked row (`problem`); its advantage as written, until a loading run
    sets it from the row's own group (`advantages`)."""
    return Rollout(prompt_id=row["prompt_id"], prompt_ids=list(row["prompt_ids"]),
                   completion_ids=list(row["completion_ids"]), logprobs=list(row["logprobs"]),
                   text=row.get("text") or "", answer=str(row.get("answer") or ""),
                   correct=float(row.get("correct") or 0.0),
                   formatted=bool(row.get("formatted", False)),
                   reward=float(row.get("reward") or 0.0),
                   advantage=float(row.get("advantage") or 0.0), version=row.get("version", 0),
                   truncated=bool(row.get("truncated", False)))


def _ints(value) -> bool:
    return isinstance(value, list) and all(isinstance(x, int) and not isinstance(x, bool)
                                           for x in value)


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def problem(row, *, vocab: int, tokenizer: str, temperature: float) -> str:
    """What is wrong with a row ('' when nothing): the checks of docs/rollouts.md."""
    if not isinstance(row, dict):
        return f"not a JSON object but {type(row).__name__}"
    if row.get("format") != FORMAT:
        return f"format {row.get('format')!r}, expected {FORMAT!r}"
    if not isinstance(row.get("prompt_id"), int) or not isinstance(row.get("version", 0), int):
        return "prompt_id and version must be integers"
    ids, logprobs = row.get("completion_ids"), row.get("logprobs")
    if not _ints(row.get("prompt_ids")) or not row["prompt_ids"] or not _ints(ids) or not ids:
        return "prompt_ids and completion_ids must be non-empty lists of integers"
    if not isinstance(logprobs, list) or not logprobs:
        return "no per-token logprobs (the behaviour policy's log-probs are required)"
    if len(logprobs) != len(ids):
        return f"{len(ids)} completion ids but {len(logprobs)} logprobs"
    bad = [x for x in logprobs if not _number(x) or x > 0]
    if bad:
        return f"a log-prob must be finite and <= 0, got {bad[0]!r}"
    outside = [t for t in row["prompt_ids"] + ids if not 0 <= t < vocab]
    if outside:
        return f"token id {outside[0]} outside this run's vocabulary (0..{vocab - 1})"
    if row.get("tokenizer") != tokenizer:
        return (f"tokenizer fingerprint {row.get('tokenizer')!r}, this run's is {tokenizer!r} "
                "(another tokenizer: its ids mean other tokens)")
    if row.get("temperature") != temperature:
        return (f"temperature {row.get('temperature')!r}, this run samples and scores at "
                f"{temperature} (--temperature): the log-probs would not compare")
    if "reward" in row and not _number(row["reward"]):
        return f"reward must be a finite number, got {row['reward']!r}"
    return ""


# ---- loading -------------------------------------------------------------------------------------

class File:
    """One loaded file: its name as given, its rollouts and each one's row number."""

    def __init__(self, name: str, rollouts: list, rows: list, rewarded: bool):
        self.name, self.rollouts, self.rows, self.rewarded = name, rollouts, rows, rewarded


def read(path: str, *, vocab: int, tokenizer: str, temperature: float) -> File:
    """The checked rollouts of one file; ValueError naming the file and row at the first bad one."""
    name = os.path.relpath(path)
    rows = data.read_records(Path(name))           # its errors name the file (and line) so
    if not rows:
        raise ValueError(f"{name}: no rows (an empty file)")
    rollouts, numbers = [], []
    for n, row in rows:
        bad = problem(row, vocab=vocab, tokenizer=tokenizer, temperature=temperature)
        if bad:
            raise ValueError(f"{name} row {n}: {bad}")
        rollouts.append(rollout_of(row))
        numbers.append(n)
    rewarded = all("reward" in row for _, row in rows)
    if not rewarded and any("answer" not in row for _, row in rows):
        n = next(n for n, row in rows if "answer" not in row)
        raise ValueError(f"{name} row {n}: no reward and no answer to grade it against")
    return File(name, rollouts, numbers, rewarded)


def groups(f: File) -> dict:
    """{(version, prompt_id): [index into f.rollouts, ...]}: the file's GRPO groups, in order."""
    out = {}
    for i, r in enumerate(f.rollouts):
        out.setdefault((r.version, r.prompt_id), []).append(i)
    return out


def advantages(f: File, score) -> None:
    """Each rollout's advantage, from its own group (grpo.grpo_advantages over the file's rewards,
    or `score(rollouts)`: the run's verifier and reward, which sets reward and advantage), chunk by
    version so that a group is one prompt_id within it. ValueError for a group of one."""
    import torch
    for (version, prompt_id), idx in groups(f).items():
        if len(idx) < 2:
            raise ValueError(f"{f.name} row {f.rows[idx[0]]}: a group of one (prompt_id "
                             f"{prompt_id}, version {version}): a GRPO advantage needs a group")
    for version in dict.fromkeys(r.version for r in f.rollouts):
        chunk = [r for r in f.rollouts if r.version == version]
        if not f.rewarded:
            score(chunk)
            continue
        rewards = torch.tensor([r.reward for r in chunk], dtype=torch.float32)      # [B]
        adv = grpo.grpo_advantages(rewards, grpo.group_ids(chunk))                  # [B]
        for r, a in zip(chunk, adv.tolist()):
            r.advantage = a


def split(rollouts: list, rank: int, world: int) -> list:
    """This rank's share: whole groups (version, prompt_id), group g of the order they first
    appear in to rank g % world, so that every row is on exactly one rank."""
    order = {}
    for r in rollouts:
        order.setdefault((r.version, r.prompt_id), len(order))
    return [r for r in rollouts if order[(r.version, r.prompt_id)] % world == rank]


def canary_rows(f: File, seed: int) -> list:
    """The rows of a file the load canary reads: LOAD_CANARY of those of its earliest version (the
    ones a run from the same weights sampled before its first update), the same on every rank."""
    first = min(r.version for r in f.rollouts)
    rows = [r for r in f.rollouts if r.version == first]
    return random.Random(seed).sample(rows, min(LOAD_CANARY, len(rows)))


# ---- the pool: the replay interface --------------------------------------------------------------

class LoggedPool:
    """Logged rollouts in a pool of their own, behind the replay interface (sample, add, stats,
    state_dict): see the module docstring. `logprobs(rows)` is the trainer's no-grad forward
    (rollout.lockstep_logprobs, every rank in step), handed in by the door."""
    # how its numbers combine over ranks (`report`): logged/share a mean over the batch (the count
    # "batch", not logged), logged/gap over the drawn rows, logged/uses over the used ones, the rest
    # totals
    COMBINE = {"logged/share": "mean batch", "batch": "weight", "logged/gap": "mean logged/drawn",
               "logged/uses": "mean logged/count",
               **dict.fromkeys(("logged/count", "logged/drawn", "logged/dropped", "logged/spent",
                                "logged/pool"), "sum")}

    def __init__(self, rollouts: list, *, k: int, uses: int, max_gap: float, prioritized: bool,
                 seed: int, logprobs):
        self.rollouts, self.k, self.max_uses = rollouts, k, uses
        self.max_gap, self.prioritized, self.logprobs = max_gap, prioritized, logprobs
        self.uses = np.zeros(len(rollouts), dtype=np.int64)     # [N] times used
        self.abs_adv = np.array([abs(r.advantage) for r in rollouts], dtype=np.float64)   # [N]
        # [N] still in the pool: a prioritized draw never draws A = 0, so those are never in it
        self.alive = self.abs_adv > 0 if prioritized else np.ones(len(rollouts), dtype=bool)
        self.seed = seed
        self._rng = np.random.default_rng(seed)
        self._last = {}

    def sample(self, step: int, n_others: int) -> list:
        """This step's logged rows for a batch of `n_others` others (fresh and replayed): k drawn,
        their gap measured, those within the bound used once (and gone after --logged-uses
        uses)."""
        cand = np.flatnonzero(self.alive)                        # [M] the rows in the pool
        k = min(self.k, len(cand))
        p = self.abs_adv[cand] / self.abs_adv[cand].sum() if self.prioritized and k else None
        drawn = self._rng.choice(cand, size=k, replace=False, p=p) if k else cand[:0]    # [k]
        rows = [self.rollouts[j] for j in drawn]
        new = self.logprobs(rows)                                # every rank, even with none
        gap = np.array([np.abs(np.array(a) - np.array(r.logprobs)).mean()
                          for a, r in zip(new, rows)])          # [k] g_j
        kept = gap <= self.max_gap if self.max_gap else np.ones(k, dtype=bool)     # [k]
        self.alive[drawn[~kept]] = False
        self.uses[drawn[kept]] += 1
        spent = drawn[kept][self.uses[drawn[kept]] >= self.max_uses]
        self.alive[spent] = False
        used = int(kept.sum())
        self._last = {"logged/count": used, "logged/drawn": k,
                      "logged/share": used / max(used + n_others, 1), "batch": used + n_others,
                      "logged/gap": float(gap.mean()) if k else 0.0,
                      "logged/uses": float(self.uses[drawn[kept]].mean()) if used else 0.0,
                      "logged/dropped": int((~kept).sum()), "logged/spent": len(spent)}
        return [rows[i] for i in np.flatnonzero(kept)]

    def add(self, rollouts: list, step: int) -> None:
        """Nothing: the pool holds the files' rows alone (fresh ones go to the replay buffer)."""

    def stats(self) -> dict:
        return {**self._last, "logged/pool": int(self.alive.sum())}

    def report(self, metrics) -> None:
        """Its numbers into a metrics.Metrics, as COMBINE says."""
        metrics.add(self.COMBINE, self.stats())

    def state_dict(self) -> dict:
        return {"uses": self.uses.tolist(), "alive": self.alive.tolist(), "seed": self.seed,
                "rng": self._rng.bit_generator.state}

    def load_state_dict(self, sd: dict) -> None:
        if len(sd["uses"]) != len(self.rollouts):
            raise ValueError(f"logged: the checkpoint's pool held {len(sd['uses'])} rows, "
                             f"--rollouts-from gives {len(self.rollouts)}")
        self.uses = np.array(sd["uses"], dtype=np.int64)
        self.alive = np.array(sd["alive"], dtype=bool)
        self._rng.bit_generator.state = sd["rng"]


# the pool's field of the log line (metrics.fields): rows used / in the pool, their mean gap
LOG = ("logged {logged/count:3d}/{logged/pool:<5d} gap {logged/gap:.3f}",)


# ---- saving --------------------------------------------------------------------------------------

def save_path(out_dir: str, rank: int, world: int) -> str:
    """rollouts.jsonl, or rollouts.rank_K.jsonl a rank under torchrun."""
    name = "rollouts.jsonl" if world == 1 else f"rollouts.rank_{rank}.jsonl"
    return os.path.join(out_dir, name)


class Saver:
    """--save-rollouts: each step's fresh rollouts appended, one record a row. The first write
    keeps only the rows of earlier steps (version < step): a fresh run starts the file anew, a
    resumed one drops the rows of steps after its checkpoint, so no row is written twice."""

    def __init__(self, path: str, meta: dict):
        self.path, self.meta, self.started = path, meta, False

    def write(self, rollouts: list, step: int) -> None:
        if not self.started:
            self._cut(step)
            self.started = True
        with open(self.path, "a") as f:
            for r in rollouts:
                f.write(json.dumps(record(r, self.meta)) + "\n")

    def _cut(self, step: int) -> None:
        kept = []
        if os.path.exists(self.path):
            with open(self.path) as f:
                kept = [line for line in f if line.strip() and json.loads(line)["version"] < step]
        with open(self.path, "w") as f:
            f.writelines(kept)


if __name__ == "__main__":
    import sys

    from transformers import AutoTokenizer
    if len(sys.argv) < 2:
        sys.exit("usage: python logged.py ROLLOUTS.jsonl [MODEL_DIR]   # checked, summarised")
    model = sys.argv[2] if len(sys.argv) > 2 else os.path.join(os.path.dirname(
        os.path.abspath(__file__)), "assets", "tiny-arith")
    tok = AutoTokenizer.from_pretrained(model)
    first = data.read_records(Path(sys.argv[1]))[:1]
    temperature = first[0][1].get("temperature") if first else 1.0
    try:
        f = read(sys.argv[1], vocab=len(tok), tokenizer=fingerprint(tok), temperature=temperature)
    except ValueError as e:
        sys.exit(f"error: {e}")
    versions = sorted({r.version for r in f.rollouts})
    print(f"{f.name}: {len(f.rollouts)} rows in {len(groups(f))} groups, versions "
          f"{versions[0]}..{versions[-1]}, rewards {'in the file' if f.rewarded else 'absent'}")
