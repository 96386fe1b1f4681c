#!/usr/bin/env python3
"""Speed and memory of the depth connections in the decoder-only LM against the plain model.

    python scripts/bench/depth.py [--quick] [--device cuda --fp16] [--out results/bench_depth_cpu.json]

``gpt_baseline_lm`` at the size of the WikiText-2 comparison (d=128, 4 and 12 blocks, 4 heads,
context 128, batch 16, a 33,278-token vocabulary as WikiText-2's) plain and with each depth
connection (fairseq_plugins.depth): training seconds per update (timed windows of forward +
backward + Adam step, every model taking turns in one process, each in every slot of the
rotation; the time ratio is the median over the rounds of the two models' ratio within a round)
and the peak memory growth of training (a process per model), with each method's
multiply-accumulate model (its ``macs`` beside its module) as the share of the plain model's
forward MACs per token. The worker is ``lm.py``'s. Ratios are the result; absolute numbers only
mean something on a GPU.
"""
import os
import sys

import torch

from layerlab import bench as common
from layerlab import paths

lm = paths.load_script("bench", "lm.py")

BASELINE = "plain"
# row -> flags of gpt_baseline_lm (the baseline: none)
METHODS = {
    BASELINE: [],
    "dwa": ["--decoder-fusion", "--fusion-kind", "dwa"],
    "lrf": ["--decoder-fusion"],
    "lrf_all_positions": ["--decoder-fusion", "--fusion-reading", "all-positions"],
    "hc_static_n4": ["--hyper-connections", "static"],
    "hc_dynamic_n4": ["--hyper-connections", "dynamic"],
    "mhc_n4": ["--mhc", "sinkhorn"],
    "mhc_lite_n4": ["--mhc", "lite"],
    "frac_static_m4": ["--frac-connections", "static"],
    "frac_dynamic_m4": ["--frac-connections", "dynamic"],
    "attn_res_full": ["--attn-res", "full"],
    # N = 2 groups (as the WikiText-2 comparison's row): 2 layers each at 4 blocks, 6 at 12
    "attn_res_block": ["--attn-res", "block", "--attn-res-blocks", "2"],
    "mudd": ["--mudd"],
    "value_residual": ["--value-residual", "learnable"],
}


def sizes(embed_dim, layers, heads):
    return ["--embed-dim", str(embed_dim), "--layers", str(layers), "--attention-heads", str(heads)]


def mac_share(flags, embed_dim, layers, context):
    """The method's forward MACs per token / the plain model's (its blocks and output layer),
    from the methods' own MAC models."""
    from fairseq_plugins.inprocess import build_language_model, make_dict

    model, _, _ = build_language_model("gpt_baseline_lm", sizes(embed_dim, layers, 4) + [
        "--tokens-per-sample", str(context), *flags], make_dict(16, "w"))
    stack = model.decoder.depth
    extra = stack.connection.macs(embed_dim)
    for i, block in enumerate(model.decoder.layers):  # LRF: a sub-layer over the history
        if block.fuse_attn is not None:
            # the all-positions reading: a causal token reads ~context/2 positions of each state
            positions = context // 2 if block.fuse_attn.reading == "all-positions" else 1
            extra += block.fuse_attn.macs(embed_dim, block.fuse_attn.num_heads,
                                          i + 1 - stack.fusion_first_state, positions=positions)
    value_residual = stack.value_residual
    if value_residual is not None:
        extra += value_residual.macs(embed_dim, layers)
    d, ffn = embed_dim, 4 * embed_dim
    # per token: q/k/v/out projections, attention over ~context/2 positions, the MLP
    plain = layers * (4 * d * d + d * context + 2 * d * ffn)
    return round(extra / plain, 4)


