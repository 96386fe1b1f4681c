"""Figures of seed comparisons."""
import os


def seed_bars(summary, metric_label, out, title=None, key="arch"):
    """A bar per row: the mean over seeds with the sample standard deviation as error bar and
    every seed's value as a dot (so that 3 seeds are seen as 3 seeds)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [s[key] for s in summary]
    fig, ax = plt.subplots(figsize=(1.1 * len(names) + 2, 4))
    xs = range(len(names))
    ax.bar(xs, [s["mean"] for s in summary], yerr=[s["std"] for s in summary], capsize=4,
           color="#9ecae1", edgecolor="#3182bd", label="mean ± sample std over seeds")
    for x, s in zip(xs, summary):
        ax.plot([x] * len(s["values"]), s["values"], "o", color="#08306b", markersize=3)
    ax.set_xticks(list(xs))
    ax.set_xticklabels(names, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel(metric_label)
    ax.set_title(title or "", fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
