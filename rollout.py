"""Rollouts: the record that flows through the trainer, its collation into tensors, and the generation engine.

    python rollout.py                      # samples a few completions from the built-in tiny model

- `Rollout`: one completion of one prompt, plain Python values (DESIGN.md's table).
- `collate(rollouts, pad_id)`: the one function that turns rollouts into padded tensors, for training and eval alike.
- `TorchEngine`: generation from a private copy of the weights, batched, with a KV cache, in small functions
  (`prefill`, `decode_one_token`, `sample_token`; gpt-fast style). It records the behaviour log-prob of every sampled
  token, which is the denominator of every importance ratio in grpo.py. `load_weights(named_tensors)` refreshes the copy
  once per loop step, after the update.
- `load_model(path)`: a Hugging Face directory -> (model, tokenizer), with a clear error for a bad path.

Log-prob convention (the trainer must use the same, or ratios are biased): log softmax(logits / temperature) of the
full vocabulary, before top-p truncation (as vLLM reports by default). Greedy decoding (temperature 0) records
log softmax(logits). Shapes: B sequences, P prompt tokens, T completion tokens, L = P + T, V vocabulary.
"""
import copy
import functools
import inspect
import os
from dataclasses import dataclass

import torch


@dataclass
class Rollout:
    """One completion of one prompt. Plain Python values only (no tensors): cheap to store, pickle and replay."""
    prompt_id: int                 # rollouts with the same prompt_id and version form one GRPO group
    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]          # behaviour-policy log-prob of each completion token
    text: str = ""                 # decoded completion
    answer: str = ""               # gold answer
    reward: float = 0.0
    advantage: float = 0.0         # set once from its own fresh group; replay never recomputes it
    version: int = 0               # loop step whose weights generated it; age = step - version (loop steps)
    truncated: bool = False        # hit the max-new-tokens limit before EOS


@dataclass
class Prompt:
    prompt_id: int
    ids: list[int]
    answer: str = ""


@dataclass
class Sampling:
    temperature: float = 1.0       # 0 means greedy
    top_p: float = 1.0
    max_new_tokens: int = 16
    seed: int = 0


def collate(rollouts: list[Rollout], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded tensors for a forward pass over prompt + completion.

    Every per-token tensor is aligned with `input_ids[:, 1:]` (the token each position predicts), so T = L - 1:
    `completion_mask[b, t]` is 1 where input_ids[b, t + 1] is a completion token, `old_logprobs[b, t]` its behaviour
    log-prob. EOS, when generated, is a completion token and is in the mask (the policy chose to stop).
    """
    B = len(rollouts)
    L = max(len(r.prompt_ids) + len(r.completion_ids) for r in rollouts)
    input_ids = torch.full((B, L), pad_id, dtype=torch.long)
    attention_mask = torch.zeros(B, L, dtype=torch.long)
    completion_mask = torch.zeros(B, L - 1)
    old_logprobs = torch.zeros(B, L - 1)
    for b, r in enumerate(rollouts):   # one slice copy per sequence, not per token
        P, T = len(r.prompt_ids), len(r.completion_ids)
        input_ids[b, :P + T] = torch.tensor(r.prompt_ids + r.completion_ids)
        attention_mask[b, :P + T] = 1
        completion_mask[b, P - 1:P - 1 + T] = 1
        old_logprobs[b, P - 1:P - 1 + T] = torch.tensor(r.logprobs, dtype=torch.float)
    advantages = torch.tensor([r.advantage for r in rollouts], dtype=torch.float)  # [B]
    return dict(input_ids=input_ids, attention_mask=attention_mask, completion_mask=completion_mask,
                old_logprobs=old_logprobs, advantages=advantages)


def load_model(path: str, device: str = "cpu", dtype: torch.dtype = torch.float32):
    """(model, tokenizer) from a local Hugging Face directory. Raises FileNotFoundError / ValueError, never downloads."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    if not os.path.isdir(path):
        raise FileNotFoundError(f"model directory not found: {path}")
    if not os.path.isfile(os.path.join(path, "config.json")):
        raise ValueError(f"{path} is not a Hugging Face model directory (no config.json)")
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=dtype).to(device)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer


# ---- sampling, in small pieces ---------------------------------------------------------------------------------

def sample_token(logits: torch.Tensor, s: Sampling, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Next token and its behaviour log-prob from last-position logits [B, V] -> ([B], [B])."""
    logits = logits.float()
    if s.temperature == 0:
        tok = logits.argmax(-1)                                          # [B]
        return tok, logits.log_softmax(-1).gather(-1, tok[:, None])[:, 0]
    logp = (logits / s.temperature).log_softmax(-1)                      # [B, V]
    probs = logp.exp()
    if s.top_p < 1.0:  # nucleus: keep the smallest prefix of sorted tokens whose mass reaches top_p
        sp, idx = probs.sort(-1, descending=True)
        drop = sp.cumsum(-1) - sp >= s.top_p                             # [B, V]; the top token is never dropped
        probs = probs.scatter(-1, idx, sp.masked_fill(drop, 0.0))
    tok = torch.multinomial(probs, 1, generator=gen)[:, 0]              # [B]
    return tok, logp.gather(-1, tok[:, None])[:, 0]


@functools.lru_cache(maxsize=None)
def _cache_arg(model_class) -> str:
    """transformers >= 5.2x names the KV-cache argument `cache`, older releases (the ones vLLM pins)
    `past_key_values`: look it up once per model class, not at every decoding step."""
    return "cache" if "cache" in inspect.signature(model_class.forward).parameters else "past_key_values"


def _forward_cached(model, ids, mask, pos, cache):
    """Forward with a KV cache, last position's logits only."""
    name = _cache_arg(type(model))
    out = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, logits_to_keep=1,
                **{name: cache})
    return out.logits[:, -1], getattr(out, name)


