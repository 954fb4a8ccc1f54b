"""GRPO with rollout-level, advantage-prioritized experience replay: the training loop.

    python train.py                                    # built-in tiny model + arithmetic task, CPU, a few minutes
    python train.py --model PATH --train-data gsm8k_train --max-new-tokens 512 --prompt-template plain
    python train.py --help                             # every flag, with its meaning and default

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
Then the engine gets the new weights (`load_weights`), so the next step samples from the current policy.

A "step" is one pass of this loop (it may hold several optimizer steps); a rollout's age is step - version.
The ratio of a replayed rollout is pi_theta / pi_behaviour with pi_behaviour its logged generation-time log-probs:
the stale policy, which is what makes replay off-policy and what clipping (eps_low, eps_high, dual-clip) guards.
With `--tis-cap C` the trainer instead recomputes old log-probs under the weights at the start of the step (the
proximal policy) and weights each token by min(pi_old / pi_behaviour, C): truncated importance sampling.
"""
import argparse
import dataclasses
import json
import os
import random
import sys
import time
from dataclasses import dataclass

import torch

import buffer
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
    """where metrics.jsonl, samples.jsonl and the final checkpoint go"""
    seed: int = 0
    """seed for data order, sampling and replay"""
    steps: int = 100
    """loop steps (generate -> update cycles)"""
    prompts_per_step: int = 32
    """distinct prompts generated per step"""
    group_size: int = 8
    """completions per prompt (the GRPO group); at least 2"""
    max_new_tokens: int = 8
    """completion length limit (L_max)"""
    temperature: float = 1.0
    """sampling temperature; the trainer's log-probs use the same"""
    top_p: float = 1.0
    """nucleus sampling mass"""
    lr: float = 1e-4
    """AdamW learning rate"""
    weight_decay: float = 0.0
    """AdamW weight decay"""
    max_grad_norm: float = 1.0
    """gradient-norm clip (0 = off)"""
    adv: str = "grpo"
    """advantage: grpo ((r - mean) / (std + 1e-6)) | drgrpo (r - mean)"""
    ratio: str = "token"
    """importance weight: token | gspo (sequence ratio) | pnpo (prefix geometric mean)"""
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
    """evict rollouts older than this many steps (age = step - version)"""
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
    log_samples: int = 4
    """decoded rollouts written to samples.jsonl each step"""
    threads: int = 0
    """torch CPU threads (0 = torch's default)"""


CHOICES = {"adv": tuple(grpo.ADVANTAGES), "ratio": tuple(grpo.RATIOS), "agg": grpo.AGG_MODES,
           "veto_scope": ("none",) + grpo.VETO_SCOPES, "kl_estimator": tuple(grpo.KL_ESTIMATORS),
           "replay": buffer.REPLAY_KINDS, "prompt_template": ("auto", "plain", "chat", "builtin")}


def parse_args(argv=None) -> Args:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    docs = eval_lib.field_docs(Args)
    for f in dataclasses.fields(Args):
        kw = dict(default=f.default, help=f"{docs[f.name]} (default: {f.default})", choices=CHOICES.get(f.name))
        if isinstance(f.default, bool):
            kw["action"] = argparse.BooleanOptionalAction
        else:
            kw["type"] = type(f.default)
        ap.add_argument("--" + f.name.replace("_", "-"), **kw)
    return Args(**vars(ap.parse_args(argv)))


def check_args(a: Args) -> None:
    """Reject bad input up front with one clear sentence (a ValueError that main prints)."""
    if a.group_size < 2:
        raise ValueError(f"--group-size must be at least 2 (a GRPO group needs a baseline), got {a.group_size}")
    if a.tau_max < 0:
        raise ValueError(f"--tau-max must be >= 0, got {a.tau_max}")
    for name in ("steps", "prompts_per_step", "max_new_tokens", "micro_batch_size", "eval_size", "epochs",
                 "mini_batches"):
        if getattr(a, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(a, name)}")
    for name in ("replay_ratio", "priority_alpha", "replay_capacity", "kl_coef", "tis_cap", "dual_clip",
                 "overlong_buffer", "dynamic_sampling_rounds", "lr", "eval_every"):
        if getattr(a, name) < 0:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 0, got {getattr(a, name)}")
    if a.temperature <= 0:
        raise ValueError("--temperature must be > 0: greedy decoding gives a group of identical completions")
    if not 0 < a.top_p <= 1:
        raise ValueError(f"--top-p must be in (0, 1], got {a.top_p}")
    if not 0 <= a.eps_low <= 1 or a.eps_high < 0:
        raise ValueError(f"need 0 <= --eps-low <= 1 and --eps-high >= 0, got {a.eps_low}, {a.eps_high}")
    if 0 < a.dual_clip <= 1:
        raise ValueError(f"--dual-clip must be > 1 (or 0 = off), got {a.dual_clip}")
    if a.overlong_buffer > a.max_new_tokens:
        raise ValueError(f"--overlong-buffer ({a.overlong_buffer}) cannot exceed --max-new-tokens ({a.max_new_tokens})")
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
    else:
        examples = data.load_benchmark(a.train_data)
    template = a.prompt_template if a.prompt_template != "auto" else \
        ("builtin" if a.train_data == data.BUILTIN else "plain")
    return eval_lib.make_prompts(examples, template, tokenizer)


