"""Running experiment steps: a command with its log, the fairseq-train and fairseq-generate
commands of one run, ``result.json`` resume, and train -> generate -> score of one run.

A run lives in its own directory (``train.log``, checkpoints, ``generate-<subset>.txt``); a
``result.json`` there marks it finished, so re-running an experiment skips it, and an
unfinished run starts again from scratch (fairseq-train would otherwise resume from its
``checkpoint_last.pt`` and train a different number of updates).
"""
import concurrent.futures
import contextlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import threading
import time

from . import paths, warm
from .fairseq_log import last_train_loss


class StepError(Exception):
    """A command of an experiment failed; the message names it and ends with its log's tail."""


def diverged(error):
    """Whether a failed training command (its :class:`StepError`) stopped because its loss became
    NaN / inf (fairseq's FloatingPointError, also raised when the fp16 loss scale hits its
    floor): a result of the run, where any other failure is a bug to see."""
    return "FloatingPointError" in str(error) or "nan" in str(error).lower()


def process_cpu_seconds(pid):
    """CPU seconds (user + system, its waited-for children included) that the running process
    ``pid`` has used so far, from Linux's ``/proc/<pid>/stat``; None where that is not there
    (another system, or the process already reaped)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            # the fields after the command name, which is in parentheses and may hold spaces
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    # fields 14-17 of proc(5) (utime, stime, cutime, cstime), here from the state (field 3) on
    return sum(int(v) for v in fields[11:15]) / os.sysconf("SC_CLK_TCK")


class _Process:
    """``cmd`` as a fresh process with its output into the open file ``f`` (None: the terminal);
    ``wait()`` sets ``returncode`` and ``cpu_seconds`` as :class:`layerlab.warm.Forked`'s."""

    def __init__(self, cmd, f):
        self.proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT if f else None)
        self.pid, self.returncode, self.cpu_seconds = self.proc.pid, None, None

    def wait(self):
        # wait4: this child's own resource usage (other runs of a pool not mixed in)
        _, status, usage = os.wait4(self.pid, 0)
        self.proc.returncode = self.returncode = os.waitstatus_to_exitcode(status)
        self.cpu_seconds = usage.ru_utime + usage.ru_stime
        return self.returncode

    def kill(self):
        self.proc.kill()
        self.proc.wait()


def run_logged(cmd, log=None, append=False, on_cpu=None, every=30.0) -> float:
    """Run ``cmd`` (output into the file ``log`` when given, after what it holds with
    ``append``, else to the terminal) -> its CPU seconds (user + system, its own children
    included); raise :class:`StepError` when it fails.

    ``on_cpu(seconds)``, when given, is called with the CPU seconds used so far every ``every``
    seconds while the command runs and once with the total when it ends (failed or not), so a
    caller that is itself killed (a session's end) has recorded all but the last ``every``
    seconds of the count."""
    cmd = [str(c) for c in cmd]
    with open(log, "a" if append else "w") if log else contextlib.nullcontext() as f:
        # (the log is truncated above: a forked command appends to it)
        proc = (warm.start(cmd, stdout=log, stderr="stdout" if log else None, append=True)
                if warm.enabled() else None) or _Process(cmd, f)
        done = threading.Event()

        def report_progress():
            while not done.wait(every):
                seconds = process_cpu_seconds(proc.pid)
                if seconds is not None and not done.is_set():
                    on_cpu(seconds)
        watcher = threading.Thread(target=report_progress, daemon=True) if on_cpu else None
        if watcher:
            watcher.start()
        try:
            proc.wait()
        except BaseException:
            proc.kill()
            raise
        finally:
            done.set()
            if watcher:
                watcher.join()
    cpu_seconds = proc.cpu_seconds
    if on_cpu:
        on_cpu(cpu_seconds)
    if proc.returncode != 0:
        tail = ""
        if log:
            with open(log, errors="replace") as f:
                tail = f.read()[-3000:]
        raise StepError(f"command failed (exit {proc.returncode}): {shlex.join(cmd[:3])} ..."
                        f"{f' see {log}' if log else ''}\n{tail}")
    return cpu_seconds


def train_command(data, run_dir, seed, flags):
    """fairseq-train of this package (``--user-dir``) into ``run_dir`` with JSON logs."""
    return [*paths.fairseq_command("fairseq-train"), data, "--user-dir", paths.PLUGIN_DIR,
            "--seed", seed, "--save-dir", run_dir, "--log-format", "json", "--num-workers", "0",
            *flags]


