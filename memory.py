"""What a run holds, planned at start: the sizes the flags derive on one rank (`Sizes`: the
micro-batch resolved from a memory budget), the bytes a token of a micro-batch keeps
(token_bytes), how a GPU is divided between the trainer and vLLM (plan_memory, engine_share),
the run's peak on one rank term by term (update_memory, `Memory`) and whether it fits the machine
(fits_machine). The door calls one function, after the flags are parsed and the model is
loaded (run_setup.resolve_memory), with what the flags ask of the memory (`Asked`, bound there
from the flags' owners by run_setup.memory_asked; no function here takes the flags whole):

    asked, sizes, need, warning = memory.resolve_sizes(asked, model, prompts, world=world,
                                                       device=device, value_bytes=2, frozen_bytes=2)

The numbers are estimates, each measured or counted where it is defined, and held at or above the
measured peaks of the README's runs (tests/test_gpu_ready.py, tests/test_gpu_first_try.py).
"""
import dataclasses
import os
from typing import NamedTuple

import data
import eval as eval_lib  # the module eval.py, not the builtin
import flags
import vllm_engine

AUTO_LOGITS = 2 ** 28        # --micro-batch-tokens 0: logits per micro-batch (1 GiB in fp32)
# on CUDA, where the budget is the GPU's free memory: 4 GiB of fp32 logits, half of int32's
# index range (a kernel that indexes the logits with int32 stays within it)
AUTO_LOGITS_CUDA = 2 ** 30
AUTO_ACTIVATIONS = 2 ** 31   # --micro-batch-tokens 0: a micro-batch's activations and logits
GiB = 2 ** 30


class Asked(NamedTuple):
    """What the flags ask of the memory, bound at the door (run_setup.memory_asked): the flags of
    the owners these functions read, and two facts their methods decide."""
    run: flags.RunFlags      # --prompts-per-step, --group-size, --max-new-tokens, --train-data
    optim: flags.OptimFlags  # --micro-batch-tokens and -size, --grad-checkpointing, --mini-batches
    engine: vllm_engine.Flags    # --engine, --gpu-memory-utilization
    evals: eval_lib.TrainFlags   # --eval-data, --eval-size, --dev-size
    completions: int         # a method's completions a step over all ranks (VIGOR's budget), or 0
    frozen: bool             # a frozen copy of the model is kept (--kl-coef > 0, a method's anchor)


class Sizes(NamedTuple):
    """The sizes the flags imply on one rank, computed once at start (`sizes`) and printed."""
    world: int
    prompts: int             # prompts this rank generates groups for each step
    group_size: int          # completions per prompt (fixed groups)
    completions: int         # completions this rank generates each step (0: fixed groups)
    micro_batch_tokens: int  # --micro-batch-tokens, 0 (auto) resolved

    def fields(self) -> list[str]:
        """The first screen's fields of the sizes (run_setup.setup prints them, metrics.wrap)."""
        if self.completions:
            per_step = f"{self.prompts} prompts, {self.completions} completions (a budget)"
        else:
            per_step = f"{self.prompts} prompts x {self.group_size} completions"
        return [f"world size {self.world}", f"{per_step} per rank per step",
                f"micro-batches of at most {self.micro_batch_tokens} padded tokens"]


def sizes(asked: Asked, model, world: int, bytes_per_value: int = 4,
          memory_budget: int = AUTO_ACTIVATIONS, logits: int = AUTO_LOGITS) -> Sizes:
    """The per-rank sizes of what the flags ask (`asked`) for `model` at `world` ranks
    (activations kept in `bytes_per_value`: 4 in fp32, 2 in bf16; a micro-batch's
    `memory_budget`: activation_budget; at most `logits` logits a micro-batch: AUTO_LOGITS,
    AUTO_LOGITS_CUDA on CUDA)."""
    run = asked.run
    return Sizes(world, run.prompts_per_step // world, run.group_size, asked.completions // world,
                 micro_batch_tokens(asked.optim, model, bytes_per_value, memory_budget, logits))


def token_bytes(config, bytes_per_value: int = 4, checkpointing: bool = False) -> int:
    """Bytes one padded token of a micro-batch holds from its forward to its backward, measured on
    SmolLM2-135M in fp32 on the CPU (peak resident memory of one forward and backward at 512 to
    2,048 tokens: 1.69 MB a token without logits, 98 d bytes a layer; +0.43 MB with the logits, 8.8
    V): layer_values a layer (25 d values at SmolLM2's MLP width), 4 bytes each in fp32, 2 in
    bf16; with --grad-checkpointing each layer keeps only its input (d values) and one layer is
    recomputed at a time; plus the logits, their log-softmax and gradient (12 V bytes, fp32
    whatever the forward's precision: grpo.token_logprobs)."""
    return activation_bytes(config, bytes_per_value, checkpointing) + 12 * config.vocab_size


