#!/usr/bin/env python3
"""The whole benchmark suite in one command: every registered architecture against its fairseq
baseline in the same run, the scaling curves, and the targets checked (JSON + markdown + PNG).

    python scripts/bench/run.py [--quick] [--device cuda --fp16] [--out results/bench.json]
        [--markdown results/bench.md] [--plot results/bench_scaling.png] [--only seq2seq,lm]

Runs ``seq2seq.py`` (transformer vs fusion enc/dec/both, bridge, the three cross-attention
variants: training tokens/s, beam-5 generation, peak memory), ``lm.py`` (gpt_baseline_lm vs
ar_encdec_lm with and without the embedding loss; cached vs recomputed generation at context 200),
``depth.py`` (the depth connections in gpt_baseline_lm and the ar_encdec_lm rows of the WikiText-2
comparison against the plain model, at 4 and 12 blocks) and ``scaling.py`` (time per update
against length and depth, with the MAC model), then checks the targets of the architecture
issues. Every figure is a ratio to a baseline measured in the same process; absolute numbers are
printed but only mean something on a GPU. On a GPU, commit the JSON under its own name, e.g.
``--out results/bench_cuda_fp16.json``. No timing is ever asserted by a test: the exit status is
0 whether or not a target is met (see ``targets``).
``--quick`` writes to ``build/bench-quick/`` unless told otherwise, never over ``results/``,
and runs each part's worker jobs in one process (``layerlab.bench.run_jobs``): its memory
figures are not isolated.
"""
import os
import sys

import torch

from layerlab import bench as common
from layerlab import paths

# the parts are scripts of their own (each also runs alone)
depth = paths.load_script("bench", "depth.py")
lm = paths.load_script("bench", "lm.py")
scaling = paths.load_script("bench", "scaling.py")
seq2seq = paths.load_script("bench", "seq2seq.py")

PARTS = {"seq2seq": seq2seq, "lm": lm, "depth": depth, "scaling": scaling}


def markdown(report):
    lines = [f"# Benchmark suite ({report['device']}{' fp16' if report['fp16'] else ''}, "
             f"{report['threads']} threads, torch {report['torch']})", "",
             f"Command: `{report['command']}`", ""]
    if report["quick"]:
        lines += ["**--quick: tiny sizes and single windows; the figures below show that the suite "
                  "runs, not what anything costs.**", ""]
    lines += ["## Targets", "",
             "| target | measured | required | met |", "|---|---:|---:|:---:|"]
    for t in report["targets"]:
        lines.append(f"| {t['target']} | {t['measured']} | {t['required']} | "
                     f"{'yes' if t['met'] else '**no**'} |")
    titles = {"seq2seq": "Sequence-to-sequence models", "lm": "Language models",
              "depth": "Depth connections in the language model",
              "scaling": "Scaling with length and depth"}
    for name, part in report["parts"].items():
        lines += ["", f"## {titles[name]}", "", PARTS[name].markdown_table(part)]
    return "\n".join(lines)


RESULTS = paths.RESULTS
# --quick numbers (tiny sizes) must never replace the committed results: they go here instead
QUICK_RESULTS = os.path.join(paths.REPO, "build", "bench-quick")


def parse_args(argv=None):
    """The suite's options; --out/--markdown/--plot default to results/bench.* for a full run
    and to build/bench-quick/ for --quick."""
    p = common.bench_parser(__doc__.split("\n\n")[0])
    p.add_argument("--markdown", help="the markdown tables (default: results/bench.md)")
    p.add_argument("--plot", help="the scaling curves as a PNG (default: "
                   "results/bench_scaling.png)")
    p.add_argument("--only", default=",".join(PARTS),
                   help=f"comma-separated subset of {', '.join(PARTS)}")
    args = common.parse_bench_args(p, None, argv)  # also rejects --fp16 on the CPU
    folder = QUICK_RESULTS if args.quick else RESULTS
    for name, file in (("out", "bench.json"), ("markdown", "bench.md"),
                       ("plot", "bench_scaling.png")):
        if getattr(args, name) is None:
            setattr(args, name, os.path.join(folder, file))
    unknown = sorted(set(args.only.split(",")) - set(PARTS))
    if unknown:
        p.error(f"--only: unknown part(s) {', '.join(unknown)}; choose from {', '.join(PARTS)}")
    return args


def main(argv=None):
    args = parse_args(argv)
    only = args.only.split(",")
    shared = ["--device", args.device, "--threads", str(args.threads)]
    shared += ["--quick"] * args.quick + ["--fp16"] * args.fp16
    parts = {}
    for name in only:
        print(f"[bench] === {name} ===", file=sys.stderr, flush=True)
        parts[name] = PARTS[name].run(PARTS[name].parser().parse_args(shared))
    report = {"benchmark": "suite", "device": args.device, "fp16": args.fp16,
              "threads": args.threads, "torch": torch.__version__, "quick": args.quick,
              "command": " ".join(["python scripts/bench/run.py", *sys.argv[1:]]
                                  if argv is None else ["python scripts/bench/run.py", *argv]),
              "targets": common.check_targets(parts), "parts": parts}
    common.emit_report(report, args.out)
    common.write_text(args.markdown, markdown(report))
    if "scaling" in parts and args.plot:
        scaling.plot(parts["scaling"], args.plot)
    missed = [t["target"] for t in report["targets"] if not t["met"]]
    print(f"[bench] wrote {args.out}, {args.markdown}"
          + (f", {args.plot}" if "scaling" in parts else "")
          + f"; targets missed: {len(missed)} of {len(report['targets'])}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
