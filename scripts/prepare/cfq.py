#!/usr/bin/env python3
"""CFQ (Keysers et al., 2020) -> MCD1/MCD2/MCD3 or random split, in Google's preprocessed form.

    python scripts/prepare/cfq.py --split mcd1 [--from DIR]
    python scripts/prepare/cfq.py --split mcd1 --preprocessed-from DIR

From the release ``cfq1.1.tar.gz`` (downloaded, or taken from ``--from DIR``; the extracted
``cfq/`` folder in DIR works too): ``dataset.json`` and ``splits/<split>.json`` (train/dev/test
indices). Each example becomes Google's preprocessed pair, the form the papers train on:
the question with entities already masked (``questionPatternModEntities``, M0..M9) with every
punctuation character split off as a token; the SPARQL query (``sparqlPatternModEntities``) with
``count(*)`` spaced out as ``count ( * )``, the ``ns:`` prefix removed from tokens that start with
it and ``m.`` entity ids written ``m_...``. ``--preprocessed-from DIR`` takes files already in
that form instead (``{train,dev,test}_{encode,decode}.txt``, e.g. the TFDS export; test optional).

The published sizes are checked (MCD1/2/3: train 95,743, dev 11,968, test 11,968;
``--no-check-sizes`` for subsets). Writes ``data/cfq-<split>/{train,valid,test}.{in,out}`` and
``data-bin/cfq-<split>`` (joined dictionary; valid = dev). Score with exact match:

    fairseq-generate data-bin/cfq-mcd1 --user-dir ... --gen-subset test > gen.txt
    python scripts/score_exact_match.py gen.txt
"""
import argparse
import json
import os
import string
import sys
import tarfile

from layerlab import prepare as common

URL = "https://storage.googleapis.com/cfq_dataset/cfq1.1.tar.gz"
ARCHIVE = "cfq1.1.tar.gz"
SPLITS = ("mcd1", "mcd2", "mcd3", "random")
MCD_SIZES = {"train": 95743, "dev": 11968, "test": 11968}
SUBSET = {"train": "train", "dev": "valid", "test": "test"}
PUNCTUATION = set(string.punctuation)


def tokenize_question(text):
    """Every ASCII punctuation character becomes a token of its own; whitespace normalised."""
    spaced = "".join(f" {c} " if c in PUNCTUATION else c for c in text)
    return " ".join(spaced.split())


def tokenize_sparql(query):
    """Google's SPARQL preprocessing (see the module doc)."""
    query = query.replace("count(*)", "count ( * )").replace("\\n", " ")
    tokens = []
    for token in query.split():
        if token.startswith("ns:"):
            token = token[len("ns:"):]
        if token.startswith("m."):
            token = "m_" + token[len("m."):]
        tokens.append(token)
    return " ".join(tokens)


def _open_release(from_dir, download):
    """(load(member) -> parsed JSON) over the release archive or an extracted cfq/ folder."""
    if from_dir and os.path.isdir(os.path.join(from_dir, "cfq")):
        root = os.path.join(from_dir, "cfq")

        def load(member):
            path = os.path.join(root, member)
            if not os.path.isfile(path):
                raise common.PrepareError(f"{path}: not found in the extracted release")
            with open(path, encoding="utf-8") as f:
                return _parse(f.read(), path)
        return load
    path = common.fetch(ARCHIVE, URL, from_dir, download)
    try:
        archive = tarfile.open(path, "r:gz")
        names = set(archive.getnames())
    except (tarfile.TarError, EOFError, OSError) as e:
        raise common.PrepareError(f"{common.origin(path)}: not a readable .tar.gz ({e}); "
                                  "truncated or corrupt download?") from None

    def load(member):
        name = f"cfq/{member}"
        if name not in names:
            raise common.PrepareError(f"{common.origin(path)}: has no {name} "
                                      "(not the CFQ release?)")
        try:
            data = archive.extractfile(name).read()
        except (tarfile.TarError, EOFError, OSError) as e:
            raise common.PrepareError(f"{common.origin(path)}: {name} cannot be read ({e}); "
                                      "truncated archive?") from None
        return _parse(data.decode("utf-8"), f"{common.origin(path)}:{name}")
    return load


def _parse(text, where):
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise common.PrepareError(f"{where}: invalid JSON at line {e.lineno} ({e.msg}); "
                                  "truncated file?") from None