def generate_command(data, checkpoint, subset, flags):
    """fairseq-generate of one checkpoint on one subset (``flags``: beam, lengths, --bpe ...).
    ``--required-batch-size-multiple 1`` keeps every sentence in its own batch slot."""
    return [*paths.fairseq_command("fairseq-generate"), data, "--user-dir", paths.PLUGIN_DIR,
            "--path", checkpoint, "--gen-subset", subset, "--required-batch-size-multiple", "1",
            "--num-workers", "0", *flags]


def score_command(scorer, flags):
    """One of ``scripts/score_*.py`` with ``--json`` (its result on stdout)."""
    return [sys.executable, paths.script(scorer), *map(str, flags), "--json"]


def run_scorer(cmd):
    proc = warm.run(cmd)
    if proc.returncode != 0:
        raise StepError(f"{os.path.basename(cmd[1])} failed: {proc.stderr[-2000:]}")
    return json.loads(proc.stdout)


class _HeldLock:
    """An open descriptor holding a ``flock``; ``close()`` releases it (so does the process's
    end, however it ends)."""

    def __init__(self, fd):
        self._fd = fd

    def close(self):
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def exclusive_lock(path):
    """A held exclusive lock on ``path`` (a file, made if missing, or an existing folder: a
    folder's lock leaves nothing in it), or None while another process holds it."""
    import fcntl

    fd = (os.open(path, os.O_RDONLY) if os.path.isdir(path)
          else os.open(path, os.O_WRONLY | os.O_CREAT, 0o644))
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return _HeldLock(fd)


def synced_result(run_dir, kept_dir, recipe, kept_files):
    """A finished run's result, or None. With a ``kept_dir`` (a comparison's ``--keep-runs``
    folder, committed) the two folders are made to agree: a run finished in the output folder
    is copied to the kept one, and a kept run missing from the output folder (a new machine, a
    fresh clone) is copied back into it. ``kept_files(folder)``: the names a run keeps (the
    result among them), of those in ``folder``."""
    done = load_result(run_dir, recipe)
    if kept_dir is None:
        return done
    if done is None:
        kept = load_result(kept_dir, recipe)
        if kept is not None:
            fresh_run_dir(run_dir)
            copy_run_files(kept_dir, run_dir, kept_files(kept_dir))
        return kept
    if load_result(kept_dir, recipe) is None:
        copy_run_files(run_dir, kept_dir, kept_files(run_dir))
    return done


def copy_run_files(source, target, names):
    """``names`` (those ``source`` has: a diverged run has only its result) from one run folder
    to another, ``result.json`` last, so that a copy broken off part-way is not a finished
    run."""
    for name in sorted(names, key=lambda n: n == "result.json"):
        if os.path.exists(os.path.join(source, name)):
            os.makedirs(os.path.dirname(os.path.join(target, name)), exist_ok=True)
            shutil.copyfile(os.path.join(source, name), os.path.join(target, name))


def write_json(path, value):
    """``value`` as JSON into ``path``."""
    with open(path, "w") as f:
        json.dump(value, f)


