"""Times RolloutReplay.sample() (numpy, vectorised) against a naive per-rollout Python loop doing the same job.

    python bench/bench_buffer.py                    # 100k stored rollouts, k = 1000
    python bench/bench_buffer.py --n 1000000 --k 4096

Both do one prioritized draw at a step where every stored rollout is inside the age window: filter the eligible
rollouts (version < step, |A| > 0), give each the Efraimidis–Spirakis key E_j / |A_j|^alpha with E_j ~ Exp(1), keep
the k smallest in order. The naive one walks the records one by one; the buffer uses its parallel numpy arrays.
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
                    advantage=rng.choice((0.0, rng.gauss(0.0, 1.0))), version=rng.randrange(tau_max + 1))
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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=100_000, help="rollouts stored")
    p.add_argument("--k", type=int, default=1000, help="rollouts drawn per sample()")
    p.add_argument("--tau-max", type=int, default=4, help="age window; versions are spread over it")
    p.add_argument("--alpha", type=float, default=1.0, help="priority exponent")
    p.add_argument("--repeats", type=int, default=5, help="timed calls per method (median reported)")
    args = p.parse_args()

    records = make_rollouts(args.n, args.tau_max, seed=0)
    replay = RolloutReplay(tau_max=args.tau_max, alpha=args.alpha, seed=0)
    replay.add(records, step=args.tau_max)
    step = args.tau_max + 1                            # everything replayable except version 0 (age tau_max + 1)
    rng = random.Random(0)
    assert len(replay.sample(args.k, step)) == len(naive_sample(records, args.k, step, args.tau_max, args.alpha, rng))

    t_vec = median_seconds(lambda: replay.sample(args.k, step), args.repeats)
    t_naive = median_seconds(lambda: naive_sample(records, args.k, step, args.tau_max, args.alpha, rng),
                             args.repeats)
    print(f"n={args.n} stored (after eviction {len(replay)}), k={args.k}, alpha={args.alpha}")
    print(f"RolloutReplay.sample  {1e3 * t_vec:9.2f} ms")
    print(f"naive Python loop     {1e3 * t_naive:9.2f} ms")
    print(f"speed-up              {t_naive / t_vec:9.1f}x")


if __name__ == "__main__":
    main()
