#!/usr/bin/env python3
"""How training time per update grows with sequence length and with depth, measured against the
MAC model, for fairseq's transformer and this package's variants (JSON + PNG).

    python scripts/bench/scaling.py [--quick] [--device cuda --fp16] [--out scaling.json]
        [--plot scaling.png]

Length: source = target length 16, 32, 64, 128 at a fixed number of sentences per batch (so the
tokens per batch grow with the length), 3+3 layers. Depth: 2, 4, 6, 8 encoder and decoder layers at
length 32. At every point the variants and the transformer are built in one fresh process and timed
in alternating windows (median), so each ratio compares like with like. Fuse-attention is quadratic
in depth (layer i attends over i+1 states): its ratio to the transformer grows with L, and the plot
puts the measured ratio next to the MAC model's (each sub-layer's ``macs``: ``naive`` is the multi-head
attention the LRF paper describes, ``implemented`` the cheaper algebra FuseAttention runs).
"""
import os
import sys

import torch

from layerlab import bench as common
from layerlab import paths

seq2seq = paths.load_script("bench", "seq2seq.py")  # the models and their MAC ratios

BASELINE = seq2seq.BASELINE
LENGTH_VARIANTS = ("fusion", "bridge", "inverted", "swapped")
DEPTH_VARIANTS = ("fusion", "bridge")


def worker(job):
    """One point: every model of ``job['variants']`` plus the baseline in this process, timed
    in alternating windows (order reversed every window) -> seconds per update per model."""
    torch.set_num_threads(job["threads"])
    cfg, w = job["cfg"], job["windows"]
    names = [BASELINE, *job["variants"]]
    benches = {n: seq2seq.bench_of(job, n) for n in names}
    for n in names:
        for _ in range(w["warmup"]):
            benches[n].train_step()
    common.sync(job["device"])
    times = {n: [] for n in names}
    for i in range(w["train"]):
        for n in (names if i % 2 == 0 else names[::-1]):
            times[n] += common.timed_windows(benches[n].train_step, 1, w["steps"], 0,
                                             job["device"])
    return {n: common.median(times[n]) for n in names}


def measure_curve(axis, points, variants, base_cfg, job, script, together=False):
    """Run one process per point (all points in one with ``together``: --quick); return the
    curve's JSON rows."""
    cfgs = []
    for value in points:
        cfg = dict(base_cfg)
        if axis == "length":
            cfg.update(src_len=value, tgt_len=value, max_tokens=value * base_cfg["sentences"])
        else:
            cfg.update(layers=value)
        cfgs.append(cfg)
    measured = common.run_jobs(
        script, [dict(job, cfg=cfg, variants=list(variants)) for cfg in cfgs], job["threads"],
        [f"scaling {axis}={value}: {BASELINE}, {', '.join(variants)}" for value in points],
        together=together)
    rows = []
    for value, cfg, seconds in zip(points, cfgs, measured):
        row = {axis: value, "target_tokens_per_batch": cfg["max_tokens"] // cfg["tgt_len"]
               * cfg["tgt_len"], "seconds_per_update": seconds, "time_ratio": {},
               "mac_model_ratio": {}, "mac_ratio_implemented": {}}
        for v in variants:
            row["time_ratio"][v] = round(seconds[v] / seconds[BASELINE], 3)
            row["mac_model_ratio"][v] = round(seq2seq.mac_ratio(v, cfg, "naive"), 3)
            row["mac_ratio_implemented"][v] = round(seq2seq.mac_ratio(v, cfg, "implemented"), 3)
        rows.append(row)
    return rows


