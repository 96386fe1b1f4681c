#!/usr/bin/env python3
"""CoGnition (Li et al., ACL 2021) English-Chinese -> fairseq binaries, plus the CTER files.

    python scripts/prepare/cognition.py [--from DIR] [--bpe-codes bpe.code] [--train-on train]

English is used as released (tokenised, lower-cased). Chinese: train/valid/test are released
jieba-segmented; cg-test.zh is raw and is segmented here with jieba. Subword-nmt BPE with 3,000
merges (``--merges``) is learned on the Chinese training side (or ``--bpe-codes FILE``, e.g. the
authors' bpe.code) and applied to Chinese only, as the authors did. Checks the published sizes
(train 196,246, valid 10,000, test 10,000, cg-test 10,800) and that every cg-test compound occurs
in its source sentence. Writes ``data/cognition/``: ``{train,valid,test,cg-test}.{en,zh}``,
``bpe.code``, the raw references ``{test,cg-test}.raw.zh`` (BLEU), ``cg-test.compound`` and
``lexicon`` (CTER), and ``data-bin/cognition`` with fairseq subsets train, valid, test, and
test1 = cg-test (in cg-test order, as CTER needs).

``--train-on valid,test`` is the small-scale recipe for machines without the training set: train
on valid+test, validate on the first 1,000 lines of test, evaluate on cg-test; say so wherever
results are shown.

    fairseq-generate data-bin/cognition --gen-subset test1 ... --required-batch-size-multiple 1 > gen.txt
    python scripts/score_cter.py gen.txt --compound data/cognition/cg-test.compound \\
        --lexicon data/cognition/lexicon --source data/cognition/cg-test.en
    python scripts/score_bleu.py gen.txt --ref data/cognition/cg-test.raw.zh --cognition-zh
"""
import logging
import os
import shutil
import sys

from layerlab import prepare as common

BASE = "https://raw.githubusercontent.com/yafuly/CoGnition/main/"
FILES = {  # name in --from DIR / the release: (release path, lines)
    "train.en": ("data/train.en", 196246), "train.zh": ("data/train.zh", 196246),
    "valid.en": ("data/valid.en", 10000), "valid.zh": ("data/valid.zh", 10000),
    "test.en": ("data/test.en", 10000), "test.zh": ("data/test.zh", 10000),
    "cg-test/cg-test.en": ("data/cg-test/cg-test.en", 10800),
    "cg-test/cg-test.zh": ("data/cg-test/cg-test.zh", 10800),
    "cg-test/cg-test.compound": ("data/cg-test/cg-test.compound", 10800),
    "lexicon": ("eval/lexicon", None),
}
SMALL_VALID = 1000


def segment_zh(lines):
    import jieba

    jieba.setLogLevel(logging.WARNING)
    return [" ".join(w for w in jieba.cut(line) if w.strip()) for line in lines]


def learn_bpe(lines, merges, codes_path):
    from subword_nmt.learn_bpe import learn_bpe as learn

    with open(codes_path, "w", encoding="utf-8") as out:
        learn(lines, out, merges)


def apply_bpe(codes_path, lines):
    from subword_nmt.apply_bpe import BPE

    with open(codes_path, encoding="utf-8") as f:
        bpe = BPE(f)
    return [bpe.process_line(line) for line in lines]


def main(argv=None):
    p = common.base_parser(__doc__.split("\n\n")[0], "cognition")
    p.add_argument("--train-on", default="train",
                   help="'train' (the release), or 'valid,test' for the small-scale recipe")
    p.add_argument("--merges", type=int, default=3000, help="BPE merges on the Chinese side")
    p.add_argument("--bpe-codes", help="apply these BPE codes instead of learning them")
    args = p.parse_args(argv)
    if args.train_on not in ("train", "valid,test"):
        raise common.PrepareError(f"--train-on {args.train_on!r}: 'train' or 'valid,test'")
    config = {"dataset": "cognition", "train_on": args.train_on, "merges": args.merges,
              "bpe_codes": os.path.abspath(args.bpe_codes) if args.bpe_codes else None}
    if common.already_prepared(args.out_dir, args.dest_dir, config, args.force):
        return 0
    needed = [f for f in FILES if not (args.train_on != "train" and f.startswith("train."))]
    with common.preparing(args.out_dir, config) as (text, download):
        os.makedirs(os.path.join(download, "cg-test"))
        paths = {name: common.fetch(name, BASE + FILES[name][0], args.from_dir, download)
                 for name in needed}
        data = {name: common.read_lines(path, expected=FILES[name][1])
                for name, path in paths.items()}
        for split in ("train", "valid", "test", "cg-test/cg-test"):
            if f"{split}.en" in data:
                common.check_parallel(paths[f"{split}.en"], data[f"{split}.en"],
                                      paths[f"{split}.zh"], data[f"{split}.zh"])
        for i, (src, comp) in enumerate(zip(data["cg-test/cg-test.en"],
                                            data["cg-test/cg-test.compound"]), 1):
            if comp.strip() not in src:
                raise common.PrepareError(
                    f"{common.origin(paths['cg-test/cg-test.compound'])}:{i}: {comp!r} is not "
                    "in its source sentence (files not aligned?)")
        shutil.copyfile(paths["lexicon"], os.path.join(text, "lexicon"))

        cg_zh = segment_zh(data["cg-test/cg-test.zh"])  # the only raw Chinese of the release
        if args.train_on == "train":
            subsets = {"train": (data["train.en"], data["train.zh"]),
                       "valid": (data["valid.en"], data["valid.zh"])}
        else:
            subsets = {"train": (data["valid.en"] + data["test.en"],
                                 data["valid.zh"] + data["test.zh"]),
                       "valid": (data["test.en"][:SMALL_VALID], data["test.zh"][:SMALL_VALID])}
        subsets["test"] = (data["test.en"], data["test.zh"])
        subsets["cg-test"] = (data["cg-test/cg-test.en"], cg_zh)
        codes = os.path.join(text, "bpe.code")
        if args.bpe_codes:
            shutil.copyfile(args.bpe_codes, codes)
        else:
            learn_bpe(subsets["train"][1], args.merges, codes)
        for subset, (en, zh) in subsets.items():
            common.write_lines(os.path.join(text, f"{subset}.en"), en)
            common.write_lines(os.path.join(text, f"{subset}.zh"), apply_bpe(codes, zh))
            print(f"cognition/{subset}: {len(en)} pairs")
        common.write_lines(os.path.join(text, "test.raw.zh"),
                           [line.replace(" ", "") for line in data["test.zh"]])
        common.write_lines(os.path.join(text, "cg-test.raw.zh"), data["cg-test/cg-test.zh"])
        common.write_lines(os.path.join(text, "cg-test.compound"),
                           data["cg-test/cg-test.compound"])
        common.binarize_translation(
            args.dest_dir, "en", "zh", os.path.join(text, "train"), os.path.join(text, "valid"),
            [os.path.join(text, "test"), os.path.join(text, "cg-test")], workers=args.workers)
    print(f"cognition: text, bpe.code, compound, lexicon -> {args.out_dir}; binaries -> "
          f"{args.dest_dir} (test1 = cg-test){'' if args.train_on == 'train' else ' [small-scale: trained on valid+test]'}")
    return 0


if __name__ == "__main__":
    sys.exit(common.run_main(main, "cognition.py"))
