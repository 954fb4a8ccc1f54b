"""GRPO with rollout-level, advantage-prioritized experience replay: the training loop.

    python train.py                                    # built-in tiny model + arithmetic task, CPU, a few minutes
    python train.py --model PATH --train-data gsm8k_train --max-new-tokens 512 --prompt-template plain
    python train.py --help                             # every flag, with its meaning and default
    torchrun --nproc-per-node 8 train.py --model PATH ...                  # one node, 8 GPUs (or CPU processes)
    torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint HOST:29500 --rdzv-id run1 train.py
        --model PATH --out-dir /shared/run1 ...        # the same on every node; HOST = any one of them
    python train.py --out-dir runs/x --resume auto     # after a crash: continue from the newest complete checkpoint

Each step reads top to bottom as generate -> score -> store -> sample -> update, then weight sync, eval, logging:
1. generate  `prompts_per_step` prompts x `group_size` completions from the rollout engine (behaviour log-probs kept);
2. score     each completion with verify.reward, then one advantage per rollout from its own group (grpo.py);
             set once, never recomputed when the rollout is replayed;
3. store     the fresh rollouts, one by one, in the replay buffer (buffer.py), tagged with version = this step;
4. sample    `replay_ratio` x (number of fresh) rollouts from earlier steps, drawn with P(j) ∝ |A_j|^alpha among those
             no older than `tau_max` steps (arXiv 2606.04560); every fresh rollout stays in the batch;
5. update    `epochs` passes over fresh + replayed in `mini_batches` optimizer steps each, micro-batched, with the loss
             normaliser of each optimizer step computed before its first micro-batch (grpo.loss_normaliser), so the
             gradient does not depend on the micro-batch size.
Then sync: the engine gets the new weights (`load_weights`), so the next step samples from the current policy;
eval (greedy, every `eval_every` steps); the log line (rank 0); and a checkpoint every `save_every` steps
(checkpoint.py: a Hugging Face directory plus optimizer, data position, replay buffers and RNG, written atomically;
`--resume auto` continues from the newest complete one exactly as if the run had never stopped).

Distributed (under plain `python`: world size 1, no process group, nothing sharded, same code path otherwise):
- `setup_distributed()`: torchrun's environment -> gloo on CPU, nccl on CUDA (cuda:LOCAL_RANK). Multi-node: torchrun's
  rendezvous flags (above), out_dir on a filesystem every node sees. `shard_model()`: FSDP2 (see its docstring).
- Data parallel over prompts: `prompts_per_step` is global; rank r takes every world-th prompt of the shuffled order,
  generates whole groups for it, keeps its own replay buffer and samples with its own seed.
- The loss normaliser N is all-reduced (SUM) and each rank's loss multiplied by the world size (FSDP averages
  gradients): a step equals the 1-rank step over the same global batch (tests/test_distributed.py: to 1e-5).
- Weight sync: full tensors all-gathered parameter by parameter in the same order on every rank, streamed into each
  rank's engine. Gradient clipping uses the global norm over all shards.
- A non-finite loss or gradient norm skips that optimizer step on every rank (train/skipped_steps); `max_bad_steps`
  in a row end the run with an error before anything of that state is checkpointed.

A "step" is one pass of this loop (it may hold several optimizer steps); a rollout's age is step - version.
The ratio of a replayed rollout is pi_theta / pi_behaviour with pi_behaviour its logged generation-time log-probs:
the stale policy, which is what makes replay off-policy and what clipping (eps_low, eps_high, dual-clip) guards.
With `--tis-cap C` the trainer instead recomputes old log-probs under the weights at the start of the step (the
proximal policy) and weights each token by min(pi_old / pi_behaviour, C): truncated importance sampling.
"""
import argparse
import dataclasses
import json
import math
import os
import random
import sys
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

import buffer
import checkpoint
import data
import eval as eval_lib  # the module eval.py, not the builtin
import grpo
import verify
from rollout import Prompt, Sampling, TorchEngine, collate, load_model

HERE = os.path.dirname(os.path.abspath(__file__))