def run(args):
    if args.quick:
        depths = (2,)
        cfg = dict(vocab=500, context=32, batch=2, gen_batch=1, gen_context=8, gen_tokens=8)
        windows = dict(train=2, steps=1, warmup=1, gen=1)
        embed_dim = 32
    else:
        depths = (4, 12)
        cfg = dict(vocab=33278, context=128, batch=16, gen_batch=1, gen_context=8, gen_tokens=8)
        windows = dict(train=len(METHODS), steps=2, warmup=2, gen=1)  # every model in every slot
        embed_dim = 128
    script = os.path.abspath(lm.__file__)
    report = {"benchmark": "depth", "device": args.device, "fp16": args.fp16,
              "threads": args.threads, "torch": torch.__version__, "config": cfg,
              "windows": windows, "embed_dim": embed_dim, "depths": {},
              "targets": common.describe_targets("depth")}
    for layers in depths:
        models = {name: ("gpt_baseline_lm", sizes(embed_dim, layers, 4) + flags)
                  for name, flags in METHODS.items()}
        job = dict(cfg=cfg, device=args.device, fp16=args.fp16, threads=args.threads,
                   windows=windows, models=models)
        print(f"[bench] depth {layers}: memory ...", file=sys.stderr, flush=True)
        if args.quick:  # a smoke run: one process for every model (~8 s of start-up each)
            memory = common.run_isolated(script, dict(job, mode="memory_each"), args.threads)
        else:
            memory = {name: common.run_isolated(script, dict(job, mode="memory", model=name),
                                                args.threads) for name in models}
        print(f"[bench] depth {layers}: training (interleaved in one process) ...",
              file=sys.stderr, flush=True)
        train = common.run_isolated(script, dict(job, mode="train"), args.threads)
        base_mem = memory[BASELINE]["train_peak_memory_growth_mb"]
        rows = {}
        for name in models:
            rows[name] = {
                "train_seconds_per_update": train[name]["train_seconds_per_update"],
                "train_seconds_per_round": train[name]["train_seconds_per_round"],
                "train_time_ratio": common.paired_ratio(train[name], train[BASELINE]),
                "train_peak_memory_growth_mb": memory[name]["train_peak_memory_growth_mb"],
                "memory_growth_ratio": (round(memory[name]["train_peak_memory_growth_mb"]
                                              / base_mem, 3) if base_mem > 0 else None),
                "params_reference_count": memory[name]["params_reference_count"],
                "mac_share": mac_share(METHODS[name], embed_dim, layers, cfg["context"]),
            }
        # mHC-lite against mHC (Sinkhorn), both against the plain LM in the same process
        rows["mhc_lite_n4"]["train_time_ratio_vs_mhc"] = common.paired_ratio(
            train["mhc_lite_n4"], train["mhc_n4"])
        report["depths"][str(layers)] = rows
    # the targets read the deepest stack measured (where the methods cost the most)
    report["ratios_vs_plain"] = report["depths"][str(max(depths))]
    return report


def markdown_table(report):
    c = report["config"]
    lines = [f"{report['device']}{' fp16' if report['fp16'] else ''}, {report['threads']} threads, "
             f"torch {report['torch']}: gpt_baseline_lm d={report['embed_dim']}, vocabulary "
             f"{c['vocab']:,}, context {c['context']}, batch {c['batch']}. Ratios to the plain "
             "model in the same process; MAC share: the method's forward MACs per token over the "
             "plain blocks'.", "",
             "| blocks | method | training time ratio | peak-memory growth ratio | parameters | "
             "MAC share |", "|---:|---|---:|---:|---:|---:|"]
    for layers, rows in report["depths"].items():
        for name, r in rows.items():
            lines.append(f"| {layers} | {name} | {r['train_time_ratio']:.3f} | "
                         f"{r['memory_growth_ratio'] or float('nan'):.3f} | "
                         f"{r['params_reference_count']:,} | {r['mac_share']:.4f} |")
    return "\n".join(lines)


def parser():
    return common.bench_parser(__doc__.split("\n\n")[0])


def main(argv=None):
    return common.bench_main(parser(), lm.worker, run, argv)


if __name__ == "__main__":
    sys.exit(main())
