#!/usr/bin/env python3
"""The validation curves of recipe-search runs, as one markdown table and JSON (issue 101's
recipe search: docs/ideas/comparison.md, "Encoder-decoder models").

    python scripts/experiments/recipe_curves.py --run multi30k-d128=LOG:bleu:valid \
        --run cogs-d128=LOG:exact_match:valid,test1 [--json results/NAME.json]

Each ``--run NAME=LOG:METRIC:SUBSETS`` reads one ``fairseq-train --log-format json`` log (a run
stopped part-way reads as far as it got): every validated subset's METRIC by update, with the
epoch, and the run's last update. The table has one line per validation, the subsets side by
side.
"""
import argparse
import json
import sys

from layerlab.fairseq_log import read_curves, records


def run_curves(log, metric, subsets):
    """{subset: [(update, value)]} and {update: epoch} of one log."""
    curves = {subset: read_curves(log, metric, subset)["valid"] for subset in subsets}
    epochs = {}
    for subset in subsets:
        for record in records(log, subset):
            try:
                epochs[int(float(record[f"{subset}_num_updates"]))] = int(record["epoch"])
            except (KeyError, ValueError):
                pass
    return curves, epochs


def parse_run(text):
    name, spec = text.split("=", 1)
    log, metric, subsets = spec.rsplit(":", 2)
    return name, log, metric, subsets.split(",")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--run", action="append", type=parse_run, required=True,
                   metavar="NAME=LOG:METRIC:SUBSETS")
    p.add_argument("--json", help="also write the curves there")
    args = p.parse_args(argv)
    out, lines = {}, []
    for name, log, metric, subsets in args.run:
        curves, epochs = run_curves(log, metric, subsets)
        out[name] = {"log": log, "metric": metric, "curves": curves,
                     "epochs": {str(u): e for u, e in sorted(epochs.items())}}
        lines += [f"### {name} ({metric})", "",
                  "| epoch | update | " + " | ".join(subsets) + " |",
                  "|---:|---:|" + "---:|" * len(subsets)]
        by_update = {subset: dict(curve) for subset, curve in curves.items()}
        for update in sorted(set().union(*(set(c) for c in by_update.values()))):
            lines.append(f"| {epochs.get(update, '')} | {update} | " + " | ".join(
                f"{by_update[s][update]:g}" if update in by_update[s] else "—"
                for s in subsets) + " |")
        lines.append("")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
