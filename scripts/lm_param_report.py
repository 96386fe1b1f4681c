#!/usr/bin/env python3
"""Parameter counts of the language-model presets, counted as the reference counts them.

    python scripts/lm_param_report.py [--vocab-size 50257] [--context 200] [--json]

Tied embedding counted once, the positional table not at all. With a dictionary of exactly 50,257
symbols (GPT-2's BPE) the four reference configurations of the autoregressive encoder-decoder LM
must come out as published; the script prints both and exits 1 on a mismatch.
"""
import argparse
import json
import logging
import sys

logging.basicConfig(level=logging.WARNING)  # fairseq's import would otherwise log at INFO
from fairseq_plugins.inprocess import build_language_model, make_dict  # noqa: E402

EMBEDDING_LOSS = ["--criterion", "lm_embedding_loss", "--embedding-loss", "mse"]
# (row, arch, extra flags, published count with V = 50,257)
CONFIGS = [
    ("AR enc-dec d=150 L=13, with embedding-loss LayerNorms", "ar_encdec_lm_yif", EMBEDDING_LOSS,
     15_763_500),
    ("AR enc-dec d=150 L=13, without them", "ar_encdec_lm_yif", [], 15_762_900),
    ("baseline d=160 L=26", "gpt_baseline_lm_yif", [], 16_036_800),
    ("smaller baseline d=156 L=26", "gpt_baseline_lm_yif_small", [], 15_441_192),
]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--vocab-size", type=int, default=50257,
                   help="dictionary size including fairseq's 4 special symbols")
    p.add_argument("--context", type=int, default=200)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    if args.vocab_size < 5:
        p.error("--vocab-size must be >= 5 (fairseq's 4 special symbols + 1)")
    dictionary = make_dict(args.vocab_size - 4, "w")
    rows = []
    for name, arch, extra, published in CONFIGS:
        model, _, _ = build_language_model(arch, ["--tokens-per-sample", args.context, *extra],
                                           dictionary)
        rows.append({"config": name, "arch": arch, "flags": extra,
                     "parameters": model.reference_parameter_count(),
                     "published": published if args.vocab_size == 50257 else None})
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        for r in rows:
            ref = f" (published {r['published']:,})" if r["published"] else ""
            print(f"{r['config']:<55} {r['arch']:<26} {r['parameters']:>12,}{ref}")
    return int(any(r["published"] and r["published"] != r["parameters"] for r in rows))


if __name__ == "__main__":
    sys.exit(main())
