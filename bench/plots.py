"""A setting's plots (bench/report.py's write_setting calls them): accuracy.png, sweep.png and
seeds.png from the summary that bench/protocol.py's run_setting returns; nothing without
matplotlib (requirements-bench.txt)."""
import statistics
from pathlib import Path

from verdicts import X_COL


def swept(summary: dict) -> bool:
    """Whether the setting has dev-sweep runs (not one whose lr was fixed elsewhere: smollm2's)."""
    return any(summary["sweep"].get(a.name) for a in summary["setting"].arms)


def plots(summary: dict, out: Path) -> bool:
    """accuracy.png, sweep.png (where there are sweep runs) and seeds.png (where the setting
    asks); False without matplotlib."""
    try:
        import matplotlib
    except ImportError:
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    s, runs = summary["setting"], summary["runs"]
    col = {"fresh": 1, "updates": 2}[s.x]
    fig, axes = plt.subplots(1, 2, figsize=(13, 5), constrained_layout=True)
    colors = plt.get_cmap("tab10").colors
    for i, a in enumerate(a for a in s.arms if a.name in runs):
        rs = runs[a.name]
        n = min(len(r["curve"]) for r in rs)
        accs = [[100 * r["curve"][j][4] for r in rs] for j in range(n)]
        mean = [statistics.mean(v) for v in accs]
        for ax, xs in zip(axes, ([rs[0]["curve"][j][col] for j in range(n)],
                                 [statistics.mean(r["curve"][j][3] for r in rs)
                                  for j in range(n)])):
            line, = ax.plot(xs, mean, marker="o", markersize=3, color=colors[i % 10],
                            label=f"{a.name} (lr {summary['chosen'][a.name]:g}, {len(rs)} seeds)")
            ax.fill_between(xs, [min(v) for v in accs], [max(v) for v in accs],
                            color=line.get_color(), alpha=0.15)
    axes[0].set(xlabel={"fresh": "fresh rollouts generated", "updates": "optimizer updates"}[s.x],
                ylabel="test accuracy (%)")
    axes[1].set(xlabel="training wall time (s, eval excluded)", ylabel="test accuracy (%)")
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.legend(*axes[0].get_legend_handles_labels(), loc="outside lower center", ncol=3,
               fontsize=8, frameon=False)
    fig.suptitle(f"{s.label}: mean over seeds, band min..max", fontsize=10)
    fig.savefig(out / "accuracy.png", dpi=90)
    plt.close(fig)
    if swept(summary):
        sweep_plot(summary, out, plt)
    if s.seed_curves:
        seed_plot(summary, out, plt)
    return True


def sweep_plot(summary: dict, out: Path, plt) -> None:
    """sweep.png: each arm's mean final dev accuracy against the lr."""
    s = summary["setting"]
    colors = plt.get_cmap("tab10").colors
    fig, ax = plt.subplots(figsize=(7, 4.5), constrained_layout=True)
    for i, a in enumerate(s.arms):
        grid = sorted(summary["sweep"][a.name])
        ax.plot(grid, [100 * statistics.mean(summary["sweep"][a.name][lr]) for lr in grid],
                marker="o", color=colors[i % 10], label=a.name)
    ax.set(xscale="log", xlabel="learning rate", ylabel="final dev accuracy (%)",
           title=f"{s.label}: the sweep (mean over seeds)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.savefig(out / "sweep.png", dpi=90)
    plt.close(fig)


def seed_plot(summary: dict, out: Path, plt) -> None:
    """seeds.png: every reported run's test accuracy against the x-axis, a panel per arm, a line
    per seed (the same colour for a seed in every panel: paired seeds side by side)."""
    s, runs = summary["setting"], summary["runs"]
    col = X_COL[s.x]
    names = [a.name for a in s.arms if a.name in runs]
    fig, axes = plt.subplots(1, len(names), figsize=(5.5 * len(names), 4.5), sharey=True,
                             constrained_layout=True, squeeze=False)
    colors = plt.get_cmap("tab10").colors
    seeds = sorted({r["seed"] for name in names for r in runs[name]})
    for ax, name in zip(axes[0], names):
        for r in runs[name]:
            ax.plot([p[col] for p in r["curve"]], [100 * p[4] for p in r["curve"]], marker="o",
                    markersize=3, color=colors[seeds.index(r["seed"]) % 10],
                    label=f"seed {r['seed']}")
        ax.set(title=f"{name} (lr {summary['chosen'][name]:g})",
               xlabel={"fresh": "fresh rollouts generated", "updates": "optimizer updates"}[s.x])
        ax.grid(alpha=0.3)
    axes[0][0].set(ylabel="test accuracy (%)")
    axes[0][0].legend(fontsize=8)
    fig.suptitle(f"{s.label}: each seed", fontsize=10)
    fig.savefig(out / "seeds.png", dpi=90)
    plt.close(fig)