def read_json(path):
    """The JSON in ``path``, or None when there is none (or it was cut short)."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def load_result(run_dir, recipe=None):
    """The finished run's result, or None (no ``result.json``: not finished). With ``recipe``
    (what makes the run's number, stored under ``"recipe"`` in its result), a finished run made
    with another recipe raises :class:`StepError` instead of lending its number to this one."""
    path = os.path.join(run_dir, "result.json")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        done = json.load(f)
    if recipe is not None and done.get("recipe") != recipe:
        raise OtherRecipe(f"{run_dir} is a finished run made with another recipe "
                          f"({recipe_difference(done.get('recipe'), recipe)}): runs of "
                          "different recipes are not mixed in one table; use another --out-dir")
    return done


class OtherRecipe(StepError):
    """A finished run was made with another recipe than the one asked for."""


def _flag_values(flags):
    """{flag: its value (True for a switch)} of a fairseq command line's flags."""
    out, flags = {}, [str(f) for f in flags]
    for i, flag in enumerate(flags):
        if flag.startswith("--"):
            has_value = i + 1 < len(flags) and not flags[i + 1].startswith("--")
            out[flag] = flags[i + 1] if has_value else True
    return out


def recipe_difference(theirs, ours):
    """What differs between two recipes (dicts; a ``recipe`` entry is a list of flags), in a
    few words: 'updates 800, not 8000; --warmup-updates 100, not 1000'."""
    if not isinstance(theirs, dict):
        return "not recorded"
    out = []
    for key in sorted(set(theirs) | set(ours)):
        a, b = theirs.get(key), ours.get(key)
        if a == b:
            continue
        if key == "recipe" and isinstance(a, list) and isinstance(b, list):
            fa, fb = _flag_values(a), _flag_values(b)
            out += [f"{f} {fa.get(f, 'unset')}, not {fb.get(f, 'unset')}"
                    for f in sorted(set(fa) | set(fb)) if fa.get(f) != fb.get(f)]
        else:
            out.append(f"{key} {a if a is not None else 'unset'}, not "
                       f"{b if b is not None else 'unset'}")
    return "; ".join(out) or "the same"


def in_parallel(function, tasks, jobs):
    """``function(*task)`` for every task, ``jobs`` at a time (threads: each task's work runs in
    subprocesses) -> yields ``(task, result)`` as they finish. A task is handed to the pool only
    when a worker is free, so a failed task (a :class:`StepError` or any other exception) starts
    nothing more: its exception is raised once the tasks already running have ended, and it is
    the first failure, not whichever failed task the pool reached while it was being filled."""
    pending = iter(tasks)
    with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
        running = {}

        def start_next():
            for task in pending:  # at most one
                running[pool.submit(function, *task)] = task
                return

        for _ in range(jobs):
            start_next()
        while running:
            done, _ = concurrent.futures.wait(
                running, return_when=concurrent.futures.FIRST_COMPLETED)
            # a failure among the finished ones is raised before any other task starts; leaving
            # the pool's block waits for those still running
            for future in done:
                if future.exception() is not None:
                    raise future.exception()
            for future in done:
                task = running.pop(future)
                start_next()
                yield task, future.result()


def save_result(run_dir, result):
    with open(os.path.join(run_dir, "result.json"), "w") as f:
        json.dump(result, f, indent=2)
    return result


def fresh_run_dir(run_dir):
    """An empty ``run_dir`` (whatever an unfinished earlier run left is removed)."""
    shutil.rmtree(run_dir, ignore_errors=True)
    os.makedirs(run_dir)
    return run_dir


def count_params(checkpoint):
    """Parameters stored in a fairseq checkpoint, each tensor once: a tied weight (shared
    embeddings, an output projection that is the embedding) is one tensor under several names,
    which torch.save keeps as one storage. fairseq's ``_float_tensor`` buffers are left out;
    its one-element ``version`` buffers (one per stack) are counted, as in every run so far."""
    import torch

    import fairseq_plugins  # noqa: F401  (allow-lists fairseq's checkpoint types for torch.load)

    state = torch.load(checkpoint, map_location="cpu")
    seen, total = set(), 0
    for name, value in state["model"].items():
        key = (value.untyped_storage().data_ptr(), value.storage_offset(), tuple(value.shape))
        if name.endswith("_float_tensor") or key in seen:
            continue
        seen.add(key)
        total += value.numel()
    return total


def machine():
    """The CPU a run trains on, as it decides the arithmetic's last bits and the speed: its model
    name (``/proc/cpuinfo``; the platform's processor elsewhere), the instruction set PyTorch's
    CPU kernels dispatch to (``AVX2``, ``AVX512``: another one sums in another order) and the
    PyTorch version, e.g. ``'AMD EPYC, AVX2, torch 2.13.0'``."""
    import platform

    import torch

    name = None
    try:
        with open("/proc/cpuinfo") as f:
            name = next((line.split(":", 1)[1].strip() for line in f
                         if line.startswith("model name")), None)
    except OSError:
        pass
    name = name or platform.processor() or platform.machine() or "unknown CPU"
    return f"{name}, {torch.backends.cpu.get_cpu_capability()}, torch {torch.__version__}"


# the machines (machine()) a run's processes trained on, in order of first use; null first for
# a run begun before they were kept. Runs of one comparison may train on different CPUs (a
# session's machine is not always the last one's), whose kernels sum in other orders and run
# at other speeds
MACHINES = "machines.json"


def record_machine(run_dir, resumed) -> list:
    """Add this machine to the run's record (``machines.json`` in ``run_dir``) unless it is
    there already, and return the record. ``resumed``: the run continues a process of the
    same recipe; a resumed run without the file began before the record was kept, which the
    record's leading null says (its first processes' machine is unknown). A new run starts
    a new record."""
    path = os.path.join(run_dir, MACHINES)
    machines = read_json(path) if resumed else []
    if machines is None:  # resumed, but begun before the record was kept
        machines = [None]
    here = machine()
    if here not in machines:
        machines.append(here)
        write_json(path, machines)
    return machines


def machines_used(results):
    """How many of the finished runs trained on each machine (``machine()``: the CPU, the
    instruction set of PyTorch's kernels, the PyTorch version), as their ``machines`` record
    says; a run of several machines (resumed elsewhere: ``'a then b'``) and a run without the
    record (older: ``'not recorded'``) are counted as such. ``results``: an iterable of
    result dicts. -> ({machine: runs}, markdown line, the most runs first)."""
    counts = {}
    for r in results:
        key = " then ".join(m or "not recorded" for m in r.get("machines") or [None])
        counts[key] = counts.get(key, 0) + 1
    text = ("Machines (the CPU, the instruction set PyTorch's kernels use, PyTorch; another "
            "machine sums in another order, so its runs differ in the last bits, not in recipe): "
            + machine_counts(counts) + ".")
    return counts, text


def machine_counts(counts) -> str:
    """``machines_used``'s counts as text, the most runs first: 'a: 2 runs; b: 1 run'."""
    return "; ".join(f"{m}: {n} run{'s' * (n != 1)}"
                     for m, n in sorted(counts.items(), key=lambda c: (-c[1], c[0])))


def package_version():
    """The package version and, in a git checkout, the commit (with '+dirty' for local edits)."""
    import fairseq_plugins

    version = fairseq_plugins.__version__
    try:
        commit = subprocess.run(["git", "-C", paths.REPO, "rev-parse", "--short", "HEAD"],
                                capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", paths.REPO, "status", "--porcelain", "--",
                                "fairseq_plugins", "layerlab", "scripts"],
                               capture_output=True, text=True).stdout.strip()
        version += f" (git {commit}{'+dirty' if dirty else ''})"
    except (OSError, subprocess.CalledProcessError):
        pass
    return version


