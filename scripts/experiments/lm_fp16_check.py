#!/usr/bin/env python3
"""fairseq's fp16 training of every row of the WikiText-2 comparison, against fp32 (a GPU check).

    python scripts/experiments/lm_fp16_check.py --data data-bin/wikitext-2 [--rows baseline,mhc]
        [--depth 12] [--updates 300] [--jobs 8] [--out-dir outputs/lm-fp16]

Each row of ``lm_depth_comparison.py`` (its architecture, size and recipe, seed 1, ``--updates``
updates) is trained twice on the GPU by ``fairseq-train``: in fp32 and with ``--fp16
--fp16-no-flatten-grads`` (fairseq's mixed precision: fp16 weights and activations, fp32 master
weights, dynamic loss scaling; the second flag keeps the depth connections out of the weight
decay, see PRECISIONS). Per run: the validation bits per token of its last checkpoint (scored in
fp32, as the comparison scores), the mean of its last three logged training losses, and for fp16
the smallest loss scale logged (where the scale fell, gradients overflowed) or the error if the
run diverged or failed. The difference fp16 - fp32 is the result: the two runs see the same data
in the same order, so it is what half precision changes (plus the GPU's run-to-run
nondeterminism: none between two H100 runs of the same fp32 rows). Writes ``results.{json,md}``
into ``--out-dir`` as the runs finish. Refuses to run without CUDA: the point is fairseq's CUDA
fp16 path (the CPU-side reduced-precision tests are ``tests/test_precision.py``).
"""
import argparse
import json
import os
import sys
import time

from layerlab import fairseq_log, paths, runs, significance

comparison = paths.load_script("experiments", "lm_depth_comparison.py")
# --fp16-no-flatten-grads: fairseq's default fp16 optimizer flattens every parameter into one
# tensor, which leaves no way to keep the depth connections out of the weight decay (the
# recipe's --weight-decay): fairseq_plugins.depth refuses that combination at build time and
# names this flag (used for every row alike)
PRECISIONS = {"fp32": [], "fp16": ["--fp16", "--fp16-no-flatten-grads"]}
# fp32 once more with one switch that must not change the function, so the training equals
# plain fp32 within fp32 rounding: --eager, the depth connections' eager code
# (fairseq_plugins/depth/fused.py); --graph, the blocks' training passes replayed as a CUDA graph
# (fairseq_plugins/cuda_graph.py; gpt_baseline_lm rows only, the recipe has no dropout)
TWINS = {"fp32_eager": ["--no-fused-kernels"], "fp32_graph": ["--cuda-graph"]}
GRAPH_ARCH = "gpt_baseline_lm"


def train_and_score(args, row, precision):
    run_dir = runs.fresh_run_dir(os.path.join(args.out_dir, row, precision))
    arch, flags = comparison.row_spec(row, args.depth, args.embed_dim)
    log = os.path.join(run_dir, "train.log")
    result = {"row": row, "precision": precision, "arch": arch, "flags": flags,
              "depth": args.depth, "updates": args.updates}
    start = time.time()
    try:
        command = ["--arch", arch, *flags, *comparison.recipe_flags(args.updates),
                   *dict(PRECISIONS, **TWINS)[precision]]
        if precision == "fp32_graph":
            # refused with the graph; it only reads weights (the multi-stream rows' Amax gain)
            command = [f for f in command if f != "--log-layer-weights"]
        runs.run_logged(runs.train_command(args.data, run_dir, 1, command), log)
    except runs.StepError as e:
        # a loss that became NaN / inf (or a loss scale at its floor) is a result of the row;
        # any other failure too, but not a divergence: reported as failed, with its error
        diverged = runs.diverged(e)
        return dict(result, diverged=diverged, failed=not diverged, error=str(e)[-400:])
    records = list(fairseq_log.records(log, "train_inner"))
    losses = [float(r["loss"]) for r in records]
    scales = [float(r["loss_scale"]) for r in records if "loss_scale" in r]
    blocks = comparison.score_blocks(os.path.join(run_dir, "checkpoint_last.pt"), args.data,
                                     "valid", device=args.device)
    for name in os.listdir(run_dir):
        if name.endswith(".pt"):
            os.remove(os.path.join(run_dir, name))
    return dict(result, diverged=False, seconds=round(time.time() - start, 1),
                last_train_loss=round(sum(losses[-3:]) / len(losses[-3:]), 4), train_losses=losses,
                valid_bits=round(significance.score("bits", blocks), 4),
                min_loss_scale=min(scales) if scales else None)


def outcome(run):
    if run.get("error"):
        return "diverged" if run["diverged"] else "failed (its error: results.json)"
    return f"{run['valid_bits']:.4f}"