def prefill(model, ids: torch.Tensor, mask: torch.Tensor):
    """Run left-padded prompts [B, P] through the model; returns (last logits [B, V], KV cache)."""
    from transformers import DynamicCache
    pos = (mask.cumsum(-1) - 1).clamp(min=0)                             # [B, P] positions ignore left padding
    return _forward_cached(model, ids, mask, pos, DynamicCache())


def decode_one_token(model, tok: torch.Tensor, mask: torch.Tensor, cache):
    """One step: feed tok [B] at the next position; mask [B, P+t] covers the cache plus this token."""
    pos = mask.sum(-1, keepdim=True) - 1                                 # [B, 1]
    return _forward_cached(model, tok[:, None], mask, pos, cache)


class TorchEngine:
    """Pure-PyTorch rollout engine: a private copy of the policy, batched KV-cache sampling, behaviour log-probs."""

    def __init__(self, model, tokenizer, batch_size: int = 512):
        self.model = copy.deepcopy(model).eval()
        self.model.requires_grad_(False)
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.eos_id = tokenizer.eos_token_id
        self.pad_id = tokenizer.pad_token_id
        self.device = next(self.model.parameters()).device

    @torch.no_grad()
    def load_weights(self, named_tensors) -> None:
        """Copy (name, tensor) pairs into the engine's weights in place. Every engine parameter must be covered."""
        params = dict(self.model.named_parameters())
        seen = set()
        for name, t in named_tensors:
            params[name].copy_(t)
            seen.add(name)
        missing = set(params) - seen
        if missing:  # a stale engine silently samples from old weights: fail loudly instead
            raise ValueError(f"load_weights: {len(missing)} parameters not updated, e.g. {sorted(missing)[:3]}")

    @torch.no_grad()
    def generate(self, prompts: list[Prompt], n: int, sampling: Sampling, version: int = 0) -> list[Rollout]:
        """n completions per prompt, the n of one prompt consecutive. Rewards and advantages are left unset."""
        gen = torch.Generator(device=self.device).manual_seed(sampling.seed)
        flat = [p for p in prompts for _ in range(n)]
        out = []
        for i in range(0, len(flat), self.batch_size):
            out += self._generate_batch(flat[i:i + self.batch_size], sampling, gen, version)
        return out

    def _generate_batch(self, prompts: list[Prompt], s: Sampling, gen, version: int) -> list[Rollout]:
        B, P = len(prompts), max(len(p.ids) for p in prompts)
        ids = torch.full((B, P), self.pad_id, dtype=torch.long)
        mask = torch.zeros(B, P, dtype=torch.long)
        for b, p in enumerate(prompts):                                  # left padding
            ids[b, P - len(p.ids):] = torch.tensor(p.ids)
            mask[b, P - len(p.ids):] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        logits, cache = prefill(self.model, ids, mask)
        toks, logps = [], []
        done = torch.zeros(B, dtype=torch.bool, device=self.device)
        for t in range(s.max_new_tokens):
            tok, logp = sample_token(logits, s, gen)                     # [B], [B]
            tok = tok.masked_fill(done, self.pad_id)
            toks.append(tok)
            logps.append(logp)
            done |= tok == self.eos_id
            if done.all() or t == s.max_new_tokens - 1:
                break
            mask = torch.cat([mask, torch.ones(B, 1, dtype=mask.dtype, device=self.device)], dim=1)
            logits, cache = decode_one_token(self.model, tok, mask, cache)
        toks = torch.stack(toks, 1).tolist()                             # [B, T]
        logps = torch.stack(logps, 1).tolist()
        out = []
        for b, p in enumerate(prompts):
            c = toks[b]
            T = c.index(self.eos_id) + 1 if self.eos_id in c else len(c)
            out.append(Rollout(prompt_id=p.prompt_id, prompt_ids=list(p.ids), completion_ids=c[:T],
                               logprobs=logps[b][:T], answer=p.answer, version=version,
                               text=self.tokenizer.decode(c[:T], skip_special_tokens=True),
                               truncated=self.eos_id not in c[:T]))
        return out


if __name__ == "__main__":
    import data
    model, tok = load_model(os.path.join(os.path.dirname(os.path.abspath(__file__)), "assets", "tiny-arith"))
    engine = TorchEngine(model, tok)
    exs = data.arithmetic_examples("test", 4)
    prompts = [Prompt(i, tok.encode(data.builtin_prompt(e.question)), e.answer) for i, e in enumerate(exs)]
    for r in engine.generate(prompts, n=2, sampling=Sampling(temperature=1.0, max_new_tokens=8)):
        print(f"{tok.decode(r.prompt_ids)!r:14} -> {r.text!r:8} gold {r.answer:6} logp {sum(r.logprobs):.2f}")
