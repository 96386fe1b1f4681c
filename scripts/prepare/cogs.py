#!/usr/bin/env python3
"""COGS (Kim & Linzen, 2020) -> fairseq binaries with a joined dictionary.

    python scripts/prepare/cogs.py [--from DIR] [--splits train,dev,test,gen]

Reads the release's tab-separated files (sentence, logical form, generalisation category),
checks the published sizes (train 24,155, dev 3,000, test 3,000, gen 21,000) and writes
``data/cogs/<subset>.{in,out,cat}`` (sentence, logical form, category; one example per line)
and ``data-bin/cogs`` with fairseq subsets train, valid (= dev), test, and test1 (= gen).
The ``.cat`` files give per-category exact match:

    python scripts/score_exact_match.py gen.txt --categories data/cogs/gen.cat
"""
import os
import sys

from layerlab import prepare as common

URL = "https://raw.githubusercontent.com/najoungkim/COGS/main/data/{}.tsv"
SIZES = {"train": 24155, "dev": 3000, "test": 3000, "gen": 21000}
SUBSET = {"train": "train", "dev": "valid", "test": "test", "gen": "gen"}


def read_split(path, split):
    rows = common.read_lines(path, expected=SIZES[split])
    out = []
    for i, row in enumerate(rows, 1):
        fields = row.split("\t")
        if len(fields) != 3 or not all(f.strip() for f in fields):
            raise common.PrepareError(f"{common.origin(path)}:{i}: expected 3 tab-separated "
                                      "fields (sentence, logical form, category)")
        out.append(fields)
    return out


def main(argv=None):
    p = common.base_parser(__doc__.split("\n\n")[0], "cogs")
    p.add_argument("--splits", default="train,dev,test,gen",
                   help="splits to prepare (train and dev are required)")
    args = p.parse_args(argv)
    splits = args.splits.split(",")
    for s in splits:
        if s not in SIZES:
            raise common.PrepareError(f"unknown COGS split {s!r}; choose from {', '.join(SIZES)}")
    if "train" not in splits or "dev" not in splits:
        raise common.PrepareError("--splits must include train and dev")
    config = {"dataset": "cogs", "splits": splits}
    if common.already_prepared(args.out_dir, args.dest_dir, config, args.force):
        return 0
    with common.preparing(args.out_dir, config) as (text, download):
        for split in splits:
            path = common.fetch(f"{split}.tsv", URL.format(split), args.from_dir, download)
            rows = read_split(path, split)
            for suffix, column in (("in", 0), ("out", 1), ("cat", 2)):
                common.write_lines(os.path.join(text, f"{SUBSET[split]}.{suffix}"),
                                   [r[column] for r in rows])
            print(f"cogs/{split}: {len(rows)} examples")
        tests = [os.path.join(text, SUBSET[s]) for s in ("test", "gen") if s in splits]
        # binarise from the temporary directory, then both directories appear together
        common.binarize_translation(args.dest_dir, "in", "out", os.path.join(text, "train"),
                                    os.path.join(text, "valid"), tests, joined=True,
                                    workers=args.workers)
    print(f"cogs: text -> {args.out_dir}, binaries -> {args.dest_dir} "
          f"(subsets: train, valid=dev{', test' if 'test' in splits else ''}"
          f"{', test1=gen' if 'gen' in splits and 'test' in splits else ''})")
    return 0


if __name__ == "__main__":
    sys.exit(common.run_main(main, "cogs.py"))