def pairs_from_release(load, split):
    """{train|dev|test: [(question, query)]} from dataset.json and splits/<split>.json."""
    indices = load(f"splits/{'random_split' if split == 'random' else split}.json")
    dataset = load("dataset.json")
    out = {}
    for part in ("train", "dev", "test"):
        key = f"{part}Idxs"
        if key not in indices:
            raise common.PrepareError(f"splits/{split}.json has no {key}")
        rows = []
        for idx in indices[key]:
            if not 0 <= idx < len(dataset):
                raise common.PrepareError(f"splits/{split}.json: index {idx} outside "
                                          f"dataset.json ({len(dataset)} examples)")
            example = dataset[idx]
            try:
                rows.append((tokenize_question(example["questionPatternModEntities"]),
                             tokenize_sparql(example["sparqlPatternModEntities"])))
            except KeyError as e:
                raise common.PrepareError(f"dataset.json example {idx}: no field {e}") from None
        out[part] = rows
    return out


def pairs_from_preprocessed(from_dir):
    out = {}
    for part in ("train", "dev", "test"):
        enc, dec = (os.path.join(from_dir, f"{part}_{s}.txt") for s in ("encode", "decode"))
        if part == "test" and not (os.path.exists(enc) or os.path.exists(dec)):
            print(f"cfq: {from_dir} has no test_{{encode,decode}}.txt: no test subset")
            continue
        questions, queries = common.read_lines(enc), common.read_lines(dec)
        common.check_parallel(enc, questions, dec, queries)
        out[part] = list(zip(questions, queries))
    return out


def main(argv=None):
    p = common.base_parser(__doc__.split("\n\n")[0], "cfq")
    p.add_argument("--split", choices=SPLITS, default="mcd1")
    p.add_argument("--preprocessed-from", metavar="DIR",
                   help="already-preprocessed {train,dev,test}_{encode,decode}.txt")
    p.add_argument("--check-sizes", action=argparse.BooleanOptionalAction, default=True,
                   help="check the published MCD sizes (default: on; --no-check-sizes for "
                        "subsets; the random split has no published sizes)")
    args = p.parse_args(argv)
    name = f"cfq-{args.split}"
    if args.out_dir == os.path.join("data", "cfq"):  # one folder per split
        args.out_dir = os.path.join("data", name)
    if args.dest_dir == os.path.join("data-bin", "cfq"):
        args.dest_dir = os.path.join("data-bin", name)
    config = {"dataset": "cfq", "split": args.split,
              "source": "preprocessed" if args.preprocessed_from else "release"}
    if common.already_prepared(args.out_dir, args.dest_dir, config, args.force):
        return 0
    with common.preparing(args.out_dir, config) as (text, download):
        if args.preprocessed_from:
            pairs = pairs_from_preprocessed(args.preprocessed_from)
        else:
            pairs = pairs_from_release(_open_release(args.from_dir, download), args.split)
        for part, rows in pairs.items():
            if args.check_sizes and args.split != "random" and len(rows) != MCD_SIZES[part]:
                raise common.PrepareError(f"cfq {args.split} {part}: {len(rows)} examples, the "
                                          f"release has {MCD_SIZES[part]} (wrong or partial "
                                          "files? --no-check-sizes for subsets)")
            for i, (question, query) in enumerate(rows, 1):
                if not question or not query:
                    raise common.PrepareError(f"cfq {args.split} {part} example {i}: empty "
                                              "question or query")
            common.write_lines(os.path.join(text, f"{SUBSET[part]}.in"), [q for q, _ in rows])
            common.write_lines(os.path.join(text, f"{SUBSET[part]}.out"), [s for _, s in rows])
            print(f"{name}/{part}: {len(rows)} examples")
        tests = [os.path.join(text, "test")] if "test" in pairs else []
        common.binarize_translation(args.dest_dir, "in", "out", os.path.join(text, "train"),
                                    os.path.join(text, "valid"), tests, joined=True,
                                    workers=args.workers)
    print(f"{name}: text -> {args.out_dir}, binaries -> {args.dest_dir} (subsets: train, "
          f"valid=dev{', test' if 'test' in pairs else ''})")
    return 0


if __name__ == "__main__":
    sys.exit(common.run_main(main, "cfq.py"))