def evaluate(engine: TorchEngine, tok, a: Args) -> float:
    """Greedy accuracy (mean@1) on the first `eval_size` prompts of the built-in test split, through eval.py's
    `evaluate`, so `python eval.py --model <checkpoint>` reproduces the number."""
    examples = data.arithmetic_examples("test", a.eval_size)
    summary, _ = eval_lib.evaluate(engine, tok, examples, template="builtin", k=1,
                                   sampling=Sampling(temperature=0, max_new_tokens=a.max_new_tokens))
    return summary["mean@k"]


# ---- one step's pieces --------------------------------------------------------------------------------------------

def score(rollouts, a: Args) -> None:
    """Reward from the verifier (plus DAPO's overlong penalty), then advantages within each group."""
    rewards = torch.tensor([verify.reward(r.text, r.answer) for r in rollouts])                # [B]
    if a.overlong_buffer:
        lengths = torch.tensor([len(r.completion_ids) for r in rollouts])
        rewards = rewards + grpo.overlong_penalty(lengths, a.max_new_tokens, a.overlong_buffer)
    group = torch.tensor([r.prompt_id for r in rollouts])                                       # [B]
    adv = grpo.ADVANTAGES[a.adv](rewards, group)                                                # [B]
    for r, rew, A in zip(rollouts, rewards.tolist(), adv.tolist()):
        r.reward, r.advantage = rew, A


def keep_informative(rollouts) -> list:
    """DAPO dynamic sampling: only rollouts whose group has non-zero reward variance."""
    rewards = torch.tensor([r.reward for r in rollouts])
    keep = grpo.dynamic_sampling_keep(rewards, torch.tensor([r.prompt_id for r in rollouts]))
    return [r for r, k in zip(rollouts, keep.tolist()) if k]


def micro_batch_loss(model, ref_model, mb: dict, a: Args, normaliser: float) -> tuple[torch.Tensor, dict]:
    """The objective of one micro-batch (the recipe at the top of grpo.py), and its metrics."""
    logits = model(input_ids=mb["input_ids"], attention_mask=mb["attention_mask"]).logits[:, :-1]   # [b, T, V]
    ids = mb["input_ids"][:, 1:]                                                                     # [b, T]
    logp = grpo.token_logprobs(logits, ids, a.temperature)                                           # [b, T]
    mask, old, adv = mb["completion_mask"], mb["old_logprobs"], mb["advantages"]                     # [b, T] [b]
    loss_mask = mask if a.veto_scope == "none" else \
        grpo.veto_mask(logp, old, adv, mask, a.veto_threshold, a.veto_scope)
    log_w = grpo.RATIOS[a.ratio](logp, old, mask)                                                    # [b, T]
    w_tis = grpo.tis_weight(old, mb["engine_logprobs"], a.tis_cap) if a.tis_cap else None
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


def collate_step(rollouts, a: Args, pad_id: int) -> dict:
    b = collate(rollouts, pad_id)
    b["engine_logprobs"] = b["old_logprobs"]
    if a.overlong_filter:
        truncated = torch.tensor([r.truncated for r in rollouts])
        b["completion_mask"] = grpo.overlong_filter(b["completion_mask"], truncated)
    return b


@torch.no_grad()
def recompute_old_logprobs(model, batch, a: Args, pad_id: int) -> list[list[float]]:
    """Log-probs of each rollout's completion under the weights at the start of this step (for --tis-cap)."""
    out = []
    for i in range(0, len(batch), a.micro_batch_size):
        rs = batch[i:i + a.micro_batch_size]
        mb = collate(rs, pad_id)
        logits = model(input_ids=mb["input_ids"], attention_mask=mb["attention_mask"]).logits[:, :-1]
        logp = grpo.token_logprobs(logits, mb["input_ids"][:, 1:], a.temperature)                   # [b, T]
        for b, r in enumerate(rs):
            P, T = len(r.prompt_ids), len(r.completion_ids)
            out.append(logp[b, P - 1:P - 1 + T].tolist())
    return out


