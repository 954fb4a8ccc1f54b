"""GRPO with rollout-level, advantage-prioritized experience replay: the training loop.

    python train.py                                    # built-in tiny model + arithmetic task, CPU, a few minutes
    python train.py --model PATH --train-data gsm8k_train --max-new-tokens 512
    python train.py --help

Each step reads top to bottom as generate -> score -> store -> sample -> update, then weight sync, eval and logging:

1. generate  `prompts_per_step` prompts x `group_size` completions from the rollout engine (behaviour log-probs kept);
2. score     each completion with verify.reward, then a GRPO advantage per group (grpo.py), set once, never redone;
3. store     the fresh rollouts, one by one, in the replay buffer (buffer.py), tagged with this step's version;
4. sample    `replay_ratio` x (number of fresh) rollouts from earlier steps, drawn with P(j) ∝ |A_j|^alpha among those
             no older than `tau_max` steps (arXiv 2606.04560);
5. update    one optimizer step on fresh + replayed, micro-batched, with the loss normaliser computed over the whole
             step's batch, so the gradient does not depend on the micro-batch size.
Then the engine gets the new weights (`load_weights`), so the next step samples from the current policy.

The importance ratio of a replayed rollout is pi_theta / pi_behaviour with pi_behaviour its logged generation-time
log-probs: the stale policy, which is what makes replay off-policy and what clipping guards (eps_low, eps_high).
"""
import dataclasses
import json
import os
import random
import sys
import time
from dataclasses import dataclass, field

import torch

import buffer
import data
import eval as eval_lib  # the module eval.py, not the builtin
import grpo
import verify
from rollout import Prompt, Sampling, TorchEngine, collate, load_model

HERE = os.path.dirname(os.path.abspath(__file__))


def flag(default, help):
    return field(default=default, metadata={"help": help})


@dataclass
class Args:
    model: str = flag(os.path.join(HERE, "assets", "tiny-arith"), "local Hugging Face model directory")
    train_data: str = flag("builtin", "prompt set to train on: 'builtin' (synthetic arithmetic) or a JSONL path")
    out_dir: str = flag("runs/default", "where metrics.jsonl, samples.jsonl and the final checkpoint go")
    seed: int = flag(0, "seed for data order, sampling and replay")
    steps: int = flag(120, "optimizer steps")
    prompts_per_step: int = flag(32, "distinct prompts generated per step")
    group_size: int = flag(8, "completions per prompt (the GRPO group); at least 2")
    max_new_tokens: int = flag(8, "completion length limit")
    temperature: float = flag(1.0, "sampling temperature (the trainer's log-probs use the same)")
    top_p: float = flag(1.0, "nucleus sampling mass")
    lr: float = flag(2e-4, "AdamW learning rate")
    weight_decay: float = flag(0.0, "AdamW weight decay")
    max_grad_norm: float = flag(1.0, "gradient-norm clip (0 = off)")
    eps_low: float = flag(0.2, "clip range below 1: ratio >= 1 - eps_low for A > 0")
    eps_high: float = flag(0.28, "clip range above 1: ratio <= 1 + eps_high for A > 0 (DAPO clip-higher)")
    micro_batch_size: int = flag(256, "rollouts per forward/backward pass (does not change the gradient)")
    replay: str = flag("prioritized", "replay buffer: none | uniform (naive replay) | prioritized (P ∝ |A|^alpha)")
    tau_max: int = flag(4, "evict rollouts older than this many steps (age = step - version)")
    replay_ratio: float = flag(0.5, "replayed rollouts per fresh rollout in each batch")
    priority_alpha: float = flag(1.0, "priority exponent alpha in P(j) ∝ |A_j|^alpha (prioritized replay)")
    replay_capacity: int = flag(0, "maximum rollouts stored, oldest out first (0 = unbounded)")
    eval_every: int = flag(20, "evaluate every N steps and at the end (0 = only at the end)")
    eval_size: int = flag(500, "held-out prompts for greedy evaluation")
    log_samples: int = flag(4, "decoded rollouts written to samples.jsonl each step")
    threads: int = flag(0, "torch CPU threads (0 = all cores)")


def parse_args(argv=None) -> Args:
    import argparse
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for f in dataclasses.fields(Args):
        ap.add_argument("--" + f.name.replace("_", "-"), type=type(f.default), default=f.default,
                        help=f"{f.metadata['help']} (default: {f.default})")
    return Args(**vars(ap.parse_args(argv)))


