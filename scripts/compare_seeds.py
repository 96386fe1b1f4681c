#!/usr/bin/env python3
"""Train several architectures with several seeds on one data-bin and score them: mean and spread.

    python scripts/compare_seeds.py --data data-bin/scan-length --archs transformer_tiny,\\
        swapped_transformer_tiny --seeds 1,2,3 --metric exact_match --out-dir outputs/cmp
    python scripts/compare_seeds.py --data data-bin/multi30k --metric bleu \\
        --spm data/multi30k/spm.model --ref data/multi30k/test.raw.en ...

Every run goes through the real CLIs (fairseq-train --user-dir, fairseq-generate) with the
quickstart's optimisation recipe (Adam, inverse-sqrt schedule, 200 warm-up updates, dropout 0
unless ``--train-args`` says otherwise). Finished runs (a ``result.json`` in their directory) are
not repeated when the command is run again. Writes ``results.json`` and ``results.md`` (mean,
sample standard deviation and every seed's value per architecture).
"""
import argparse
import json
import os
import shlex
import sys

from layerlab import recipes, runs, stats


def run_one(arch, seed, args):
    spm = ["--bpe", "sentencepiece", "--sentencepiece-model", args.spm] if args.spm else []
    return runs.train_generate_score(
        os.path.join(args.out_dir, f"{arch}-seed{seed}"), args.data, seed,
        ["--arch", arch, *recipes.adam_inverse_sqrt(args.lr, args.max_tokens, args.max_update),
         *shlex.split(args.train_args)],
        args.gen_subset,
        ["--beam", "5", "--batch-size", "128", "--max-len-a", str(args.max_len_a),
         "--max-len-b", str(args.max_len_b), *spm],
        args.metric, ref=args.ref, info={"arch": arch})


def markdown(summary, args):
    name = "exact match %" if args.metric == "exact_match" else "BLEU"
    lines = [f"`{args.data}` {args.gen_subset}, {args.max_update} updates x {args.max_tokens} "
             f"tokens, lr {args.lr}, beam 5, seeds {args.seeds}"
             + (f", extra train flags `{args.train_args}`" if args.train_args else ""), "",
             f"| arch | {name} mean | std | per seed | final train loss (bits/token) | params |",
             "|---|---:|---:|---|---:|---:|"]
    for s in summary:
        lines.append(f"| {s['arch']} | {s['mean']:.2f} | {s['std']:.2f} | "
                     f"{', '.join(f'{v:.2f}' for v in s['values'])} | "
                     f"{s['train_loss_bits_mean']} | {s['params']:,} |")
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", required=True, help="fairseq data-bin (translation)")
    p.add_argument("--archs", required=True, help="comma-separated --arch names")
    p.add_argument("--seeds", default="1,2,3")
    p.add_argument("--metric", choices=("exact_match", "bleu"), default="exact_match")
    p.add_argument("--spm", help="SentencePiece model: detokenise hypotheses for BLEU")
    p.add_argument("--ref", help="raw reference file for BLEU (default: the T- lines)")
    p.add_argument("--gen-subset", default="test")
    p.add_argument("--max-update", type=int, default=2000)
    p.add_argument("--max-tokens", type=int, default=1024)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--max-len-a", type=float, default=1.2,
                   help="fairseq-generate --max-len-a (SCAN: 0, its outputs are up to 48 tokens)")
    p.add_argument("--max-len-b", type=int, default=10, help="fairseq-generate --max-len-b "
                   "(SCAN: 64)")
    p.add_argument("--train-args", default="", help="extra fairseq-train flags (one string)")
    p.add_argument("--out-dir", required=True)
    args = p.parse_args(argv)
    if not os.path.isdir(args.data):
        p.error(f"--data {args.data} is not a directory (prepare it with scripts/prepare/)")
    seeds = [int(s) for s in args.seeds.split(",")]
    os.makedirs(args.out_dir, exist_ok=True)
    rows = []
    for arch in args.archs.split(","):
        for seed in seeds:
            print(f"[compare] {arch} seed {seed} ...", flush=True)
            try:
                rows.append(run_one(arch, seed, args))
            except runs.StepError as e:
                raise SystemExit(f"compare_seeds: {e}") from None
            print(f"          {args.metric} {rows[-1][args.metric]}", flush=True)
    summary = stats.summarise(rows, args.metric)
    table = markdown(summary, args)
    with open(os.path.join(args.out_dir, "results.json"), "w") as f:
        json.dump({"config": vars(args), "runs": rows, "summary": summary}, f, indent=2)
    with open(os.path.join(args.out_dir, "results.md"), "w") as f:
        f.write(table + "\n")
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
