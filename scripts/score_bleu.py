#!/usr/bin/env python3
"""Corpus BLEU with sacreBLEU for fairseq-generate output (the papers' two recipes).

    # De-En: detokenised output (fairseq-generate ... --bpe sentencepiece, D- lines), 13a
    python scripts/score_bleu.py gen.txt --ref newstest2016.en
    # CoGnition Chinese: BPE and spaces removed from hypotheses, raw references, --tokenize zh
    python scripts/score_bleu.py gen.txt --ref cg-test/cg-test.zh --cognition-zh

HYP is a fairseq-generate log (re-ordered by sample id; D- lines) or a plain file, one line per
reference. --tokenize overrides sacreBLEU's tokeniser. --json prints score and signature.
"""
import argparse
import json
import logging
import sys

# fairseq's text_to_speech task calls logging.basicConfig(level=INFO) when fairseq is imported;
# configuring logging first makes that a no-op, so errors stay one line on stderr
logging.basicConfig(level=logging.WARNING, format="%(message)s")
from fairseq_plugins.metrics.bleu import corpus_bleu  # noqa: E402
from fairseq_plugins.metrics.generate_log import (  # noqa: E402
    GenerateLogError,
    add_format_arg,
    read_hypotheses,
    read_lines,
)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("hyp", help="fairseq-generate log or plain hypotheses in reference order")
    p.add_argument("--ref", required=True, help="reference file, one line per sample")
    p.add_argument("--cognition-zh", action="store_true",
                   help="CoGnition recipe: strip '@@ ' and spaces from hypotheses, --tokenize zh")
    p.add_argument("--tokenize", help="sacreBLEU tokeniser (default 13a; zh with --cognition-zh)")
    p.add_argument("--json", action="store_true")
    add_format_arg(p)
    args = p.parse_args(argv)
    try:
        refs = read_lines(args.ref)
        hyps = read_hypotheses(args.hyp, len(refs), args.ref, args.format)
        result = corpus_bleu(hyps, refs, cognition_zh=args.cognition_zh, tokenize=args.tokenize)
    except (OSError, ValueError, GenerateLogError) as e:
        print(f"score_bleu.py: error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(result, indent=2) if args.json else f"{result['text']}\n{result['signature']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
