#!/usr/bin/env python3
"""Speed and memory of the depth connections in the decoder-only LM against the plain model.

    python scripts/bench/depth.py [--quick] [--device cuda --fp16] [--rows plain,mudd,...]
        [--depths 4,12] [--embed-dim 128] [--vocab 8000] [--dropout 0.1]
        [--out results/bench_depth_cpu.json]

``gpt_baseline_lm`` at the size of the WikiText-2 comparison (d=128, 4 and 12 blocks, 4 heads,
context 128, batch 16; by default a 33,278-token vocabulary, WikiText-2's words) plain and with
each depth connection (fairseq_plugins.depth), and that comparison's ``ar_encdec_lm`` rows (two
stacks of half the blocks; plain, with the bridges over its encoder, with the embedding loss):
training seconds per update (timed windows of forward + backward + Adam step, every model
taking turns in one process, each in every slot of the rotation; the time ratio is the median
over the rounds of the two models' ratio within a round) and the peak memory growth of training
(a process per model), with each method's multiply-accumulate model (its ``macs`` beside its
module) as the share of the plain model's forward MACs per token, the aten operators of one
forward + backward pass (:func:`operators_per_step`: what a GPU step of a narrow model is bound
by) and the kernel's share of each model's CPU time in the timed steps (page faults: on CPU
they pad the plain model's time; the report names the ``MALLOC_*`` settings it ran under).
``--rows`` measures a subset (the plain model always); ``--embed-dim`` another width (FFN 4x;
heads, context and batch unchanged), ``--batch`` another batch, ``--vocab`` another vocabulary
(the comparison trains over 8,000 SentencePiece pieces: its output layer is a quarter of the
word-level one, so every method's overhead is a larger share of its step), ``--dropout`` the
models' dropout (by default theirs, 0; the comparison trains with 0.1, and dropout on an
attention's weights costs in proportion to its keys: LRF's all-positions reading, whose keys
are every position of every lower state, pays the most). The worker is
``lm.py``'s. Ratios are the result; absolute numbers only mean something on a GPU.
"""
import os
import sys

import torch

from layerlab import bench as common
from layerlab import paths, recipes

lm = paths.load_script("bench", "lm.py")

BASELINE = "plain"
ARCH = "gpt_baseline_lm"
# row -> (architecture, flags) at a given total depth; ar_encdec_lm rows have two stacks of half
# the blocks (the WikiText-2 comparison's rows: the same total)
METHODS = {
    BASELINE: (ARCH, []),
    "dwa": (ARCH, ["--decoder-fusion", "--fusion-kind", "dwa"]),
    "lrf": (ARCH, ["--decoder-fusion"]),
    "lrf_all_positions": (ARCH, ["--decoder-fusion", "--fusion-reading", "all-positions"]),
    "hc_static_n4": (ARCH, ["--hyper-connections", "static"]),
    "hc_dynamic_n4": (ARCH, ["--hyper-connections", "dynamic"]),
    "mhc_n4": (ARCH, ["--mhc", "sinkhorn"]),
    "mhc_lite_n4": (ARCH, ["--mhc", "lite"]),
    "frac_static_m4": (ARCH, ["--frac-connections", "static"]),
    "frac_dynamic_m4": (ARCH, ["--frac-connections", "dynamic"]),
    # the multi-stream methods rebuilding their inputs and inner streams in the backward pass
    "hc_dynamic_n4_recompute": (ARCH, ["--hyper-connections", "dynamic", "--stream-recompute"]),
    "mhc_n4_recompute": (ARCH, ["--mhc", "sinkhorn", "--stream-recompute"]),
    "frac_dynamic_m4_recompute": (ARCH, ["--frac-connections", "dynamic", "--stream-recompute"]),
    "attn_res_full": (ARCH, ["--attn-res", "full"]),
    # N = 2 groups (as the WikiText-2 comparison's row): 2 layers each at 4 blocks, 6 at 12
    "attn_res_block": (ARCH, ["--attn-res", "block", "--attn-res-blocks", "2"]),
    "mudd": (ARCH, ["--mudd"]),
    "value_residual": (ARCH, ["--value-residual", "learnable"]),
    # r = 4 (3% of the comparison's width): the WikiText-2 comparison's rows
    "laurel_rw_lr": (ARCH, ["--laurel", "rw_lr", "--laurel-rank", "4"]),
    "laurel_pa": (ARCH, ["--laurel", "pa", "--laurel-rank", "4"]),
    "ar_encdec": ("ar_encdec_lm", []),
    "ar_encdec_bridge": ("ar_encdec_lm", ["--bridge", "fc"]),
    "ar_encdec_transparent": ("ar_encdec_lm", ["--bridge", "transparent"]),
    # the criterion's extra work is part of what a training step costs
    "ar_encdec_embedding_loss": ("ar_encdec_lm", ["--criterion", "lm_embedding_loss",
                                                  "--embedding-loss", "mse"]),
}
# the fused rows' eager code in the same process (--no-fused-kernels): on a GPU what the Triton
# kernels gain (fairseq_plugins/depth/fused.py); on a CPU the very code of the row without the
# suffix, so measured there only when --rows names them
EAGER = "_eager"
FUSED = ("hc_static_n4", "hc_dynamic_n4", "mhc_n4", "mhc_lite_n4", "frac_dynamic_m4",
         "attn_res_full", "attn_res_block", "mudd")
