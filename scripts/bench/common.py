"""Timing and memory helpers shared by the benchmark scripts (JSON out, no assertions).

Speed: the median of several timed windows after warm-up, every model measured in the same
process run with the same threads and data. Peak memory: on CUDA, torch's allocator peak; on
CPU, each measurement runs in its own subprocess and reports the growth of its peak resident set
during the timed steps over the peak after building model and data (activations, gradients and
optimizer state), since the allocator keeps no CPU statistics.
"""
import json
import os
import resource
import statistics
import subprocess
import sys
import time

import torch

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)


def peak_rss_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def sync(device):
    if device.startswith("cuda"):
        torch.cuda.synchronize()


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
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
        return torch.cuda.max_memory_allocated() / 2**20
    return peak_rss_mb()


def memory_peak_growth(device, start):
    if device.startswith("cuda"):
        return torch.cuda.max_memory_allocated() / 2**20 - start
    return peak_rss_mb() - start


def run_isolated(script, worker_args, threads):
    """Run ``script --worker ...`` in a fresh process; return its JSON line."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), PYTHONWARNINGS="ignore")
    proc = subprocess.run([sys.executable, script, "--worker", json.dumps(worker_args)],
                          capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"benchmark worker failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def median(xs):
    return statistics.median(xs)


def bench_parser(description):
    """The options every benchmark script shares (its own are added by the caller)."""
    import argparse

    import torch

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


def parse_bench_args(parser, worker, argv=None):
    """Parsed options, or None after running the ``--worker`` job (its JSON on stdout).
    ``worker`` may be None for a script that has no worker jobs."""
    args = parser.parse_args(argv)
    if args.worker and worker is not None:
        print(json.dumps(worker(json.loads(args.worker))))
        return None
    if args.fp16 and args.device == "cpu":
        parser.error("--fp16 needs --device cuda")
    return args
