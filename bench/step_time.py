"""One training step of train.py, split into its parts, against the machine's limit for the update.

    python bench/step_time.py                  # the built-in default (64 prompts x 8, replay 0.5)
    python bench/step_time.py --repeats 5 -- \\
        --prompts-per-step 16 --threads 1      # train.py's flags after --
    python bench/step_time.py --warmup 1 --repeats 2 --hf-generate -- \\
        --model assets/smollm2-135m-instruct --train-data builtin_mixed --prompts-per-step 8 \\
        --max-new-tokens 16 --threads 2        # a real model; against model.generate too

Everything runs through train.py's own objects and functions (the run run_setup.setup builds for
train.main, train.generate_and_score,
the replay buffer, train.update, parallel.full_parameters + engine.load_weights): no step is
re-implemented here. After `--warmup` whole steps (so the replay
buffer holds `tau_max` steps of rollouts and
sample() returns replay_ratio x fresh), each of `--repeats` steps is timed part by part and the
medians are printed:

    generate        engine.generate inside train.generate_and_score (the run's engine is
                    wrapped to time its call; a method whose allocate slot holds the engine itself,
                    VIGOR's, is timed under score)
    score           the rest of generate_and_score (the task's grader, advantages; the canary
                    every --check-every steps)
    sample+store    replay.sample + replay.add
    update          train.update (collate, forward, loss, backward, clip, AdamW)
    sync            engine.load_weights(parallel.full_parameters(model))

then tokens/s (generated completion tokens per second of `generate`; real and padded tokens per
second of `update`), the share of padded tokens in the update's forward passes (from the attention
masks of the micro-batches that train.update collates for it: length-bucketed,
rollout.length_buckets), and a bare forward + backward of the same model over the same micro-batches
(the logits at the completion positions, as the update computes them, summed and backpropagated;
no loss, no optimizer: the machine's limit for this model and these shapes). `--hf-generate` also
times transformers' `model.generate` on the same prompts at the same settings and length limit:
TorchEngine's completion tokens/s against it.

`--consecutive` also measures the layout before length bucketing: the same rollouts cut into
consecutive micro-batches in batch order. It checks that the gradient of train.micro_batch_loss
summed over those equals the one over the trainer's bucketed micro-batches (float rounding), then
times the bare pass and train.update with rollout.micro_batches replaced by the consecutive one for
the duration of the measurement only.
"""
import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import flags  # noqa: E402
import parallel  # noqa: E402
import rollout  # noqa: E402
import run_setup  # noqa: E402
import train  # noqa: E402

PARTS = ("generate", "score", "sample+store", "update", "sync")
# the update's targets on the built-in default: at most 15% padded forward positions, at most
# 1.15x a bare forward + backward of the same micro-batches; generation (--hf-generate): at least
# 1.3x model.generate's completion tokens/s
TARGET_PAD, TARGET_RATIO, TARGET_GENERATE = 0.15, 1.15, 1.3


class TimedEngine:
    """The run's engine, with the seconds and completion tokens of its last generate() call
    recorded."""

    def __init__(self, engine):
        self.engine, self.seconds, self.tokens = engine, 0.0, 0

    def generate(self, *a, **kw):
        t0 = time.perf_counter()
        out = self.engine.generate(*a, **kw)
        self.seconds += time.perf_counter() - t0
        self.tokens += sum(len(r.completion_ids) for r in out)
        return out

    def __getattr__(self, name):
        return getattr(self.engine, name)


def update_micro_batches(run, fresh, replayed) -> list[dict]:
    """The micro-batches train.update collates in its first epoch (same mini-batch split, same
    calls: rollout.micro_batches, then the loss slot's batch hooks)."""
    batch = fresh + replayed
    parts = rollout.mini_batches(len(fresh), len(replayed), run.settings.optim.mini_batches, None)
    out = []
    for idx in parts:
        mbs = rollout.micro_batches([batch[i] for i in idx], run.micro_batch[0],
                                    run.tok.pad_token_id, run.device, max_tokens=run.micro_batch[1])
        for adjust in run.hooks.batch:
            mbs = adjust(mbs)
        out += mbs
    return out