for _name in FUSED:
    METHODS[_name + EAGER] = (METHODS[_name][0], METHODS[_name][1] + ["--no-fused-kernels"])
# the rows with the training passes of their blocks replayed as a CUDA graph (--cuda-graph,
# gpt_baseline_lm only; fairseq_plugins/cuda_graph.py): on a GPU what the launches cost; on a
# CPU the very code of the row without the suffix, so measured there only when --rows names them
GRAPH = "_graph"
for _name in [BASELINE, "dwa", "value_residual", *FUSED]:
    METHODS[_name + GRAPH] = (METHODS[_name][0], METHODS[_name][1] + ["--cuda-graph"])
# the same rows through torch.compile (--torch-compile, mode reduce-overhead: inductor's fused
# kernels replayed by torch's own CUDA graphs; fairseq_plugins/torch_compile.py): on a GPU the
# other way to cut the launches, beside the _graph rows; on a CPU compiling takes minutes per row
COMPILE = "_compile"
for _name in [BASELINE, "dwa", "value_residual", *FUSED]:
    METHODS[_name + COMPILE] = (METHODS[_name][0], METHODS[_name][1] + [
        "--torch-compile", "--torch-compile-mode", "reduce-overhead"])
GPU_ONLY = (EAGER, GRAPH, COMPILE)
HEADS = 4
EMBED_DIM = 128  # the WikiText-2 comparison's width
BATCH = 16  # its sequences per update
VOCAB = 33278  # WikiText-2's words (the comparison itself trains over 8,000 pieces)
MIN_VOCAB = 5  # fairseq's four special symbols and one word


def sizes(arch, embed_dim, layers):
    """Size flags of a row with ``layers`` blocks in all, as the WikiText-2 comparison trains it
    (ar_encdec_lm: half per stack)."""
    return recipes.lm_sizes(arch, layers, embed_dim, HEADS)


def small_vocabulary_model(arch, flags, embed_dim, layers, context):
    """The row's model built in-process over a 16-symbol dictionary (what its structure does
    not depend on: the MAC model and the operator count read it, nothing trains it)."""
    from fairseq_plugins.inprocess import build_language_model, make_dict

    model, _, _ = build_language_model(arch, sizes(arch, embed_dim, layers) + [
        "--tokens-per-sample", str(context), *flags], make_dict(16, "w"))
    return model


