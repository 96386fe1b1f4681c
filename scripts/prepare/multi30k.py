#!/usr/bin/env python3
"""Multi30k task 1 German-English (Elliott et al., 2016): a small set for quick De-En runs.

    python scripts/prepare/multi30k.py [--from DIR] [--vocab-size 8000]

Reads the release's raw files (train 29,000, val 1,014, test_2016_flickr 1,000,
test_2017_flickr 1,000 sentence pairs; plain or .gz), trains one joint SentencePiece model on
the training set (both languages), and writes ``data/multi30k/``: ``spm.model``, the encoded
``<subset>.{de,en}`` and the raw ``<subset>.raw.{de,en}`` (BLEU references), plus
``data-bin/multi30k`` (joined dictionary; subsets train, valid = val, test = test_2016_flickr,
test1 = test_2017_flickr). Detokenised output for sacreBLEU:

    fairseq-generate data-bin/multi30k ... --bpe sentencepiece \\
        --sentencepiece-model data/multi30k/spm.model > gen.txt
    python scripts/score_bleu.py gen.txt --ref data/multi30k/test.raw.en
"""
import os
import sys

from layerlab import prepare as common

URL = "https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw/{}.gz"
SPLITS = {"train": ("train", 29000), "valid": ("val", 1014), "test": ("test_2016_flickr", 1000),
          "test1": ("test_2017_flickr", 1000)}


def main(argv=None):
    p = common.base_parser(__doc__.split("\n\n")[0], "multi30k")
    p.add_argument("--vocab-size", type=int, default=8000, help="joint SentencePiece vocabulary")
    args = p.parse_args(argv)
    config = {"dataset": "multi30k", "vocab_size": args.vocab_size}
    if common.already_prepared(args.out_dir, args.dest_dir, config, args.force):
        return 0
    with common.preparing(args.out_dir, config) as (text, download):
        raw = {}
        for subset, (name, size) in SPLITS.items():
            paths = [common.fetch_maybe_gz(f"{name}.{lang}", URL.format(f"{name}.{lang}"),
                                           args.from_dir, download) for lang in ("de", "en")]
            de, en = (common.read_lines(path, expected=size) for path in paths)
            common.check_parallel(paths[0], de, paths[1], en)
            raw[subset] = {"de": de, "en": en}
        sp = common.train_sentencepiece(raw["train"]["de"] + raw["train"]["en"],
                                        os.path.join(text, "spm"), args.vocab_size)
        for subset, langs in raw.items():
            for lang, lines in langs.items():
                common.write_lines(os.path.join(text, f"{subset}.raw.{lang}"), lines)
                common.write_lines(os.path.join(text, f"{subset}.{lang}"),
                                   common.encode_pieces(sp, lines))
            print(f"multi30k/{subset} ({SPLITS[subset][0]}): {len(langs['de'])} pairs")
        common.binarize_translation(
            args.dest_dir, "de", "en", os.path.join(text, "train"), os.path.join(text, "valid"),
            [os.path.join(text, "test"), os.path.join(text, "test1")], joined=True,
            workers=args.workers)
    print(f"multi30k: text + spm.model -> {args.out_dir}, binaries -> {args.dest_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(common.run_main(main, "multi30k.py"))