def update(model, ref_model, opt, batch, a: Args, step: int, pad_id: int) -> dict:
    """`epochs` x `mini_batches` optimizer steps on `batch` (fresh + replayed), micro-batched; returns metrics."""
    old = recompute_old_logprobs(model, batch, a, pad_id) if a.tis_cap else None
    order = list(range(len(batch)))
    parts, total, norms = [], 0.0, []
    for epoch in range(a.epochs):
        if epoch > 0:
            random.Random(a.seed * 1_000_003 + step * 101 + epoch).shuffle(order)
        size = -(-len(order) // a.mini_batches)
        for start in range(0, len(order), size):
            idx = order[start:start + size]
            mini = [batch[i] for i in idx]
            normaliser = grpo.loss_normaliser(collate_step(mini, a, pad_id)["completion_mask"], a.agg,
                                              max_len=a.max_new_tokens)
            opt.zero_grad(set_to_none=True)
            for j in range(0, len(mini), a.micro_batch_size):
                mb = collate_step(mini[j:j + a.micro_batch_size], a, pad_id)
                if old is not None:  # proximal policy = trainer at step start; engine log-probs feed the TIS weight
                    mb["old_logprobs"] = collate([dataclasses.replace(batch[i], logprobs=old[i])
                                                  for i in idx[j:j + a.micro_batch_size]], pad_id)["old_logprobs"]
                loss, m = micro_batch_loss(model, ref_model, mb, a, normaliser)
                loss.backward()
                parts.append(m)
                total += loss.item()
            norms.append(torch.nn.utils.clip_grad_norm_(model.parameters(), a.max_grad_norm or float("inf")).item())
            opt.step()
    n_opt = a.epochs * len(range(0, len(order), size))
    return {**grpo.merge_metrics(parts), "loss/policy": total / n_opt, "loss/grad_norm": sum(norms) / len(norms)}


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
    return s + (f" | eval acc {m['eval/accuracy']:.3f}" if "eval/accuracy" in m else "")


# ---- the loop --------------------------------------------------------------------------------------------------

def train(a: Args, model, tok, prompts: list[Prompt], device: str) -> dict:
    torch.manual_seed(a.seed)
    ref_model = load_model(a.model, device)[0].eval().requires_grad_(False) if a.kl_coef > 0 else None
    engine = TorchEngine(model, tok)
    model = shard_model(model)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=a.weight_decay)
    replay = buffer.make_replay(a.replay, a.tau_max, a.priority_alpha, a.replay_capacity or None, a.seed)
    order = list(range(len(prompts)))
    random.Random(a.seed).shuffle(order)
    pos = 0                                        # prompts consumed so far, in `order`
    os.makedirs(a.out_dir, exist_ok=True)
    metrics_f = open(os.path.join(a.out_dir, "metrics.jsonl"), "w")
    samples_f = open(os.path.join(a.out_dir, "samples.jsonl"), "w")
    print(json.dumps(dataclasses.asdict(a)))
    acc0 = evaluate(engine, tok, a)
    print(f"step    0 | eval acc {acc0:.3f}")
    metrics_f.write(json.dumps({"step": 0, "eval/accuracy": acc0}) + "\n")

    for step in range(a.steps):
        t0 = time.perf_counter()
        fresh, generated = [], []
        for round_ in range(1 + (a.dynamic_sampling_rounds if a.dynamic_sampling else 0)):
            need = a.prompts_per_step - len({r.prompt_id for r in fresh})
            batch_prompts = [prompts[order[(pos + i) % len(order)]] for i in range(need)]
            pos += need
            sampling = Sampling(a.temperature, a.top_p, a.max_new_tokens,
                                seed=a.seed * 1_000_003 + step * 1_009 + round_)
            new = engine.generate(batch_prompts, a.group_size, sampling, version=step)          # 1. generate
            score(new, a)                                                                       # 2. score
            generated += new
            fresh += keep_informative(new) if a.dynamic_sampling else new
            if len({r.prompt_id for r in fresh}) >= a.prompts_per_step:
                break
        t1 = time.perf_counter()
        replayed = []
        if replay is not None:
            replay.add(fresh, step)                                                             # 3. store
            replayed = replay.sample(round(a.replay_ratio * len(fresh)), step)                  # 4. sample
        m = {}
        if fresh or replayed:
            m = update(model, ref_model, opt, fresh + replayed, a, step, tok.pad_token_id)     # 5. update
            engine.load_weights(model.named_parameters())                                       # weight sync
        t2 = time.perf_counter()

        m.setdefault("loss/policy", 0.0)
        m.update(rollout_metrics(fresh, generated))
        m.update(replay.stats() if replay is not None else
                 {"replay/size": 0, "replay/sampled": 0, "replay/age_mean": 0.0})
        m.update({"step": step + 1, "time/generate": t1 - t0, "time/update": t2 - t1, "time/step": t2 - t0})
        if (a.eval_every and (step + 1) % a.eval_every == 0) or step + 1 == a.steps:
            m["eval/accuracy"] = evaluate(engine, tok, a)
        print(log_line(m), flush=True)
        metrics_f.write(json.dumps(m) + "\n")
        metrics_f.flush()
        for r in generated[:a.log_samples]:
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
    rank, world, device = setup_distributed()
    if a.threads:
        torch.set_num_threads(a.threads)
    try:  # bad input ends in one line and exit status 2; a bug past this point still shows its traceback
        check_args(a)
        model, tok = load_model(a.model, device)
        prompts = load_prompts(a, tok)
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    train(a, model, tok, prompts, device)
    return 0


if __name__ == "__main__":
    sys.exit(main())