def layer_values(config) -> int:
    """Values one decoder layer keeps of one token for its backward: the SwiGLU MLP's four tensors
    of its width ff (config.intermediate_size: the gate and up projections, the gate's SiLU, their
    product: 4 ff) and 43/3 d of the rest (the attention's inputs and outputs, the norms, the
    residual), so that SmolLM2-135M's measured 25 d holds at its ff = 8/3 d. Qwen2's MLP is
    5.3-5.8 d wide: 1.4-1.5x SmolLM2's 25 d. A config without intermediate_size: SmolLM2's
    width."""
    d = config.hidden_size
    ff = getattr(config, "intermediate_size", None) or 8 * d // 3
    return (43 * d + 12 * ff) // 3


def activation_bytes(config, bytes_per_value: int = 4, checkpointing: bool = False) -> int:
    """token_bytes without the logits: what the decoder layers keep of one token."""
    d, layers = config.hidden_size, config.num_hidden_layers
    per_layer = layer_values(config) * bytes_per_value
    return layers * d * bytes_per_value + per_layer if checkpointing else layers * per_layer


def bf16_weights(config, n_params: int, world: int) -> int:
    """Bytes of bf16 weights the backward holds beside the fp32 master (a bf16 run): in one process
    autocast's cast of every weight (2 n); under FSDP2 (`world` > 1) only what is gathered: the
    root's parameters (the embedding and an untied head, kept from the forward to the backward)
    and two decoder layers' (the one computing and the one prefetched), the rest stays sharded
    (a 7B on 8 ranks: 2.9 GiB, not 14.2)."""
    if world == 1:
        return 2 * n_params
    tied = getattr(config, "tie_word_embeddings", False)
    root = config.vocab_size * config.hidden_size * (1 if tied else 2)
    layer = max(n_params - root, 0) // config.num_hidden_layers
    return min(2 * (root + 2 * layer), 2 * n_params)


# Above a micro-batch's kept activations, measured (peak resident memory, the README's your-data
# run on the tiny model, 1.03 GiB of activations a micro-batch): its backward's gradients of them,
# and what the allocator keeps of an earlier micro-batch's (the layers' tensors are small enough,
# under glibc's 32 MiB mmap threshold, to be served from a heap that fragments; the logits' are
# not): the peak was 1.85 GiB after the first update, 2.29 after the third and 2.4 over 100 steps.
ACTIVATION_SLACK = 0.75


def peak_token_bytes(config, bytes_per_value: int = 4, checkpointing: bool = False) -> int:
    """What one padded token of a micro-batch costs at the run's peak: token_bytes plus
    ACTIVATION_SLACK of its activations."""
    return (token_bytes(config, bytes_per_value, checkpointing)
            + int(ACTIVATION_SLACK * activation_bytes(config, bytes_per_value, checkpointing)))


