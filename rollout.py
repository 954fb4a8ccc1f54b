"""Rollouts: the record that flows through the trainer, its batching into tensors and optimizer
steps, and the trainer's forward over them. (The engines that sample them: engine.py,
vllm_engine.py; how many completions each prompt gets, and how they are graded and scored:
train.py.)

- `Rollout`: one completion of one prompt, plain Python values (DESIGN.md's table).
- Batching: `collate` is the one function that turns rollouts into padded tensors;
  `optimizer_steps` turns an update's rollouts into optimizer steps, (micro-batches, N) each: the
  epoch's shuffle, the fresh-anchored mini-batches (`mini_batches`), the length-bucketed
  micro-batches (`micro_batches`), a method's batch hooks, the global normaliser, the skip of a
  step no rank has a rollout in, and the lockstep across ranks, inside.
- `forward_logprobs`: the trainer's one forward for scoring rollouts; `lockstep_logprobs`: that
  forward over many rollouts, without gradient, on every rank in step.

Log-prob convention (the trainer must use the same, or ratios are biased): log softmax(logits /
temperature) of the full vocabulary, before top-p truncation (as vLLM reports by default). Greedy
decoding (temperature 0) records log softmax(logits). Shapes: B sequences, P prompt tokens, T
completion tokens, L = P + T, V vocabulary.
"""
import functools
import inspect
import random
from dataclasses import dataclass
from typing import NamedTuple

import torch

import grpo
import parallel


@dataclass
class Rollout:
    """One completion of one prompt. Plain Python values only (no tensors): cheap to store, pickle
    and replay. Rollouts with the same prompt_id and version form one GRPO group."""
    prompt_id: int
    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]          # behaviour log-prob of each completion token (of the base head)
    text: str = ""                 # decoded completion
    answer: str = ""               # gold answer
    correct: float = 0.0           # the verifier's verdict (1.0 = right), set once, by grading
    formatted: bool = False        # in the task's answer form (verify.format_rule), set with it
    reward: float = 0.0            # the shaped reward, set once, by scoring: the advantage's input
    advantage: float = 0.0         # set once from its own fresh group; replay never recomputes it
    version: int = 0               # loop step whose weights generated it; age = step - version
    truncated: bool = False        # hit the max-new-tokens limit before EOS
    head_logprobs: list[float] | None = None   # under the logits head that sampled it, if any


@dataclass
class Sampling:
    temperature: float = 1.0       # 0 means greedy
    top_p: float = 1.0
    max_new_tokens: int = 16
    seed: int = 0
    use_head: bool = False         # sample through the engine's logits_head; eval never does


# ---- batching: rollouts -> tensors ---------------------------------------------------------------

class StepOut(NamedTuple):
    """What one loop step hands the loop (train.train_step's, and a method's step slot's)."""
    generated: list               # every rollout it generated (samples.jsonl)
    pos: int                      # the next prompt position
    metrics: object               # its numbers, this rank's (a metrics.Metrics)
    updates: list                 # each optimizer step's numbers (updates.jsonl)


def collate(rollouts: list[Rollout], pad_id: int,
            old_logprobs: list[list[float]] | None = None,
            ref_logprobs: list[list[float]] | None = None) -> dict:
    """Right-padded tensors for a forward pass over prompt + completion.

    Every per-token tensor covers only the positions a completion token can be predicted from: from
    s = (the shortest prompt) - 1 on, aligned with `input_ids[:, s + 1:]` (the token each position
    predicts), so T = L - 1 - s, and the forward computes logits there alone (forward_logprobs):
    no [B, L, V] logits over the prompts (SmolLM2's 49,152-word vocabulary: 0.2 MB a position).
    `completion_mask[b, t]` is 1 where input_ids[b, s + t + 1] is a completion token,
    `behaviour_logprobs[b, t]` its behaviour log-prob (the engine's, at generation). `old_logprobs`
    (the ratio's denominator) is the same tensor unless other per-rollout log-probs are given
    (train.py's --tis-cap: recomputed by the trainer; a logits head's step: the head's);
    `ref_logprobs`, where given, the KL reference's (`ref_logprobs[b, t]`, computed once a step).
    EOS, when generated, is a completion token and is in the mask (the policy chose to stop).
    `truncated` [B] says which rollouts hit the length limit (DAPO's overlong filter masks them:
    a method's loss).
    """
    B = len(rollouts)
    L = max(len(r.prompt_ids) + len(r.completion_ids) for r in rollouts)
    s = first_predicting(rollouts)
    input_ids = torch.full((B, L), pad_id, dtype=torch.long)
    attention_mask = torch.zeros(B, L, dtype=torch.long)
    completion_mask = torch.zeros(B, L - 1 - s)
    behaviour = torch.zeros(B, L - 1 - s)
    old = behaviour if old_logprobs is None else torch.zeros(B, L - 1 - s)
    ref = None if ref_logprobs is None else torch.zeros(B, L - 1 - s)
    for b, r in enumerate(rollouts):   # one slice copy per sequence, not per token
        P, T = len(r.prompt_ids), len(r.completion_ids)
        input_ids[b, :P + T] = torch.tensor(r.prompt_ids + r.completion_ids)
        attention_mask[b, :P + T] = 1
        t0 = P - 1 - s                 # where its completion starts in the per-token tensors
        completion_mask[b, t0:t0 + T] = 1
        behaviour[b, t0:t0 + T] = torch.tensor(r.logprobs, dtype=torch.float)
        if old_logprobs is not None:
            old[b, t0:t0 + T] = torch.tensor(old_logprobs[b], dtype=torch.float)
        if ref is not None:
            ref[b, t0:t0 + T] = torch.tensor(ref_logprobs[b], dtype=torch.float)
    advantages = torch.tensor([r.advantage for r in rollouts], dtype=torch.float)  # [B]
    truncated = torch.tensor([r.truncated for r in rollouts], dtype=torch.bool)     # [B]
    out = dict(input_ids=input_ids, attention_mask=attention_mask, completion_mask=completion_mask,
               behaviour_logprobs=behaviour, old_logprobs=old, advantages=advantages,
               truncated=truncated)
    return out if ref is None else {**out, "ref_logprobs": ref}