@dataclass
class Args:
    model: str = os.path.join(HERE, "assets", "tiny-arith")
    """local Hugging Face model directory (the default is the built-in tiny model)"""
    train_data: str = "builtin"
    """prompt set: 'builtin' (synthetic arithmetic), a benchmark name (gsm8k_train, math500, ...) or a JSONL path"""
    prompt_template: str = "auto"
    """plain | chat | builtin; auto = builtin for the built-in task, plain otherwise"""
    out_dir: str = "runs/default"
    """where metrics.jsonl, samples.jsonl and checkpoints/ go (final -> the last checkpoint)"""
    seed: int = 0
    """seed for data order, sampling and replay"""
    steps: int = 100
    """loop steps (generate -> update cycles)"""
    prompts_per_step: int = 64
    """distinct prompts generated per step"""
    group_size: int = 8
    """completions per prompt (the GRPO group); at least 2"""
    max_new_tokens: int = 8
    """completion length limit (L_max)"""
    temperature: float = 1.0
    """sampling temperature; the trainer's log-probs use the same"""
    top_p: float = 1.0
    """nucleus sampling mass"""
    lr: float = 3e-4
    """AdamW learning rate"""
    weight_decay: float = 0.0
    """AdamW weight decay"""
    max_grad_norm: float = 1.0
    """gradient-norm clip (0 = off); the norm is global over all shards"""
    max_bad_steps: int = 3
    """optimizer steps in a row with a non-finite loss or gradient norm (each one skipped) that end the run"""
    grad_checkpointing: bool = False
    """recompute each layer's activations in backward: less memory, about a third more compute"""
    adv: str = "grpo"
    """advantage: grpo ((r - mean) / (std + 1e-6)) | drgrpo (r - mean)"""
    ratio: str = "token"
    """importance weight: token | gspo (sequence ratio) | pnpo (prefix geometric mean)"""
    pnpo_grad: str = "detached"
    """PNPO's gradient: detached (w_t = sg[w_t] pi_t / sg[pi_t], GRPO's on-policy) | full (through the prefix mean)"""
    agg: str = "token-mean"
    """loss aggregation: token-mean | seq-mean-token-mean | seq-mean-token-sum | seq-mean-token-sum-norm"""
    eps_low: float = 0.2
    """clip range below 1 (mu-GRPO's relaxed range [0, 5]: --eps-low 1 --eps-high 4)"""
    eps_high: float = 0.28
    """clip range above 1 (DAPO clip-higher: 0.28; symmetric PPO: 0.2)"""
    dual_clip: float = 0.0
    """dual-clip constant c for A < 0 (e.g. 3; 0 = off)"""
    veto_scope: str = "none"
    """mu-GRPO negative-advantage veto: none | suffix (the method) | trigger | response (ablations)"""
    veto_threshold: float = 1e-4
    """veto trigger: a token of an A < 0 response whose ratio is below this"""
    kl_coef: float = 0.0
    """KL-to-reference coefficient; the reference model is loaded only when > 0"""
    kl_estimator: str = "k3"
    """KL estimator: k1 | abs | k2 | k3"""
    tis_cap: float = 0.0
    """truncated importance sampling cap C (0 = off): recompute old log-probs, weight by min(pi_old/pi_engine, C)"""
    epochs: int = 1
    """passes over each step's batch"""
    mini_batches: int = 1
    """optimizer steps per pass (the batch is split into this many)"""
    micro_batch_size: int = 256
    """rollouts per forward/backward (memory only: does not change the gradient)"""
    dynamic_sampling: bool = False
    """DAPO dynamic sampling: drop zero-variance groups from the fresh batch"""
    dynamic_sampling_rounds: int = 0
    """with dynamic sampling: up to this many extra generation rounds to refill the batch"""
    overlong_buffer: int = 0
    """DAPO soft overlong penalty: the last L_cache tokens before max_new_tokens are penalised (0 = off)"""
    overlong_filter: bool = False
    """DAPO overlong filtering: truncated responses get no loss"""
    replay: str = "prioritized"
    """replay buffer: none | uniform (naive replay) | prioritized (P ∝ |A|^alpha)"""
    tau_max: int = 4
    """evict rollouts older than this many loop steps (age = step - version; one loop step holds epochs x
    mini_batches optimizer steps)"""
    replay_ratio: float = 0.5
    """replayed rollouts per fresh rollout in each batch"""
    priority_alpha: float = 1.0
    """priority exponent alpha in P(j) ∝ |A_j|^alpha"""
    replay_capacity: int = 0
    """maximum rollouts stored, oldest out first (0 = unbounded)"""
    eval_every: int = 20
    """evaluate every N steps and at the end (0 = only at the end)"""
    eval_size: int = 500
    """held-out built-in prompts for greedy evaluation (eval/accuracy)"""
    eval_benchmarks: str = ""
    """comma-separated benchmarks (names from data.py or files) also evaluated at each eval: eval/<bench>/mean@<k>"""
    eval_k: int = 1
    """samples per problem for --eval-benchmarks"""
    eval_temperature: float = 0.0
    """sampling temperature for --eval-benchmarks (0 = greedy)"""
    data_dir: str = data.DEFAULT_DATA_DIR
    """where named benchmarks (--train-data, --eval-benchmarks) are read from"""
    log_samples: int = 4
    """decoded rollouts written to samples.jsonl each step (rank 0's)"""
    save_every: int = 50
    """write a checkpoint every N steps and at the end (0 = only at the end)"""
    resume: str = ""
    """a checkpoint directory to continue from, or 'auto' = the newest complete one in out_dir/checkpoints"""
    threads: int = 0
    """torch CPU threads (0 = torch's default)"""


CHOICES = {"adv": tuple(grpo.ADVANTAGES), "ratio": tuple(grpo.RATIOS), "agg": grpo.AGG_MODES,
           "pnpo_grad": grpo.PNPO_GRADS,
           "veto_scope": ("none",) + grpo.VETO_SCOPES, "kl_estimator": tuple(grpo.KL_ESTIMATORS),
           "replay": buffer.REPLAY_KINDS, "prompt_template": ("auto", "plain", "chat", "builtin")}


def parse_args(argv=None) -> Args:
    return eval_lib.parse_dataclass(Args, argv, __doc__, CHOICES)


AT_LEAST_1 = ("steps", "prompts_per_step", "max_new_tokens", "micro_batch_size", "eval_size", "epochs",
              "mini_batches", "max_bad_steps", "eval_k")
