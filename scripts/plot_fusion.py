#!/usr/bin/env python3
"""Fuse-attention weight heatmaps: which previous layer each layer attends to.

    python scripts/plot_fusion.py checkpoint.pt --data DATA_BIN [--subset valid] \\
        [--max-sentences 256] --out fusion.png [--json weights.json]

Runs the checkpoint (a ``layerwise_transformer`` with fusion) teacher-forced over the first
``--max-sentences`` sentences of a subset of its data-bin with the weights recorded, and averages
them over sentences, heads and non-padding positions. One heatmap per fused stack: row l = layer l
(1-based), column k = the state it reads (h_0 = the embedding output, h_k = layer k's output),
cells above the diagonal empty (layer l sees h_0..h_{l-1} only).
"""
import argparse
import json
import logging
import os
import sys

logging.basicConfig(level=logging.WARNING, format="%(message)s")


def mean_weights(checkpoint, data, subset="valid", max_sentences=256):
    """{'encoder' | 'decoder': N x N nested lists (NaN above the diagonal / unfused layers)}."""
    import torch
    from fairseq import checkpoint_utils, utils

    plugin_dir = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                              "fairseq_plugins")
    utils.import_user_module(argparse.Namespace(user_dir=plugin_dir))
    models, _cfg, task = checkpoint_utils.load_model_ensemble_and_task(
        [checkpoint], arg_overrides={"data": data})
    model = models[0].eval()
    if not hasattr(model, "record_fusion_weights"):
        raise SystemExit(f"{checkpoint}: not a layerwise_transformer (no fuse-attention)")
    task.load_dataset(subset)
    dataset = task.dataset(subset)
    batches = task.get_batch_iterator(dataset, max_sentences=64, required_batch_size_multiple=1,
                                      num_workers=0).next_epoch_itr(shuffle=False)
    pad = task.source_dictionary.pad()
    sums, counts, seen = {}, {}, 0
    model.record_fusion_weights()
    with torch.no_grad():
        for sample in batches:
            net = sample["net_input"]
            model(**net)
            masks = {"encoder": net["src_tokens"].ne(pad),
                     "decoder": net["prev_output_tokens"].ne(task.target_dictionary.pad())}
            for side, layers in model.fusion_weights().items():
                for layer, w in layers.items():  # B x H x T x L
                    mask = masks[side][:, None, :, None].to(w.dtype)
                    key = (side, layer)
                    sums[key] = sums.get(key, 0) + (w * mask).sum(dim=(0, 1, 2))
                    counts[key] = counts.get(key, 0) + mask.sum() * w.size(1)
            seen += net["src_tokens"].size(0)
            if seen >= max_sentences:
                break
    out = {}
    for side in ("encoder", "decoder"):
        layers = sorted(layer for s, layer in sums if s == side)
        if not layers:
            continue
        n = max(layers) + 1
        grid = [[float("nan")] * n for _ in range(n)]
        for layer in layers:
            mean = (sums[(side, layer)] / counts[(side, layer)]).tolist()
            offset = layer + 1 - len(mean)  # 1 without h_0
            for k, value in enumerate(mean):
                grid[layer][k + offset] = value
        out[side] = grid
    if not out:
        raise SystemExit(f"{checkpoint}: no fuse-attention weights were recorded (no fusion?)")
    return out


def plot(weights, out, title=None):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, axes = plt.subplots(1, len(weights), figsize=(4.2 * len(weights), 3.8), squeeze=False)
    for ax, (side, grid) in zip(axes[0], weights.items()):
        a = np.array(grid, dtype=float)
        im = ax.imshow(a, cmap="viridis", vmin=0, vmax=1)
        n = a.shape[0]
        ax.set(xticks=range(n), xticklabels=[f"h{k}" for k in range(n)], yticks=range(n),
               yticklabels=[f"layer {i + 1}" for i in range(n)], title=f"{side} fuse-attention",
               xlabel="state attended to")
        for i in range(n):
            for k in range(n):
                if not np.isnan(a[i, k]):
                    ax.text(k, i, f"{a[i, k]:.2f}", ha="center", va="center", fontsize=7,
                            color="white" if a[i, k] < 0.5 else "black")
        fig.colorbar(im, ax=ax, fraction=0.046)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("checkpoint")
    p.add_argument("--data", required=True, help="the data-bin the model was trained on")
    p.add_argument("--subset", default="valid")
    p.add_argument("--max-sentences", type=int, default=256)
    p.add_argument("--out", help="PNG")
    p.add_argument("--json", help="also write the mean weights here")
    p.add_argument("--title")
    args = p.parse_args(argv)
    if not (args.out or args.json):
        p.error("nothing to write: give --out and/or --json")
    weights = mean_weights(args.checkpoint, args.data, args.subset, args.max_sentences)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(weights, f, indent=1)
    if args.out:
        plot(weights, args.out, args.title)
    return 0


if __name__ == "__main__":
    sys.exit(main())
