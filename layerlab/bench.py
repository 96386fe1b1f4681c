"""Timing and memory helpers shared by the benchmark scripts (JSON out, no assertions).

Speed: the median of several timed windows after warm-up, every model measured in the same
process run with the same threads and data. Peak memory: on CUDA, torch's allocator peak (reset
per measurement and counting live tensors only, so the measurements share one process: see
:func:`run_jobs`); on CPU, each measurement runs in its own subprocess and reports the growth of
its peak resident set during the timed steps over the peak after building model and data
(activations, gradients and optimizer state), since the allocator keeps no CPU statistics.
"""
import gc
import json
import logging
import os
import resource
import statistics
import subprocess
import sys
import time

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from . import warm
from .paths import REPO  # noqa: F401  (the repository the suite writes its results under)

# importing fairseq's models runs its wav2vec2_classification module, which configures the root
# logger at DEBUG: every library's debug lines (matplotlib's font search: hundreds) would then
# bury the suite's progress on stderr. Configuring it first makes that a no-op; the suite reports
# in its JSON and markdown, so only warnings and errors are logged
logging.basicConfig(level=logging.WARNING, format="%(levelname)s:%(name)s:%(message)s")

# The targets of the architecture issues, checked by scripts/bench/run.py and named in each
# part's report: (part, ratio, rows (None: every row that has the ratio), op, threshold, label).
# The rows' ratios are the part's own (a model against its fairseq baseline in one process).
TARGETS = (
    ("seq2seq", "train_ratio_over_mac_ratio", ("fusion", "fusion_enc", "fusion_dec", "bridge"),
     "<=", 1.15, "{}: training time / (transformer time x MAC-model ratio)"),
    ("seq2seq", "train_time_ratio", ("dwa",), "<=", 1.05, "{}: training time / transformer's"),
    # LRF's training memory with its fuse-attention recomputed in the backward pass
    ("seq2seq", "memory_growth_ratio", ("fusion_recompute",), "<=", 1.15,
     "{}: training peak-memory growth / transformer's"),
    ("seq2seq", "train_time_ratio_vs_bridge", ("transparent",), "<=", 1.0,
     "{}: training time / FC bridge's"),
    ("seq2seq", "generate_speed_ratio", ("fusion", "fusion_enc", "fusion_dec"), ">=", 0.8,
     "{}: generation speed / transformer's"),
    ("seq2seq", "train_time_ratio", ("inverted",), "<=", 1.1, "{}: training time / transformer's"),
    ("seq2seq", "generate_time_ratio", ("inverted",), "<=", 1.1,
     "{}: generation time / transformer's"),
    ("seq2seq", "train_time_ratio", ("swapped",), "<=", 2.0, "{}: training time / transformer's"),
    ("seq2seq", "generate_time_ratio", ("swapped",), "<=", 1.3,
     "{}: generation time / transformer's"),
    ("lm", "train_tokens_per_second_ratio", None, ">=", 0.9,
     "{}: training tokens/s / gpt_baseline_lm's"),
    ("lm", "cache_speedup", None, ">=", 5.0, "{}: cached generation / recomputing the context"),
    ("depth", "train_time_ratio", ("hc_dynamic_n4",), "<=", 1.10,
     "{}: training time / the plain LM's"),
    ("depth", "train_time_ratio", ("value_residual",), "<=", 1.02,
     "{}: training time / the plain LM's"),
    ("depth", "train_time_ratio", ("mudd",), "<=", 1.15, "{}: training time / the plain LM's"),
    ("depth", "train_time_ratio", ("dwa",), "<=", 1.05, "{}: training time / the plain LM's"),
    ("depth", "train_time_ratio", ("mhc_n4",), "<=", 1.20, "{}: training time / the plain LM's"),
    ("depth", "train_time_ratio_vs_mhc", ("mhc_lite_n4",), "<=", 1.0, "{}: training time / mHC's"),
    ("depth", "train_time_ratio", ("frac_dynamic_m4",), "<=", 1.05,
     "{}: training time / the plain LM's"),
    ("depth", "memory_growth_ratio", ("frac_dynamic_m4",), "<=", 1.02,
     "{}: peak-memory growth / the plain LM's"),
    ("depth", "train_time_ratio", ("attn_res_full",), "<=", 1.10,
     "{}: training time / the plain LM's"),
    ("depth", "train_time_ratio", ("attn_res_block",), "<=", 1.05,
     "{}: training time / the plain LM's"),
)


def _measured(part, report, ratio):
    """{row: value} of one ratio in a part's report."""
    if part == "seq2seq":
        rows = report["ratios_vs_transformer"]
    elif part == "depth":
        rows = report["ratios_vs_plain"]
    elif ratio == "cache_speedup":
        return dict(report["cache_speedup"])
    else:
        rows = report["ratios_vs_gpt_baseline_lm"]
    return {row: r[ratio] for row, r in rows.items() if ratio in r}