def plot(report, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(11, 8))
    colors = {BASELINE: "black", "fusion": "tab:blue", "bridge": "tab:orange",
              "inverted": "tab:green", "swapped": "tab:red"}
    for col, (axis, label) in enumerate((("length", "source = target length (tokens)"),
                                         ("depth", "encoder = decoder layers"))):
        rows = report["curves"][axis]
        if not rows:
            continue
        xs = [r[axis] for r in rows]
        top, bottom = axes[0][col], axes[1][col]
        for name in rows[0]["seconds_per_update"]:
            ys = [r["seconds_per_update"][name] for r in rows]
            top.plot(xs, ys, "o-", color=colors.get(name), label=f"{name} (measured)")
            if name != BASELINE:
                predicted = [r["seconds_per_update"][BASELINE] * r["mac_model_ratio"][name]
                             for r in rows]
                top.plot(xs, predicted, "--", color=colors.get(name), alpha=0.6,
                         label=f"{name} (transformer x MAC model)")
                bottom.plot(xs, [r["time_ratio"][name] for r in rows], "o-",
                            color=colors.get(name), label=f"{name} measured")
                bottom.plot(xs, [r["mac_model_ratio"][name] for r in rows], "--",
                            color=colors.get(name), alpha=0.6, label=f"{name} MAC model")
                bottom.plot(xs, [r["mac_ratio_implemented"][name] for r in rows], ":",
                            color=colors.get(name), alpha=0.6,
                            label=f"{name} MAC as implemented")
        top.set(xlabel=label, ylabel="seconds per update", xticks=xs,
                title=f"training time vs {axis} ({report['device']})")
        bottom.set(xlabel=label, ylabel="time / transformer's time", xticks=xs,
                   title="ratio to fairseq transformer, same process")
        bottom.axhline(1.0, color="grey", linewidth=0.5)
        top.legend(fontsize=7)
        bottom.legend(fontsize=7)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run(args):
    """The scaling report (a dict); also used by run.py."""
    if args.quick:
        base = dict(layers=2, d=64, ffn=128, heads=4, vocab=500, src_len=16, tgt_len=16,
                    sentences=8, max_tokens=128, gen_sentences=1)
        lengths, depths = (8, 16), (2, 3)
        windows = dict(train=2, steps=1, warmup=1)
    else:
        base = dict(layers=3, d=256, ffn=1024, heads=4, vocab=8000, src_len=32, tgt_len=32,
                    sentences=32, max_tokens=1024, gen_sentences=1)
        lengths, depths = (16, 32, 64, 128), (2, 4, 6, 8)
        windows = dict(train=5, steps=2, warmup=2)
    job = dict(device=args.device, fp16=args.fp16, threads=args.threads, windows=windows)
    script = os.path.abspath(__file__)
    return {"benchmark": "scaling", "device": args.device, "fp16": args.fp16,
            "threads": args.threads, "torch": torch.__version__, "config": base,
            "windows": windows,
            "curves": {"length": measure_curve("length", lengths, LENGTH_VARIANTS, base, job,
                                               script, args.quick),
                       "depth": measure_curve("depth", depths, DEPTH_VARIANTS, base, job,
                                              script, args.quick)}}


def markdown_table(report):
    c = report["config"]
    lines = [f"{report['device']}{' fp16' if report['fp16'] else ''}, {report['threads']} threads: "
             f"d={c['d']}, FFN {c['ffn']}, {c['heads']} heads, {c['sentences']} sentences per "
             f"batch; length curve at {c['layers']}+{c['layers']} layers, depth curve at length "
             f"{c['tgt_len']}. Training time ratio to fairseq's `transformer` in the same process "
             "(MAC model's ratio in brackets).", ""]
    for axis in ("length", "depth"):
        rows = report["curves"][axis]
        if not rows:
            continue
        variants = list(rows[0]["time_ratio"])
        lines += [f"| {axis} | transformer s/update | "
                  + " | ".join(f"{v} (MAC model)" for v in variants) + " |",
                  "|---:|---:|" + "---:|" * len(variants)]
        for r in rows:
            lines.append(f"| {r[axis]} | {r['seconds_per_update'][BASELINE]:.4f} | "
                         + " | ".join(f"{r['time_ratio'][v]:.3f} ({r['mac_model_ratio'][v]:.3f})"
                                      for v in variants) + " |")
        lines.append("")
    return "\n".join(lines)


def parser():
    p = common.bench_parser(__doc__.split("\n\n")[0])
    p.add_argument("--plot", help="write the curves as a PNG here")
    return p


def main(argv=None):
    def write_plot(report, args):
        if args.plot:
            plot(report, args.plot)

    return common.bench_main(parser(), worker, run, argv, write_plot)


if __name__ == "__main__":
    sys.exit(main())