def padding(mbs: list[dict]) -> tuple[int, int]:
    """(real tokens, padded positions) over the micro-batches' forward passes."""
    real = sum(int(mb["attention_mask"].sum()) for mb in mbs)
    return real, sum(mb["attention_mask"].numel() for mb in mbs) - real


def bare_forward_backward(model, mbs: list[dict]) -> float:
    """Seconds of forward + backward of the model over the micro-batches, nothing else (gradients
    dropped): the logits where the update computes them (rollout.completion_logits: the
    completion positions), summed, no loss, no optimizer."""
    t0 = time.perf_counter()
    for mb in mbs:
        rollout.completion_logits(model, mb)[1].sum().backward()
    seconds = time.perf_counter() - t0
    model.zero_grad(set_to_none=True)
    return seconds


@torch.no_grad()
def hf_generate(run, prompts: list, n: int) -> tuple[float, int]:
    """(seconds, completion tokens) of transformers' `model.generate` on the engine's own weights
    over the same prompts (n rows each, left-padded, one batch: what num_return_sequences=n runs;
    TorchEngine prefills each prompt once and repeats its cache), at the run's temperature, top-p
    and --max-new-tokens: the reference TorchEngine's tokens/s is compared with. Tokens counted up
    to and including EOS, as the engine counts them."""
    engine, s = run.engine, train.sampling(run, 0, 0)
    flat = [p for p in prompts for _ in range(n)]
    ids, mask = engine._left_padded(flat)
    sample = {"do_sample": True, "temperature": s.temperature, "top_p": s.top_p} \
        if s.temperature > 0 else {"do_sample": False}
    t0 = time.perf_counter()
    out = engine.model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=s.max_new_tokens,
                                pad_token_id=engine.pad_id, eos_token_id=engine.eos_id, **sample)
    seconds = time.perf_counter() - t0
    tokens = 0
    for row in out[:, ids.shape[1]:].tolist():
        tokens += row.index(engine.eos_id) + 1 if engine.eos_id in row else len(row)
    return seconds, tokens


def consecutive_micro_batches(rollouts, size, pad_id, device, *, old_logprobs=None, max_tokens=0,
                              ref_logprobs=None):
    """The layout before length bucketing: rollouts[i:i + size] in batch order, collated as
    rollout.micro_batches collates its buckets. Same number of micro-batches of the same sizes
    (max_tokens is ignored: this layout is the one before the token budget too)."""
    old, ref, starts = old_logprobs or None, ref_logprobs or None, range(0, len(rollouts), size)
    return [{k: v.to(device)
             for k, v in rollout.collate(rollouts[i:i + size], pad_id, old and old[i:i + size],
                                         ref and ref[i:i + size]).items()}
            for i in starts]


_bucketed_micro_batches = rollout.micro_batches


def gradient(run, mbs, normaliser) -> list[torch.Tensor]:
    """Sum over micro-batches of d train.micro_batch_loss / d params (no optimizer step), after the
    loss slot's prepare hooks, as train.optimizer_step runs them."""
    model = run.model
    model.zero_grad(set_to_none=True)
    for prepare in run.hooks.prepare:
        mbs = prepare(model, mbs)
    for mb in mbs:
        train.micro_batch_loss(run, mb, normaliser)[0].backward()
    grads = [p.grad.detach().clone() for p in model.parameters() if p.grad is not None]
    model.zero_grad(set_to_none=True)
    return grads


def build(argv: list[str]) -> run_setup.Run:
    """The run train.main would make with flags `argv`, in one process on the CPU."""
    return run_setup.setup(flags.parse(list(argv), "train.py flags"), rank=0, world=1,
                           device="cpu", shard=train.shard_model, steps=train.STEPS)


