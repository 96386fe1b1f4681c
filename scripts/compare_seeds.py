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
import shutil
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from quickstart import (  # noqa: E402
    PLUGIN_DIR,
    _cli,
    _count_params,
    _last_train_loss,
    _run,
    train_command,
)


def score(metric, gen_log, args):
    from fairseq_plugins.metrics.bleu import corpus_bleu
    from fairseq_plugins.metrics.exact_match import exact_match
    from fairseq_plugins.metrics.generate_log import read_generate_log, read_lines

    log = read_generate_log(gen_log)
    if metric == "exact_match":
        return exact_match(log["hypotheses"], log["references"])["exact_match"]
    # hypotheses are the D- lines (detokenised with --bpe sentencepiece) when the log has them
    refs = read_lines(args.ref) if args.ref else log["references"]
    return corpus_bleu(log["hypotheses"], refs)["bleu"]


def run_one(arch, seed, args):
    run_dir = os.path.join(args.out_dir, f"{arch}-seed{seed}")
    result_path = os.path.join(run_dir, "result.json")
    if os.path.exists(result_path):  # finished earlier: resume, do not re-train
        with open(result_path) as f:
            return json.load(f)
    shutil.rmtree(run_dir, ignore_errors=True)  # an unfinished run starts again from scratch
    os.makedirs(run_dir)
    ckpt = os.path.join(run_dir, "checkpoint_last.pt")
    start = time.time()
    _run(train_command(args.data, arch, run_dir, args.lr, args.max_tokens, args.max_update, seed,
                       shlex.split(args.train_args)), os.path.join(run_dir, "train.log"))
    train_s = time.time() - start
    gen_log = os.path.join(run_dir, f"generate-{args.gen_subset}.txt")
    spm = ["--bpe", "sentencepiece", "--sentencepiece-model", args.spm] if args.spm else []
    _run([_cli("fairseq-generate"), args.data, "--user-dir", PLUGIN_DIR, "--path", ckpt,
          "--gen-subset", args.gen_subset, "--beam", "5", "--batch-size", "128",
          "--max-len-a", str(args.max_len_a), "--max-len-b", str(args.max_len_b),
          "--required-batch-size-multiple", "1",
          "--num-workers", "0", *spm], gen_log)
    result = {"arch": arch, "seed": seed, args.metric: round(score(args.metric, gen_log, args), 2),
              "train_loss_bits": _last_train_loss(os.path.join(run_dir, "train.log")),
              "params": _count_params(ckpt), "train_seconds": round(train_s, 1)}
    with open(result_path, "w") as f:
        json.dump(result, f, indent=2)
    return result


def summarise(rows, metric):
    by_arch = {}
    for r in rows:
        by_arch.setdefault(r["arch"], []).append(r)
    out = []
    for arch, runs in by_arch.items():
        values = [r[metric] for r in runs]
        out.append({"arch": arch, "mean": round(statistics.mean(values), 2),
                    "std": round(statistics.stdev(values), 2) if len(values) > 1 else 0.0,
                    "values": values, "seeds": [r["seed"] for r in runs],
                    "params": runs[0]["params"],
                    "train_loss_bits_mean": round(statistics.mean(r["train_loss_bits"]
                                                                  for r in runs), 3)})
    return out


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
            rows.append(run_one(arch, seed, args))
            print(f"          {args.metric} {rows[-1][args.metric]}", flush=True)
    summary = summarise(rows, args.metric)
    table = markdown(summary, args)
    with open(os.path.join(args.out_dir, "results.json"), "w") as f:
        json.dump({"config": vars(args), "runs": rows, "summary": summary}, f, indent=2)
    with open(os.path.join(args.out_dir, "results.md"), "w") as f:
        f.write(table + "\n")
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