def first_predicting(rollouts: list[Rollout]) -> int:
    """s of `collate`: the first position any completion token of `rollouts` is predicted from (the
    shortest prompt's last token)."""
    return min(len(r.prompt_ids) for r in rollouts) - 1


def completion_slice(r: Rollout, s: int) -> slice:
    """Where rollout r's completion tokens sit in the per-token tensors of a batch collated from
    position s (first_predicting)."""
    return slice(len(r.prompt_ids) - 1 - s, len(r.prompt_ids) - 1 - s + len(r.completion_ids))


def sampling_seed(seed: int, rank: int, step: int, round_: int) -> int:
    """The training rollouts' sampling seed at (rank, step, round): a stream of its own each."""
    return seed * 1_000_003 + step * 1_009 + round_ + rank * 1_000_000_007


def shuffle_seed(seed: int, step: int, epoch: int) -> int:
    """The order of an update's rollouts in epoch > 0 of `step`: the same on every rank."""
    return seed * 1_000_003 + step * 101 + epoch


def mini_batches(n_fresh: int, n_replayed: int, parts: int,
                 seed: int | None = None) -> list[list[int]]:
    """Fresh-anchored mini-batches: indices into fresh + replayed for `parts` optimizer steps. The
    fresh rollouts and the replayed ones are each cut into `parts` near-equal pieces and mini-batch
    j takes piece j of both, so every optimizer step holds its proportional share of each (none is
    pure replay). With a seed both are shuffled first (python's random.Random(seed)); without one
    the batch order is kept."""
    fresh = list(range(n_fresh))
    replayed = list(range(n_fresh, n_fresh + n_replayed))
    if seed is not None:
        rng = random.Random(seed)
        rng.shuffle(fresh)
        rng.shuffle(replayed)

    def piece(xs: list[int], j: int) -> list[int]:
        return xs[len(xs) * j // parts:len(xs) * (j + 1) // parts]

    return [piece(fresh, j) + piece(replayed, j) for j in range(parts)]


def length_buckets(rollouts: list[Rollout], size: int, max_tokens: int = 0) -> list[list[int]]:
    """Indices of `rollouts` in chunks of at most `size` rows, sorted by length (prompt +
    completion; stable), so that a micro-batch pads to about its own rows' length (built-in
    default: 16.8% of the forward positions are padding in consecutive chunks, 7.9% sorted); with
    `max_tokens`, also at most that many padded positions (rows x longest; a longer row alone)."""
    def length(i: int) -> int:
        return len(rollouts[i].prompt_ids) + len(rollouts[i].completion_ids)

    chunks: list[list[int]] = []
    for i in sorted(range(len(rollouts)), key=length):    # ascending: i is its chunk's longest
        full = chunks and (len(chunks[-1]) == size
                           or max_tokens and (len(chunks[-1]) + 1) * length(i) > max_tokens)
        if not chunks or full:
            chunks.append([])
        chunks[-1].append(i)
    return chunks


def micro_batches(rollouts: list[Rollout], size: int, pad_id: int, device, *,
                  old_logprobs: list | None = None, max_tokens: int = 0,
                  ref_logprobs: list | None = None) -> list[dict]:
    """`rollouts` in micro-batches of at most `size` rows and `max_tokens` padded positions (0: no
    bound), in the chunks of `length_buckets`, each collated once and moved to `device`. Neither
    changes the gradient: the loss is a sum over tokens with a normaliser fixed before the first
    micro-batch (parallel.global_normaliser), so only the float summation order differs."""
    out = []
    for idx in length_buckets(rollouts, size, max_tokens):
        old = [old_logprobs[i] for i in idx] if old_logprobs else None
        ref = [ref_logprobs[i] for i in idx] if ref_logprobs else None
        batch = collate([rollouts[i] for i in idx], pad_id, old, ref)
        out.append({k: v.to(device) for k, v in batch.items()})
    return out


class Batching(NamedTuple):
    """How an update's rollouts become optimizer steps (optimizer_steps), bound once at the door."""
    epochs: int              # passes over the batch
    mini_batches: int        # optimizer steps a pass
    rows: int                # rows a micro-batch at most
    tokens: int              # padded positions a micro-batch at most (0: no bound)
    pad_id: int
    device: str
    agg: str                 # the loss aggregation, whose normaliser N is fixed first
    max_len: int             # --max-new-tokens (a constant normaliser's length)
    world: int
    seed: int                # --seed: the shuffle of every epoch after the first


def optimizer_steps(b: Batching, fresh: list[Rollout], replayed: list[Rollout], *, step: int,
                    model, old: list | None = None, ref: list | None = None, adjust: list = (),
                    prepare: list = ()):
    """Yield (micro-batches, N) per optimizer step of the update at `step`: `epochs` passes over
    fresh + replayed (the first in batch order, the others shuffled: shuffle_seed), each cut into
    `mini_batches` fresh-anchored mini-batches, each of those into length-bucketed micro-batches
    (with pi_old's log-probs `old` where the trainer recomputed them, and the KL reference's
    `ref`, each in batch order); a method's `adjust(mbs)` hooks, then N = the global normaliser
    over every rank (a step no rank has a rollout in is skipped), then its `prepare(model, mbs)`
    hooks (a step-wide pass). The micro-batches come wrapped in parallel.lockstep: iterated to the
    end, this rank makes the passes it lacks, so every rank joins FSDP's collectives alike."""
    batch = fresh + replayed
    for epoch in range(b.epochs):
        seed = shuffle_seed(b.seed, step, epoch) if epoch else None
        for idx in mini_batches(len(fresh), len(replayed), b.mini_batches, seed):
            olds = None if old is None else [old[i] for i in idx]
            refs = None if ref is None else [ref[i] for i in idx]
            mbs = micro_batches([batch[i] for i in idx], b.rows, b.pad_id, b.device,
                                old_logprobs=olds, max_tokens=b.tokens, ref_logprobs=refs)
            for hook in adjust:
                mbs = hook(mbs)
            n = parallel.global_normaliser(mbs, b.agg, b.max_len, b.world)
            if n is None:
                continue
            for hook in prepare:
                mbs = hook(model, mbs)
            yield parallel.lockstep(mbs, model, b.pad_id, b.world, backward=True), n


@functools.lru_cache(maxsize=None)
def _keeps_logits(model_class) -> bool:
    """Whether the model's forward takes `logits_to_keep` (transformers' causal LMs do: the lm_head
    then runs on the last positions only)."""
    return "logits_to_keep" in inspect.signature(model_class.forward).parameters


def completion_logits(model, batch: dict, **kwargs):
    """(the model's output, logits [B, T, V] at the positions of the batch's per-token tensors:
    the last T + 1 positions but the very last, collate's s .. L - 2). The lm_head runs only there
    when the model takes logits_to_keep; a model that does not computes all and is sliced."""
    T = batch["completion_mask"].shape[1]
    keep = {"logits_to_keep": T + 1} if _keeps_logits(type(model)) else {}
    out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], **keep,
                **kwargs)
    return out, out.logits[:, -(T + 1):-1]


