#!/usr/bin/env python3
"""The fused kernels' GPU targets, checked against what ``scripts/bench/gpu_check.sh`` wrote.

    python scripts/bench/gpu_targets.py OUT     # OUT: gpu_check.sh's folder

Reads the bench reports the check leaves in OUT (``bench_depth_d1024.json``,
``bench_graph_d128.json``, ``bench_compile_d128.json``; a missing one: its targets are listed as
not measured) and writes ``OUT/targets.{json,md}``: every target with the measured ratio, met
or missed. The targets (docs/ideas/fused-kernels.md; 12 blocks, fp16, the training time over
the plain LM's in the same process): at d = 1024 mHC <= 1.10x; HC static and dynamic, mHC-lite,
Frac-Connections, AttnRes Full and MUDD <= 1.05x; AttnRes Block, DWA and value residual <=
1.03x; at d = 128 every method <= 1.25x with a CUDA graph (``--cuda-graph``) or with
``--torch-compile``, against the plain model captured the same way (``plain_graph``,
``plain_compile``: the stricter reading, the capture speeds the plain model up too).
"""
import json
import os
import sys

# (bench report in OUT, its rows, the ratio each must not exceed, the plain row it is
# divided by: None: the report's own plain model, whose ratio is 1)
D1024 = "bench_depth_d1024"
TARGETS = (
    (D1024, ("mhc_n4",), 1.10, None),
    (D1024, ("hc_static_n4", "hc_dynamic_n4", "mhc_lite_n4", "frac_dynamic_m4",
             "attn_res_full", "mudd"), 1.05, None),
    (D1024, ("attn_res_block", "dwa", "value_residual"), 1.03, None),
    ("bench_graph_d128", ("hc_static_n4_graph", "hc_dynamic_n4_graph", "mhc_n4_graph",
                          "mhc_lite_n4_graph", "frac_dynamic_m4_graph", "attn_res_full_graph",
                          "attn_res_block_graph", "mudd_graph", "dwa_graph",
                          "value_residual_graph"), 1.25, "plain_graph"),
    ("bench_compile_d128", ("hc_dynamic_n4_compile", "mhc_n4_compile", "attn_res_full_compile",
                            "mudd_compile"), 1.25, "plain_compile"),
)


def load(out, name):
    path = os.path.join(out, name + ".json")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def check(out):
    """[{report, row, ratio, required, met}] for every target (ratio None: not measured)."""
    results = []
    for name, rows, threshold, against in TARGETS:
        report = load(out, name)
        measured = {} if report is None else report["ratios_vs_plain"]
        for row in rows:
            ratio = measured.get(row, {}).get("train_time_ratio")
            if ratio is not None and against is not None:
                base = measured.get(against, {}).get("train_time_ratio")
                ratio = None if base is None else round(ratio / base, 3)
            results.append({"report": name, "row": row, "ratio": ratio, "required": threshold,
                            "against": against or "plain",
                            "met": None if ratio is None else ratio <= threshold})
    return results


def markdown(results):
    met = sum(r["met"] is True for r in results)
    measured = sum(r["met"] is not None for r in results)
    lines = [f"{met} of {measured} measured targets met ({len(results) - measured} not "
             "measured). Training time over the plain model's in the same process, 12 blocks, "
             "fp16.", "", "| report | row | against | ratio | target | met |",
             "|---|---|---|---:|---:|:-:|"]
    for r in results:
        ratio = "—" if r["ratio"] is None else f"{r['ratio']:.3f}"
        verdict = {True: "yes", False: "no", None: "not measured"}[r["met"]]
        lines.append(f"| {r['report']} | {r['row']} | {r['against']} | {ratio} | "
                     f"<= {r['required']:.2f} | {verdict} |")
    return "\n".join(lines)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1 or not os.path.isdir(argv[0]):
        print("usage: gpu_targets.py OUT (gpu_check.sh's folder)", file=sys.stderr)
        return 2
    out = argv[0]
    results = check(out)
    with open(os.path.join(out, "targets.json"), "w") as f:
        json.dump(results, f, indent=2)
    table = markdown(results)
    with open(os.path.join(out, "targets.md"), "w") as f:
        f.write(table + "\n")
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