def markdown(report):
    lines = [report["written"], "",
             f"Comparison rows at {report['depth']} blocks, d={report['embed_dim']}, seed 1, "
             f"{report['updates']} updates of the comparison's recipe, trained by fairseq-train "
             f"on {report['gpu']} in fp32 and with {' '.join(report['fp16_flags'])}; validation "
             "bits per token of the last checkpoint (scored in fp32); training loss: mean of the "
             "last three logged intervals.", "",
             "| row | fp32 valid bits | fp16 valid bits | Δ (fp16 - fp32) | fp32 train loss | "
             "fp16 train loss | smallest fp16 loss scale |", "|---|---:|---:|---:|---:|---:|---:|"]
    for row, r in report["rows"].items():
        if "fp32" not in r or "fp16" not in r:  # its twin not finished yet
            continue
        a, b = r["fp32"], r["fp16"]
        if a.get("error") or b.get("error"):
            lines.append(f"| {row} | {outcome(a)} | {outcome(b)} | — | — | — | — |")
            continue
        lines.append(f"| {row} | {a['valid_bits']:.4f} | {b['valid_bits']:.4f} | "
                     f"{b['valid_bits'] - a['valid_bits']:+.4f} | {a['last_train_loss']:.3f} | "
                     f"{b['last_train_loss']:.3f} | {b['min_loss_scale']} |")
    for twin, flags in TWINS.items():
        pairs = [(row, r) for row, r in report["rows"].items() if twin in r and "fp32" in r]
        if not pairs:
            continue
        lines += ["", f"fp32 against fp32 with `{' '.join(flags)}`, the same data and order: "
                  "the largest difference of the logged training losses over the run, and the "
                  "validation bits.", "", f"| row | fp32 valid bits | {twin} valid bits | Δ | "
                  "largest training-loss Δ | logged intervals |", "|---|---:|---:|---:|---:|---:|"]
        for row, r in pairs:
            a, b = r["fp32"], r[twin]
            if a.get("error") or b.get("error"):
                lines.append(f"| {row} | {outcome(a)} | {outcome(b)} | — | — | — |")
                continue
            gap = max(abs(x - y) for x, y in zip(a["train_losses"], b["train_losses"]))
            lines.append(f"| {row} | {a['valid_bits']:.4f} | {b['valid_bits']:.4f} | "
                         f"{a['valid_bits'] - b['valid_bits']:+.4f} | {gap:.4f} | "
                         f"{len(a['train_losses'])} |")
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default="data-bin/wikitext-2")
    p.add_argument("--out-dir", default="outputs/lm-fp16")
    p.add_argument("--rows", type=comparison.parse_list, default=list(comparison.ROWS))
    p.add_argument("--depth", type=int, default=12)
    p.add_argument("--updates", type=int, default=300)
    p.add_argument("--embed-dim", type=int, default=128)
    p.add_argument("--jobs", type=int, default=8, help="runs at once (they share the GPU)")
    p.add_argument("--eager", action="store_true",
                   help="also train fp32 with --no-fused-kernels (the fused kernels' equality)")
    p.add_argument("--graph", action="store_true",
                   help="also train fp32 with --cuda-graph (the graph's equality; "
                        f"{GRAPH_ARCH} rows)")
    args = p.parse_args(argv)
    import torch

    unknown = [r for r in args.rows if r not in comparison.ROWS]
    problems = ([f"unknown row(s) {', '.join(unknown)}"] if unknown else []) + (
        ["--jobs: at least 1"] if args.jobs < 1 else []) + (
        [] if torch.cuda.is_available() else ["no CUDA device: this checks fairseq's GPU fp16"])
    if problems:
        print(f"error: {'; '.join(problems)}", file=sys.stderr)
        return 2
    args.device = "cuda"
    os.environ["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // args.jobs))
    variants = list(PRECISIONS) + (["fp32_eager"] if args.eager else []) + (
        ["fp32_graph"] if args.graph else [])
    tasks = [(args, row, precision) for row in args.rows for precision in variants
             if precision != "fp32_graph"
             or comparison.row_spec(row, args.depth, args.embed_dim)[0] == GRAPH_ARCH]
    command = " ".join(["python scripts/experiments/lm_fp16_check.py",
                        *(sys.argv[1:] if argv is None else map(str, argv))])
    report = {"written": f"Written {time.strftime('%Y-%m-%d')} by `{command}` with "
                         f"{runs.package_version()}, torch {torch.__version__}.",
              "gpu": torch.cuda.get_device_name(), "depth": args.depth,
              "embed_dim": args.embed_dim, "updates": args.updates,
              "fp16_flags": PRECISIONS["fp16"], "rows": {}}
    os.makedirs(args.out_dir, exist_ok=True)
    for (_, row, precision), result in runs.in_parallel(train_and_score, tasks, args.jobs):
        report["rows"].setdefault(row, {})[precision] = result
        print(f"{row} {precision}: {result.get('valid_bits', 'diverged')}", file=sys.stderr,
              flush=True)
        # written as the runs finish (rows in --rows order): a check stopped part-way keeps them
        report["rows"] = {r: report["rows"][r] for r in args.rows if r in report["rows"]}
        with open(os.path.join(args.out_dir, "results.json"), "w") as f:
            json.dump(report, f, indent=2)
        with open(os.path.join(args.out_dir, "results.md"), "w") as f:
            f.write(markdown(report) + "\n")
    print(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
