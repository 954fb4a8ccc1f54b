"""The curves of one training run in one PNG, from its metrics.jsonl.

    python bench/plot_run.py runs/default                 # writes runs/default/curves.png
    python bench/plot_run.py runs/default --out x.png

Six panels against the loop step: held-out accuracy (every eval/* key), reward (mean and zero-std
fraction), clip and veto fractions (loss/clip_frac, loss/veto_frac), replay age (mean, max) and size
(right axis), response length, and the step-time split (time/generate and time/update stacked). A
key absent from the run (e.g. replay/* under --replay none) leaves its panel with what there is.

matplotlib is an optional dependency (requirements-bench.txt), imported only in `plot()`; without it
the script says so in one line and exits with status 2. `load_metrics` and `series` need nothing
beyond the standard library.
"""
import argparse
import json
import os
import sys

MISSING_MPL = "bench/plot_run.py needs matplotlib: pip install -r requirements-bench.txt"


def load_metrics(run_dir: str) -> list[dict]:
    """The rows of RUN_DIR/metrics.jsonl (step 0 is the evaluation before training)."""
    path = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path} not found: RUN_DIR is a train.py --out-dir")
    with open(path) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    if not rows:
        raise ValueError(f"{path} is empty")
    return rows


def series(rows: list[dict], key: str) -> tuple[list[int], list[float]]:
    """(steps, values) of the rows that hold `key`."""
    pts = [(r["step"], r[key]) for r in rows if key in r]
    return [s for s, _ in pts], [v for _, v in pts]


def import_pyplot():
    """matplotlib.pyplot on the non-interactive backend, or SystemExit with one line when it is
    absent."""
    try:
        import matplotlib
    except ImportError:
        raise SystemExit(MISSING_MPL) from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def plot(rows: list[dict], out: str, title: str = "") -> str:
    plt = import_pyplot()
    fig, axes = plt.subplots(2, 3, figsize=(15, 8), constrained_layout=True)
    (acc, rew, clip), (age, length, time_ax) = axes

    eval_keys = list(dict.fromkeys(k for r in rows for k in r if k.startswith("eval/")))
    for key in eval_keys:
        acc.plot(*series(rows, key), marker="o", label=key)
    acc.set(title="held-out accuracy", xlabel="step", ylim=(0, None))
    for key, style in (("reward/mean", "-"), ("reward/zero_std_frac", "--")):
        rew.plot(*series(rows, key), style, label=key)
    rew.set(title="reward", xlabel="step")
    for key in ("loss/clip_frac", "loss/veto_frac"):
        clip.plot(*series(rows, key), label=key)
    clip.set(title="clip and veto fractions", xlabel="step")
    for key in ("replay/age_mean", "replay/age_max"):
        age.plot(*series(rows, key), label=key)
    age.set(title="replay age and size", xlabel="step", ylabel="age (steps)")
    size_ax = age.twinx()
    size_ax.plot(*series(rows, "replay/size"), color="tab:green", linestyle=":", linewidth=2,
                 label="replay/size (right)")
    size_ax.set_ylabel("rollouts stored")
    for key in ("response/len_mean",):
        length.plot(*series(rows, key), label=key)
    length.plot(*series(rows, "response/truncated_frac"), "--", label="response/truncated_frac")
    length.set(title="response length (tokens)", xlabel="step")
    steps, gen = series(rows, "time/generate")
    _, upd = series(rows, "time/update")
    if steps:
        time_ax.stackplot(steps, gen, upd, labels=["time/generate", "time/update (+ sync)"],
                          alpha=0.7)
        _, step_t = series(rows, "time/step")
        time_ax.plot(steps, step_t, color="black", linewidth=0.8, label="time/step")
    time_ax.set(title="step time split (s)", xlabel="step")

    for ax in (acc, rew, clip, age, length, time_ax):
        handles, labels = ax.get_legend_handles_labels()
        if ax is age:
            h2, l2 = size_ax.get_legend_handles_labels()
            handles, labels = handles + h2, labels + l2
        if handles:
            ax.legend(handles, labels, fontsize=8)
        ax.grid(alpha=0.3)
    if title:
        fig.suptitle(title)
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run_dir", help="a train.py --out-dir (holds metrics.jsonl)")
    p.add_argument("--out", default="", help="PNG path (default RUN_DIR/curves.png)")
    args = p.parse_args(argv)
    try:
        rows = load_metrics(args.run_dir)
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        out = plot(rows, args.out or os.path.join(args.run_dir, "curves.png"), title=args.run_dir)
    except SystemExit as e:
        print(e, file=sys.stderr)
        return 2
    print(f"wrote {out} ({len(rows)} rows, last step {rows[-1]['step']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
