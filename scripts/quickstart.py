#!/usr/bin/env python3
"""Quickstart: SCAN -> train fairseq's transformer and every seq2seq architecture of this
package under one small budget -> exact match with fairseq-generate -> markdown table + JSON ->
the layer analysis of the trained models (scripts/analyze_layers.py).

Everything runs through the real CLIs (fairseq-preprocess, fairseq-train --user-dir,
fairseq-generate --user-dir). The architectures are discovered from the registry: every ``*_tiny``
preset of this package's encoder-decoder models (but ``layerwise_transformer_tiny``, which is
fairseq's ``transformer_tiny`` with every switch off), plus ``transformer_tiny`` itself.
"""
import argparse
import json
import logging
import os
import subprocess
import sys

from layerlab import paths, recipes, runs

MAX_OUTPUT_LEN = 64
# fairseq's text_to_speech task calls logging.basicConfig(level=INFO) when fairseq is imported;
# configuring logging first keeps the quickstart's own progress lines readable
logging.basicConfig(level=logging.WARNING, format="%(message)s")


def seq2seq_tiny_archs():
    """fairseq's transformer_tiny first, then this package's encoder-decoder *_tiny presets."""
    import fairseq_plugins  # noqa: F401
    from fairseq.models import ARCH_MODEL_REGISTRY, FairseqEncoderDecoderModel

    ours = sorted(
        name for name, cls in ARCH_MODEL_REGISTRY.items()
        if name.endswith("_tiny") and cls.__module__.split(".")[0] == "fairseq_plugins"
        and issubclass(cls, FairseqEncoderDecoderModel) and name != "layerwise_transformer_tiny"
    )
    return ["transformer_tiny"] + ours


def train_and_evaluate(arch, data, out_dir, args):
    """One architecture, always from scratch (no resume: the quickstart measures times)."""
    return runs.train_generate_score(
        os.path.join(out_dir, arch), data, args.seed,
        ["--arch", arch, *recipes.adam_inverse_sqrt(args.lr, args.max_tokens, args.max_update)],
        args.gen_subset,
        # SCAN actions are at most 48 tokens; the cap only matters for untrained models
        ["--beam", "5", "--batch-size", "256", "--max-len-a", "0",
         "--max-len-b", str(MAX_OUTPUT_LEN)],
        "exact_match", resume=False, info={"arch": arch})


def markdown(rows, args):
    lines = [f"SCAN `{args.split}` {args.gen_subset}, {args.max_update} updates x {args.max_tokens} tokens, "
             f"lr {args.lr}, seed {args.seed}, beam 5 (CPU)", "",
             "| arch | exact match % | correct / total | final train loss (bits/token) | params "
             "| train s | generate s |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['arch']} | {r['exact_match']:.2f} | {r['correct']} / {r['total']} | "
                     f"{r['train_loss_bits']} | {r['params']:,} | {r['train_seconds']} | "
                     f"{r['generate_seconds']} |")
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--split", default="simple", help="SCAN split (default: simple)")
    p.add_argument("--max-update", type=int, default=2000, help="updates per architecture")
    p.add_argument("--max-tokens", type=int, default=1024)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--gen-subset", default="test", help="subset scored for exact match")
    p.add_argument("--archs", default=None, help="comma-separated subset (default: all)")
    p.add_argument("--out-dir", default=os.path.join("outputs", "quickstart"))
    args = p.parse_args(argv)

    data = os.path.join("data-bin", f"scan-{args.split}")
    print(f"[1/4] SCAN {args.split} -> {data}", flush=True)
    subprocess.run([sys.executable, paths.script("prepare", "scan.py"), "--split", args.split],
                   check=True)
    archs = args.archs.split(",") if args.archs else seq2seq_tiny_archs()
    os.makedirs(args.out_dir, exist_ok=True)
    rows = []
    for i, arch in enumerate(archs, 1):
        print(f"[2/4] ({i}/{len(archs)}) {arch}: training {args.max_update} updates, "
              "then beam-5 generation on test ...", flush=True)
        try:
            rows.append(train_and_evaluate(arch, data, args.out_dir, args))
        except runs.StepError as e:
            raise SystemExit(f"quickstart: {e}") from None
        r = rows[-1]
        print(f"      exact match {r['exact_match']:.2f}%  (train {r['train_seconds']} s, "
              f"generate {r['generate_seconds']} s)", flush=True)
    table = markdown(rows, args)
    json_path = os.path.join(args.out_dir, "results.json")
    md_path = os.path.join(args.out_dir, "results.md")
    with open(json_path, "w") as f:
        json.dump({"split": args.split, "gen_subset": args.gen_subset, "max_update": args.max_update,
                   "max_tokens": args.max_tokens, "lr": args.lr, "seed": args.seed,
                   "results": rows}, f, indent=2)
    with open(md_path, "w") as f:
        f.write(table + "\n")
    print("[3/4] results\n")
    print(table)
    print(f"\n[4/4] what each model's layers hold (scripts/analyze_layers.py, docs/analysis.md) ...",
          flush=True)
    analysis_dir = os.path.join(args.out_dir, "analysis")
    checkpoints = [r["checkpoint"] for r in rows]
    try:
        runs.run_logged([sys.executable, paths.script("analyze_layers.py"), checkpoints[0],
                         *(["--compare", *checkpoints[1:]] if len(checkpoints) > 1 else []),
                         "--labels", ",".join(archs),
                         "--data", data, "--subset", args.gen_subset, "--max-sentences", "1000",
                         "--out-dir", analysis_dir], os.path.join(args.out_dir, "analysis.log"))
    except runs.StepError as e:
        raise SystemExit(f"quickstart: {e}") from None
    print(f"\ntable: {md_path}\njson: {json_path}\nlayer analysis: {analysis_dir}/analysis.png"
          f"\nruns (checkpoints, logs, generations): {args.out_dir}/<arch>/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