def measure(argv: list[str] = (), warmup: int = 2, repeats: int = 3,
            consecutive: bool = False, generate: bool = False) -> dict:
    """Time `repeats` steps after `warmup` steps of the run train.py would make with flags `argv`;
    medians. `generate`: also transformers' model.generate on each timed step's prompts
    (hf_generate)."""
    run = build(argv)
    engine, model, replay = run.engine, run.model, run.replay
    optim = run.settings.optim
    timed, pad_id, device = TimedEngine(engine), run.tok.pad_token_id, run.device
    run.engine = timed                             # train.generate's engine
    run.mine, pos = list(range(len(run.prompts))), 0
    mine = run.mine
    rows = []
    for step in range(warmup + repeats):
        t = {}
        timed.seconds, timed.tokens = 0.0, 0
        t0 = time.perf_counter()
        start = pos
        fresh, generated, pos, _ = train.generate_and_score(run, pos, step)
        t1 = time.perf_counter()
        t["generate"], t["score"] = timed.seconds, (t1 - t0) - timed.seconds
        if generate and step >= warmup:                  # the same prompts, the same lengths
            prompts = [run.prompts[mine[i % len(mine)]] for i in range(start, pos)]
            t["hf_generate"], t["hf_gen_tokens"] = hf_generate(run, prompts,
                                                               run.settings.run.group_size)
            t1 = time.perf_counter()                       # not a part of the step
        replayed = []
        if replay is not None:
            replayed = replay.sample(step, len(fresh))             # as train.train_step
            replay.add([r for r in fresh if all(k(r) for k in run.hooks.keeps)], step)
        t2 = time.perf_counter()
        t["sample+store"] = t2 - t1
        # not timed: for the counts
        mbs = update_micro_batches(run, fresh, replayed)
        t3 = time.perf_counter()
        train.update(run, fresh, replayed, step=step,
                     guard=parallel.StepGuard(optim.max_bad_steps))
        t4 = time.perf_counter()
        engine.load_weights(parallel.full_parameters(model))
        t5 = time.perf_counter()
        t["update"], t["sync"] = t4 - t3, t5 - t4
        t["bare_fwd_bwd"] = bare_forward_backward(model, mbs)
        real, padded = padding(mbs)
        t.update(gen_tokens=timed.tokens, fresh=len(fresh), replayed=len(replayed),
                 real_tokens=real, padded_tokens=padded, micro_batches=len(mbs),
                 epochs=optim.epochs)
        if consecutive:
            parts = rollout.mini_batches(len(fresh), len(replayed), optim.mini_batches, None)
            cmbs = [mb for idx in parts
                    for mb in consecutive_micro_batches([(fresh + replayed)[i] for i in idx],
                                                        optim.micro_batch_size, pad_id, device)]
            t["consec_padded_tokens"] = padding(cmbs)[1]
            t["consec_bare_fwd_bwd"] = bare_forward_backward(model, cmbs)
            # train.update's micro-batches are rollout.micro_batches'
            rollout.micro_batches = consecutive_micro_batches
            try:
                t5 = time.perf_counter()
                # one more optimizer step: same shapes, for the time
                train.update(run, fresh, replayed, step=step,
                             guard=parallel.StepGuard(optim.max_bad_steps))
                t["consec_update"] = time.perf_counter() - t5
            finally:
                rollout.micro_batches = _bucketed_micro_batches
            engine.load_weights(parallel.full_parameters(model))
            if step == warmup:                          # gradient identity, once
                normaliser = parallel.global_normaliser(mbs, run.settings.loss.agg,
                                                        run.settings.run.max_new_tokens, 1)
                g0, g1 = gradient(run, mbs, normaliser), gradient(run, cmbs, normaliser)
                t["consec_grad_max_abs_diff"] = max(float((a - b).abs().max())
                                                    for a, b in zip(g0, g1))
                t["grad_max_abs"] = max(float(a.abs().max()) for a in g0)
        if step >= warmup:
            rows.append(t)
    out = {k: statistics.median(r[k] for r in rows) for k in rows[0]
           if not k.startswith("consec_grad") and k != "grad_max_abs"}
    for k in ("consec_grad_max_abs_diff", "grad_max_abs"):
        if any(k in r for r in rows):
            out[k] = next(r[k] for r in rows if k in r)
    out["step"] = sum(out[p] for p in PARTS)
    out["flags"] = " ".join(argv) or "(defaults)"
    out["threads"] = torch.get_num_threads()
    return out