def check_targets(parts):
    """Every target whose part was run and whose row was measured, as rows
    {target, measured, required, met, from}, in the order of :data:`TARGETS`."""
    out = []
    for part, ratio, rows, op, threshold, label in TARGETS:
        if part not in parts:
            continue
        measured = _measured(part, parts[part], ratio)
        for row in (measured if rows is None else [r for r in rows if r in measured]):
            value = measured[row]
            met = value is not None and (value <= threshold if op == "<=" else value >= threshold)
            out.append({"target": label.format(row), "measured": value,
                        "required": f"{op} {threshold}", "met": met, "from": part})
    return out


def describe_targets(part):
    """{ratio: "op threshold (rows)"} of one part, for its report."""
    out = {}
    for p, ratio, rows, op, threshold, _ in TARGETS:
        if p == part:
            text = f"{op} {threshold} ({', '.join(rows) if rows else 'every model'})"
            out[ratio] = f"{out[ratio]}; {text}" if ratio in out else text
    return out


def peak_rss_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def is_cuda(device) -> bool:
    """Whether a ``--device`` value (``cpu``, ``cuda``, ``cuda:1``) names a GPU."""
    return str(device).startswith("cuda")


def sync(device):
    if is_cuda(device):
        torch.cuda.synchronize()


def cpu_seconds():
    """(user, system) CPU seconds this process has used so far, all its threads. The system
    part is the kernel's work for the process: on CPU mostly the page faults that give freshly
    mapped memory its pages, which glibc's default allocator causes for every large tensor it
    maps and unmaps (docs/benchmarks.md)."""
    t = os.times()
    return t.user, t.system


# The kernel splits a process's CPU time into user and system parts by sampling at each clock
# tick (10 ms at Linux's usual 100 Hz), so a split over few ticks is coarse: over 3 ticks the
# share can only be 0, 1/3, 2/3 or 1. Below this many ticks of CPU time the share is not
# reported (None).
MIN_TICKS_FOR_SHARE = 50


def system_share(user, system, ticks_per_second=None):
    """The system (kernel) part of ``user + system`` CPU seconds, rounded to 3 decimals; None
    where the seconds span fewer than ``MIN_TICKS_FOR_SHARE`` clock ticks (a share sampled that
    coarsely, e.g. 1.0 from one system tick and no user one, would be read as a measurement)."""
    ticks_per_second = ticks_per_second or os.sysconf("SC_CLK_TCK")
    total = user + system
    if total * ticks_per_second < MIN_TICKS_FOR_SHARE:
        return None
    return round(system / total, 3)


def allocator_environment():
    """The glibc allocator settings (``MALLOC_*`` variables) the workers inherit: they decide
    how much of a CPU step is page faults, so a report names them."""
    return {k: v for k, v in sorted(os.environ.items()) if k.startswith("MALLOC_")}


def timed_windows(step, windows, steps_per_window, warmup, device):
    for _ in range(warmup):
        step()
    sync(device)
    times = []
    for _ in range(windows):
        start = time.perf_counter()
        for _ in range(steps_per_window):
            step()
        sync(device)
        times.append((time.perf_counter() - start) / steps_per_window)
    return times


def memory_start(device):
    if is_cuda(device):
        torch.cuda.reset_peak_memory_stats()
        return torch.cuda.max_memory_allocated() / 2**20
    return peak_rss_mb()


def memory_peak_growth(device, start):
    if is_cuda(device):
        return torch.cuda.max_memory_allocated() / 2**20 - start
    return peak_rss_mb() - start


