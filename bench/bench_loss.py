"""Time grpo.policy_loss (vectorised, forward + backward) against the same loss written as a
per-token Python loop.

    python bench/bench_loss.py                      # 32 responses x 256 tokens,
                                                    # clip-higher + dual-clip, token-mean
    python bench/bench_loss.py --batch 8 --tokens 1024

Both compute the clipped surrogate of DAPO/GRPO with dual-clip and token-mean aggregation and their
gradient with respect to logp; the script checks they agree before it prints the timings and the
speed-up.
"""
import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import grpo  # noqa: E402
from methods import gspo, pnpo  # noqa: E402

# every importance weight: the spine's token ratio, GSPO's and PNPO's three prefix ratios
RATIOS = {"token": grpo.token_log_ratio, "gspo": gspo.gspo_log_ratio, **pnpo.RATIOS}

EPS_LOW, EPS_HIGH, DUAL_CLIP = 0.2, 0.28, 3.0


def make_batch(batch: int, tokens: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(batch, tokens, generator=g) * 4           # [B, T] behaviour log-probs
    logp = old + 0.3 * torch.randn(batch, tokens, generator=g)  # [B, T] current log-probs
    lengths = torch.randint(tokens // 4, tokens + 1, (batch,), generator=g)
    mask = torch.arange(tokens)[None, :] < lengths[:, None]     # [B, T] right-padded responses
    adv = torch.randn(batch, generator=g)                       # [B]
    return logp, old, mask, adv


def vectorised(logp, old, mask, adv):
    x = logp.clone().requires_grad_()
    loss, _ = grpo.policy_loss(grpo.token_log_ratio(x, old, mask), adv, mask,
                               eps_low=EPS_LOW, eps_high=EPS_HIGH,
                               dual_clip=DUAL_CLIP, agg="token-mean",
                               normaliser=grpo.loss_normaliser(mask, "token-mean"))
    loss.backward()
    return loss.detach(), x.grad


def naive(logp, old, mask, adv):
    """One token at a time: l = max(-A r, -A clip(r)), capped at -A c for A < 0, summed, divided by
    the count."""
    x = logp.clone().requires_grad_()
    total, n = torch.zeros(()), 0
    for i in range(x.shape[0]):
        a = float(adv[i])
        for t in range(x.shape[1]):
            if not mask[i, t]:
                continue
            r = torch.exp(torch.clamp(x[i, t] - old[i, t], -20, 20))
            loss = torch.maximum(-a * r, -a * torch.clamp(r, 1 - EPS_LOW, 1 + EPS_HIGH))
            if a < 0:
                loss = torch.minimum(loss, torch.tensor(-a * DUAL_CLIP))
            total, n = total + loss, n + 1
    loss = total / n
    loss.backward()
    return loss.detach(), x.grad


def timed(fn, *args, repeats: int):
    times, out = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn(*args)
        times.append(time.perf_counter() - start)
    return statistics.median(times), out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    p.add_argument("--batch", type=int, default=32, help="responses in the batch")
    p.add_argument("--tokens", type=int, default=256, help="padded completion length T")
    p.add_argument("--repeats", type=int, default=20,
                   help="timed runs of the vectorised loss (median reported)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random batch")
    args = p.parse_args()
    torch.set_num_threads(1)              # fair: the loop uses one core
    batch = make_batch(args.batch, args.tokens, args.seed)
    n_tok = int(batch[2].sum())
    t_vec, (loss_v, grad_v) = timed(vectorised, *batch, repeats=args.repeats)
    t_loop, (loss_n, grad_n) = timed(naive, *batch, repeats=1)
    torch.testing.assert_close(loss_v, loss_n, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(grad_v, grad_n, rtol=1e-5, atol=1e-8)
    print(f"batch {args.batch} x {args.tokens} ({n_tok} valid tokens), eps {EPS_LOW}/{EPS_HIGH}, "
          f"dual-clip {DUAL_CLIP}")
    print(f"vectorised policy_loss  fwd+bwd  {t_vec * 1e3:9.2f} ms  (median of {args.repeats})")
    print(f"naive per-token loop    fwd+bwd  {t_loop * 1e3:9.2f} ms")
    print(f"speed-up {t_loop / t_vec:,.0f}x; loss and gradient agree (rtol 1e-5)")
    for name, fn in RATIOS.items():  # the other weights, same surrogate
        def run(logp, old, mask, adv, fn=fn):
            x = logp.clone().requires_grad_()
            loss, _ = grpo.policy_loss(fn(x, old, mask), adv, mask,
                                       eps_low=EPS_LOW, eps_high=EPS_HIGH,
                                       normaliser=grpo.loss_normaliser(mask, "token-mean"))
            loss.backward()
        print(f"  ratio {name:5s} vectorised fwd+bwd "
              f"{timed(run, *batch, repeats=args.repeats)[0] * 1e3:8.2f} ms")


if __name__ == "__main__":
    main()