def report(m: dict) -> str:
    lines = [f"train.py {m['flags']} | {m['fresh']:.0f} fresh + {m['replayed']:.0f} replayed "
             f"rollouts | {m['micro_batches']:.0f} micro-batches | {m['threads']} threads "
             "| medians"]
    for part in PARTS:
        lines.append(f"  {part:13s} {1e3 * m[part]:9.1f} ms  {100 * m[part] / m['step']:5.1f}%")
    lines.append(f"  {'step':13s} {1e3 * m['step']:9.1f} ms")
    total = m["real_tokens"] + m["padded_tokens"]
    pad = m["padded_tokens"] / total
    ratio = m["update"] / (m["epochs"] * m["bare_fwd_bwd"])
    lines += [
        f"generation   {m['gen_tokens'] / m['generate']:10.0f} completion tokens/s "
        f"({m['gen_tokens']:.0f} tokens)",
        f"update       {m['epochs'] * m['real_tokens'] / m['update']:10.0f} real tokens/s, "
        f"{m['epochs'] * total / m['update']:.0f} padded positions/s",
        f"padded share {100 * pad:9.1f}% of the update's forward positions "
        f"({m['padded_tokens']:.0f} of {total:.0f}); "
        f"target <= {100 * TARGET_PAD:.0f}%: {'met' if pad <= TARGET_PAD else 'NOT met'}",
        f"bare fwd+bwd {1e3 * m['bare_fwd_bwd']:9.1f} ms per epoch; update / bare = {ratio:.2f}x; "
        f"target <= {TARGET_RATIO}x: {'met' if ratio <= TARGET_RATIO else 'NOT met'}"]
    if "hf_generate" in m:
        ours, theirs = m["gen_tokens"] / m["generate"], m["hf_gen_tokens"] / m["hf_generate"]
        lines.append(f"model.generate {theirs:8.0f} completion tokens/s on the same prompts "
                     f"({m['hf_gen_tokens']:.0f} tokens); TorchEngine / model.generate = "
                     f"{ours / theirs:.2f}x tokens/s; target >= {TARGET_GENERATE}x: "
                     f"{'met' if ours / theirs >= TARGET_GENERATE else 'NOT met'}")
    if "consec_update" in m:
        ctotal = m["real_tokens"] + m["consec_padded_tokens"]
        lines += [
            f"consecutive micro-batches (before length bucketing): padded share "
            f"{100 * m['consec_padded_tokens'] / ctotal:.1f}% "
            f"({m['consec_padded_tokens']:.0f} of {ctotal:.0f}); "
            f"bare fwd+bwd {1e3 * m['consec_bare_fwd_bwd']:.1f} ms (bucketed: "
            f"{m['consec_bare_fwd_bwd'] / m['bare_fwd_bwd']:.2f}x faster); "
            f"update {1e3 * m['consec_update']:.1f} ms "
            f"(bucketed: {m['consec_update'] / m['update']:.2f}x faster; "
            f"{m['consec_update'] / (m['epochs'] * m['consec_bare_fwd_bwd']):.2f}x "
            "its bare fwd+bwd)",
            f"  gradient of the summed micro-batch loss, bucketed vs consecutive: max |diff| "
            f"{m['consec_grad_max_abs_diff']:.2e} (max |grad| {m['grad_max_abs']:.2e})"]
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                epilog="train.py's flags go after --, "
                                       "e.g. -- --prompts-per-step 16")
    p.add_argument("--warmup", type=int, default=5,
                   help="whole steps before timing (fills the replay buffer)")
    p.add_argument("--repeats", type=int, default=3, help="timed steps (medians reported)")
    p.add_argument("--consecutive", action="store_true",
                   help="also measure consecutive micro-batches "
                        "(the layout before length bucketing)")
    argv = sys.argv[1:] if argv is None else argv
    ours, train_flags = ((argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv
                         else (argv, []))
    p.add_argument("--hf-generate", action="store_true",
                   help="also time transformers' model.generate on the same prompts and lengths")
    args = p.parse_args(ours)
    print(report(measure(train_flags, args.warmup, args.repeats, args.consecutive,
                         args.hf_generate)), flush=True)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
