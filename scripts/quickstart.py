#!/usr/bin/env python3
"""Quickstart: SCAN -> train fairseq's transformer and every seq2seq architecture of this
package under one small budget -> exact match with fairseq-generate -> markdown table + JSON.

Everything runs through the real CLIs (fairseq-preprocess, fairseq-train --user-dir,
fairseq-generate --user-dir). The architectures are discovered from the registry: every ``*_tiny``
preset of this package's encoder-decoder models, plus fairseq's ``transformer_tiny`` baseline.
"""
import argparse
import json
import logging
import os
import shutil
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PLUGIN_DIR = os.path.join(REPO, "fairseq_plugins")
sys.path.insert(0, REPO)
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
        and issubclass(cls, FairseqEncoderDecoderModel)
    )
    return ["transformer_tiny"] + ours


def _cli(name):
    exe = os.path.join(os.path.dirname(sys.executable), name)
    return exe if os.path.exists(exe) else name


def _run(cmd, log_path):
    with open(log_path, "w") as log:
        proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        with open(log_path) as f:
            tail = f.read()[-3000:]
        raise SystemExit(f"quickstart: command failed ({' '.join(cmd[:2])} ...), see {log_path}:\n{tail}")


def train_command(data, arch, run_dir, lr, max_tokens, max_update, seed, extra=()):
    """The quickstart's fairseq-train recipe: Adam, inverse-sqrt schedule with 200 warm-up
    updates, no dropout, no validation, JSON logs every 100 updates."""
    return [_cli("fairseq-train"), data, "--user-dir", PLUGIN_DIR, "--arch", arch,
            "--task", "translation", "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)",
            "--lr", str(lr), "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "200",
            "--dropout", "0", "--criterion", "cross_entropy", "--max-tokens", str(max_tokens),
            "--max-update", str(max_update), "--save-dir", run_dir, "--no-epoch-checkpoints",
            "--disable-validation", "--seed", str(seed), "--num-workers", "0",
            "--log-format", "json", "--log-interval", "100", *extra]


def train_and_evaluate(arch, data, out_dir, args):
    from fairseq_plugins.metrics.exact_match import exact_match
    from fairseq_plugins.metrics.generate_log import read_generate_log

    run_dir = os.path.join(out_dir, arch)
    # start from scratch: fairseq-train would otherwise resume from an earlier checkpoint_last.pt
    shutil.rmtree(run_dir, ignore_errors=True)
    os.makedirs(run_dir)
    ckpt = os.path.join(run_dir, "checkpoint_last.pt")
    start = time.time()
    _run(train_command(data, arch, run_dir, args.lr, args.max_tokens, args.max_update,
                       args.seed), os.path.join(run_dir, "train.log"))
    train_s = time.time() - start
    train_loss = _last_train_loss(os.path.join(run_dir, "train.log"))
    gen_log = os.path.join(run_dir, f"generate-{args.gen_subset}.txt")
    start = time.time()
    _run([_cli("fairseq-generate"), data, "--user-dir", PLUGIN_DIR, "--path", ckpt,
          "--gen-subset", args.gen_subset, "--beam", "5", "--batch-size", "256",
          # SCAN actions are at most 48 tokens; the cap only matters for untrained models
          "--max-len-a", "0", "--max-len-b", str(MAX_OUTPUT_LEN),
          "--required-batch-size-multiple", "1", "--num-workers", "0"], gen_log)
    gen_s = time.time() - start
    log = read_generate_log(gen_log)
    score = exact_match(log["hypotheses"], log["references"])
    return {"arch": arch, "exact_match": round(score["exact_match"], 2),
            "correct": score["correct"], "total": score["total"],
            "params": _count_params(ckpt), "train_loss_bits": train_loss,
            "train_seconds": round(train_s, 1),
            "generate_seconds": round(gen_s, 1), "checkpoint": ckpt}


def _last_train_loss(log_path):
    """Loss (base 2, per target token) of the last --log-format json train_inner record, or of
    the end-of-training record when the run was shorter than one log interval."""
    inner = final = None
    with open(log_path) as f:
        for line in f:
            if "| train_inner | " in line:
                inner = float(json.loads(line.split("| train_inner | ", 1)[1])["loss"])
            elif "| train | " in line:
                final = float(json.loads(line.split("| train | ", 1)[1])["train_loss"])
    return inner if inner is not None else final


def _count_params(ckpt):
    import torch

    import fairseq_plugins  # noqa: F401  (allow-lists fairseq checkpoint types)

    state = torch.load(ckpt, map_location="cpu")
    return sum(v.numel() for k, v in state["model"].items() if not k.endswith("_float_tensor"))


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
    print(f"[1/3] SCAN {args.split} -> {data}", flush=True)
    subprocess.run([sys.executable, os.path.join(REPO, "scripts", "prepare_scan.py"),
                    "--split", args.split], check=True)
    archs = args.archs.split(",") if args.archs else seq2seq_tiny_archs()
    os.makedirs(args.out_dir, exist_ok=True)
    rows = []
    for i, arch in enumerate(archs, 1):
        print(f"[2/3] ({i}/{len(archs)}) {arch}: training {args.max_update} updates, "
              "then beam-5 generation on test ...", flush=True)
        rows.append(train_and_evaluate(arch, data, args.out_dir, args))
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
    print("[3/3] results\n")
    print(table)
    print(f"\ntable: {md_path}\njson: {json_path}\nruns (checkpoints, logs, generations): "
          f"{args.out_dir}/<arch>/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
