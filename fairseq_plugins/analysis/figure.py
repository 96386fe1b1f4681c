"""The multi-panel figure of one or several analyses (one row per checkpoint, same panels)."""
from typing import Dict, List, Optional, Tuple

PANELS = ("encoder CKA", "decoder CKA", "encoder x decoder CKA (sentence)", "logit lens",
          "sub-layer updates (decoder)", "cross-attention entropy", "learned layer weights")


def weights_panel(layer_weights: Dict) -> Optional[Tuple[str, str, object]]:
    """What the "learned layer weights" panel draws from an analysis' ``layer_weights``:
    (title, 'matrix', rows of [layer][state] with None where a layer does not read a state) for
    the decoder's (else the encoder's) DWA alphas or mean fuse-attention weights, (title,
    'bars', {name: value}) for the depth connections' own weights (Hyper-Connections, MUDD,
    value residual), or None when the model has none."""
    for key, what in (("depth_averages", "DWA alphas"), ("fuse_attention", "fuse-attention")):
        sides = layer_weights.get(key, {})
        side = "decoder" if "decoder" in sides else next(iter(sides), None)
        if side is None:
            continue
        per_block = []
        for block, row in sorted(sides[side].items(), key=lambda item: int(item[0])):
            if key == "depth_averages":  # after 1-based block s: {"states": [j...], "weights"}
                per_block.append(dict(zip(row["states"], row["weights"])))
            else:  # 1-based block k attends states ..k-1 (its input last), in order
                k = int(block)
                per_block.append(dict(zip(range(k - len(row), k), row)))
        width = max(max(values) for values in per_block) + 1
        return (f"{side} {what}", "matrix",
                [[values.get(j) for j in range(width)] for values in per_block])
    connections = layer_weights.get("depth_connections", {})
    if connections:
        stack = "decoder.depth" if "decoder.depth" in connections else next(iter(connections))
        return f"{stack}: connection weights", "bars", connections[stack]
    return None


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
        _layer_weights(ax[6], analysis.get("layer_weights", {}), label)
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


def _layer_weights(ax, layer_weights, label):
    panel = weights_panel(layer_weights)
    if panel is None:
        return _blank(ax, f"{label}: learned layer weights")
    title, kind, data = panel
    if kind == "matrix":
        import numpy as np

        values = np.array([[np.nan if v is None else v for v in row] for row in data])
        image = ax.imshow(values, cmap="viridis", origin="lower", aspect="auto")
        ax.set_xlabel("state j (0: embedding output)", fontsize=7)
        ax.set_ylabel("block (1-based)", fontsize=7)
        ax.set_yticks(range(len(data)))
        ax.set_yticklabels(range(1, len(data) + 1))
        ax.figure.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
    else:
        names = list(data)[:24]  # the first ones: a panel, not a table (all in analysis.json)
        ax.barh(range(len(names)), [data[n] for n in names])
        ax.set_yticks(range(len(names)))
        ax.set_yticklabels(names, fontsize=5)
        ax.invert_yaxis()
    ax.set_title(f"{label}: {title}", fontsize=8)
