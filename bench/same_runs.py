"""The runs a refactor is checked on: `python train.py --threads 1` (the default, 100 steps), a
3-step run of every preset (flags.PRESETS), R²PO across its head phase into its policy phase, and
a run killed (SIGKILL) once its step-2 checkpoint exists, then resumed (`--resume auto`), each
into OUT/NAME, from the code of --repo (default: this checkout).

    python bench/same_runs.py runs/before --repo ../before    # the code before the change
    python bench/same_runs.py runs/after                      # this checkout
    python bench/same_metrics.py runs/before runs/after --dropped ratio/far_prefix_frac

Same flags, same --threads, same machine: what differs is the code alone. A finished run (its
final/ link) is kept, so a stopped call resumes.
"""
import argparse
import os
import signal
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
SHORT = ("--steps", "3", "--eval-every", "3", "--eval-size", "50", "--save-every", "0")
KILLED = "resume"          # the run killed mid-way, then resumed (killed_then_resumed)


def presets() -> tuple[str, ...]:
    """Every preset of this checkout's registry (flags.PRESETS: the spine's and every method's)."""
    import flags
    return tuple(flags.PRESETS)


def runs() -> dict[str, list[str]]:
    """{name: train.py flags}: the default, then each preset for 3 steps (mu-GRPO with 64-prompt
    stages of 8 updates, so that 3 of them take seconds, not minutes), R²PO through 2 head steps
    into 2 policy steps, and the killed-then-resumed run (4 steps, a checkpoint every 2)."""
    out = {"default": []}
    for name in presets():
        extra = ("--prompts-per-step", "64", "--mini-batches", "8") if name == "mu-grpo" else ()
        out[name] = ["--preset", name, *SHORT, *extra]
    out["r2po-phases"] = ["--preset", "r2po", "--r2po-schedule", "2,2", *SHORT[2:],
                          "--steps", "4"]
    out[KILLED] = ["--steps", "4", "--eval-every", "2", "--eval-size", "50", "--save-every", "2"]
    return out


def killed_then_resumed(cmd: list[str], out: str, repo: str) -> int:
    """Run `cmd`, SIGKILL it once OUT/checkpoints/step_000002 is complete (mid step 3), then run it
    again with --resume auto; the exit status of the resumed run."""
    proc = subprocess.Popen(cmd, cwd=repo, stdout=subprocess.DEVNULL)
    done = os.path.join(out, "checkpoints", "step_000002", "COMPLETE")
    while proc.poll() is None and not os.path.exists(done):
        time.sleep(0.05)
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    return subprocess.run([*cmd, "--resume", "auto"], cwd=repo,
                          stdout=subprocess.DEVNULL).returncode


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
        if name == KILLED:
            rc = killed_then_resumed(cmd, out, args.repo)
        else:
            rc = subprocess.run(cmd, cwd=args.repo, stdout=subprocess.DEVNULL).returncode
        if rc:
            print(f"{name}: exit {rc}", file=sys.stderr)
            return rc
    return 0


if __name__ == "__main__":
    sys.exit(main())