def mac_share(arch, flags, embed_dim, layers, context):
    """The row's forward MACs per token beyond the plain model's / the plain model's (its
    blocks), from the methods' own MAC models; ar_encdec_lm: its decoder's cross-attention and
    input projection, and the bridge over its encoder."""
    model = small_vocabulary_model(arch, flags, embed_dim, layers, context)
    d, ffn = embed_dim, 4 * embed_dim
    # per token: q/k/v/out projections, attention over ~context/2 positions, the MLP
    plain = layers * (4 * d * d + d * context + 2 * d * ffn)
    decoder = model.decoder
    if arch == "ar_encdec_lm":
        # each decoder block's cross-attention: its four projections and a causal read of
        # ~context/2 encoder positions; one input projection; the bridge once per token
        extra = len(decoder.layers) * (4 * d * d + d * context) + d * d
        if decoder.bridge is not None:
            extra += decoder.bridge.macs(d, decoder.bridge.num_states, len(decoder.layers), 1)
        return round(extra / plain, 4)
    stack = decoder.depth
    extra = stack.connection.macs(embed_dim)
    for i, block in enumerate(decoder.layers):  # LRF: a sub-layer over the history
        if block.fuse_attn is not None:
            # the all-positions reading: a causal token reads ~context/2 positions of each state
            positions = context // 2 if block.fuse_attn.reading == "all-positions" else 1
            extra += block.fuse_attn.macs(embed_dim, block.fuse_attn.num_heads,
                                          i + 1 - stack.fusion_first_state, positions=positions)
    value_residual = stack.value_residual
    if value_residual is not None:
        extra += value_residual.macs(embed_dim, layers)
    return round(extra / plain, 4)


def uncaptured(flags):
    """``flags`` without ``--cuda-graph`` and ``--torch-compile`` (and its mode)."""
    out, skip = [], False
    for flag in flags:
        if skip:
            skip = False
        elif flag == "--torch-compile-mode":
            skip = True
        elif flag not in ("--cuda-graph", "--torch-compile"):
            out.append(flag)
    return out


def operators_per_step(arch, flags, layers):
    """The aten operators one forward + backward pass of the row dispatches (views and
    allocations apart; :func:`layerlab.bench.operators_dispatched`), counted on the CPU at
    d=32, context 16, batch 2: the count depends on the depth and the method, not on the width
    or the batch, and a GPU step of the comparison's narrow model is bound by it. The ``_graph``
    and ``_compile`` rows count their eager row's operators (what the capture replays or
    the compiler starts from; compiling here would take minutes of CPU per row)."""
    model = small_vocabulary_model(arch, uncaptured(flags), 32, layers, 16)
    tokens = torch.randint(4, 20, (2, 16), generator=torch.Generator().manual_seed(0))

    def step():
        model(tokens)[0].float().sum().backward()
    return common.operators_dispatched(step)


def saved_per_token(arch, flags, embed_dim, layers, device, fp16):
    """The bytes one training forward pass of the row keeps for its backward, per token
    (:func:`layerlab.bench.bytes_saved_for_backward`, parameters apart), at the row's width
    and depth, context 16, batch 2 (per token it depends on the context only through the
    attention), on ``device``: on a GPU (or under Triton's interpreter) what the fused kernels
    keep, on a CPU the eager code's. The memory a method must add is its streams (n x C per
    position at each sub-layer's input instead of C) and its sources; anything beyond is what
    its code keeps. None for the ``--cuda-graph`` and ``--torch-compile`` rows: the same
    function as their row's, which a capture (a CUDA graph's memory pool, compiled code's own
    saving) changes in ways these hooks do not see."""
    if uncaptured(flags) != flags:
        return None
    model = small_vocabulary_model(arch, flags, embed_dim, layers, 16).to(
        device=device, dtype=torch.float16 if fp16 else torch.float32).train()
    tokens = torch.randint(4, 16, (2, 16), generator=torch.Generator().manual_seed(0))
    saved = common.bytes_saved_for_backward(lambda: model(tokens.to(device))[0],
                                            exclude=list(model.parameters()))
    return round(saved / tokens.numel())


def chosen_rows(rows, device="cpu"):
    """The rows to measure (``--rows``; the plain model always), in METHODS' order; by default
    every row (the ``_eager``, ``_graph`` and ``_compile`` ones on a GPU only)."""
    if not rows:
        return [r for r in METHODS if not r.endswith(GPU_ONLY) or device.startswith("cuda")]
    names = [r for r in rows.split(",") if r]
    unknown = [r for r in names if r not in METHODS]
    if unknown:
        raise SystemExit(f"depth.py: unknown row(s) {', '.join(unknown)}; known: "
                         f"{', '.join(METHODS)}")
    return [r for r in METHODS if r == BASELINE or r in names]