def micro_batch_tokens(optim: flags.OptimFlags, model, bytes_per_value: int = 4,
                       budget: int = AUTO_ACTIVATIONS, logits: int = AUTO_LOGITS) -> int:
    """--micro-batch-tokens, with 0 resolved to what fits `budget` bytes (token_bytes) and
    `logits` / the vocabulary size, whichever is fewer (SmolLM2-135M in fp32 on the CPU, 2 GiB:
    926 tokens; the built-in tiny model: 38,977, no bound in practice). The budget: AUTO_ACTIVATIONS
    on the CPU, what the GPU's memory leaves on CUDA (activation_budget)."""
    if optim.micro_batch_tokens:
        return optim.micro_batch_tokens
    c = model.config
    per_token = token_bytes(c, bytes_per_value, optim.grad_checkpointing)
    return max(min(logits // c.vocab_size, budget // per_token), 1)


def activation_budget(device: str, beside: int = 0) -> int:
    """The bytes one micro-batch may hold under --micro-batch-tokens 0: AUTO_ACTIVATIONS on the CPU
    (the same on every machine, so a run's micro-batches, and its rounding, do not depend on the
    RAM); on CUDA what is left of GPU_USABLE of the GPU's memory after `beside` bytes (the
    trainer's resident state and what vLLM keeps asleep: Memory.beside_micro_batch), over 1 +
    ACTIVATION_SLACK, so that the micro-batch and its backward fit what is left (0 when nothing
    is: fits_machine then says what to change)."""
    import torch
    if torch.device(device).type != "cuda":
        return AUTO_ACTIVATIONS
    total = torch.cuda.get_device_properties(device).total_memory
    return max(int((GPU_USABLE * total - beside) / (1 + ACTIVATION_SLACK)), 0)


GPU_USABLE = 0.9         # of a GPU's memory planned for; the rest: the CUDA context, fragmentation
VLLM_SHARE_MAX = 0.85    # --gpu-memory-utilization 0 (auto): vLLM's share at most
VLLM_ASLEEP_SHARE = 0.05  # what vLLM keeps while it sleeps (CUDA graphs' pools, NCCL and cuBLAS
#                           workspaces): an estimate until a GPU run measures it (ops/gpu_check.sh)


def engine_share(asked: float, *, total: int, trainer: int, engine_weights: int,
                 others: int = 0) -> float:
    """vLLM's share of a GPU of `total` bytes: --gpu-memory-utilization `asked`, or with 0 (auto)
    all that GPU_USABLE leaves beside the `trainer`'s bytes while the engine is awake
    (Memory.between_updates) and the `others` bytes in use on the GPU that are not this trainer's
    (gpu_memory: another process, an engine not yet closed, a second job), at most
    VLLM_SHARE_MAX (an 80 GB GPU beside a 7B's FSDP shard on 8 ranks: 0.85, ~50 GB of KV cache;
    the old fixed 0.3 left ~4 GB). vLLM refuses to start when less than its share is free, so a
    share that counts on memory another process holds would stop it. A ValueError naming the flag
    when the share cannot fit beside the trainer and the others (the engine's start or its first
    wake after an update would run out of memory), or holds no more than its own `engine_weights`
    and a fifth for the KV cache."""
    room = GPU_USABLE - (trainer + others) / total
    if not asked and room <= 0:
        held = f" and the {others / GiB:.1f} GiB other processes hold" if others else ""
        raise ValueError(f"the {trainer / GiB:.1f} GiB the trainer keeps between updates{held} "
                         f"exceed {GPU_USABLE:.0%} of this GPU's {total / GiB:.1f} GiB: no share "
                         f"is left for vLLM (--gpu-memory-utilization 0): shard the trainer over "
                         f"more GPUs (torchrun), or use --engine torch")
    share = asked or min(VLLM_SHARE_MAX, room)
    if share > room:
        held = f" and the {others / GiB:.1f} GiB other processes hold" if others else ""
        raise ValueError(f"--gpu-memory-utilization {share:.2f}: vLLM's {share * total / GiB:.1f} "
                         f"GiB, the {trainer / GiB:.1f} GiB the trainer keeps between updates"
                         f"{held} exceed {GPU_USABLE:.0%} of this GPU's {total / GiB:.1f} GiB: "
                         f"set it to at most {max(room, 0):.2f}, or 0 (auto)")
    if share * total < 1.2 * engine_weights:
        raise ValueError(f"--gpu-memory-utilization {share:.2f}: {share * total / GiB:.1f} GiB "
                         f"leaves no room for a KV cache beside the engine's "
                         f"{engine_weights / GiB:.1f} GiB of bf16 weights: raise it, shard the "
                         f"trainer over more GPUs (torchrun), or use --engine torch")
    return share


def gpu_memory(device: str) -> tuple[int, int]:
    """(total, others) bytes of the GPU `device`: its memory, and what is in use on it that this
    process's caching allocator does not hold (torch.cuda.mem_get_info's used less
    memory_reserved: other processes, this process's CUDA context)."""
    import torch
    total = torch.cuda.get_device_properties(device).total_memory
    free = torch.cuda.mem_get_info(device)[0]
    return total, max(total - free - torch.cuda.memory_reserved(device), 0)


class GpuPlan(NamedTuple):
    """How a run divides its device's memory, decided at start (plan_memory)."""
    budget: int              # bytes a micro-batch may hold (activation_budget)
    engine_share: float      # --gpu-memory-utilization, 0 (auto) resolved
    engine_asleep: int       # bytes vLLM keeps on the GPU while the trainer updates


def plan_memory(asked: Asked, model, prompts: list, *, world: int, device: str, value_bytes: int,
                frozen_bytes: int) -> GpuPlan:
    """The micro-batch's budget and vLLM's share for this run on `device`. On the CPU nothing
    changes with the machine: AUTO_ACTIVATIONS, and the share vLLM's CPU build ignores (0.3 for
    auto). On CUDA the trainer's resident state comes first (update_memory): with vLLM, its share
    is checked against it and against what other processes hold on the GPU (engine_share,
    gpu_memory) and VLLM_ASLEEP_SHARE of the GPU stays the engine's while it sleeps; the budget is
    what is left (activation_budget)."""
    import torch
    engine = asked.engine
    if torch.device(device).type != "cuda":
        return GpuPlan(AUTO_ACTIVATIONS, engine.gpu_memory_utilization or 0.3, 0)
    total, others = gpu_memory(device)
    longest = max(len(p.ids) for p in prompts)
    resident = update_memory(asked, model, longest, world, engine_copy=engine.engine == "torch",
                             bytes_per_value=value_bytes, budget=0, frozen_bytes=frozen_bytes)
    share, asleep = engine.gpu_memory_utilization or 0.3, 0
    if engine.engine == "vllm":
        n_params = sum(p.numel() for p in model.parameters())
        share = engine_share(engine.gpu_memory_utilization, total=total,
                             trainer=resident.between_updates, engine_weights=2 * n_params,
                             others=others)
        asleep = int(VLLM_ASLEEP_SHARE * total)
    beside = resident.beside_micro_batch + asleep + others
    return GpuPlan(activation_budget(device, beside), share, asleep)


class Memory(NamedTuple):
    """What a run holds at its peak on one rank, in bytes (update_memory): the parts of the
    message when it does not fit. The backward's terms (the bf16 cast, a micro-batch and its
    backward) and AdamW's step are never resident together: the peak holds the larger."""
    training: int         # the policy's weights, gradients and AdamW's two moments
    copies: int           # the engine's copy of the weights, the frozen reference / a method's
    micro_batch: int      # one micro-batch's activations and logits (token_bytes)
    runtime: int          # the interpreter, torch and transformers themselves
    slack: int = 0        # the backward's gradients and the allocator's keep (ACTIVATION_SLACK)
    cast: int = 0         # in bf16: the bf16 weights kept for the backward (bf16_weights)
    optimizer: int = 0    # AdamW's temporaries at opt.step (foreach: a value a parameter)
    engine: int = 0       # what vLLM keeps on the GPU while it sleeps (VLLM_ASLEEP_SHARE)

    @property
    def beside_micro_batch(self) -> int:
        """What the backward holds beside its micro-batch: all but micro_batch, slack, optimizer."""
        return self.training + self.copies + self.runtime + self.engine + self.cast

    @property
    def between_updates(self) -> int:
        """What the trainer keeps while the engine is awake: the weights and AdamW's moments (the
        gradients are freed after each step), the copies, the runtime."""
        return self.training * 3 // 4 + self.copies + self.runtime

    @property
    def total(self) -> int:
        return (self.training + self.copies + self.runtime + self.engine
                + max(self.cast + self.micro_batch + self.slack, self.optimizer))

    def line(self) -> str:
        gib = [f"{x / GiB:.1f}" for x in self]
        return (f"{self.total / GiB:.1f} GiB (weights, gradients and AdamW {gib[0]}, copies of the "
                f"weights {gib[1]}, the runtime {gib[3]}, vLLM asleep {gib[7]}, then the larger "
                f"of the backward's: bf16 weights {gib[5]}, one micro-batch {gib[2]} and its "
                f"backward {gib[4]}, and AdamW's step {gib[6]})")


RUNTIME_BYTES = 700 * 2 ** 20   # python, torch, transformers and a tokenizer, resident (measured)


def update_memory(asked: Asked, model, longest_prompt: int, world: int = 1, *,
                  engine_copy: bool = True, bytes_per_value: int = 4,
                  budget: int = AUTO_ACTIVATIONS, frozen_bytes: int = 4, engine_asleep: int = 0,
                  foreach: bool = True) -> Memory:
    """The run's peak memory on one rank, roughly (Memory), each term its own field:
    - training: 16 bytes a parameter, the weights, gradients and AdamW's two moments in fp32,
      sharded over `world` ranks by FSDP2;
    - copies: 4 for TorchEngine's whole copy (`engine_copy`), `frozen_bytes` for the frozen
      reference of --kl-coef or a method's anchor (`asked.frozen`; run_setup.frozen_dtype: 2 on
      CUDA, 4 on the CPU), sharded as the policy;
    - cast: in bf16 (`bytes_per_value` 2), the bf16 weights kept from the forward to the backward
      (bf16_weights: autocast's 2 a parameter in one process; under FSDP2 the root and two
      layers);
    - micro_batch and slack: one micro-batch's tokens (the fewer of --micro-batch-tokens and
      --micro-batch-size rows of the longest prompt + --max-new-tokens) at token_bytes each, and
      ACTIVATION_SLACK of their activations again (its backward, the allocator);
    - optimizer: AdamW's temporaries at opt.step: with `foreach` (torch's choice on CUDA) 4 a
      parameter of the shard, the square root of the second moment of every parameter at once;
      without (on the CPU), two of the largest parameter's, one parameter at a time;
    - engine: `engine_asleep`, what vLLM keeps while it sleeps (plan_memory: VLLM_ASLEEP_SHARE
      of the GPU);
    - runtime. Held at or above the measured peaks of the README's runs
    (tests/test_gpu_ready.py)."""
    c, optim, checkpointing = model.config, asked.optim, asked.optim.grad_checkpointing
    numels = [p.numel() for p in model.parameters()]
    n_params = sum(numels)
    rows = optim.micro_batch_size * (longest_prompt + asked.run.max_new_tokens)
    tokens = min(micro_batch_tokens(optim, model, bytes_per_value, budget), rows)
    copies = (4 * n_params * int(engine_copy)
              + frozen_bytes * n_params * int(asked.frozen) // world)
    cast = bf16_weights(c, n_params, world) if bytes_per_value == 2 else 0
    return Memory(16 * n_params // world, copies,
                  tokens * token_bytes(c, bytes_per_value, checkpointing),
                  RUNTIME_BYTES,
                  int(tokens * ACTIVATION_SLACK * activation_bytes(c, bytes_per_value,
                                                                   checkpointing)),
                  cast=cast, optimizer=(4 * n_params if foreach else 8 * max(numels)) // world,
                  engine=engine_asleep)


def machine_memory(device: str) -> tuple[int, int, str]:
    """(total, available, what) bytes of the memory a run on `device` lives in: the GPU's on CUDA
    (available: all but what other processes hold, gpu_memory), else the machine's RAM
    (/proc/meminfo's MemTotal and MemAvailable; where there is none, the physical pages, all
    counted available)."""
    import torch
    if torch.device(device).type == "cuda":
        total, others = gpu_memory(device)
        return total, total - others, "GPU memory"
    try:
        info = dict(line.split(":", 1) for line in open("/proc/meminfo"))
        total, available = (int(info[k].split()[0]) * 1024 for k in ("MemTotal", "MemAvailable"))
    except (OSError, KeyError, ValueError):
        total = available = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return total, available, "RAM"


def check_memory(need: Memory, per_token: int, *, checkpointing: bool, total: int,
                 available: int, what: str, ranks_here: int = 1) -> str | None:
    """The run against the machine, at start: a ValueError naming the flag that fixes it when
    `ranks_here` ranks of `need` exceed the `total` memory (a run that cannot fit is killed
    mid-step, or takes the machine down with it); a warning when they exceed what is `available`
    now (other processes hold the rest); else None. `per_token`: peak_token_bytes of the run;
    `checkpointing`: --grad-checkpointing is on already."""
    if ranks_here * need.total <= total:
        if ranks_here * need.total > available:
            return (f"the run may need about {ranks_here} x {need.line()}, more than the "
                    f"{available / GiB:.1f} GiB of {what} available now")
        return None
    room = (0.9 * total / ranks_here - need.beside_micro_batch) // per_token
    if room < 64 or need.beside_micro_batch + need.optimizer > 0.9 * total / ranks_here:
        fix = ("the weights and the optimizer alone do not fit: a machine with more memory, or "
               "more ranks (FSDP2 shards them)")
    else:
        fix = f"set --micro-batch-tokens {int(room)}"
        if not checkpointing:
            fix += " (or --grad-checkpointing: about a third more compute)"
    raise ValueError(f"the run needs about {ranks_here} x {need.line()}, more than this "
                     f"machine's {total / GiB:.1f} GiB of {what}: {fix}")


def fits_machine(asked: Asked, model, prompts: list, *, world: int, device: str, value_bytes: int,
                 budget: int, frozen_bytes: int = 4,
                 engine_asleep: int = 0) -> tuple[Memory, str | None]:
    """The run's memory (update_memory) against the machine's (machine_memory: RAM on the CPU,
    shared by the ranks of this node; the GPU's own on CUDA), at start: (the estimate, a warning
    when it may not fit what is free now, or None); a ValueError naming the flag that fixes it
    when it cannot fit (check_memory)."""
    import torch
    longest = max(len(p.ids) for p in prompts)
    cuda = torch.device(device).type == "cuda"
    need = update_memory(asked, model, longest, world, engine_copy=asked.engine.engine == "torch",
                         bytes_per_value=value_bytes, budget=budget, frozen_bytes=frozen_bytes,
                         engine_asleep=engine_asleep, foreach=cuda)
    ranks_here = 1 if cuda else int(os.environ.get("LOCAL_WORLD_SIZE", world))
    total, available, what = machine_memory(device)
    checkpointing = asked.optim.grad_checkpointing
    per_token = peak_token_bytes(model.config, value_bytes, checkpointing)
    return need, check_memory(need, per_token, checkpointing=checkpointing,
                              total=total, available=available, what=what,
                              ranks_here=ranks_here)


def resolve_sizes(asked: Asked, model, prompts: list, *, world: int, device: str,
                  value_bytes: int, frozen_bytes: int):
    """(`asked` with --micro-batch-tokens 0 and --gpu-memory-utilization 0 resolved, the sizes,
    the memory estimate, a warning or None): the device's memory divided (plan_memory: on CUDA the
    micro-batch's budget is what the trainer's resident state and vLLM's leave), the sizes
    checked (check_sizes) and the run against the machine (fits_machine: a ValueError when it
    cannot fit, a warning when it may not fit what is free now). `value_bytes`: what the
    activations are kept in; `frozen_bytes`: a frozen copy's (run_setup.frozen_dtype)."""
    import torch
    plan = plan_memory(asked, model, prompts, world=world, device=device,
                       value_bytes=value_bytes, frozen_bytes=frozen_bytes)
    logits = AUTO_LOGITS_CUDA if torch.device(device).type == "cuda" else AUTO_LOGITS
    found = sizes(asked, model, world, value_bytes, plan.budget, logits)
    asked = asked._replace(                                                      # 0 resolved
        optim=dataclasses.replace(asked.optim, micro_batch_tokens=found.micro_batch_tokens),
        engine=dataclasses.replace(asked.engine, gpu_memory_utilization=plan.engine_share))
    check_sizes(asked, model, prompts, found)
    need, warning = fits_machine(asked, model, prompts, world=world, device=device,
                                 value_bytes=value_bytes, budget=plan.budget,
                                 frozen_bytes=frozen_bytes, engine_asleep=plan.engine_asleep)
    return asked, found, need, warning


def check_sizes(asked: Asked, model, prompts: list, sizes: Sizes) -> None:
    """Bounds that need the sizes, the model and the data: every optimizer step must hold a fresh
    rollout, a prompt must not appear twice in one step (its two groups would share a prompt_id and
    be merged), the test and dev splits must hold --eval-size and --dev-size prompts, and the
    longest prompt plus --max-new-tokens must fit the model's positions. (Memory: fits_machine.)"""
    run, evals = asked.run, asked.evals
    world, fresh = sizes.world, sizes.prompts * sizes.group_size
    if fresh and asked.optim.mini_batches > fresh:  # offline (0 fresh): the logged rows alone
        raise ValueError(f"--mini-batches ({asked.optim.mini_batches}) exceeds the {fresh} fresh "
                         f"rollouts per rank and step: some optimizer steps would have no rollout")
    if sizes.prompts > len(prompts) // world:
        raise ValueError(f"--prompts-per-step ({run.prompts_per_step}) exceeds the {len(prompts)} "
                         f"training prompts (at most {len(prompts) // world * world} on {world} "
                         f"rank(s))")
    for name, split in (("eval_size", "test"), ("dev_size", "dev")):
        if run.train_data not in data.BUILTIN_NAMES:
            break                       # a file's held-out rows: as many as there are (eval.py)
        if name == "eval_size" and evals.eval_data != "auto":
            continue                    # another set: its first --eval-size rows
        n = len(data.builtin_split(run.train_data, split))
        if getattr(evals, name) > n:
            raise ValueError(f"{flags.flag(name)} ({getattr(evals, name)}) exceeds the {n} "
                             f"prompts of the built-in {split} split")
    limit = getattr(model.config, "max_position_embeddings", None)
    longest = max(len(p.ids) for p in prompts)
    if limit and longest + run.max_new_tokens > limit:
        raise ValueError(f"--max-new-tokens ({run.max_new_tokens}) plus the longest prompt "
                         f"({longest} tokens) exceeds the model's {limit} positions")
