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


def _weight_matrix(weights):
    """{key: value} -> (matrix, row labels, column labels) when the keys index a matrix
    (``k<i>_s<j>``: AttnRes's mean weight of sub-layer i on source j; ``averages.<i>.s<j>``:
    DWA's; ``b<i>_lambda<j>``: value residual's), else None."""
    import re

    import numpy as np

    cells = {}
    for key, value in weights.items():
        match = re.search(r"(?:k|averages\.|b)(\d+)[._](?:s|lambda)(\d+)$", key)
        if match is None:
            return None
        cells[(int(match.group(1)), int(match.group(2)))] = value
    rows = sorted({i for i, _ in cells})
    cols = sorted({j for _, j in cells})
    matrix = np.full((len(rows), len(cols)), np.nan)
    for (i, j), value in cells.items():
        matrix[rows.index(i), cols.index(j)] = value
    return matrix, rows, cols


def connection_weights(panels, out, title=None):
    """One panel per (label, {weight name: value}): a heatmap where the names index a matrix
    (per sub-layer or block, per source state: AttnRes, DWA, value residual), else a bar per
    weight (Hyper-Connections' and mHC's read / write / keep weights, MUDD's static weights)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [(label, weights) for label, weights in panels if weights]
    if not panels:
        return False
    fig, axes = plt.subplots(len(panels), 1, figsize=(8, 2.6 * len(panels)), squeeze=False)
    for ax, (label, weights) in zip(axes[:, 0], panels):
        found = _weight_matrix(weights)
        if found is not None:
            matrix, rows, cols = found
            image = ax.imshow(matrix, aspect="auto", cmap="viridis")
            ax.set_yticks(range(len(rows)))
            ax.set_yticklabels(rows, fontsize=6)
            ax.set_xticks(range(len(cols)))
            ax.set_xticklabels(cols, fontsize=6)
            ax.set_xlabel("source (0: the embedding output)", fontsize=7)
            ax.set_ylabel("sub-layer / block", fontsize=7)
            fig.colorbar(image, ax=ax)
        else:
            names = list(weights)
            ax.bar(range(len(names)), [weights[n] for n in names], color="#9ecae1",
                   edgecolor="#3182bd")
            ax.set_xticks(range(len(names)))
            ax.set_xticklabels(names, rotation=90, fontsize=5)
            ax.grid(axis="y", alpha=0.3)
        ax.set_title(label, fontsize=8)
    if title:
        fig.suptitle(title, fontsize=9)
    # keep a strip at the top for the title (tight_layout alone puts the first panel under it)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.3 / (2.6 * len(panels))) if title else None)
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return True


def layer_profiles(rows, out, title=None, offsets=None):
    """What the layers of several models hold, one line per model (label, the ``analyses``
    entry of ``scripts/analyze_layers.py``'s JSON), three panels: the logit lens (bits per
    token when each block's output in the decoder stack is read out by the final norm and the
    output layer), the CKA between consecutive states of that stack, and the
    relative norm of each block's update (its sub-layers' summed). ``offsets`` {label: blocks
    below the decoder stack} places a stack that sits on another (``ar_encdec_lm``'s decoder on
    its encoder) at its depth in the model. False when no row has an analysis."""
    import math

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    rows = [(label, a) for label, a in rows if a]
    if not rows:
        return False
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    looks = _row_styles([label for label, _ in rows])
    for label, analysis in rows:
        style = dict(marker="o", markersize=3, linewidth=1, label=label, **looks[label])
        below = (offsets or {}).get(label, 0)
        lens = analysis["logit_lens"]  # from block 1's output (the embedding's is far off)
        axes[0].plot([below + i for i in lens["layers"][1:]],
                     [n / math.log(2) for n in lens["cross_entropy"][1:]], **style)
        side = "decoder" if "decoder" in analysis["cka"] else next(iter(analysis["cka"]))
        cka = analysis["cka"][side]  # states x states
        axes[1].plot([below + i for i in range(1, len(cka))],
                     [cka[i - 1][i] for i in range(1, len(cka))], **style)
        updates = analysis["updates"].get(side, {})
        blocks = sorted(updates, key=int)
        axes[2].plot([below + int(b) for b in blocks], [sum(updates[b].values()) for b in blocks],
                     **style)
    axes[0].set(xlabel="block whose output is read out", ylabel="bits per token",
                title="logit lens")
    axes[1].set(xlabel="block l (CKA of states l-1 and l)", ylabel="linear CKA",
                title="similarity of consecutive states")
    axes[2].set(xlabel="block", ylabel="sum over sub-layers of ||update|| / ||block input||",
                title="update norms", yscale="log")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes[2].legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    return _save(fig, out, title)


def _row_styles(labels):
    """{label: its colour and line style}, in the order given: tab20's colours (a dark and a
    light shade of each hue), the labels after the tenth dashed, a second cue beside the colour
    in a figure of many rows."""
    import matplotlib.pyplot as plt

    colours = plt.get_cmap("tab20")
    return {label: dict(color=colours(k % 20), linestyle="-" if k < 10 else "--")
            for k, label in enumerate(labels)}


def _save(fig, out, title=None):
    """Title, layout, ``out`` written (its folder made), the figure closed -> True."""
    import matplotlib.pyplot as plt

    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return True


def curve_differences(panels, out, title=None, ylabel="Δ validation bits vs the baseline"):
    """Learning curves as differences from a baseline: one panel per (label, {row: (updates,
    mean, low, high)}), each row a line (its mean over seeds) with a band (``low`` .. ``high``,
    e.g. the seeds' range), a dotted zero line (the baseline). A row has one colour and line
    style in every panel (panels may hold different rows: a deeper depth with fewer finished),
    and the one legend, beside the last panel, names every row of every panel. False when no
    panel has a row."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [(label, rows) for label, rows in panels if rows]
    if not panels:
        return False
    order = list(dict.fromkeys(row for _, rows in panels for row in rows))  # first seen first
    style = _row_styles(order)
    fig, axes = plt.subplots(1, len(panels), figsize=(7 * len(panels), 4.8), squeeze=False)
    handles = {}
    for ax, (label, rows) in zip(axes[0], panels):
        for row, (updates, mean, low, high) in rows.items():
            (line,) = ax.plot(updates, mean, marker="o", markersize=3, linewidth=1, label=row,
                              **style[row])
            handles.setdefault(row, line)
            ax.fill_between(updates, low, high, color=style[row]["color"], alpha=0.15,
                            linewidth=0)
        ax.axhline(0, color="black", linestyle=":", linewidth=1)
        ax.set(xlabel="updates", ylabel=ylabel, title=label)
        ax.grid(alpha=0.3)
    axes[0][-1].legend([handles[row] for row in order], order, fontsize=6, loc="upper left",
                       bbox_to_anchor=(1.02, 1.0))
    return _save(fig, out, title)