def check_args(a: Args) -> None:
    """Reject bad input up front with one clear sentence (raised as ValueError, printed by main)."""
    if a.group_size < 2:
        raise ValueError(f"--group-size must be at least 2 (a GRPO group needs a baseline), got {a.group_size}")
    if a.tau_max < 0:
        raise ValueError(f"--tau-max must be >= 0, got {a.tau_max}")
    for name in ("steps", "prompts_per_step", "max_new_tokens", "micro_batch_size", "eval_size"):
        if getattr(a, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(a, name)}")
    if a.replay_ratio < 0 or a.priority_alpha < 0 or a.replay_capacity < 0 or a.temperature < 0:
        raise ValueError("--replay-ratio, --priority-alpha, --replay-capacity and --temperature must be >= 0")
    if not 0 < a.top_p <= 1:
        raise ValueError(f"--top-p must be in (0, 1], got {a.top_p}")
    if a.temperature == 0:
        raise ValueError("--temperature 0 (greedy) gives identical completions in a group: use a positive temperature")
    if not os.path.isdir(a.model):
        raise ValueError(f"--model: no such directory: {a.model}")


# ---- set-up: process group, model wrapping, data ---------------------------------------------------------------

def setup_distributed() -> tuple[int, int, str]:
    """(rank, world_size, device). World size 1 under plain `python`."""
    return 0, 1, "cpu"


def shard_model(model):
    """Wrap the policy for training. Identity at world size 1."""
    return model


def load_prompts(a: Args, tokenizer) -> list[Prompt]:
    if a.train_data == data.BUILTIN:
        examples = data.arithmetic_examples("train", 50_000, seed=0)
        texts = [data.builtin_prompt(e.question) for e in examples]
    else:
        examples = data.load_benchmark(a.train_data)
        texts = [data.apply_template(e, "plain", tokenizer) for e in examples]
    return [Prompt(i, tokenizer.encode(t), e.answer) for i, (t, e) in enumerate(zip(texts, examples))]


def evaluate(engine: TorchEngine, tok, a: Args) -> float:
    """Greedy accuracy (mean@1) on the first `eval_size` prompts of the built-in test split, through eval.py's
    `evaluate`, so `python eval.py` on a saved checkpoint reproduces the number."""
    examples = data.arithmetic_examples("test", a.eval_size)
    summary, _ = eval_lib.evaluate(engine, tok, examples, template="builtin", k=1,
                                   sampling=Sampling(temperature=0, max_new_tokens=a.max_new_tokens))
    return summary["mean@k"]


# ---- one step's pieces --------------------------------------------------------------------------------------------

def score(rollouts) -> None:
    """Reward from the verifier, then GRPO advantages within each group (same prompt_id, same version)."""
    rewards = torch.tensor([verify.reward(r.text, r.answer) for r in rollouts])                # [B]
    group = torch.tensor([r.prompt_id for r in rollouts])                                       # [B]
    adv = grpo.grpo_advantages(rewards, group)                                                  # [B]
    for r, rew, A in zip(rollouts, rewards.tolist(), adv.tolist()):
        r.reward, r.advantage = rew, A


def update(model, opt, batch, a: Args, pad_id: int) -> dict:
    """One optimizer step on `batch` (fresh + replayed rollouts), micro-batched; returns loss metrics.

    The normaliser N (valid tokens of the whole batch) is fixed before the first micro-batch, so the summed
    micro-batch gradients equal the gradient of L = -(1/N) sum_i sum_t min(rho A, clip(rho, 1-eps_low, 1+eps_high) A).
    """
    normaliser = grpo.loss_normaliser(collate(batch, pad_id)["completion_mask"], "token-mean")
    opt.zero_grad(set_to_none=True)
    parts, total = [], 0.0
    for i in range(0, len(batch), a.micro_batch_size):
        mb = collate(batch[i:i + a.micro_batch_size], pad_id)
        logits = model(input_ids=mb["input_ids"], attention_mask=mb["attention_mask"]).logits[:, :-1]  # [b, T, V]
        logp = grpo.token_logprobs(logits, mb["input_ids"][:, 1:], a.temperature)                   # [b, T]
        mask = mb["completion_mask"]                                                                 # [b, T]
        log_ratio = grpo.token_log_ratio(logp, mb["old_logprobs"], mask)                             # [b, T]
        loss, m = grpo.policy_loss(log_ratio, mb["advantages"], mask, eps_low=a.eps_low, eps_high=a.eps_high,
                                   agg="token-mean", normaliser=normaliser)
        loss.backward()
        parts.append(m)
        total += loss.item()
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), a.max_grad_norm or float("inf"))
    opt.step()
    return {**grpo.merge_metrics(parts), "loss/policy": total, "loss/grad_norm": grad_norm.item()}


