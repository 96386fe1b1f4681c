#!/usr/bin/env python3
"""Time per update of the WikiText-2 comparison's training, with glibc's default allocator and
with freed memory retained, side by side (docs/ideas/comparison.md, "Throughput").

    python scripts/bench/comparison_throughput.py [--data data-bin/wikitext-2] [--depths 4,12]
        [--row baseline] [--updates 200] [--out-dir build/bench-throughput]
        [--results-name bench_comparison_throughput_cpu]

For each depth, two ``fairseq-train`` processes of the comparison's run (its architecture, size,
recipe and seed 1, one thread each: ``lm_depth_comparison.py --jobs 2`` on two cores) run at the
same time, one per allocator setting of ``lm_depth_comparison.ALLOCATORS``; each reports its
seconds per update over the logged intervals after the first (start-up and the first interval
left out), its user and system CPU seconds and its peak resident memory (from the kernel's
accounting of the finished process). The settings change no arithmetic: the two final models
are compared parameter by parameter, bitwise (``identical``). The speed-up is the default's
seconds per update over the retained one's, in the same run. These are fairseq-train's own
times: the comparison adds only the scoring after each run.
"""
import argparse
import json
import os
import subprocess
import sys
import time

from layerlab import bench, fairseq_log, paths, runs

comparison = paths.load_script("experiments", "lm_depth_comparison.py")
LOG_EVERY = 20


def command(args, depth, save_dir):
    arch, flags = comparison.row_spec(args.row, depth, 128)
    return [str(c) for c in runs.train_command(
        args.data, save_dir, 1, ["--arch", arch, *flags,
                                 *comparison.recipe_flags(args.updates, warmup=100,
                                                          log_interval=LOG_EVERY)])]


def seconds_per_update(log):
    """Wall seconds per update between the first and the last logged interval."""
    records = list(fairseq_log.records(log, "train_inner"))
    first, last = records[0], records[-1]
    return ((float(last["wall"]) - float(first["wall"]))
            / (int(last["num_updates"]) - int(first["num_updates"])))


def identical(checkpoints):
    import torch

    import fairseq_plugins  # noqa: F401  (allow-lists fairseq's checkpoint types for torch.load)

    a, b = (torch.load(c, map_location="cpu")["model"] for c in checkpoints)
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def measure(args, depth):
    """Both settings of one depth, side by side -> {setting: measurements}, identical."""
    procs = {}
    for setting, variables in comparison.ALLOCATORS.items():
        run_dir = runs.fresh_run_dir(os.path.join(args.out_dir, f"d{depth}", setting))
        env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
        env.update(variables, OMP_NUM_THREADS="1")
        log = open(os.path.join(run_dir, "train.log"), "w")
        procs[setting] = (subprocess.Popen(command(args, depth, run_dir), stdout=log,
                                           stderr=subprocess.STDOUT, env=env), log, run_dir)
    out = {}
    for setting, (proc, log, run_dir) in procs.items():
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        log.close()
        if proc.returncode:
            sys.exit(f"error: fairseq-train ({setting}, {depth} blocks) failed: see {log.name}")
        out[setting] = {
            "environment": comparison.ALLOCATORS[setting],
            "seconds_per_update": round(seconds_per_update(log.name), 4),
            "user_seconds": round(usage.ru_utime, 1), "system_seconds": round(usage.ru_stime, 1),
            "system_share": bench.system_share(usage.ru_utime, usage.ru_stime),
            "peak_rss_mb": round(usage.ru_maxrss / 1024)}
    same = identical([os.path.join(r, "checkpoint_last.pt") for _, _, r in procs.values()])
    return {"settings": out, "identical": same,
            "speedup": round(out["default"]["seconds_per_update"]
                             / out["retain"]["seconds_per_update"], 3)}


def markdown(report):
    lines = [f"Written {report['date']} by `{report['command']}` with {report['code']}.", "",
             f"The comparison's `{report['row']}` run (seed 1, {report['updates']} updates, one "
             "thread), the two allocator settings trained at the same time on this machine's "
             f"{report['cpus']} cores; seconds per update over the logged intervals after the "
             "first; identical: the two final models equal bitwise.", "",
             "| blocks | setting | s / update | user s | system s | system share | peak RSS MB "
             "| speed-up | identical |", "|---:|---|---:|---:|---:|---:|---:|---:|:-:|"]
    for depth, entry in report["depths"].items():
        for setting, m in entry["settings"].items():
            lines.append(f"| {depth} | {setting} | {m['seconds_per_update']:.3f} | "
                         f"{m['user_seconds']} | {m['system_seconds']} | {m['system_share']} | "
                         f"{m['peak_rss_mb']} | "
                         + (f"{entry['speedup']:.2f}x | {'yes' if entry['identical'] else 'NO'}"
                            if setting == "retain" else " | ") + " |")
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default="data-bin/wikitext-2")
    p.add_argument("--depths", type=lambda t: comparison.parse_list(t, int), default=[4, 12])
    p.add_argument("--row", default=comparison.BASELINE, choices=sorted(comparison.ROWS))
    p.add_argument("--updates", type=int, default=200)
    p.add_argument("--out-dir", default=os.path.join("build", "bench-throughput"))
    p.add_argument("--results-name", help="also write results/NAME.{json,md}")
    args = p.parse_args(argv)
    if args.updates < 3 * LOG_EVERY:
        p.error(f"--updates {args.updates}: at least {3 * LOG_EVERY} (the first logged interval "
                "is left out and two more are timed)")
    if not os.path.isfile(os.path.join(args.data, "train.bin")):
        p.error(f"{args.data}: no train.bin; prepare the data first (python scripts/prepare/lm.py "
                "--dataset wikitext-2 ...)")
    report = {"command": " ".join(["python scripts/bench/comparison_throughput.py",
                                   *(sys.argv[1:] if argv is None else argv)]),
              "code": runs.package_version(), "date": time.strftime("%Y-%m-%d"),
              "row": args.row, "updates": args.updates, "cpus": os.cpu_count(),
              "depths": {str(d): measure(args, d) for d in args.depths}}
    text = markdown(report)
    bench.write_text(os.path.join(args.out_dir, "report.md"), text)
    bench.emit_report(report, os.path.join(args.out_dir, "report.json"))
    if args.results_name:
        bench.write_text(os.path.join(paths.RESULTS, f"{args.results_name}.json"),
                         json.dumps(report, indent=2))
        bench.write_text(os.path.join(paths.RESULTS, f"{args.results_name}.md"), text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
