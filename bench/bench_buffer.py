"""Times RolloutReplay.sample() (its draw: numpy, vectorised) against a naive per-rollout Python
loop doing the same job.

    python bench/bench_buffer.py                    # 100k stored rollouts, k = 1000
    python bench/bench_buffer.py --n 1000000 --k 4096
    python bench/bench_buffer.py --overhead          # add + sample per step at 10^3..10^6 stored,
                                                     # vs a step's time
    python bench/bench_buffer.py --overhead --step-seconds 1.4 --sizes 1000,100000

Both do one prioritized draw of k at a step where every stored rollout but the oldest step's is
inside the age window: filter the eligible rollouts (age <= tau_max, version < step, |A| > 0), give
each the Efraimidis–Spirakis key E_j / |A_j|^alpha with E_j ~ Exp(1), keep the k smallest in order.
The naive one walks the records one by one; the buffer (`sample(step, n_fresh = k)` at ratio 1,
train.py's call) uses its parallel numpy arrays.

--overhead: the replay's cost per training step at a steady state of N stored rollouts, for each N
of --sizes. Each step does what train.py does, in its order: sample(step, fresh), which draws
round(replay_ratio x fresh) (evicting by age first), then add(fresh, step). tau_max is set to N /
fresh, so that the buffer holds N rollouts from tau_max earlier steps (prefilled) and eviction
removes one step's rollouts per step, as in a long run. The per-step time (median of --repeats
steps) is printed next to a training step's time: measured with bench/step_time.py's `measure` on
the built-in default, or given with --step-seconds.
"""
import argparse
import heapq
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from buffer import RolloutReplay  # noqa: E402
from rollout import Rollout  # noqa: E402


def make_rollouts(n: int, tau_max: int, seed: int) -> list[Rollout]:
    rng = random.Random(seed)
    return [Rollout(prompt_id=i, prompt_ids=[1], completion_ids=[2, 3], logprobs=[-0.1, -0.2],
                    advantage=rng.choice((0.0, rng.gauss(0.0, 1.0))),
                    version=rng.randrange(tau_max + 1))
            for i in range(n)]


def naive_sample(records: list[Rollout], k: int, step: int, tau_max: int, alpha: float,
                 rng: random.Random) -> list[Rollout]:
    """The same draw, one rollout at a time."""
    keyed = []
    for i, r in enumerate(records):
        if step - r.version <= tau_max and r.version < step and (alpha == 0 or r.advantage != 0):
            keyed.append((rng.expovariate(1.0) / abs(r.advantage) ** alpha, i, r))
    return [r for _, _, r in heapq.nsmallest(k, keyed)]


