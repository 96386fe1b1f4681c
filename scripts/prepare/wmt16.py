#!/usr/bin/env python3
"""WMT16 German-English: the first ``--max-pairs`` training pairs in release order, newstest2015
as valid and newstest2016 as test, SentencePiece-tokenised, binarised.

    python scripts/prepare/wmt16.py [--from DIR] [--max-pairs 1000000] [--vocab-size 32000]
    python scripts/prepare/wmt16.py --opus-mt-dir data-bin/opus-mt-de-en ...   # opus-mt's pieces

Training pairs, in this order (the order of the release and of Hugging Face's ``wmt16`` de-en
export; the bridge paper took the first 1M): Europarl v7, Common Crawl, News Commentary v11,
read from ``training-parallel-europarl-v7.tgz``, ``training-parallel-commoncrawl.tgz`` and
``training-parallel-nc-v11.tgz`` (downloaded from statmt.org, or in ``--from DIR``), or from
plain ``train.de`` / ``train.en`` in DIR (e.g. an export of the Hugging Face dataset) when those
exist. Reading stops after ``--max-pairs`` pairs. Pairs with an empty side are dropped and
counted (Europarl has them). newstest2015/2016 are ``newstest201{5,6}.{de,en}`` in DIR, or
fetched with sacreBLEU (its cache works offline once filled); sizes 2,169 and 2,999 are checked.

Tokenisation: a new joint SentencePiece model (``--vocab-size``) trained on the training pairs,
with a joined dictionary; or, with ``--opus-mt-dir`` (a folder written by
``scripts/convert_opus_mt.py``), opus-mt's own ``source.spm`` (German) and ``target.spm``
(English) and its dictionaries, so the converted model can be fine-tuned on the binaries.
Writes ``data/wmt16-de-en/`` (encoded and raw ``<subset>.{de,en}``) and ``data-bin/wmt16-de-en``
(subsets train, valid = newstest2015, test = newstest2016).
"""
import os
import sys
import tarfile

from layerlab import prepare as common

STATMT = "http://www.statmt.org/wmt13/{}"
# (archive, URL, member prefix inside it) in release order
TRAIN_ARCHIVES = [
    ("training-parallel-europarl-v7.tgz", STATMT.format("training-parallel-europarl-v7.tgz"),
     "europarl-v7.de-en"),
    ("training-parallel-commoncrawl.tgz", STATMT.format("training-parallel-commoncrawl.tgz"),
     "commoncrawl.de-en"),
    ("training-parallel-nc-v11.tgz",
     "http://data.statmt.org/wmt16/translation-task/training-parallel-nc-v11.tgz",
     "news-commentary-v11.de-en"),
]
TEST_SETS = {"valid": ("newstest2015", "wmt15", 2169), "test": ("newstest2016", "wmt16", 2999)}


def _archive_pairs(path, prefix):
    """(de, en) lines of the member pair ``<prefix>.de`` / ``<prefix>.en`` of a .tgz, lazily."""
    try:
        archive = tarfile.open(path, "r:gz")
        members = {os.path.basename(m.name): m for m in archive.getmembers() if m.isfile()}
    except (tarfile.TarError, EOFError, OSError) as e:
        raise common.PrepareError(f"{common.origin(path)}: not a readable .tgz ({e}); "
                                  "truncated or corrupt download?") from None
    files = []
    for lang in ("de", "en"):
        member = members.get(f"{prefix}.{lang}")
        if member is None:
            raise common.PrepareError(f"{common.origin(path)}: has no {prefix}.{lang}")
        files.append(archive.extractfile(member))
    try:
        for line_no, (de, en) in enumerate(zip(*files), 1):
            yield (_decode(de, path, prefix, line_no), _decode(en, path, prefix, line_no))
        if any(f.read(1) for f in files):
            raise common.PrepareError(f"{common.origin(path)}: {prefix}.de and .en have "
                                      "different line counts")
    except (tarfile.TarError, EOFError, OSError) as e:
        raise common.PrepareError(f"{common.origin(path)}: cannot be read to the end ({e}); "
                                  "truncated download?") from None


def _decode(raw, path, member, line_no):
    try:
        return raw.decode("utf-8").rstrip("\r\n")
    except UnicodeDecodeError as e:
        raise common.PrepareError(f"{common.origin(path)}:{member}:{line_no}: not UTF-8 text "
                                  f"({e.reason})") from None


def training_pairs(from_dir, download, max_pairs):
    """Up to max_pairs non-empty (de, en) pairs in release order; (pairs, dropped)."""
    if from_dir and os.path.isfile(os.path.join(from_dir, "train.de")):
        paths = [os.path.join(from_dir, f"train.{lang}") for lang in ("de", "en")]
        de, en = (common.read_lines(p, allow_empty=True) for p in paths)
        common.check_parallel(paths[0], de, paths[1], en)
        streams = [zip(de, en)]
    else:
        streams = (_archive_pairs(common.fetch(name, url, from_dir, download), prefix)
                   for name, url, prefix in TRAIN_ARCHIVES)
    pairs, dropped = [], 0
    for stream in streams:
        for de, en in stream:
            if not de.strip() or not en.strip():
                dropped += 1
                continue
            pairs.append((de, en))
            if len(pairs) == max_pairs:
                return pairs, dropped
    return pairs, dropped


