#!/usr/bin/env python3
"""COGS (Kim & Linzen, 2020) -> fairseq binaries with a joined dictionary.

    python scripts/prepare/cogs.py [--from DIR] [--splits train,dev,test,gen_dev]

Reads the release's tab-separated files (sentence, logical form, generalisation category),
checks the published sizes (train 24,155, dev 3,000, test 3,000, gen 21,000) and writes
``data/cogs/<subset>.{in,out,cat}`` (sentence, logical form, category; one example per line)
and ``data-bin/cogs`` with fairseq subsets train, valid (= dev) and, in this order, test,
gen and gen_dev as test, test1, test2 (those of them prepared; the script prints which is
which). The ``.cat`` files give per-category exact match:

    python scripts/score_exact_match.py gen.txt --categories data/cogs/gen_dev.cat

``gen_dev`` (the default instead of ``gen``) is the part of the generalization set this
project develops and chooses on: 143 examples of each of its 21 categories, every seventh line
of a category from its first (3,003), read as ``gen_dev.tsv`` from ``--from`` where it is
there, else taken so from the release's ``gen.tsv``. The rest of the generalization set is not
used in the project's comparisons.
"""
import os
import sys

from layerlab import prepare as common

URL = "https://raw.githubusercontent.com/najoungkim/COGS/main/data/{}.tsv"
SIZES = {"train": 24155, "dev": 3000, "test": 3000, "gen": 21000, "gen_dev": 3003}
SUBSET = {"train": "train", "dev": "valid", "test": "test", "gen": "gen", "gen_dev": "gen_dev"}
TESTS = ("test", "gen", "gen_dev")  # fairseq's test, test1, test2, in this order
# gen_dev: every GEN_DEV_STRIDE-th example of each of the generalization set's categories
GEN_CATEGORIES, GEN_PER_CATEGORY, GEN_DEV_STRIDE = 21, 1000, 7


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


def gen_dev_rows(gen_rows, origin="gen.tsv"):
    """gen_dev from the generalization set's rows: each category's examples in file order,
    every seventh from its first (143 of 1,000), categories in order of first appearance."""
    by_category = {}
    for row in gen_rows:
        by_category.setdefault(row[2], []).append(row)
    counts = {cat: len(rows) for cat, rows in by_category.items()}
    if len(counts) != GEN_CATEGORIES or set(counts.values()) != {GEN_PER_CATEGORY}:
        raise common.PrepareError(f"{origin}: expected {GEN_CATEGORIES} categories of "
                                  f"{GEN_PER_CATEGORY} examples, found {len(counts)} "
                                  f"({', '.join(f'{c} {n}' for c, n in counts.items())})")
    return [row for rows in by_category.values() for row in rows[::GEN_DEV_STRIDE]]


def check_gen_dev(rows, origin):
    counts = {}
    for row in rows:
        counts[row[2]] = counts.get(row[2], 0) + 1
    per = -(-GEN_PER_CATEGORY // GEN_DEV_STRIDE)
    if len(counts) != GEN_CATEGORIES or set(counts.values()) != {per}:
        raise common.PrepareError(f"{origin}: expected {GEN_CATEGORIES} categories of {per} "
                                  f"examples, found {len(counts)} with "
                                  f"{sorted(set(counts.values()))}")


def read_gen_dev(from_dir, download):
    """gen_dev's rows: ``gen_dev.tsv`` from ``from_dir`` where it is there, else every seventh
    example of each category of ``gen.tsv`` (from ``from_dir`` or downloaded)."""
    if from_dir and os.path.isfile(os.path.join(from_dir, "gen_dev.tsv")):
        path = common.fetch("gen_dev.tsv", None, from_dir, download)
        rows = read_split(path, "gen_dev")
    else:
        path = common.fetch("gen.tsv", URL.format("gen"), from_dir, download)
        rows = gen_dev_rows(read_split(path, "gen"), common.origin(path))
    check_gen_dev(rows, common.origin(path))
    return rows


def main(argv=None):
    p = common.base_parser(__doc__.split("\n\n")[0], "cogs")
    p.add_argument("--splits", default="train,dev,test,gen_dev",
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
            if split == "gen_dev":
                rows = read_gen_dev(args.from_dir, download)
            else:
                path = common.fetch(f"{split}.tsv", URL.format(split), args.from_dir, download)
                rows = read_split(path, split)
            for suffix, column in (("in", 0), ("out", 1), ("cat", 2)):
                common.write_lines(os.path.join(text, f"{SUBSET[split]}.{suffix}"),
                                   [r[column] for r in rows])
            print(f"cogs/{split}: {len(rows)} examples")
        tested = [s for s in TESTS if s in splits]
        tests = [os.path.join(text, SUBSET[s]) for s in tested]
        # binarise from the temporary directory, then both directories appear together
        common.binarize_translation(args.dest_dir, "in", "out", os.path.join(text, "train"),
                                    os.path.join(text, "valid"), tests, joined=True,
                                    workers=args.workers)
    names = [f"{'test' + (str(i) if i else '')}={s}" for i, s in enumerate(tested)]
    print(f"cogs: text -> {args.out_dir}, binaries -> {args.dest_dir} "
          f"(subsets: train, valid=dev{''.join(', ' + n for n in names)})")
    return 0


if __name__ == "__main__":
    sys.exit(common.run_main(main, "cogs.py"))
