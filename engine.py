"""The pure-PyTorch engine that samples rollouts, and the canary that checks an engine against the
trainer. (The vLLM engine, same interface: vllm_engine.py; the record, its batching and the
trainer's forward: rollout.py.)

    python engine.py                       # samples a few completions from the built-in tiny model

- `TorchEngine`: generation from a private copy of the weights, batched, with a KV cache, in small
  functions (`prefill`, `decode_one_token`, `sample_token`; gpt-fast style). It records the
  behaviour log-prob of every sampled token, the denominator of every importance ratio in grpo.py.
  `load_weights(named_tensors)` refreshes the copy once per loop step, after the update; its
  `logits_head` hook adds a module's output to the logits it samples from (a method's head).
- An engine owns its concerns: `sleep` before the update (a no-op here; vLLM frees its memory) and
  wake at `load_weights`; `serves_as_old(precision)` says whether its log-probs can be the ratio's
  pi_old for a trainer computing at `precision` (only where both compute in fp32: the same weights
  then agree to about 1e-6; in bf16 a KV-cache decode and a full forward round differently).
- The canary (`canary`, `logprob_diff`, `check_canary`): does the engine sample from the trainer's
  weights?

Log-prob convention (the trainer must use the same, or ratios are biased): log softmax(logits /
temperature) of the full vocabulary, before top-p truncation (as vLLM reports by default). Greedy
decoding (temperature 0) records log softmax(logits). Shapes: B sequences, P prompt tokens, T
completion tokens, L = P + T, V vocabulary.
"""
import copy
import functools
import inspect
import os

import torch

import parallel
from data import Prompt
from rollout import Rollout, Sampling, collate, forward_logprobs


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
        self.autocast = False          # run_setup.build: the copy samples under bf16 autocast

    # VLLMEngine's interface; the copy is small next to the trainer's state
    def sleep(self, push_follows: bool = False) -> None:
        pass

    def serves_as_old(self, precision: str) -> bool:
        """Whether this engine's log-probs can be pi_old for a trainer whose forward computes at
        `precision`: where both are fp32 (about 1e-6 apart). Under bf16 a KV-cache decode and the
        trainer's full forward round differently (about 1e-2: a sequence ratio clipped at a few
        1e-4 fires on most rollouts), whichever of them autocasts."""
        return precision == "fp32" and not self.autocast

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


CANARY_ROLLOUTS = 16      # the canary scores the first 16 of the step's generated rollouts
# how the canary's numbers combine over ranks (metrics.Metrics.add): each rank's, equally weighted
COMBINE = {"rollout/logprob_diff": "mean", "rollout/logprob_floor": "mean"}


def canary(model, generated: list[Rollout], temperature: float, pad_id: int, precision: str, *,
           max_tokens: int = 0, world: int = 1) -> dict:
    """{rollout/logprob_diff: the canary on the first CANARY_ROLLOUTS of the step's rollouts, and
    under bf16 autocast rollout/logprob_floor: what precision alone moves (logprob_floor)}, each in
    forward passes of at most `max_tokens` padded positions (the update's micro-batch budget: the
    canary's peak is then one micro-batch's), in lockstep over `world` ranks; then the no-grad
    forward's gathered parameters resharded. The loop runs it while the engine sleeps, so its
    forward does not meet vLLM's memory."""
    rollouts = generated[:CANARY_ROLLOUTS]
    passes = _passes(model, rollouts, pad_id, max_tokens)           # collated once, for both
    out = {"rollout/logprob_diff": _diff(model, passes, temperature, pad_id, world)}
    if precision == "autocast-bf16":
        out["rollout/logprob_floor"] = _floor(model, passes, temperature, pad_id, world)
    parallel.reshard(model)
    return out


