#!/usr/bin/env python3
"""Training and validation curves of several fairseq runs, from their ``--log-format json`` logs.

    python scripts/plot_curves.py run1/train.log run2/train.log --labels A,B --out curves.png \\
        [--nats] [--metric nll_loss] [--json curves.json]

Reads the ``train_inner`` records (training loss every ``--log-interval`` updates) and the
``valid`` records (validation loss after each epoch or ``--validate-interval-updates``) that
fairseq-train prints with ``--log-format json`` (to stdout or ``--log-file``), and draws loss
against updates: one colour per run, training solid, validation dashed with markers. fairseq logs
losses in bits (base 2); ``--nats`` converts them (x ln 2). Without matplotlib, ``--json`` still
writes the curves.
"""
import argparse
import json
import os
import sys

from layerlab.curves import curves_for, plot


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("logs", nargs="+", help="fairseq-train logs written with --log-format json")
    p.add_argument("--labels", help="comma-separated, one per log (default: the log's folder)")
    p.add_argument("--out", help="PNG to write")
    p.add_argument("--json", help="also write the curves as JSON here")
    p.add_argument("--nats", action="store_true", help="convert fairseq's bits to nats")
    p.add_argument("--metric", choices=("loss", "nll_loss"), default="loss",
                   help="nll_loss: the cross-entropy alone where the criterion logs it "
                        "(label smoothing and embedding losses left out)")
    p.add_argument("--title")
    args = p.parse_args(argv)
    labels = (args.labels.split(",") if args.labels
              else [os.path.basename(os.path.dirname(os.path.abspath(x))) for x in args.logs])
    if len(labels) != len(args.logs):
        p.error(f"--labels has {len(labels)} names for {len(args.logs)} logs")
    curves = curves_for(args.logs, args.nats, args.metric)
    empty = [log for log, c in zip(args.logs, curves) if not c["train"] and not c["valid"]]
    if empty:
        p.error(f"no train_inner/valid records in {', '.join(empty)}: train with "
                "--log-format json (and a --log-interval below the number of updates)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(zip(labels, curves)), f, indent=1)
    if args.out:
        plot(curves, labels, args.out, "nats" if args.nats else "bits", args.title, args.metric)
    if not (args.out or args.json):
        p.error("nothing to write: give --out and/or --json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