def forward_logprobs(model, batch: dict, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(logits [B, T, V], log pi of each next token [B, T]) of a collated batch, aligned with its
    masks: the one forward through which the trainer (loss, TIS, drift, canary) scores rollouts.
    Logits only where a completion token is predicted (collate)."""
    _, logits = completion_logits(model, batch)
    T = logits.shape[1]
    return logits, grpo.token_logprobs(logits, batch["input_ids"][:, -T:], temperature)


@torch.no_grad()
def lockstep_logprobs(model, rollouts: list, size: int, temperature: float, pad_id: int,
                      world: int, max_tokens: int = 0) -> list:
    """Each rollout's completion log-probs under `model` (forward_logprobs), without gradient, in
    micro-batches of `size` run in lockstep with the other ranks (parallel.forward_passes): a list
    of floats per rollout, in the order of `rollouts` (micro-batches group rows by length:
    length_buckets says where each row came from)."""
    out = [None] * len(rollouts)
    device = next(model.parameters()).device
    mbs = micro_batches(rollouts, size, pad_id, device, max_tokens=max_tokens)
    buckets = length_buckets(rollouts, size, max_tokens)
    # to the end: the padding passes too
    for j, mb in enumerate(parallel.forward_passes(mbs, model, pad_id, world)):
        rows = forward_logprobs(model, mb, temperature)[1].tolist()     # [b, T]: one host copy
        s = first_predicting([rollouts[i] for i in buckets[j]])
        for b, i in enumerate(buckets[j]):
            out[i] = rows[b][completion_slice(rollouts[i], s)]
    return out
