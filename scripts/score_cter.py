#!/usr/bin/env python3
"""CoGnition CTER (compound translation error rate) of cg-test translations.

    python scripts/score_cter.py HYP --compound cg-test.compound --lexicon lexicon \
        [--source cg-test.en] [--strict] [--json]

HYP is a fairseq-generate log (re-ordered by sample id; give --required-batch-size-multiple 1 so
no sentence is dropped) or a plain file with one translation per line in cg-test order. BPE markers
("@@ ") and spaces are removed before matching. Prints instance and aggregate CTER overall and,
for the full 10,800-line cg-test, per NP / VP / PP. Default: the official tool's definition,
quirks included; --strict fixes the documented lexicon quirks (see fairseq_plugins/metrics/cter.py).
"""
import argparse
import json
import logging
import sys

# fairseq's text_to_speech task calls logging.basicConfig(level=INFO) when fairseq is imported;
# configuring logging first makes that a no-op, so errors stay one line on stderr
logging.basicConfig(level=logging.WARNING, format="%(message)s")
from fairseq_plugins.metrics.cter import CterInputError, cter, read_lexicon  # noqa: E402
from fairseq_plugins.metrics.generate_log import (  # noqa: E402
    GenerateLogError,
    add_format_arg,
    read_hypotheses,
    read_lines,
)


def check_sources(compounds, source_path):
    sources = read_lines(source_path)
    if len(sources) != len(compounds):
        raise CterInputError(f"{source_path}: {len(sources)} lines, the compound file has "
                             f"{len(compounds)}")
    for i, (src, comp) in enumerate(zip(sources, compounds), 1):
        if comp.strip() not in src:
            raise CterInputError(f"{source_path}:{i}: compound {comp.strip()!r} is not in the "
                                 "source sentence (files not aligned?)")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("hyp", help="fairseq-generate log or plain translations, cg-test order")
    p.add_argument("--compound", required=True, help="cg-test.compound (one compound per line)")
    p.add_argument("--lexicon", required=True, help="CoGnition lexicon (english<TAB>zh/zh...)")
    p.add_argument("--source", help="cg-test.en: checks every compound occurs in its sentence")
    p.add_argument("--strict", action="store_true", help="fix the official tool's lexicon quirks")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    add_format_arg(p)
    args = p.parse_args(argv)
    try:
        compounds = read_lines(args.compound)
        if not compounds or len(compounds) % 5:
            raise CterInputError(f"{args.compound}: {len(compounds)} lines is not a positive "
                                 "multiple of 5 (cg-test has 5 consecutive contexts per compound)")
        lexicon = read_lexicon(args.lexicon, strict=args.strict)
        if args.source:
            check_sources(compounds, args.source)
        hyps = read_hypotheses(args.hyp, len(compounds), args.compound, args.format)
        result = cter(compounds, hyps, lexicon)
    except (OSError, CterInputError, GenerateLogError) as e:
        print(f"score_cter.py: error: {e}", file=sys.stderr)
        return 2
    result["mode"] = "strict" if args.strict else "official"
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"CTER ({result['mode']} definition)")
    for name, r in result.items():
        if isinstance(r, dict):
            print(f"  {name:>3}: instance {r['instance']:.3f}%  aggregate {r['aggregate']:.3f}%  "
                  f"({r['instances']} instances, {r['compounds']} compounds)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