def run(args):
    if args.quick and args.embed_dim is not None:
        raise SystemExit("depth.py: --embed-dim: not with --quick (which measures d=32)")
    if args.quick and args.batch is not None:
        raise SystemExit("depth.py: --batch: not with --quick (which measures batch 2)")
    if args.quick and args.vocab is not None:
        raise SystemExit("depth.py: --vocab: not with --quick (which measures 500 symbols)")
    if args.vocab is not None and args.vocab < MIN_VOCAB:
        raise SystemExit(f"depth.py: --vocab {args.vocab}: at least {MIN_VOCAB} symbols "
                         "(fairseq's four special ones and one word)")
    if not 0 <= args.dropout < 1:
        raise SystemExit(f"depth.py: --dropout {args.dropout}: a probability in [0, 1)")
    if args.batch is not None and args.batch < 1:
        raise SystemExit(f"depth.py: --batch {args.batch}: at least 1 sequence")
    if args.embed_dim is not None and (args.embed_dim < HEADS or args.embed_dim % HEADS):
        raise SystemExit(f"depth.py: --embed-dim {args.embed_dim}: a positive multiple of "
                         f"{HEADS} (the heads)")
    if args.quick:
        depths = (2,)
        cfg = dict(vocab=500, context=32, batch=2, gen_batch=1, gen_context=8, gen_tokens=8,
                   dropout=args.dropout)
        windows = dict(train=2, steps=1, warmup=1, gen=1)
        embed_dim = 32
    else:
        depths = tuple(args.depths)
        cfg = dict(vocab=args.vocab or VOCAB, context=128, batch=args.batch or BATCH,
                   gen_batch=1, gen_context=8, gen_tokens=8, dropout=args.dropout)
        embed_dim = args.embed_dim or EMBED_DIM
    names = chosen_rows(args.rows, args.device)
    # ar_encdec_lm's two stacks and AttnRes Block's two groups each take half of the blocks
    halved = [n for n in names if METHODS[n][0] == "ar_encdec_lm" or n == "attn_res_block"]
    for layers in depths:
        if layers < 1 or (halved and layers % 2):
            raise SystemExit(f"depth.py: --depths {layers}: a positive number of blocks"
                             + (f", even for {', '.join(halved)}" if halved else ""))
    # each row's method flags, with the dropout asked for (the models' default is none)
    methods = {name: (METHODS[name][0], METHODS[name][1]
                      + (["--dropout", str(args.dropout)] if args.dropout else []))
               for name in names}
    if args.saved_only:
        return saved_report(args, names, depths, embed_dim, methods)
    if not args.quick:  # every model in every slot of the rotation
        windows = dict(train=len(names), steps=2, warmup=2, gen=1)
    script = os.path.abspath(lm.__file__)
    report = {"benchmark": "depth", "device": args.device, "fp16": args.fp16,
              "threads": args.threads, "torch": torch.__version__, "config": cfg,
              "windows": windows, "embed_dim": embed_dim, "depths": {},
              "allocator_env": common.allocator_environment(),
              "targets": common.describe_targets("depth")}
    if common.is_cuda(args.device):  # absolute times mean something only with the card named
        report["gpu"] = torch.cuda.get_device_name(args.device)
    for layers in depths:
        models = {name: (methods[name][0], sizes(methods[name][0], embed_dim, layers)
                         + methods[name][1]) for name in names}
        job = dict(cfg=cfg, device=args.device, fp16=args.fp16, threads=args.threads,
                   windows=windows, models=models)
        memory = dict(zip(models, common.run_jobs(
            script, [dict(job, mode="memory", model=name) for name in models], args.threads,
            [f"depth {layers}, {name}: memory" for name in models], together=args.quick)))
        print(f"[bench] depth {layers}: training (interleaved in one process) ...",
              file=sys.stderr, flush=True)
        train = common.run_isolated(script, dict(job, mode="train"), args.threads,
                                    forkable=args.quick)
        base_mem = memory[BASELINE]["train_peak_memory_growth_mb"]
        rows = {}
        for name in models:
            rows[name] = {
                "train_seconds_per_update": train[name]["train_seconds_per_update"],
                "train_seconds_per_round": train[name]["train_seconds_per_round"],
                "train_time_ratio": common.paired_ratio(train[name], train[BASELINE]),
                "system_time_share": train[name]["train_system_share"],
                "train_peak_memory_growth_mb": memory[name]["train_peak_memory_growth_mb"],
                "memory_growth_ratio": (round(memory[name]["train_peak_memory_growth_mb"]
                                              / base_mem, 3) if base_mem > 0 else None),
                "params_reference_count": memory[name]["params_reference_count"],
                "mac_share": mac_share(*methods[name], embed_dim, layers, cfg["context"]),
                "operators_per_step": operators_per_step(*methods[name], layers),
                "saved_bytes_per_token": saved_per_token(*methods[name], embed_dim, layers,
                                                         args.device, args.fp16),
            }
        if {"mhc_lite_n4", "mhc_n4"} <= set(rows):  # mHC-lite against mHC (Sinkhorn)
            rows["mhc_lite_n4"]["train_time_ratio_vs_mhc"] = common.paired_ratio(
                train["mhc_lite_n4"], train["mhc_n4"])
        add_saved_ratios(rows)
        report["depths"][str(layers)] = rows
    # the targets read the deepest stack measured (where the methods cost the most)
    report["ratios_vs_plain"] = report["depths"][str(max(depths))]
    return report