AT_LEAST_0 = ("tau_max", "replay_ratio", "priority_alpha", "replay_capacity", "kl_coef", "tis_cap", "dual_clip",
              "overlong_buffer", "dynamic_sampling_rounds", "lr", "weight_decay", "max_grad_norm", "eval_every",
              "save_every", "log_samples", "threads", "eval_temperature", "seed")


def check_args(a: Args, world: int = 1) -> None:
    """Reject bad input up front with one clear sentence (a ValueError that main prints). Every float flag must be
    finite; the bounds below are what the code can run with, not a judgement of taste."""
    flag = lambda name: "--" + name.replace("_", "-")                         # noqa: E731
    for f in dataclasses.fields(a):
        v = getattr(a, f.name)
        if isinstance(v, float) and not math.isfinite(v):
            raise ValueError(f"{flag(f.name)} must be a finite number, got {v}")
    for name in AT_LEAST_1:
        if getattr(a, name) < 1:
            raise ValueError(f"{flag(name)} must be >= 1, got {getattr(a, name)}")
    for name in AT_LEAST_0:
        if getattr(a, name) < 0:
            raise ValueError(f"{flag(name)} must be >= 0, got {getattr(a, name)}")
    if a.prompts_per_step % world:
        raise ValueError(f"--prompts-per-step ({a.prompts_per_step}) must be divisible by the world size ({world}): "
                         f"every rank generates whole groups for an equal share of the prompts")
    if a.group_size < 2:
        raise ValueError(f"--group-size must be at least 2 (a GRPO group needs a baseline), got {a.group_size}")
    if a.seed >= 2 ** 31:
        raise ValueError(f"--seed must be below 2**31 (sampling seeds are derived from it), got {a.seed}")
    if a.threads > 1024:
        raise ValueError(f"--threads must be at most 1024, got {a.threads}")
    if a.temperature <= 0:
        raise ValueError("--temperature must be > 0: greedy decoding gives a group of identical completions")
    if not 0 < a.top_p <= 1:
        raise ValueError(f"--top-p must be in (0, 1], got {a.top_p}")
    if not 0 <= a.eps_low <= 1 or a.eps_high < 0:
        raise ValueError(f"need 0 <= --eps-low <= 1 and --eps-high >= 0, got {a.eps_low}, {a.eps_high}")
    if 0 < a.dual_clip <= 1:
        raise ValueError(f"--dual-clip must be > 1 (or 0 = off), got {a.dual_clip}")
    if a.mini_batches > a.prompts_per_step // world * a.group_size:
        raise ValueError(f"--mini-batches ({a.mini_batches}) exceeds the {a.prompts_per_step // world * a.group_size} "
                         f"fresh rollouts per rank and step: some optimizer steps would have no rollout")
    if a.veto_threshold <= 0:
        raise ValueError(f"--veto-threshold must be > 0 (a ratio below it triggers the veto), got {a.veto_threshold}")
    if a.overlong_buffer > a.max_new_tokens:
        raise ValueError(f"--overlong-buffer ({a.overlong_buffer}) cannot exceed --max-new-tokens ({a.max_new_tokens})")
    if not os.path.isdir(a.model):
        raise ValueError(f"--model: no such directory: {a.model}")


def check_sizes(a: Args, model, prompts: list[Prompt], world: int) -> None:
    """Bounds that need the model and the data: a prompt must not appear twice in one step (its two groups would
    share a prompt_id and be merged), the eval split must hold --eval-size prompts, and the longest prompt plus
    --max-new-tokens must fit the model's positions."""
    if a.prompts_per_step // world > len(prompts) // world:
        raise ValueError(f"--prompts-per-step ({a.prompts_per_step}) exceeds the {len(prompts)} training prompts "
                         f"(at most {len(prompts) // world * world} on {world} rank(s))")
    n_test = len(data.arithmetic_examples("test"))
    if a.eval_size > n_test:
        raise ValueError(f"--eval-size ({a.eval_size}) exceeds the {n_test} prompts of the built-in test split")
    limit = getattr(model.config, "max_position_embeddings", None)
    longest = max(len(p.ids) for p in prompts)
    if limit and longest + a.max_new_tokens > limit:
        raise ValueError(f"--max-new-tokens ({a.max_new_tokens}) plus the longest prompt ({longest} tokens) exceeds "
                         f"the model's {limit} positions")


# ---- set-up: process group, model wrapping, data ---------------------------------------------------------------

def setup_distributed() -> tuple[int, int, str]:
    """(rank, world_size, device). Under torchrun (RANK, WORLD_SIZE, LOCAL_RANK in the environment): a process group,
    nccl with one GPU per process (cuda:LOCAL_RANK) when CUDA is there, gloo on CPU otherwise. Under plain `python`:
    (0, 1, cuda or cpu) and no process group; nothing else in this file needs one at world size 1."""
    if "RANK" not in os.environ:
        return 0, 1, "cuda" if torch.cuda.is_available() else "cpu"
    rank, world, local = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ["LOCAL_RANK"])
    if torch.cuda.is_available():
        torch.cuda.set_device(local)
        dist.init_process_group("nccl", device_id=torch.device("cuda", local))
        return rank, world, f"cuda:{local}"
    dist.init_process_group("gloo")
    return rank, world, "cpu"