def generation(gen_log, ref=None):
    """(hypotheses, references) of a fairseq-generate log in sentence-id order: the D- lines
    (detokenised with --bpe sentencepiece) where the log has them, and ``ref`` (a raw reference
    file) or the log's T- lines."""
    from fairseq_plugins.metrics.generate_log import read_generate_log, read_lines

    log = read_generate_log(gen_log)
    return log["hypotheses"], (read_lines(ref) if ref else log["references"])


def score_generation(gen_log, metric, ref=None):
    """{metric: value, ...} of a fairseq-generate log: ``exact_match`` (with correct and total)
    or ``bleu`` (against ``ref``, a raw reference file, or the log's T- lines)."""
    from fairseq_plugins.metrics.bleu import corpus_bleu
    from fairseq_plugins.metrics.exact_match import exact_match

    hypotheses, references = generation(gen_log, ref if metric == "bleu" else None)
    if metric == "exact_match":
        score = exact_match(hypotheses, references)
        return {"exact_match": round(score["exact_match"], 2), "correct": score["correct"],
                "total": score["total"]}
    return {"bleu": round(corpus_bleu(hypotheses, references)["bleu"], 2)}


def train_generate_score(run_dir, data, seed, train_flags, subset, generate_flags, metric,
                         ref=None, resume=True, info=None, checkpoint="checkpoint_last.pt"):
    """One seq2seq run: fairseq-train, fairseq-generate with ``checkpoint`` (a file name in
    ``run_dir``) on ``subset``, then the metric -> its result (``info``, e.g. the row's name,
    first; also saved as ``result.json``). With ``resume``, a finished run's result is returned
    as it is, without running anything."""
    if resume:
        done = load_result(run_dir)
        if done is not None:
            return done
    fresh_run_dir(run_dir)
    checkpoint = os.path.join(run_dir, checkpoint)
    start = time.time()
    run_logged(train_command(data, run_dir, seed, train_flags), os.path.join(run_dir, "train.log"))
    train_s = time.time() - start
    gen_log = os.path.join(run_dir, f"generate-{subset}.txt")
    start = time.time()
    run_logged(generate_command(data, checkpoint, subset, generate_flags), gen_log)
    generate_s = time.time() - start
    result = {**(info or {}), "seed": seed, **score_generation(gen_log, metric, ref),
              "params": count_params(checkpoint),
              "train_loss_bits": last_train_loss(os.path.join(run_dir, "train.log")),
              "train_seconds": round(train_s, 1), "generate_seconds": round(generate_s, 1),
              "checkpoint": checkpoint, "package_version": package_version()}
    return save_result(run_dir, result)