def add_saved_ratios(rows):
    """Each row's ``saved_ratio``: its saved bytes per token over the plain model's (None
    where the row has none)."""
    base = rows[BASELINE]["saved_bytes_per_token"]
    for r in rows.values():
        r["saved_ratio"] = (None if r["saved_bytes_per_token"] is None
                            else round(r["saved_bytes_per_token"] / base, 3))


def saved_report(args, names, depths, embed_dim, methods):
    """``--saved-only``: the saved-for-backward column alone (no timing, no worker process): on
    a CPU under ``TRITON_INTERPRET=1`` what the fused kernels keep, without a GPU. ``methods``:
    {row: (arch, flags)}, the flags with the dropout asked for."""
    report = {"benchmark": "depth", "saved_only": True, "device": args.device,
              "fp16": args.fp16, "torch": torch.__version__, "embed_dim": embed_dim,
              "dropout": args.dropout,
              "interpreter": os.environ.get("TRITON_INTERPRET") == "1", "depths": {}}
    for layers in depths:
        rows = {name: {"saved_bytes_per_token": saved_per_token(
            *methods[name], embed_dim, layers, args.device, args.fp16)} for name in names}
        add_saved_ratios(rows)
        report["depths"][str(layers)] = rows
    return report


def saved_markdown(report):
    """The markdown of a ``--saved-only`` report."""
    lines = [f"{report['device']}{' fp16' if report['fp16'] else ''}"
             f"{' (Triton interpreter: the fused kernels)' if report['interpreter'] else ''}"
             f", torch {report['torch']}: gpt_baseline_lm d={report['embed_dim']}"
             f"{', dropout %g' % report['dropout'] if report.get('dropout') else ''}; the "
             "bytes per token one training forward pass keeps for its backward (parameters "
             "apart, each storage once; context 16, batch 2) and their ratio to the plain "
             "model's.", "", "| blocks | method | saved for backward | ratio |",
             "|---:|---|---:|---:|"]
    for layers, rows in report["depths"].items():
        lines += [f"| {layers} | {name} | {r['saved_bytes_per_token']:,} B | "
                  f"{r['saved_ratio']:.3f} |" for name, r in rows.items()
                  if r["saved_bytes_per_token"] is not None]
    return "\n".join(lines)