def print0(*args, **kw) -> None:
    if not dist.is_initialized() or dist.get_rank() == 0:
        print(*args, **kw)


def shard_model(model, device: str):
    """FSDP2 (torch.distributed.fsdp.fully_shard), by hand: each decoder layer is one group (its parameters are
    all-gathered just before its forward and its gradients reduce-scattered right after its backward), then the root
    takes what is left (embeddings, final norm, the tied head). On CUDA the gathered parameters are bf16 and gradients
    are reduced in fp32; the sharded master copy, and so AdamW, stays fp32. On CPU everything is fp32.

    Contract with the loss: FSDP *averages* gradients over ranks, while the objective sums over the whole step's
    tokens divided by N = the global normaliser (all ranks); so update() all-reduces N and multiplies each rank's
    loss by the world size. Without a process group (plain `python`) the model is returned as it is."""
    if not dist.is_initialized():
        return model
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    kind = torch.device(device).type
    mesh = init_device_mesh(kind, (dist.get_world_size(),))
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if kind == "cuda" else \
        MixedPrecisionPolicy()
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)
    return model


def full_parameters(model):
    """(name, full tensor) for every parameter, in named_parameters() order (the same on every rank, layer by
    layer), one at a time: a sharded parameter is all-gathered (DTensor.full_tensor(), a collective every rank joins
    in this order) only when the consumer asks for it, so at most one full tensor is alive beyond the model."""
    for name, p in model.named_parameters():
        with torch.no_grad():
            t = p.full_tensor() if isinstance(p, DTensor) else p.detach()
        yield name, t


def all_reduce(values: list[float], world: int, op=dist.ReduceOp.SUM) -> list[float]:
    if world == 1:
        return values
    t = torch.tensor(values, dtype=torch.float64, device="cuda" if dist.get_backend() == "nccl" else "cpu")
    dist.all_reduce(t, op=op)
    return t.tolist()


def load_prompts(a: Args, tokenizer) -> list[Prompt]:
    if a.train_data == data.BUILTIN:
        examples = data.arithmetic_examples("train")
    else:
        examples = data.load_benchmark(a.train_data, a.data_dir)
    return eval_lib.make_prompts(examples, template_for(a.train_data, a), tokenizer)


def template_for(name: str, a: Args) -> str:
    if a.prompt_template != "auto":
        return a.prompt_template
    return "builtin" if name == data.BUILTIN else "plain"


def load_eval_sets(a: Args) -> dict:
    """{name: (examples, template)}: the built-in test split (eval/accuracy) and each of --eval-benchmarks."""
    sets = {"accuracy": (data.arithmetic_examples("test", a.eval_size), "builtin")}
    for name in filter(None, (n.strip() for n in a.eval_benchmarks.split(","))):
        sets[f"{eval_lib.bench_label(name)}/mean@{a.eval_k}"] = (data.load_benchmark(name, a.data_dir),
                                                                  template_for(name, a))
    return sets


def evaluate(engine: TorchEngine, tok, a: Args, eval_sets: dict, rank: int = 0, world: int = 1) -> dict:
    """{"eval/accuracy": greedy mean@1 on the built-in test split, "eval/<bench>/mean@k": ...} through eval.py's
    `evaluate`, so `python eval.py --model <checkpoint>` with the same settings reproduces each number. Rank r grades
    every world-th problem with its own engine (same weights everywhere); the correct counts are summed."""
    out = {}
    for key, (examples, template) in eval_sets.items():
        k, temp = (1, 0.0) if key == "accuracy" else (a.eval_k, a.eval_temperature)
        mine, correct = examples[rank::world], 0.0
        if mine:
            summary, _ = eval_lib.evaluate(engine, tok, mine, template=template, k=k,
                                           sampling=Sampling(temp, a.top_p, a.max_new_tokens, seed=a.seed))
            correct = summary["mean@k"] * len(mine)
        out[f"eval/{key}"] = all_reduce([correct], world)[0] / len(examples)
    return out


# ---- one step's pieces --------------------------------------------------------------------------------------------

def score(rollouts, a: Args) -> torch.Tensor:
    """Reward from the verifier (plus DAPO's overlong penalty), then advantages within each group. Returns the
    verifier's verdicts [B] (1.0 = correct), which DAPO's dynamic sampling filters on (not the shaped reward)."""
    correct = torch.tensor([verify.reward(r.text, r.answer) for r in rollouts])                # [B]
    rewards = correct
    if a.overlong_buffer:
        lengths = torch.tensor([len(r.completion_ids) for r in rollouts])
        rewards = rewards + grpo.overlong_penalty(lengths, a.max_new_tokens, a.overlong_buffer)
    group = torch.tensor([r.prompt_id for r in rollouts])                                       # [B]
    adv = grpo.ADVANTAGES[a.adv](rewards, group)                                                # [B]
    for r, rew, A in zip(rollouts, rewards.tolist(), adv.tolist()):
        r.reward, r.advantage = rew, A
    return correct


