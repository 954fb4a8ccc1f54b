"""Rollouts: the record that flows through the trainer, its batching into tensors, the trainer's
forward over them, the pure-PyTorch engine that samples them, and the canary that checks the
engine. (The vLLM engine, same interface: vllm_engine.py; how many completions each prompt gets,
and how they are graded and scored: train.py.)

    python rollout.py                      # samples a few completions from the built-in tiny model

- `Rollout`: one completion of one prompt, plain Python values (DESIGN.md's table).
- Batching: `collate` is the one function that turns rollouts into padded tensors; `mini_batches`
  cuts a step's batch into optimizer steps, `micro_batches` each of those into length-bucketed
  forward passes. `forward_logprobs`: the trainer's one forward for scoring rollouts;
  `lockstep_logprobs`: that forward over many rollouts, without gradient, on every rank in step.
- `TorchEngine`: generation from a private copy of the weights, batched, with a KV cache, in small
  functions (`prefill`, `decode_one_token`, `sample_token`; gpt-fast style). It records the
  behaviour log-prob of every sampled token, the denominator of every importance ratio in grpo.py.
  `load_weights(named_tensors)` refreshes the copy once per loop step, after the update; its
  `logits_head` hook adds a module's output to the logits it samples from (a method's head).
- The canary: `logprob_diff` and `check_canary`: does the engine sample from the trainer's weights?

Log-prob convention (the trainer must use the same, or ratios are biased): log softmax(logits /
temperature) of the full vocabulary, before top-p truncation (as vLLM reports by default). Greedy
decoding (temperature 0) records log softmax(logits). Shapes: B sequences, P prompt tokens, T
completion tokens, L = P + T, V vocabulary.
"""
import copy
import functools
import inspect
import os
import random
from dataclasses import dataclass

import torch

import grpo
import parallel
from data import Prompt


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

def collate(rollouts: list[Rollout], pad_id: int,
            old_logprobs: list[list[float]] | None = None) -> dict:
    """Right-padded tensors for a forward pass over prompt + completion.

    Every per-token tensor covers only the positions a completion token can be predicted from: from
    s = (the shortest prompt) - 1 on, aligned with `input_ids[:, s + 1:]` (the token each position
    predicts), so T = L - 1 - s, and the forward computes logits there alone (forward_logprobs):
    no [B, L, V] logits over the prompts (SmolLM2's 49,152-word vocabulary: 0.2 MB a position).
    `completion_mask[b, t]` is 1 where input_ids[b, s + t + 1] is a completion token,
    `behaviour_logprobs[b, t]` its behaviour log-prob (the engine's, at generation). `old_logprobs`
    (the ratio's denominator) is the same tensor unless other per-rollout log-probs are given
    (train.py's --tis-cap: recomputed by the trainer; a logits head's step: the head's).
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
    for b, r in enumerate(rollouts):   # one slice copy per sequence, not per token
        P, T = len(r.prompt_ids), len(r.completion_ids)
        input_ids[b, :P + T] = torch.tensor(r.prompt_ids + r.completion_ids)
        attention_mask[b, :P + T] = 1
        t0 = P - 1 - s                 # where its completion starts in the per-token tensors
        completion_mask[b, t0:t0 + T] = 1
        behaviour[b, t0:t0 + T] = torch.tensor(r.logprobs, dtype=torch.float)
        if old_logprobs is not None:
            old[b, t0:t0 + T] = torch.tensor(old_logprobs[b], dtype=torch.float)
    advantages = torch.tensor([r.advantage for r in rollouts], dtype=torch.float)  # [B]
    truncated = torch.tensor([r.truncated for r in rollouts], dtype=torch.bool)     # [B]
    return dict(input_ids=input_ids, attention_mask=attention_mask, completion_mask=completion_mask,
                behaviour_logprobs=behaviour, old_logprobs=old, advantages=advantages,
                truncated=truncated)


def first_predicting(rollouts: list[Rollout]) -> int:
    """s of `collate`: the first position any completion token of `rollouts` is predicted from (the
    shortest prompt's last token)."""
    return min(len(r.prompt_ids) for r in rollouts) - 1


def completion_slice(r: Rollout, s: int) -> slice:
    """Where rollout r's completion tokens sit in the per-token tensors of a batch collated from
    position s (first_predicting)."""
    return slice(len(r.prompt_ids) - 1 - s, len(r.prompt_ids) - 1 - s + len(r.completion_ids))


def mini_batches(n_fresh: int, n_replayed: int, parts: int,
                 shuffle_seed: int | None = None) -> list[list[int]]:
    """Fresh-anchored mini-batches: indices into fresh + replayed for `parts` optimizer steps. The
    fresh rollouts and the replayed ones are each cut into `parts` near-equal pieces and mini-batch
    j takes piece j of both, so every optimizer step holds its proportional share of each (none is
    pure replay). With a seed both are shuffled first (python's random.Random(seed)); without one
    the batch order is kept."""
    fresh = list(range(n_fresh))
    replayed = list(range(n_fresh, n_fresh + n_replayed))
    if shuffle_seed is not None:
        rng = random.Random(shuffle_seed)
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
                  old_logprobs: list | None = None, max_tokens: int = 0) -> list[dict]:
    """`rollouts` in micro-batches of at most `size` rows and `max_tokens` padded positions (0: no
    bound), in the chunks of `length_buckets`, each collated once and moved to `device`. Neither
    changes the gradient: the loss is a sum over tokens with a normaliser fixed before the first
    micro-batch (parallel.global_normaliser), so only the float summation order differs."""
    out = []
    for idx in length_buckets(rollouts, size, max_tokens):
        old = [old_logprobs[i] for i in idx] if old_logprobs else None
        batch = collate([rollouts[i] for i in idx], pad_id, old)
        out.append({k: v.to(device) for k, v in batch.items()})
    return out


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
        logp = forward_logprobs(model, mb, temperature)[1]                       # [b, T]
        s = first_predicting([rollouts[i] for i in buckets[j]])
        for b, i in enumerate(buckets[j]):
            out[i] = logp[b, completion_slice(rollouts[i], s)].tolist()
    return out