def markdown_table(report):
    if report.get("saved_only"):
        return saved_markdown(report)
    c = report["config"]
    lines = [f"{report['device']}{' fp16' if report['fp16'] else ''}, {report['threads']} threads, "
             f"torch {report['torch']}: gpt_baseline_lm d={report['embed_dim']} (the ar_encdec "
             "rows: ar_encdec_lm, two stacks of half the blocks), vocabulary "
             f"{c['vocab']:,}, context {c['context']}, batch {c['batch']}"
             f"{', dropout %g' % c['dropout'] if c.get('dropout') else ', no dropout'}. "
             "Ratios to the plain "
             "model in the same process; MAC share: the method's forward MACs per token over the "
             "plain blocks'; operators: aten operators of one forward + backward pass, views and "
             "allocations apart; saved for backward: the bytes per token one training forward "
             "pass keeps for its backward (parameters apart; context 16, batch 2, on the "
             "bench's device), and their ratio to the plain model's; kernel share: the system "
             "part of the process's CPU time in the timed steps (page faults, mostly; empty "
             f"where those steps took under {common.MIN_TICKS_FOR_SHARE} clock ticks of CPU "
             "time, and in reports made before "
             "the bench counted them). "
             "Allocator settings: "
             + (", ".join(f"{k}={v}" for k, v in report.get("allocator_env", {}).items())
                or "glibc's defaults (or not recorded)") + ".", "",
             "| blocks | method | training time ratio | peak-memory growth ratio | parameters | "
             "MAC share | operators | saved for backward | kernel share |",
             "|---:|---|---:|---:|---:|---:|---:|---:|---:|"]

    def cell(value, spec):
        return "" if value is None else format(value, spec)

    def saved_cell(r):  # empty in reports made before the bench measured it
        if r.get("saved_bytes_per_token") is None:
            return ""
        return f"{r['saved_bytes_per_token']:,} B ({r['saved_ratio']:.2f}x)"
    for layers, rows in report["depths"].items():
        for name, r in rows.items():
            lines.append(f"| {layers} | {name} | {r['train_time_ratio']:.3f} | "
                         f"{r['memory_growth_ratio'] or float('nan'):.3f} | "
                         f"{r['params_reference_count']:,} | {r['mac_share']:.4f} | "
                         f"{cell(r.get('operators_per_step'), ',')} | "
                         f"{saved_cell(r)} | {cell(r.get('system_time_share'), '.3f')} |")
    return "\n".join(lines)


def parser():
    p = common.bench_parser(__doc__.split("\n\n")[0])
    p.add_argument("--rows", help="comma-separated rows to measure (default: every row; the "
                   f"plain model always): {', '.join(METHODS)}")
    p.add_argument("--depths", type=lambda t: [int(x) for x in t.split(",") if x],
                   default=[4, 12], help="total blocks of each measured size (not with --quick, "
                   "which measures 2); default 4,12")
    p.add_argument("--embed-dim", type=int, help=f"model width (default {EMBED_DIM}, the "
                   "WikiText-2 comparison's; FFN 4x, heads, context and batch unchanged): on a "
                   "GPU the narrow model's steps are kernel-launch bound, a wider one shows the "
                   "methods' arithmetic share")
    p.add_argument("--saved-only", action="store_true", help="measure only the bytes one "
                   "training forward pass keeps for its backward (no timing): with "
                   "TRITON_INTERPRET=1 on a CPU, what the fused kernels keep")
    p.add_argument("--batch", type=int, help=f"sequences per update (default {BATCH}, the "
                   "comparison's): on a GPU in fp16 the plain step at batch 16 is launch-bound "
                   "even at d=1024 (results/gpu_check_h200); a larger batch measures the "
                   "methods' arithmetic")
    p.add_argument("--dropout", type=float, default=0.0, help="the models' dropout (default 0, "
                   "theirs; the WikiText-2 comparison trains with 0.1): dropout on attention "
                   "weights costs in proportion to the keys, so each method's time ratio "
                   "depends on it")
    p.add_argument("--vocab", type=int, help=f"symbols in the dictionary, fairseq's four special "
                   f"ones included (default {VOCAB:,}, WikiText-2's words); the WikiText-2 "
                   "comparison trains over 8,000 (its SentencePiece pieces): the output layer's "
                   "share of a step, and so each method's time ratio, depends on it")
    return p


def main(argv=None):
    return common.bench_main(parser(), lm.worker, run, argv)


if __name__ == "__main__":
    sys.exit(main())
