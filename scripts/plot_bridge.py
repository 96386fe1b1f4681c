#!/usr/bin/env python3
"""Heatmap of a bridge: how strongly each decoder layer reads each encoder layer.

    python scripts/plot_bridge.py checkpoint.pt [more.pt ...] --out bridge.png [--json norms.json]

For every checkpoint with a bridge, plots an N_dec x N matrix (rows: decoder layers 1..N_dec,
columns: encoder layers, h_0 first when the embedding is included), side by side: for --bridge fc
the Frobenius norms of the d x d blocks of the bridge weights, so that the original init (last
column), GCA (anti-diagonal) and learned connections can be compared by eye; for --bridge
transparent the softmax weights each decoder layer puts on h_0 .. h_N (rows sum to 1).
"""
import argparse
import json
import logging
import os
import sys

# fairseq's text_to_speech task calls logging.basicConfig(level=INFO) when fairseq is imported;
# configuring logging first makes that a no-op, so errors stay one line on stderr
logging.basicConfig(level=logging.WARNING, format="%(message)s")


def bridge_norms(path):
    """(N_dec x N norms as nested lists, first encoder layer index) of a checkpoint's bridge."""
    import torch

    from fairseq_plugins.modules.layer_bridge import block_norms  # also allow-lists checkpoints

    from fairseq_plugins.modules.transparent_attention import TransparentAttention

    state = torch.load(path, map_location="cpu")
    weight = state["model"].get("encoder.bridge.weight")
    if weight is None:
        raise ValueError(f"{path} has no bridge (encoder.bridge.weight); train with --bridge fc "
                         "or transparent")
    if weight.dim() == 2:  # transparent attention: N_dec x (N + 1) logits
        transparent = TransparentAttention(weight.size(1), weight.size(0))
        transparent.weight.data.copy_(weight)
        return transparent.combination_weights().tolist(), 0
    norms = block_norms(weight)
    args = state.get("args") or state["cfg"]["model"]
    with_embedding = bool(getattr(args, "bridge_include_embedding", None)
                          if not isinstance(args, dict) else args.get("bridge_include_embedding"))
    return norms.tolist(), 0 if with_embedding else 1


def plot(panels, out):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(panels), figsize=(3.2 * len(panels) + 1, 3.4), squeeze=False)
    for ax, (title, norms, first) in zip(axes[0], panels):
        image = ax.imshow(norms, cmap="viridis", aspect="auto")
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("encoder layer")
        ax.set_ylabel("decoder layer")
        ax.set_xticks(range(len(norms[0])), [str(first + k) for k in range(len(norms[0]))])
        ax.set_yticks(range(len(norms)), [str(i + 1) for i in range(len(norms))])
        fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04,
                     label="block norm (fc) / weight (transparent)")
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("checkpoints", nargs="+")
    p.add_argument("--out", required=True, help="PNG to write")
    p.add_argument("--titles", help="comma-separated panel titles (default: file names)")
    p.add_argument("--json", help="also write the norms as JSON")
    args = p.parse_args(argv)
    titles = args.titles.split(",") if args.titles else [
        os.path.basename(os.path.dirname(os.path.abspath(c))) + "/" + os.path.basename(c)
        for c in args.checkpoints]
    if len(titles) != len(args.checkpoints):
        p.error("--titles needs one title per checkpoint")
    try:
        panels = [(t, *bridge_norms(c)) for t, c in zip(titles, args.checkpoints)]
        plot(panels, args.out)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({t: {"norms": n, "first_encoder_layer": first}
                           for t, n, first in panels}, f, indent=2)
    except (OSError, ValueError, KeyError) as e:
        print(f"plot_bridge.py: error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