def test_set(subset, from_dir):
    name, sacrebleu_name, size = TEST_SETS[subset]
    paths = [os.path.join(from_dir or "", f"{name}.{lang}") for lang in ("de", "en")]
    if from_dir and all(os.path.isfile(p) for p in paths):
        de, en = (common.read_lines(p, expected=size) for p in paths)
        common.check_parallel(paths[0], de, paths[1], en)
        return de, en
    try:  # sacreBLEU's own copy of the test set (downloaded once, then cached)
        from sacrebleu.utils import get_source_file, get_reference_files
        src, (ref,) = get_source_file(sacrebleu_name, "de-en"), get_reference_files(
            sacrebleu_name, "de-en")
    except Exception as e:  # sacreBLEU raises several types for "no network"
        raise common.PrepareError(f"{name}: not in --from DIR and sacreBLEU could not fetch it "
                                  f"({e}); put {name}.de/.en in DIR") from None
    return common.read_lines(src, expected=size), common.read_lines(ref, expected=size)


def main(argv=None):
    p = common.base_parser(__doc__.split("\n\n")[0], "wmt16-de-en")
    p.add_argument("--max-pairs", type=int, default=1_000_000,
                   help="first N training pairs in release order (default: 1,000,000)")
    p.add_argument("--vocab-size", type=int, default=32000, help="joint SentencePiece vocabulary")
    p.add_argument("--opus-mt-dir", metavar="DIR",
                   help="tokenise with a converted opus-mt folder's source.spm/target.spm and "
                        "binarise with its dict.de.txt/dict.en.txt")
    args = p.parse_args(argv)
    if args.max_pairs < 1:
        p.error("--max-pairs must be >= 1")
    if args.opus_mt_dir:
        needed = ["source.spm", "target.spm", "dict.de.txt", "dict.en.txt"]
        missing = [f for f in needed if not os.path.isfile(os.path.join(args.opus_mt_dir, f))]
        if missing:
            raise common.PrepareError(f"--opus-mt-dir {args.opus_mt_dir}: missing "
                                      f"{', '.join(missing)} (run scripts/convert_opus_mt.py)")
    config = {"dataset": "wmt16-de-en", "max_pairs": args.max_pairs,
              "tokenizer": "opus-mt" if args.opus_mt_dir else f"spm{args.vocab_size}"}
    if common.already_prepared(args.out_dir, args.dest_dir, config, args.force):
        return 0
    with common.preparing(args.out_dir, config) as (text, download):
        pairs, dropped = training_pairs(args.from_dir, download, args.max_pairs)
        print(f"wmt16-de-en/train: {len(pairs)} pairs ({dropped} with an empty side dropped)")
        if len(pairs) < args.max_pairs:
            print(f"wmt16-de-en: the release has only {len(pairs)} usable pairs "
                  f"(< --max-pairs {args.max_pairs})")
        raw = {"train": ([d for d, _ in pairs], [e for _, e in pairs])}
        for subset in TEST_SETS:
            raw[subset] = test_set(subset, args.from_dir)
            print(f"wmt16-de-en/{subset} ({TEST_SETS[subset][0]}): {len(raw[subset][0])} pairs")
        if args.opus_mt_dir:
            import sentencepiece as spm
            processors = {lang: spm.SentencePieceProcessor(
                model_file=os.path.join(args.opus_mt_dir, f"{side}.spm"))
                for lang, side in (("de", "source"), ("en", "target"))}
            extra = ["--srcdict", os.path.join(args.opus_mt_dir, "dict.de.txt"),
                     "--tgtdict", os.path.join(args.opus_mt_dir, "dict.en.txt")]
        else:
            joint = common.train_sentencepiece(raw["train"][0] + raw["train"][1],
                                               os.path.join(text, "spm"), args.vocab_size)
            processors, extra = {"de": joint, "en": joint}, []
        for subset, (de, en) in raw.items():
            for lang, lines in (("de", de), ("en", en)):
                common.write_lines(os.path.join(text, f"{subset}.raw.{lang}"), lines)
                common.write_lines(os.path.join(text, f"{subset}.{lang}"),
                                   common.encode_pieces(processors[lang], lines))
        common.binarize_translation(args.dest_dir, "de", "en", os.path.join(text, "train"),
                                    os.path.join(text, "valid"), [os.path.join(text, "test")],
                                    joined=not args.opus_mt_dir, workers=args.workers,
                                    extra=extra)
    print(f"wmt16-de-en: text -> {args.out_dir}, binaries -> {args.dest_dir} "
          "(subsets: train, valid=newstest2015, test=newstest2016)")
    return 0


if __name__ == "__main__":
    sys.exit(common.run_main(main, "wmt16.py"))
