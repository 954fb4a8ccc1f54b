"""The runs a refactor is checked on: `python train.py --threads 1` (the default, 100 steps) and a
3-step run of every preset, each into OUT/NAME, from the code of --repo (default: this checkout).

    python bench/same_runs.py runs/before --repo ../before    # the code before the change
    python bench/same_runs.py runs/after                      # this checkout
    python bench/same_metrics.py runs/before runs/after --dropped ratio/far_prefix_frac

Same flags, same --threads, same machine: what differs is the code alone. A finished run (its
final/ link) is kept, so a stopped call resumes.
"""
import argparse
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PRESETS = ("grpo", "dapo", "drgrpo", "gspo", "pnpo", "rollout-replay", "naive-replay",
           "headroom-drift", "mu-grpo", "m2po", "vigor", "r2po")
SHORT = ("--steps", "3", "--eval-every", "3", "--eval-size", "50", "--save-every", "0")


def runs() -> dict[str, list[str]]:
    """{name: train.py flags}: the default, then each preset for 3 steps (mu-GRPO with 64-prompt
    stages of 8 updates, so that 3 of them take seconds, not minutes)."""
    out = {"default": []}
    for name in PRESETS:
        extra = ("--prompts-per-step", "64", "--mini-batches", "8") if name == "mu-grpo" else ()
        out[name] = ["--preset", name, *SHORT, *extra]
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", help="where the runs go: OUT/NAME")
    ap.add_argument("--repo", default=ROOT, help="the checkout whose train.py runs")
    ap.add_argument("--only", default="", help="comma-separated names (default: all)")
    args = ap.parse_args(argv)
    only = set(filter(None, args.only.split(",")))
    for name, flags in runs().items():
        out = os.path.abspath(os.path.join(args.out, name))
        if (only and name not in only) or os.path.exists(os.path.join(out, "final")):
            continue
        cmd = [sys.executable, os.path.join(args.repo, "train.py"), *flags, "--threads", "1",
               "--out-dir", out]
        print(" ".join(cmd[1:]), flush=True)
        rc = subprocess.run(cmd, cwd=args.repo, stdout=subprocess.DEVNULL).returncode
        if rc:
            print(f"{name}: exit {rc}", file=sys.stderr)
            return rc
    return 0


if __name__ == "__main__":
    sys.exit(main())