def run_isolated(script, worker_args, threads, forkable=False):
    """Run ``script --worker ...`` in a fresh process; return its JSON line. ``forkable``: a
    --quick run's worker, forked from a warm server where ``layerlab.warm`` is enabled (the
    test suite: a fresh interpreter's ~5 s of imports is most of a quick worker's time, and a
    quick run's figures are not read); a measured run's worker is always a fresh process,
    whose peak memory is its own."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), PYTHONWARNINGS="ignore")
    cmd = [sys.executable, script, "--worker", json.dumps(worker_args)]
    proc = (warm.run(cmd, env=env) if forkable else
            subprocess.run(cmd, capture_output=True, text=True, env=env))
    if proc.returncode != 0:
        raise RuntimeError(f"benchmark worker failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# a worker job that runs a list of jobs one after the other in one process
JOBS = "jobs"


def on_cuda(job) -> bool:
    return is_cuda(job.get("device", "cpu"))


def run_jobs(script, jobs, threads, labels, together=False):
    """The results of ``script``'s worker ``jobs`` (a list), each in a fresh process, or all in
    one process (:func:`run_in_one_process`) when ``together`` (--quick smoke runs: a process's
    ~5 s of start-up is most of a tiny job's time, and no figure of a quick run is meant to be
    read; a CPU peak-memory growth is then not isolated: 0 when an earlier job of the process
    reached a higher peak) or when every job runs on CUDA: the allocator's peak is reset at each
    measurement's start and counts live tensors only, so a process per job would only add CUDA's
    start-up (~15 s a job on an H100, measured: the GPU run of the depth suite did not finish in
    190 s). ``labels`` (one per job) are printed to stderr as the jobs start."""
    jobs = list(jobs)
    if together or all(on_cuda(job) for job in jobs):
        print(f"[bench] {'; '.join(labels)} (one process) ...", file=sys.stderr, flush=True)
        return run_isolated(script, {"mode": JOBS, "jobs": jobs}, threads, forkable=together)
    results = []
    for label, job in zip(labels, jobs):
        print(f"[bench] {label} ...", file=sys.stderr, flush=True)
        results.append(run_isolated(script, job, threads))
    return results


def run_in_one_process(worker, jobs):
    """``worker`` over ``jobs`` in this process, each after the previous one's tensors are
    freed. With CUDA jobs the first one runs once more before them, unrecorded: what a process
    allocates once and keeps (cuBLAS's workspaces) is then part of every measurement's starting
    point instead of the first one's growth."""
    if jobs and on_cuda(jobs[0]):
        worker(jobs[0])
    results = []
    for job in jobs:
        gc.collect()
        if on_cuda(job):
            torch.cuda.empty_cache()
        results.append(worker(job))
    return results


class _OperatorCount(TorchDispatchMode):
    """Counts the aten operators dispatched inside it, views and allocations apart (they move
    no data)."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not (func.is_view or func.__name__.startswith(("empty", "detach"))):
            self.count += 1
        return func(*args, **(kwargs or {}))


def operators_dispatched(fn) -> int:
    """How many aten operators ``fn()`` dispatches (its backward pass included when ``fn`` runs
    it), views and allocations apart. In eager PyTorch each is a host-side dispatch and, on a
    GPU, at least one kernel launch: where a step's arithmetic is small (a narrow model on a
    GPU), its time follows this count rather than its MACs."""
    with _OperatorCount() as counter:
        fn()
    return counter.count


def bytes_saved_for_backward(fn, exclude=()) -> int:
    """The bytes autograd keeps for the backward of what ``fn()`` computes (``fn`` runs the
    forward only): every tensor a node saves (custom Functions' ``save_for_backward``
    included), each storage once (views of one tensor, a tensor several nodes save), the
    storages of ``exclude`` (the parameters: kept whether or not a node saves them) apart.
    Independent of the allocator: what a method's backward needs, not what a device's cache
    holds."""
    skip = {t.untyped_storage().data_ptr() for t in exclude}
    saved = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in skip:
            saved[storage.data_ptr()] = storage.nbytes()
        return tensor
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        fn()
    return sum(saved.values())


def median(xs):
    return statistics.median(xs)


def paired_ratio(model, baseline, key="train_seconds_per_round"):
    """The median over the rotation's rounds of two models' time ratio within a round (each a
    worker's per-round times under ``key``): the machine's speed drifts over the minutes of a
    run, and a ratio of two medians taken over the whole run carries that drift."""
    return round(median([m / b for m, b in zip(model[key], baseline[key])]), 3)


def bench_parser(description):
    """The options every benchmark script shares (its own are added by the caller)."""
    import argparse

    p = argparse.ArgumentParser(description=description)
    p.add_argument("--quick", action="store_true", help="tiny sizes, few windows (CI smoke)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--fp16", action="store_true", help="half precision (GPU only)")
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    p.add_argument("--out", help="also write the JSON here")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    return p


def write_text(path, text):
    """Write ``text`` (plus a final newline) to ``path``, creating its folder."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        f.write(text + "\n")


def emit_report(report, out=None):
    """Print the report as JSON and also write it to ``out`` when given."""
    text = json.dumps(report, indent=2)
    print(text)
    if out:
        write_text(out, text)


def bench_main(parser, worker, run, argv=None, write_extra=None):
    """A benchmark script's main: its ``--worker`` job, or ``run(args)`` -> the report printed
    as JSON (and written to ``--out``); ``write_extra(report, args)`` writes what else the
    script offers (a markdown table, a plot)."""
    args = parse_bench_args(parser, worker, argv)
    if args is None:
        return 0
    report = run(args)
    emit_report(report, args.out)
    if write_extra is not None:
        write_extra(report, args)
    return 0


def parse_bench_args(parser, worker, argv=None):
    """Parsed options, or None after running the ``--worker`` job (its JSON on stdout).
    ``worker`` may be None for a script that has no worker jobs."""
    args = parser.parse_args(argv)
    if args.worker and worker is not None:
        job = json.loads(args.worker)
        result = (run_in_one_process(worker, job["jobs"]) if job.get("mode") == JOBS
                  else worker(job))
        print(json.dumps(result))
        return None
    if args.fp16 and args.device == "cpu":
        parser.error("--fp16 needs --device cuda")
    return args