def rollout_metrics(fresh) -> dict:
    rewards = torch.tensor([r.reward for r in fresh])
    group = torch.tensor([r.prompt_id for r in fresh])
    return {"reward/mean": rewards.mean().item(),
            "reward/zero_std_frac": grpo.zero_std_fraction(rewards, group),
            "response/len_mean": sum(len(r.completion_ids) for r in fresh) / len(fresh),
            "response/truncated_frac": sum(r.truncated for r in fresh) / len(fresh)}


def log_line(m: dict) -> str:
    s = (f"step {m['step']:4d} | reward {m['reward/mean']:.3f} | zero-std {m['reward/zero_std_frac']:.2f} "
         f"| loss {m['loss/policy']:+.4f} | clip {m['loss/clip_frac']:.3f} | replay {m['replay/sampled']:3d}/"
         f"{m['replay/size']:<5d} age {m['replay/age_mean']:.2f} | len {m['response/len_mean']:.1f} "
         f"| {m['time/step']:.2f}s")
    return s + (f" | eval acc {m['eval/accuracy']:.3f}" if "eval/accuracy" in m else "")


# ---- the loop --------------------------------------------------------------------------------------------------

def train(a: Args) -> dict:
    rank, world, device = setup_distributed()
    if a.threads:
        torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    model, tok = load_model(a.model, device)
    prompts = load_prompts(a, tok)
    engine = TorchEngine(model, tok)
    model = shard_model(model)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=a.weight_decay)
    replay = buffer.make_replay(a.replay, a.tau_max, a.priority_alpha, a.replay_capacity or None, a.seed)
    order = list(range(len(prompts)))
    random.Random(a.seed).shuffle(order)
    os.makedirs(a.out_dir, exist_ok=True)
    metrics_f = open(os.path.join(a.out_dir, "metrics.jsonl"), "w")
    samples_f = open(os.path.join(a.out_dir, "samples.jsonl"), "w")
    print(json.dumps(dataclasses.asdict(a)))
    acc0 = evaluate(engine, tok, a)
    print(f"step    0 | eval acc {acc0:.3f}")
    metrics_f.write(json.dumps({"step": 0, "eval/accuracy": acc0}) + "\n")

    for step in range(a.steps):
        t0 = time.perf_counter()
        pos = step * a.prompts_per_step
        batch_prompts = [prompts[order[(pos + i) % len(order)]] for i in range(a.prompts_per_step)]
        sampling = Sampling(a.temperature, a.top_p, a.max_new_tokens, seed=a.seed * 1_000_003 + step)
        fresh = engine.generate(batch_prompts, a.group_size, sampling, version=step)             # 1. generate
        t1 = time.perf_counter()
        score(fresh)                                                                            # 2. score
        replayed = []
        if replay is not None:
            replay.add(fresh, step)                                                             # 3. store
            replayed = replay.sample(round(a.replay_ratio * len(fresh)), step)                  # 4. sample
        t2 = time.perf_counter()
        m = update(model, opt, fresh + replayed, a, tok.pad_token_id)                          # 5. update
        engine.load_weights(model.named_parameters())                                           # weight sync
        t3 = time.perf_counter()

        m.update(rollout_metrics(fresh))
        m.update(replay.stats() if replay is not None else
                 {"replay/size": 0, "replay/sampled": 0, "replay/age_mean": 0.0})
        m.update({"step": step + 1, "time/generate": t1 - t0, "time/update": t3 - t2, "time/step": t3 - t0})
        if (a.eval_every and (step + 1) % a.eval_every == 0) or step + 1 == a.steps:
            m["eval/accuracy"] = evaluate(engine, tok, a)
        print(log_line(m), flush=True)
        metrics_f.write(json.dumps(m) + "\n")
        metrics_f.flush()
        for r in fresh[:a.log_samples]:
            samples_f.write(json.dumps({"step": step + 1, "prompt": tok.decode(r.prompt_ids), "completion": r.text,
                                        "answer": r.answer, "reward": r.reward, "advantage": r.advantage}) + "\n")

    final = os.path.join(a.out_dir, "final")
    model.save_pretrained(final, safe_serialization=True)
    tok.save_pretrained(final)
    with open(os.path.join(final, "args.json"), "w") as f:
        json.dump(dataclasses.asdict(a), f, indent=1)
    metrics_f.close()
    samples_f.close()
    print(f"saved {final} | eval acc {acc0:.3f} -> {m['eval/accuracy']:.3f}")
    return m


def main(argv=None) -> int:
    a = parse_args(argv)
    try:
        check_args(a)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    train(a)
    return 0


if __name__ == "__main__":
    sys.exit(main())