def _passes(model, rollouts: list[Rollout], pad_id: int, max_tokens: int) -> list[dict]:
    """`rollouts` collated in consecutive chunks of at most max_tokens padded positions (rows x
    longest; 0: one chunk), each on the model's device."""
    device = next(model.parameters()).device
    chunks: list[list[Rollout]] = []
    for r in rollouts:
        rows = chunks[-1] + [r] if chunks else [r]
        longest = max(len(x.prompt_ids) + len(x.completion_ids) for x in rows)
        if not chunks or (max_tokens and len(rows) * longest > max_tokens):
            chunks.append([r])
        else:
            chunks[-1].append(r)
    return [{k: v.to(device) for k, v in collate(c, pad_id).items()} for c in chunks]


def _mean_gap(gaps: list[tuple[torch.Tensor, torch.Tensor]]) -> float:
    """The mean over every chunk's valid tokens of |a - b|, from each chunk's (sum, count)."""
    total = sum(g.item() for g, _ in gaps)
    return total / max(sum(n.item() for _, n in gaps), 1.0)


def _gap(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return ((a - b).abs() * mask).sum(), mask.sum()


@torch.no_grad()
def logprob_diff(model, rollouts: list[Rollout], temperature: float, pad_id: int, *,
                 max_tokens: int = 0, world: int = 1) -> float:
    """The canary: mean over completion tokens of |engine log-prob - trainer log-prob|, the
    trainer's from `model`'s forward through the trainer's own path (collate,
    grpo.token_logprobs), in passes of at most max_tokens positions (_passes). An engine that
    samples from stale or wrongly loaded weights shows here at once (fp32, same weights: about
    1e-6; bf16 engine: about 1e-2). Under FSDP every rank calls it (its passes run in lockstep).
    0.0 for no tokens."""
    return _diff(model, _passes(model, rollouts, pad_id, max_tokens), temperature, pad_id, world)


@torch.no_grad()
def _diff(model, passes: list[dict], temperature: float, pad_id: int, world: int) -> float:
    """logprob_diff on collated passes (_passes); 0.0 for none."""
    if not passes:
        return 0.0
    gaps = []
    for b in parallel.forward_passes(passes, model, pad_id, world):
        logp = forward_logprobs(model, b, temperature or 1.0)[1]              # greedy: log softmax
        gaps.append(_gap(logp, b["behaviour_logprobs"], b["completion_mask"]))
    return _mean_gap(gaps)


@torch.no_grad()
def logprob_floor(model, rollouts: list[Rollout], temperature: float, pad_id: int, *,
                  max_tokens: int = 0, world: int = 1) -> float:
    """The canary's floor: mean over completion tokens of |bf16 log-prob - fp32 log-prob| of the
    trainer's own forward, what precision alone moves a log-prob (a bf16 engine's logprob_diff
    cannot go below it), in passes as logprob_diff's. A model wrapped by run_setup.autocast_bf16
    runs its class's fp32 forward."""
    return _floor(model, _passes(model, rollouts, pad_id, max_tokens), temperature, pad_id, world)


@torch.no_grad()
def _floor(model, passes: list[dict], temperature: float, pad_id: int, world: int) -> float:
    """logprob_floor on collated passes (_passes); 0.0 for none."""
    if not passes:
        return 0.0
    wrapper = model.__dict__.pop("forward", None)                 # autocast_bf16's, if any
    device = passes[0]["input_ids"].device.type
    try:                                    # a sweep each: every rank's passes pair up
        fp32 = [forward_logprobs(model, b, temperature or 1.0)[1]
                for b in parallel.forward_passes(passes, model, pad_id, world)]
        with torch.autocast(device, dtype=torch.bfloat16):
            bf16 = [forward_logprobs(model, b, temperature or 1.0)[1]
                    for b in parallel.forward_passes(passes, model, pad_id, world)]
    finally:
        if wrapper is not None:
            model.forward = wrapper
    return _mean_gap([_gap(h, f, b["completion_mask"]) for h, f, b in zip(bf16, fp32, passes)])


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