def generate_and_score(engine, prompts, mine: list[int], pos: int, a: Args, step: int, rank: int, world: int):
    """1. generate and 2. score this rank's `prompts_per_step / world` prompts (`mine[pos:]`, wrapping around), with
    DAPO's extra rounds when dynamic sampling drops groups. Returns (fresh, every generated rollout, new pos)."""
    fresh, generated = [], []
    for round_ in range(1 + (a.dynamic_sampling_rounds if a.dynamic_sampling else 0)):
        need = a.prompts_per_step // world - len({r.prompt_id for r in fresh})
        batch_prompts = [prompts[mine[(pos + i) % len(mine)]] for i in range(need)]
        pos += need
        sampling = Sampling(a.temperature, a.top_p, a.max_new_tokens,   # own stream per (rank, step, round)
                            seed=a.seed * 1_000_003 + step * 1_009 + round_ + rank * 1_000_000_007)
        new = engine.generate(batch_prompts, a.group_size, sampling, version=step)
        correct = score(new, a)
        generated += new
        fresh += keep_informative(new, correct) if a.dynamic_sampling else new
        if len({r.prompt_id for r in fresh}) >= a.prompts_per_step // world:
            break
    return fresh, generated, pos


def keep_informative(rollouts, correct: torch.Tensor) -> list:
    """DAPO dynamic sampling: only rollouts whose group is neither all correct nor all wrong (by the verifier's
    verdicts `correct` [B], not the shaped reward: an all-correct group is not trained on its lengths alone)."""
    keep = grpo.dynamic_sampling_keep(correct, torch.tensor([r.prompt_id for r in rollouts]))
    return [r for r, k in zip(rollouts, keep.tolist()) if k]


def storable(fresh, a: Args) -> list:
    """What the replay buffer keeps of the fresh rollouts: under --overlong-filter a truncated rollout has no loss
    token, so it would only take a replay slot; it is not stored."""
    return [r for r in fresh if not r.truncated] if a.overlong_filter else fresh


def micro_batch_loss(model, ref_model, mb: dict, a: Args, normaliser: float) -> tuple[torch.Tensor, dict]:
    """The objective of one micro-batch (the recipe at the top of grpo.py), and its metrics."""
    logits = model(input_ids=mb["input_ids"], attention_mask=mb["attention_mask"]).logits[:, :-1]   # [b, T, V]
    ids = mb["input_ids"][:, 1:]                                                                     # [b, T]
    logp = grpo.token_logprobs(logits, ids, a.temperature)                                           # [b, T]
    mask, old, adv = mb["completion_mask"], mb["old_logprobs"], mb["advantages"]                     # [b, T] [b]
    behaviour = mb["engine_logprobs"]        # the policy that generated the rollout (old = it, unless --tis-cap)
    loss_mask = mask if a.veto_scope == "none" else \
        grpo.veto_mask(logp, behaviour, adv, mask, a.veto_threshold, a.veto_scope)   # veto: against the behaviour
    log_w = grpo.log_ratio(a.ratio, logp, old, mask, pnpo_grad=a.pnpo_grad)                          # [b, T]
    w_tis = grpo.tis_weight(old, behaviour, a.tis_cap) if a.tis_cap else None
    loss, m = grpo.policy_loss(log_w, adv, loss_mask, eps_low=a.eps_low, eps_high=a.eps_high,
                               dual_clip=a.dual_clip or None, agg=a.agg, normaliser=normaliser,
                               token_weight=w_tis)
    with torch.no_grad():
        m["entropy"] = grpo.masked_mean(grpo.entropy_from_logits(logits, a.temperature), mask)
        m["loss/veto_frac"] = 1 - loss_mask.sum() / mask.sum().clamp(min=1)
    if ref_model is not None:
        with torch.no_grad():
            ref_logits = ref_model(input_ids=mb["input_ids"], attention_mask=mb["attention_mask"]).logits[:, :-1]
            ref_logp = grpo.token_logprobs(ref_logits, ids, a.temperature)                           # [b, T]
        kl = grpo.kl_penalty(logp, ref_logp, a.kl_estimator)                                         # [b, T]
        loss = loss + a.kl_coef * grpo.aggregate(kl, loss_mask, a.agg, normaliser)
        m["kl"] = grpo.masked_mean(kl.detach(), mask)
    return loss, m


def collate_step(rollouts, a: Args, pad_id: int, device) -> dict:
    b = collate(rollouts, pad_id)
    b["engine_logprobs"] = b["old_logprobs"]
    if a.overlong_filter:
        truncated = torch.tensor([r.truncated for r in rollouts])
        b["completion_mask"] = grpo.overlong_filter(b["completion_mask"], truncated)
    return {k: v.to(device) for k, v in b.items()}


def padding_pass(model, pad_id: int, device, backward: bool) -> None:
    """A forward (and backward) that changes nothing, for a rank with fewer micro-batches than another: FSDP
    all-gathers parameters inside every forward and reduce-scatters gradients inside every backward, collectives that
    every rank must join equally often. Its loss is 0 * logits, so its gradient is exactly 0."""
    logits = model(input_ids=torch.full((1, 1), pad_id, device=device)).logits
    if backward:
        (logits.float().sum() * 0.0).backward()


def lockstep(n_local: int, world: int) -> int:
    """The number of forward passes every rank runs: the largest over ranks (see padding_pass)."""
    return int(all_reduce([float(n_local)], world, op=dist.ReduceOp.MAX)[0])


