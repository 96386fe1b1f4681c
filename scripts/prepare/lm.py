#!/usr/bin/env python3
"""Language-modelling data: WikiText-2 / WikiText-103, or any text file, for fairseq's
``language_modeling`` task.

    python scripts/prepare/lm.py --dataset wikitext-2 [--from DIR] [--vocab-size 8000]
    python scripts/prepare/lm.py --text corpus.txt [--name mycorpus] [--vocab-size 8000]

WikiText: the release's ``wiki.{train,valid,test}.tokens`` (or ``{train,valid,test}.txt``) from
``--from DIR`` or the release zip, checked against the release's line counts (WikiText-2:
train 36,718, valid 3,760, test 4,358; WikiText-103: train 1,801,350). ``--text``: one file,
split by lines into the first 98% (train), the next 1% (valid) and the last 1% (test). A SentencePiece model (``--vocab-size``) is trained on
the training split only and applied to all three. Empty lines (WikiText's paragraph breaks) are
dropped and counted. Writes ``data/<name>/`` (``spm.model``, encoded ``{train,valid,test}.txt``)
and ``data-bin/<name>`` (``fairseq-preprocess --only-source``).
"""
import os
import sys
import zipfile

from layerlab import prepare as common

WIKITEXT = {
    "wikitext-2": "https://wikitext.smerity.com/wikitext-2-v1.zip",
    "wikitext-103": "https://wikitext.smerity.com/wikitext-103-v1.zip",
}
SUBSETS = ("train", "valid", "test")
# lines of the release files (wiki.{train,valid,test}.tokens; the raw variants have the same)
SIZES = {"wikitext-2": {"train": 36718, "valid": 3760, "test": 4358},
         "wikitext-103": {"train": 1801350, "valid": 3760, "test": 4358}}


def wikitext_files(name, from_dir, download):
    """{subset: path} of the three WikiText files (from DIR, or the downloaded zip)."""
    if from_dir:
        found = {}
        for subset in SUBSETS:
            for candidate in (f"wiki.{subset}.tokens", f"{subset}.txt"):
                if os.path.isfile(os.path.join(from_dir, candidate)):
                    found[subset] = common.fetch(candidate, None, from_dir, download)
                    break
            else:
                raise common.PrepareError(f"{from_dir}: no wiki.{subset}.tokens or {subset}.txt")
        return found
    archive = common.fetch(os.path.basename(WIKITEXT[name]), WIKITEXT[name], None, download)
    try:
        with zipfile.ZipFile(archive) as z:
            members = {os.path.basename(m): m for m in z.namelist()}
            paths = {}
            for subset in SUBSETS:
                member = members.get(f"wiki.{subset}.tokens")
                if member is None:
                    raise common.PrepareError(f"{archive}: no wiki.{subset}.tokens inside")
                paths[subset] = z.extract(member, download)
            return paths
    except zipfile.BadZipFile as e:
        raise common.PrepareError(f"{archive}: corrupt or truncated zip ({e})") from None


def drop_empty(lines):
    kept = [line.strip() for line in lines if line.strip()]
    return kept, len(lines) - len(kept)


def main(argv=None):
    p = common.base_parser(__doc__.split("\n\n")[0], "lm")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--dataset", choices=sorted(WIKITEXT))
    source.add_argument("--text", help="any UTF-8 text file, one sentence or paragraph per line")
    p.add_argument("--name", help="output name (default: the dataset or the file's stem)")
    p.add_argument("--vocab-size", type=int, default=8000)
    args = p.parse_args(argv)
    name = args.name or args.dataset or os.path.splitext(os.path.basename(args.text))[0]
    # base_parser's defaults name the dataset generically: place outputs under the real name
    out_dir = args.out_dir if args.out_dir != os.path.join("data", "lm") else os.path.join("data", name)
    dest_dir = (args.dest_dir if args.dest_dir != os.path.join("data-bin", "lm")
                else os.path.join("data-bin", name))
    config = {"dataset": args.dataset or os.path.abspath(args.text), "vocab_size": args.vocab_size}
    if common.already_prepared(out_dir, dest_dir, config, args.force):
        return 0
    with common.preparing(out_dir, config) as (text, download):
        if args.dataset:
            files = wikitext_files(args.dataset, args.from_dir, download)
            splits = {s: common.read_lines(files[s], expected=SIZES[args.dataset][s],
                                           allow_empty=True) for s in SUBSETS}
        else:
            lines = common.read_lines(args.text, allow_empty=True)
            n_train, n_valid = int(len(lines) * 0.98), max(1, len(lines) // 100)
            splits = {"train": lines[:n_train], "valid": lines[n_train:n_train + n_valid],
                      "test": lines[n_train + n_valid:]}
        for subset in SUBSETS:
            splits[subset], dropped = drop_empty(splits[subset])
            if not splits[subset]:
                raise common.PrepareError(f"the {subset} split is empty")
            print(f"{name}/{subset}: {len(splits[subset])} lines ({dropped} empty lines dropped)")
        sp = common.train_sentencepiece(splits["train"], os.path.join(text, "spm"),
                                        args.vocab_size)
        for subset in SUBSETS:
            common.write_lines(os.path.join(text, f"{subset}.txt"),
                               common.encode_pieces(sp, splits[subset]))
        common.binarize(dest_dir, ["--only-source",
                                   "--trainpref", os.path.join(text, "train.txt"),
                                   "--validpref", os.path.join(text, "valid.txt"),
                                   "--testpref", os.path.join(text, "test.txt")], args.workers)
    print(f"{name}: text + spm.model -> {out_dir}, binaries -> {dest_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(common.run_main(main, "lm.py"))
