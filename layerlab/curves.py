"""Training and validation curves of fairseq runs (from their ``--log-format json`` logs) as a
PNG: one colour per run, training solid, validation dashed with markers."""
import math
import os

from .fairseq_log import read_curves


def curves_for(logs, nats=False, metric="loss"):
    """The curves of each log (see :func:`.fairseq_log.read_curves`), in nats if asked
    (fairseq logs bits)."""
    curves = [read_curves(p, metric) for p in logs]
    if nats:
        curves = [{k: [(u, v * math.log(2)) for u, v in c[k]] for k in c} for c in curves]
    return curves


def plot(curves, labels, out, unit="bits", title=None, metric="loss"):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (label, c) in enumerate(zip(labels, curves)):
        color = colors[i % len(colors)]
        if c["train"]:
            ax.plot(*zip(*c["train"]), "-", color=color, label=f"{label} train")
        if c["valid"]:
            ax.plot(*zip(*c["valid"]), "--o", color=color, markersize=3, label=f"{label} valid")
    ax.set(xlabel="updates", ylabel=f"{metric} ({unit} per token)", title=title or "")
    ax.legend(fontsize=7, ncol=2)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