def median_seconds(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def steady_buffer(n: int, fresh: int, alpha: float, seed: int,
                  ratio: float = 1.0) -> tuple[RolloutReplay, int]:
    """A buffer holding n rollouts, `fresh` per step over tau_max = n // fresh earlier steps;
    (buffer, next step). The rollouts share their token lists (the buffer never reads them): memory
    is the records, not the tokens."""
    tau_max = max(1, n // fresh)
    rng = random.Random(seed)
    prompt, completion, logprobs = [1], [2, 3], [-0.1, -0.2]
    step = tau_max
    records = [Rollout(prompt_id=i % fresh, prompt_ids=prompt, completion_ids=completion,
                       logprobs=logprobs, advantage=rng.choice((0.0, rng.gauss(0.0, 1.0))),
                       version=step - 1 - (i // fresh) % tau_max)
               for i in range(n)]
    replay = RolloutReplay(tau_max=tau_max, alpha=alpha, seed=seed, ratio=ratio)
    replay.add(records, step=step)
    return replay, step


def overhead_per_step(n: int, fresh: int, replay_ratio: float, alpha: float, repeats: int) -> dict:
    """Median seconds of sample + add per step at a steady state of about n stored rollouts."""
    replay, step = steady_buffer(n, fresh, alpha, seed=0, ratio=replay_ratio)
    rng = random.Random(1)
    k = round(replay_ratio * fresh)
    t_sample, t_add, sizes = [], [], []
    for s in range(step, step + repeats):
        new = [Rollout(prompt_id=i, prompt_ids=[1], completion_ids=[2, 3], logprobs=[-0.1, -0.2],
                       advantage=rng.choice((0.0, rng.gauss(0.0, 1.0))), version=s)
               for i in range(fresh)]
        t0 = time.perf_counter()
        drawn = replay.sample(s, fresh)                   # round(replay_ratio x fresh), as train.py
        t1 = time.perf_counter()
        replay.add(new, s)
        t2 = time.perf_counter()
        assert len(drawn) == k, (len(drawn), k)
        t_sample.append(t1 - t0)
        t_add.append(t2 - t1)
        sizes.append(len(replay))
    return {"n": n, "size": statistics.median(sizes), "k": k, "tau_max": replay.tau_max,
            "sample": statistics.median(t_sample), "add": statistics.median(t_add),
            "total": statistics.median(a + b for a, b in zip(t_sample, t_add))}


def overhead_main(args) -> None:
    step_s, how = args.step_seconds, "given with --step-seconds"
    if not step_s:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        import step_time
        m = step_time.measure(["--threads", str(args.step_threads)] if args.step_threads else [],
                              warmup=5, repeats=3)
        step_s, how = m["step"], (f"measured by bench/step_time.py's measure() on the built-in "
                                  f"default ({m['threads']} threads)")
    print(f"replay overhead per step: {args.fresh} fresh rollouts per step, replay ratio "
          f"{args.replay_ratio} (sample {round(args.replay_ratio * args.fresh)}), "
          f"alpha {args.alpha}; training step {1e3 * step_s:.0f} ms ({how})")
    print(f"{'stored':>9s} {'tau_max':>7s} {'sample ms':>10s} {'add ms':>8s} {'total ms':>9s} "
          f"{'of a step':>9s}")
    for n in args.sizes:
        r = overhead_per_step(n, args.fresh, args.replay_ratio, args.alpha, args.repeats)
        print(f"{r['size']:9.0f} {r['tau_max']:7d} {1e3 * r['sample']:10.2f} {1e3 * r['add']:8.2f} "
              f"{1e3 * r['total']:9.2f} {100 * r['total'] / step_s:8.2f}%", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--overhead", action="store_true",
                   help="sample + add per step at --sizes, vs a step's time")
    p.add_argument("--sizes", type=lambda s: [int(float(x)) for x in s.split(",")],
                   default=[1_000, 10_000, 100_000, 1_000_000],
                   help="--overhead: stored rollouts (comma-separated)")
    p.add_argument("--fresh", type=int, default=512,
                   help="--overhead: fresh rollouts per step (64 prompts x 8)")
    p.add_argument("--replay-ratio", type=float, default=0.5,
                   help="--overhead: replayed per fresh rollout")
    p.add_argument("--step-seconds", type=float, default=0.0,
                   help="--overhead: a training step's time "
                        "(0 = measure it with bench/step_time.py)")
    p.add_argument("--step-threads", type=int, default=0,
                   help="--overhead: torch threads of that step (0 = default)")
    p.add_argument("--n", type=int, default=100_000, help="rollouts stored")
    p.add_argument("--k", type=int, default=1000, help="rollouts drawn per sample()")
    p.add_argument("--tau-max", type=int, default=4, help="age window; versions are spread over it")
    p.add_argument("--alpha", type=float, default=1.0, help="priority exponent")
    p.add_argument("--repeats", type=int, default=5,
                   help="timed calls per method (median reported)")
    args = p.parse_args()
    if args.overhead:
        overhead_main(args)
        return

    records = make_rollouts(args.n, args.tau_max, seed=0)
    replay = RolloutReplay(tau_max=args.tau_max, alpha=args.alpha, seed=0, ratio=1.0)
    replay.add(records, step=args.tau_max)
    # everything replayable except version 0 (age tau_max + 1: the first sample evicts it)
    step = args.tau_max + 1
    rng = random.Random(0)
    naive = naive_sample(records, args.k, step, args.tau_max, args.alpha, rng)
    drawn = replay.sample(step, args.k)                # ratio 1: k = n_fresh
    assert len(drawn) == len(naive) and len({id(r) for r in drawn}) == len(drawn)

    t_vec = median_seconds(lambda: replay.sample(step, args.k), args.repeats)
    t_naive = median_seconds(
        lambda: naive_sample(records, args.k, step, args.tau_max, args.alpha, rng), args.repeats)
    print(f"n={args.n} stored (after eviction {len(replay)}), k={len(drawn)}, alpha={args.alpha}")
    print(f"RolloutReplay.sample  {1e3 * t_vec:9.2f} ms")
    print(f"naive Python loop     {1e3 * t_naive:9.2f} ms")
    print(f"speed-up              {t_naive / t_vec:9.1f}x")


if __name__ == "__main__":
    main()