def global_normaliser(mask: torch.Tensor, a: Args, world: int) -> float:
    """N of the whole optimizer step over all ranks: every mode's N is a count, so the global N is the sum of the
    ranks' counts (grpo.loss_normaliser's floor of 1 is applied once, to the sum, not per rank)."""
    n = grpo.loss_normaliser(mask, a.agg, max_len=a.max_new_tokens) if mask.bool().any() else 0.0   # mask [b, T]
    return max(all_reduce([n], world)[0], 1.0)


@torch.no_grad()
def recompute_old_logprobs(model, batch, a: Args, pad_id: int, world: int = 1) -> list[list[float]]:
    """Log-probs of each rollout's completion under the weights at the start of this step (for --tis-cap)."""
    device = next(model.parameters()).device
    out = []
    for i in range(0, lockstep(-(-len(batch) // a.micro_batch_size), world) * a.micro_batch_size,
                   a.micro_batch_size):
        rs = batch[i:i + a.micro_batch_size]
        if not rs:
            padding_pass(model, pad_id, device, backward=False)
            continue
        mb = collate_step(rs, a, pad_id, device)
        logits = model(input_ids=mb["input_ids"], attention_mask=mb["attention_mask"]).logits[:, :-1]
        logp = grpo.token_logprobs(logits, mb["input_ids"][:, 1:], a.temperature)                   # [b, T]
        for b, r in enumerate(rs):
            P, T = len(r.prompt_ids), len(r.completion_ids)
            out.append(logp[b, P - 1:P - 1 + T].tolist())
    return out


class NonFiniteError(RuntimeError):
    pass


class StepGuard:
    """A non-finite loss or gradient norm never reaches the weights: that optimizer step is skipped on every rank
    (gradients dropped), logged and counted; `max_bad` skips in a row raise NonFiniteError, which ends the run
    before anything of that state is saved, so the last good checkpoint stays the newest."""

    def __init__(self, max_bad: int):
        self.max_bad, self.skipped, self.in_row = max_bad, 0, 0

    def allow(self, loss: float, grad_norm: float, world: int, step: int) -> bool:
        bad = all_reduce([float(not (math.isfinite(loss) and math.isfinite(grad_norm)))], world,
                         op=dist.ReduceOp.MAX)[0]        # one rank's inf loss is everyone's skipped step
        if not bad:
            self.in_row = 0
            return True
        self.skipped += 1
        self.in_row += 1
        print0(f"step {step + 1}: non-finite loss {loss} or gradient norm {grad_norm}: optimizer step skipped "
               f"({self.in_row} in a row, {self.skipped} in all)", flush=True)
        if self.in_row >= self.max_bad:
            raise NonFiniteError(f"{self.in_row} optimizer steps in a row had a non-finite loss or gradient norm "
                                 f"(step {step + 1}); stopping. The newest checkpoint predates them.")
        return False


def clip_gradients(model, max_norm: float) -> float:
    """Clip to max_norm (0 = no clip) by the global norm: on FSDP2's DTensor gradients clip_grad_norm_ reduces the
    per-shard norms over ranks, and returns the norm as a replicated DTensor."""
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm or float("inf"))
    return float(norm.full_tensor() if isinstance(norm, DTensor) else norm)


def mini_batch_indices(n_fresh: int, n_replayed: int, a: Args, step: int, epoch: int) -> list[list[int]]:
    """Indices into fresh + replayed for each of the `mini_batches` optimizer steps of one epoch, fresh-anchored: the
    fresh rollouts and the replayed ones are each cut into `mini_batches` near-equal parts and mini-batch j takes
    part j of both, so every optimizer step holds its proportional share of each (never pure replay). Epoch 0 keeps
    the batch's order; later epochs shuffle both parts with a seeded RNG (the same on every rank)."""
    fresh, replayed = list(range(n_fresh)), list(range(n_fresh, n_fresh + n_replayed))
    if epoch > 0:
        rng = random.Random(a.seed * 1_000_003 + step * 101 + epoch)
        rng.shuffle(fresh)
        rng.shuffle(replayed)
    M = a.mini_batches
    part = lambda xs, j: xs[len(xs) * j // M:len(xs) * (j + 1) // M]          # noqa: E731
    return [part(fresh, j) + part(replayed, j) for j in range(M)]


def update(model, ref_model, opt, fresh, replayed, a: Args, step: int, pad_id: int, world: int = 1,
           guard: StepGuard | None = None) -> dict:
    """`epochs` x `mini_batches` optimizer steps on this rank's fresh + replayed rollouts, micro-batched; returns
    this rank's metrics (reduce_metrics combines ranks). Every rank makes the same optimizer steps and the same number
    of forward/backward passes (lockstep); a mini-batch empty on every rank is no optimizer step."""
    guard = guard or StepGuard(a.max_bad_steps)
    device = next(model.parameters()).device
    batch = fresh + replayed
    old = recompute_old_logprobs(model, batch, a, pad_id, world) if a.tis_cap else None
    parts, total, norms = [], 0.0, []
    for epoch in range(a.epochs):
        for idx in mini_batch_indices(len(fresh), len(replayed), a, step, epoch):
            n_micro = lockstep(-(-len(idx) // a.micro_batch_size), world)
            if n_micro == 0:
                continue
            mask = collate_step([batch[i] for i in idx], a, pad_id, device)["completion_mask"] if idx else \
                torch.zeros(0, 1)
            normaliser = global_normaliser(mask, a, world)
            opt.zero_grad(set_to_none=True)
            loss_sum = 0.0
            for j in range(0, n_micro * a.micro_batch_size, a.micro_batch_size):
                chunk = idx[j:j + a.micro_batch_size]
                if not chunk:
                    padding_pass(model, pad_id, device, backward=True)
                    continue
                mb = collate_step([batch[i] for i in chunk], a, pad_id, device)
                if old is not None:  # proximal policy = trainer at step start; engine log-probs feed the TIS weight
                    mb["old_logprobs"] = collate([dataclasses.replace(batch[i], logprobs=old[i]) for i in chunk],
                                                 pad_id)["old_logprobs"].to(device)
                loss, m = micro_batch_loss(model, ref_model, mb, a, normaliser)
                (loss * world).backward()     # FSDP averages over ranks; N is global: the sum is the step's gradient
                parts.append(m)
                loss_sum += loss.item()
            norm = clip_gradients(model, a.max_grad_norm)
            if guard.allow(loss_sum, norm, world, step):
                opt.step()
            opt.zero_grad(set_to_none=True)
            total += loss_sum
            norms.append(norm)
    n_opt = max(len(norms), 1)
    return {**grpo.merge_metrics(parts), "loss/policy": total / n_opt,
            "loss/grad_norm": sum(norms) / n_opt, "train/skipped_steps": guard.skipped}


SUMMED = ("loss/policy", "loss/tokens", "batch/fresh", "replay/size", "replay/sampled", "replay/evicted",
          "replay/capacity_dropped", *(f"verify/{k}" for k in verify.stats()))


def reduce_metrics(m: dict, world: int) -> dict:
    """One dict for the whole step from every rank's: counts and loss/policy (each rank's share of the global loss)
    are summed, time/* and maxima maxed, ratio/min minned, the rest averaged over ranks, which is exact for the
    rollout metrics when ranks generate equal counts (every rank has prompts_per_step / world prompts) and a
    rank-mean of token-weighted means for the loss metrics."""
    if world == 1:
        return m
    parts = [None] * world
    dist.all_gather_object(parts, m)
    out = {}
    for k in dict.fromkeys(k for p in parts for k in p):          # union, in first-seen order
        v = [p[k] for p in parts if k in p]
        if k in SUMMED:
            out[k] = sum(v)
        elif k.startswith("time/") or k.endswith("_max") or k == "ratio/max":
            out[k] = max(v)
        elif k == "ratio/min":
            out[k] = min(v)
        else:
            out[k] = v[0] if all(x == v[0] for x in v) else sum(v) / len(v)
    return out


def rollout_metrics(fresh, generated) -> dict:
    rewards = torch.tensor([r.reward for r in generated])
    group = torch.tensor([r.prompt_id for r in generated])
    return {"reward/mean": rewards.mean().item(),
            "reward/zero_std_frac": grpo.zero_std_fraction(rewards, group),
            "batch/fresh": len(fresh),
            "response/len_mean": sum(len(r.completion_ids) for r in generated) / len(generated),
            "response/truncated_frac": sum(r.truncated for r in generated) / len(generated)}


def log_line(m: dict) -> str:
    s = (f"step {m['step']:4d} | reward {m['reward/mean']:.3f} | zero-std {m['reward/zero_std_frac']:.2f} "
         f"| loss {m['loss/policy']:+.4f} | clip {m.get('loss/clip_frac', 0):.3f} | replay {m['replay/sampled']:3d}/"
         f"{m['replay/size']:<5d} age {m['replay/age_mean']:.2f} | len {m['response/len_mean']:.1f} "
         f"| {m['time/step']:.2f}s")
    s += "".join(f" | {k[5:]} {v:.3f}" for k, v in m.items() if k.startswith("eval/"))
    if m.get("verify/error") or m.get("verify/worker_restarts"):   # a verifier bug would quietly zero rewards
        s += (f" | WARNING verifier: {m['verify/error']} internal errors, {m['verify/worker_restarts']} worker "
              f"restarts (see verify/* in metrics.jsonl)")
    return s


# ---- the loop --------------------------------------------------------------------------------------------------

def train(a: Args, model, tok, prompts: list[Prompt], rank: int = 0, world: int = 1, device: str = "cpu",
          resume: str | None = None, eval_sets: dict | None = None) -> dict:
    torch.manual_seed(a.seed)
    eval_sets = eval_sets or load_eval_sets(a)
    ref_model = load_model(a.model, device)[0].eval().requires_grad_(False) if a.kl_coef > 0 else None
    engine = TorchEngine(model, tok)               # a private full copy, made before sharding
    if a.grad_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model = shard_model(model, device)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=a.weight_decay)
    replay = buffer.make_replay(a.replay, a.tau_max, a.priority_alpha, a.replay_capacity or None,
                                a.seed + 7_919 * rank)
    order = list(range(len(prompts)))
    random.Random(a.seed).shuffle(order)
    mine = order[rank::world]                      # this rank's share of the prompts, in order
    pos, start, guard = 0, 0, StepGuard(a.max_bad_steps)   # pos: prompts of `mine` consumed so far
    ckpt_root = os.path.join(a.out_dir, "checkpoints")
    if resume:
        state, mine_state = checkpoint.load(resume, model, opt, rank)
        start, pos, guard.skipped, guard.in_row = state["step"], mine_state["pos"], state["skipped"], state["in_row"]
        if replay is not None:
            replay.load_state_dict(mine_state["replay"])
        checkpoint.set_rng_state(mine_state["rng"])
        print0(f"resumed from {resume} at step {start}")
        for change in checkpoint.changed_args(resume, dataclasses.asdict(a)):
            print0(f"warning: resumed with a changed flag, {change}")
    metrics_f = samples_f = None
    if rank == 0:
        os.makedirs(a.out_dir, exist_ok=True)
        metrics_f = checkpoint.open_log(os.path.join(a.out_dir, "metrics.jsonl"), start)
        samples_f = checkpoint.open_log(os.path.join(a.out_dir, "samples.jsonl"), start)
    print0(json.dumps(dataclasses.asdict(a)))
    print0(f"world size {world} | {a.prompts_per_step // world} prompts x {a.group_size} completions per rank "
           f"per step | device {device}")
    if start == 0:
        ev = evaluate(engine, tok, a, eval_sets, rank, world)
        print0("step    0 | " + " | ".join(f"{k[5:]} {v:.3f}" for k, v in ev.items()))
        if metrics_f:
            metrics_f.write(json.dumps({"step": 0, **ev}) + "\n")

    m, ckpt = {}, resume
    for step in range(start, a.steps):
        t0, verified = time.perf_counter(), verify.stats()
        fresh, generated, pos = generate_and_score(engine, prompts, mine, pos, a, step, rank, world)  # 1., 2.
        t1 = time.perf_counter()
        replayed = []
        if replay is not None:   # sample first: with a capacity bound, this step's rollouts cannot push out
            replayed = replay.sample(round(a.replay_ratio * len(fresh)), step)                  # 4. sample
            replay.add(storable(fresh, a), step)                                                # 3. store
        m = update(model, ref_model, opt, fresh, replayed, a, step, tok.pad_token_id, world, guard)  # 5. update
        engine.load_weights(full_parameters(model))                                             # weight sync
        t2 = time.perf_counter()

        m.update(rollout_metrics(fresh, generated))
        m.update(replay.stats() if replay is not None else
                 {"replay/size": 0, "replay/sampled": 0, "replay/age_mean": 0.0})
        m.update({"time/generate": t1 - t0, "time/update": t2 - t1, "time/step": t2 - t0})
        if (a.eval_every and (step + 1) % a.eval_every == 0) or step + 1 == a.steps:
            m.update(evaluate(engine, tok, a, eval_sets, rank, world))
        m.update({f"verify/{k}": v - verified[k] for k, v in verify.stats().items()})   # this step's scoring + eval
        m = {"step": step + 1, **reduce_metrics(m, world)}
        print0(log_line(m), flush=True)
        if metrics_f:
            metrics_f.write(json.dumps(m) + "\n")
            metrics_f.flush()
            for r in generated[:a.log_samples]:
                samples_f.write(json.dumps({"step": step + 1, "prompt": tok.decode(r.prompt_ids),
                                            "completion": r.text, "answer": r.answer, "reward": r.reward,
                                            "advantage": r.advantage}) + "\n")
            samples_f.flush()
        if (a.save_every and (step + 1) % a.save_every == 0) or step + 1 == a.steps:
            ckpt = checkpoint.save(ckpt_root, step + 1, model, opt, tok, dataclasses.asdict(a),
                                   {"step": step + 1, "skipped": guard.skipped, "in_row": guard.in_row},
                                   {"pos": pos, "replay": replay.state_dict() if replay is not None else None,
                                    "rng": checkpoint.rng_state()}, rank, world)
            print0(f"saved {ckpt}", flush=True)

    if metrics_f:
        metrics_f.close()
        samples_f.close()
        if ckpt:
            print(f"final -> {checkpoint.point_final(a.out_dir, ckpt)}" +
                  "".join(f" | {k[5:]} {v:.3f}" for k, v in m.items() if k.startswith("eval/")))
    return m


def main(argv=None) -> int:
    a = parse_args(argv)
    rank, world, device = setup_distributed()
    try:
        try:  # bad input ends in one line and exit status 2; a bug past this point still shows its traceback
            check_args(a, world)
            if a.threads:
                torch.set_num_threads(a.threads)
            resume = checkpoint.resolve(a.resume, a.out_dir, world)
            model, tok = load_model(resume or a.model, device)   # resuming: the checkpoint's weights
            prompts = load_prompts(a, tok)
            check_sizes(a, model, prompts, world)
            eval_sets = load_eval_sets(a)
        except (ValueError, OSError) as e:
            print0(f"error: {e}", file=sys.stderr)
            return 2
        if a.resume and not resume:
            print0(f"--resume auto: no complete checkpoint in {os.path.join(a.out_dir, 'checkpoints')}; "
                   f"starting from step 0")
        try:
            train(a, model, tok, prompts, rank, world, device, resume, eval_sets)
        except NonFiniteError as e:
            print0(f"error: {e}", file=sys.stderr)
            return 1
        return 0
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
