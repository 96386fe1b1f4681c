"""The multi-panel figure of one or several analyses (one row per checkpoint, same panels)."""
from typing import Dict, List

PANELS = ("encoder CKA", "decoder CKA", "encoder x decoder CKA (sentence)", "logit lens",
          "sub-layer updates (decoder)", "cross-attention entropy")


def plot(analyses: List[Dict], labels: List[str], out: str):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(analyses), len(PANELS), squeeze=False,
                             figsize=(3.3 * len(PANELS), 3.0 * len(analyses)))
    for row, (analysis, label) in enumerate(zip(analyses, labels)):
        ax = axes[row]
        for k, side in enumerate(("encoder", "decoder")):
            _heatmap(ax[k], analysis["cka"].get(side), f"{label}: {side} CKA", "layer", "layer")
        _heatmap(ax[2], analysis["cka"].get("encoder_decoder"), f"{label}: enc x dec CKA",
                 "decoder layer", "encoder layer")
        _lens(ax[3], analysis["logit_lens"], label)
        _updates(ax[4], analysis["updates"].get("decoder"), label)
        _entropy(ax[5], analysis.get("cross_attention_entropy"), label)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)


def _blank(ax, title):
    ax.set_title(title, fontsize=8)
    ax.text(0.5, 0.5, "not in this model", ha="center", va="center", fontsize=8)
    ax.set_axis_off()


def _heatmap(ax, matrix, title, xlabel, ylabel):
    if not matrix:
        return _blank(ax, title)
    image = ax.imshow(matrix, vmin=0, vmax=1, cmap="magma", origin="lower")
    ax.set_xticks(range(len(matrix[0])))
    ax.set_yticks(range(len(matrix)))
    ax.set_title(title, fontsize=8)
    ax.set_xlabel(xlabel, fontsize=7)
    ax.set_ylabel(ylabel, fontsize=7)
    ax.figure.colorbar(image, ax=ax, fraction=0.046, pad=0.04)


def _lens(ax, lens, label):
    layers = lens["layers"]
    ax.plot(layers, lens["accuracy"], "o-", label="accuracy %")
    ax.set_xticks(layers)
    ax.set_xlabel("decoder layer (0: its input)", fontsize=7)
    ax.set_ylabel("next-token accuracy %", fontsize=7)
    twin = ax.twinx()
    twin.plot(layers, lens["cross_entropy"], "s--", color="C1", label="cross-entropy")
    twin.set_ylabel("cross-entropy (nats)", fontsize=7)
    ax.set_title(f"{label}: logit lens", fontsize=8)


def _updates(ax, updates, label):
    if not updates:
        return _blank(ax, f"{label}: sub-layer updates")
    layers = sorted(updates, key=int)
    terms = sorted({t for layer in updates.values() for t in layer})
    for t in terms:
        ax.plot([int(i) for i in layers], [updates[i].get(t, float("nan")) for i in layers],
                "o-", label=t)
    ax.set_xticks([int(i) for i in layers])
    ax.set_xlabel("decoder layer", fontsize=7)
    ax.set_ylabel("||update|| / ||layer input||", fontsize=7)
    ax.legend(fontsize=6)
    ax.set_title(f"{label}: sub-layer updates", fontsize=8)


def _entropy(ax, entropy, label):
    if not entropy:
        return _blank(ax, f"{label}: cross-attention entropy")
    per = entropy["per_layer_and_head"]
    layers = sorted(per, key=int)
    for i in layers:
        ax.plot([int(i)] * len(per[i]), per[i], "o", color="C0", markersize=3)
    ax.plot([int(i) for i in layers], [sum(per[i]) / len(per[i]) for i in layers], "-",
            color="C0", label="mean over heads")
    ax.axhline(entropy["uniform_mean"], color="gray", linestyle=":", label="uniform (log S)")
    ax.set_xticks([int(i) for i in layers])
    ax.set_xlabel("decoder layer", fontsize=7)
    ax.set_ylabel("entropy over source (nats)", fontsize=7)
    ax.legend(fontsize=6)
    ax.set_title(f"{label}: cross-attention entropy", fontsize=8)