# ---- sampling, in small pieces -------------------------------------------------------------------

def sample_token(logits: torch.Tensor, s: Sampling,
                 gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Next token and its behaviour log-prob from last-position logits [B, V] -> ([B], [B])."""
    logits = logits.float()
    if s.temperature == 0:
        tok = logits.argmax(-1)                                          # [B]
        return tok, logits.log_softmax(-1).gather(-1, tok[:, None])[:, 0]
    logp = (logits / s.temperature).log_softmax(-1)                      # [B, V]
    probs = logp.exp()
    if s.top_p < 1.0:
        # nucleus: keep the smallest prefix of sorted tokens whose mass reaches top_p
        sp, idx = probs.sort(-1, descending=True)
        # [B, V]; never the top token
        drop = sp.cumsum(-1) - sp >= s.top_p
        probs = probs.scatter(-1, idx, sp.masked_fill(drop, 0.0))
    tok = torch.multinomial(probs, 1, generator=gen)[:, 0]              # [B]
    return tok, logp.gather(-1, tok[:, None])[:, 0]


@functools.lru_cache(maxsize=None)
def _cache_arg(model_class) -> str:
    """transformers >= 5.2x names the KV-cache argument `cache`, older releases (the ones vLLM pins)
    `past_key_values`: look it up once per model class, not at every decoding step."""
    params = inspect.signature(model_class.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def _forward_cached(model, ids, mask, pos, cache, head=None):
    """Forward with a KV cache, last position's logits only; with a logits `head`, (base logits,
    head logits) = (lm_head(h), lm_head(h) + head(h)) of the last hidden state h (transformers' last
    hidden state is the final norm's output, the lm_head's input)."""
    name = _cache_arg(type(model))
    extra = {"output_hidden_states": True} if head is not None else {}
    out = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True,
                logits_to_keep=1, **{name: cache}, **extra)
    logits = out.logits[:, -1]
    if head is not None:
        logits = (logits, logits + head(out.hidden_states[-1][:, -1]))
    return logits, getattr(out, name)


def prefill(model, ids: torch.Tensor, mask: torch.Tensor, head=None):
    """Run left-padded prompts [B, P] through the model; returns (last logits [B, V], KV cache)."""
    from transformers import DynamicCache
    # [B, P] ignore left padding
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    return _forward_cached(model, ids, mask, pos, DynamicCache(), head)


def decode_one_token(model, tok: torch.Tensor, mask: torch.Tensor, cache, head=None):
    """One step: feed tok [B] at the next position; mask [B, P+t]: the cache and this token."""
    pos = mask.sum(-1, keepdim=True) - 1                                 # [B, 1]
    return _forward_cached(model, tok[:, None], mask, pos, cache, head)


class TorchEngine:
    """Pure-PyTorch rollout engine: a private copy of the policy, batched KV-cache sampling,
    behaviour log-probs.

    `logits_head`: an optional module h -> residual logits (a method's rollout head, the trainer's
    own module, read here without gradient). A `Sampling(use_head=True)` call samples from
    lm_head(h) + logits_head(h) and keeps each token's log-prob under both: `head_logprobs` (the
    distribution sampled from) and `logprobs` (the base)."""

    def __init__(self, model, tokenizer, batch_size: int = 512):
        self.model = copy.deepcopy(model).eval()
        self.model.requires_grad_(False)
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.eos_id = tokenizer.eos_token_id
        self.pad_id = tokenizer.pad_token_id
        self.device = next(self.model.parameters()).device
        self.logits_head = None

    # VLLMEngine's interface; the copy is small next to the trainer's state
    def sleep(self, push_follows: bool = False) -> None:
        pass

    def close(self) -> None:
        pass

    @torch.no_grad()
    def load_weights(self, named_tensors) -> None:
        """Copy (name, tensor) pairs into the engine's weights in place. Every engine parameter must
        be covered."""
        params = dict(self.model.named_parameters())
        seen = set()
        for name, t in named_tensors:
            params[name].copy_(t)
            seen.add(name)
        missing = set(params) - seen
        if missing:  # a stale engine silently samples from old weights: fail loudly instead
            raise ValueError(f"load_weights: {len(missing)} parameters not updated, "
                             f"e.g. {sorted(missing)[:3]}")

    @torch.no_grad()
    def generate(self, prompts: list[Prompt], n: int, sampling: Sampling,
                 version: int = 0) -> list[Rollout]:
        """n completions per prompt, the n of one prompt consecutive. Verdicts, rewards and
        advantages are left unset. Batches of batch_size // n prompts (batch_size rows)."""
        gen = torch.Generator(device=self.device).manual_seed(sampling.seed)
        per_batch = max(1, self.batch_size // n)
        out = []
        for i in range(0, len(prompts), per_batch):
            out += self._generate_batch(prompts[i:i + per_batch], n, sampling, gen, version)
        return out

    def _left_padded(self, prompts: list[Prompt]) -> tuple[torch.Tensor, torch.Tensor]:
        P = max(len(p.ids) for p in prompts)
        ids = torch.full((len(prompts), P), self.pad_id, dtype=torch.long)
        mask = torch.zeros(len(prompts), P, dtype=torch.long)
        for b, p in enumerate(prompts):
            ids[b, P - len(p.ids):] = torch.tensor(p.ids)
            mask[b, P - len(p.ids):] = 1
        return ids.to(self.device), mask.to(self.device)

    def _generate_batch(self, unique: list[Prompt], n: int, s: Sampling, gen,
                        version: int) -> list[Rollout]:
        """The prompts' n completions each: each prompt prefilled once, its KV cache, mask and last
        logits repeated n times (row b is prompt b // n; 9x less prefill: docs/smollm2.md)."""
        prompts = [p for p in unique for _ in range(n)]
        B = len(prompts)
        ids, mask = self._left_padded(unique)
        head = self.logits_head if s.use_head else None
        if s.use_head and head is None:
            raise ValueError("Sampling.use_head needs a TorchEngine.logits_head (a method's head)")
        logits, cache = prefill(self.model, ids, mask, head)
        cache.batch_repeat_interleave(n)
        mask = mask.repeat_interleave(n, 0)                              # [B, P]
        logits = (logits.repeat_interleave(n, 0) if head is None
                  else tuple(x.repeat_interleave(n, 0) for x in logits))
        toks, logps, head_logps = [], [], []
        done = torch.zeros(B, dtype=torch.bool, device=self.device)
        for t in range(s.max_new_tokens):
            if head is None:
                tok, logp = sample_token(logits, s, gen)                 # [B], [B]
            else:
                # the head's distribution samples; each token's log-prob under both is kept
                tok, head_logp = sample_token(logits[1], s, gen)
                base_logp = (logits[0].float() / s.temperature).log_softmax(-1)
                logp = base_logp.gather(-1, tok[:, None])[:, 0]
                head_logps.append(head_logp)
            tok = tok.masked_fill(done, self.pad_id)
            toks.append(tok)
            logps.append(logp)
            done |= tok == self.eos_id
            if done.all() or t == s.max_new_tokens - 1:
                break
            mask = torch.cat([mask, torch.ones(B, 1, dtype=mask.dtype, device=self.device)], dim=1)
            logits, cache = decode_one_token(self.model, tok, mask, cache, head)
        toks = torch.stack(toks, 1).tolist()                             # [B, T]
        logps = torch.stack(logps, 1).tolist()
        head_logps = torch.stack(head_logps, 1).tolist() if head is not None else None
        out = []
        for b, p in enumerate(prompts):
            c = toks[b]
            T = c.index(self.eos_id) + 1 if self.eos_id in c else len(c)
            out.append(Rollout(prompt_id=p.prompt_id, prompt_ids=list(p.ids), completion_ids=c[:T],
                               logprobs=logps[b][:T], answer=p.answer, version=version,
                               text=self.tokenizer.decode(c[:T], skip_special_tokens=True),
                               truncated=self.eos_id not in c[:T],
                               head_logprobs=head_logps[b][:T] if head is not None else None))
        return out


# ---- the canary: does the engine sample from the trainer's weights? ------------------------------

class EngineMismatchError(RuntimeError):
    pass


def check_canary(diff: float, limit: float, step: int) -> None:
    """Raise EngineMismatchError when the engine's log-probs are further from the trainer's than
    `limit`."""
    if diff > limit:
        raise EngineMismatchError(f"step {step}: rollout/logprob_diff {diff:.3g} > "
                                  f"--max-logprob-diff {limit:g}: the engine does not sample from "
                                  f"the trainer's weights (stale or wrongly loaded)")


def _collated(model, rollouts: list[Rollout], pad_id: int) -> dict:
    device = next(model.parameters()).device
    return {k: v.to(device) for k, v in collate(rollouts, pad_id).items()}


def _token_gap(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor) -> float:
    return ((a - b).abs() * mask).sum().item() / max(mask.sum().item(), 1.0)


@torch.no_grad()
def logprob_diff(model, rollouts: list[Rollout], temperature: float, pad_id: int) -> float:
    """The canary: mean over completion tokens of |engine log-prob - trainer log-prob|, the
    trainer's from one forward of `model` through the trainer's own path (collate,
    grpo.token_logprobs). An engine that samples from stale or wrongly loaded weights shows here at
    once (fp32, same weights: about 1e-6; bf16 engine: about 1e-2). Under FSDP every rank must call
    it (the forward is a collective). 0.0 for no tokens."""
    if not rollouts:
        return 0.0
    b = _collated(model, rollouts, pad_id)
    logp = forward_logprobs(model, b, temperature or 1.0)[1]                  # greedy: log softmax
    return _token_gap(logp, b["behaviour_logprobs"], b["completion_mask"])


@torch.no_grad()
def logprob_floor(model, rollouts: list[Rollout], temperature: float, pad_id: int) -> float:
    """The canary's floor: mean over completion tokens of |bf16 log-prob - fp32 log-prob| of the
    trainer's own forward, what precision alone moves a log-prob (a bf16 engine's logprob_diff
    cannot go below it). A model wrapped by run_setup.autocast_bf16 runs its class's fp32
    forward."""
    if not rollouts:
        return 0.0
    b = _collated(model, rollouts, pad_id)
    wrapper = model.__dict__.pop("forward", None)                 # autocast_bf16's, if any
    try:
        fp32 = forward_logprobs(model, b, temperature or 1.0)[1]
        with torch.autocast(b["input_ids"].device.type, dtype=torch.bfloat16):
            bf16 = forward_logprobs(model, b, temperature or 1.0)[1]
    finally:
        if wrapper is not None:
            model.forward = wrapper
    return _token_gap(bf16, fp32, b["completion_mask"])


if __name__ == "__main__":
    import data
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging
    hf_logging.disable_progress_bar()           # no bar for loading the weights
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "assets", "tiny-arith")
    model, tok = AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)
    engine = TorchEngine(model, tok)
    exs = data.arithmetic_examples("test", 4)
    prompts = [Prompt(i, tok.encode(data.builtin_prompt(e.question)), e.answer)
               for i, e in enumerate(exs)]
    for r in engine.generate(prompts, n=2, sampling=Sampling(temperature=1.0, max_new_tokens=8)):
        print(f"{tok.decode(r.prompt_ids)!r:14} -> {r.text!r:8} gold {r.answer:6} "
              f"logp {sum(r.logprobs):.2f}")
