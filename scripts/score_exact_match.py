#!/usr/bin/env python3
"""Exact-match accuracy of a fairseq-generate log (SCAN, COGS, CFQ).

    fairseq-generate data-bin/scan-simple --user-dir $PWD/fairseq_plugins --path ckpt.pt \
        --gen-subset test --beam 5 --required-batch-size-multiple 1 > gen.txt
    python scripts/score_exact_match.py gen.txt [--ref test.out] [--categories cats.txt] [--json]

Hypotheses are taken in sample-id order (D- lines, i.e. detokenised, when present) from a
fairseq-generate log, recognised by its scored H-/D- lines, or else line by line from a plain file
(``--format {auto,log,plain}`` overrides the guess); references from ``--ref`` (one per line, in
the original order) or else the log's T- lines. With
``--categories`` (one label per line, e.g. COGS's third column) accuracy is also given per label.
"""
import argparse
import json
import logging
import sys

# fairseq's text_to_speech task calls logging.basicConfig(level=INFO) when fairseq is imported;
# configuring logging first makes that a no-op, so errors stay one line on stderr
logging.basicConfig(level=logging.WARNING, format="%(message)s")
from fairseq_plugins.metrics.exact_match import exact_match  # noqa: E402
from fairseq_plugins.metrics.generate_log import (  # noqa: E402
    GenerateLogError,
    add_format_arg,
    read_generate_log,
    read_hypotheses,
    read_lines,
    resolve_format,
)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("log", help="fairseq-generate output, or plain hypotheses (one per line, in "
                   "reference order; needs --ref)")
    p.add_argument("--ref", help="reference file, one line per sample in original order")
    p.add_argument("--categories", help="category label per sample, one per line")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    add_format_arg(p)
    args = p.parse_args(argv)
    try:
        refs = read_lines(args.ref) if args.ref else None
        if refs is not None:
            hyps = read_hypotheses(args.log, len(refs), args.ref, args.format)
        elif resolve_format(args.log, args.format) == "plain":
            raise ValueError(f"{args.log} is a plain hypothesis file (no scored H-/D- lines "
                             "of a fairseq-generate log): pass --ref")
        else:
            log = read_generate_log(args.log)
            hyps, refs = log["hypotheses"], log["references"]
            if not refs:
                raise ValueError(f"{args.log} has no T- lines: pass --ref")
        cats = read_lines(args.categories) if args.categories else None
        result = exact_match(hyps, refs, cats)
    except (OSError, ValueError, GenerateLogError) as e:
        print(f"score_exact_match.py: error: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"exact match: {result['exact_match']:.2f}% ({result['correct']}/{result['total']})")
        for cat, r in result.get("per_category", {}).items():
            print(f"  {cat}: {r['exact_match']:.2f}% ({r['correct']}/{r['total']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
