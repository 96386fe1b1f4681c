"""The experiment runner: a comparison declared as rows, settings and seeds; its runs planned in
one order, launched through submitit and collected (docs/experiments.md, "The runner").

A comparison is a :class:`Comparison`: its rows (each an architecture and its flags), the
settings every row runs in (a task, a depth), the seeds and the baseline row. The runner owns:

- **planning** (:meth:`Comparison.plan`): one :class:`Run` per (setting, row, seed), each with
  its own folder ``<out>/<setting>/<row>/seed<seed>``, ordered seed by seed (every row's first
  seed in every setting before any second seed), so that a comparison stopped part-way has
  every row at the seeds it reached;
- **refusals before anything trains** (:meth:`Comparison.check`): an unknown baseline, a row
  of a setting that is not declared, a row whose flags the model family refuses (each row's
  model is built in-process once, on the settings' data dictionaries): one line each;
- **launching** (:func:`launch`): every run that has no ``result.json`` is submitted through
  submitit: ``local`` (this machine, ``jobs`` runs at a time, one thread each), ``slurm``
  (one job per run, with a partition, GPUs per run and a time limit; ``jobs`` at a time as a
  job array's parallelism) or ``debug`` (in this process, for tests and debugging: a run that
  fails opens pdb there, as submitit's debug executor does). A finished run (its
  ``result.json``) is not submitted again; the work function itself resumes what it can;
- **matched baselines** (:func:`add_matched_baselines`): a wider-FFN baseline for every row
  whose parameters exceed the baseline's by more than a threshold, added to the comparison in
  the settings that need it (:func:`nearest_width`: the width whose count is nearest);
- **collecting**: each run's result, in plan order, and what its work printed on stderr
  (relayed as it finishes); a run that failed stops the comparison
  with one line naming it and the end of its log (a diverged run is the work's result to
  report, not a failure).

The work of one run is a plain function ``work(run, *args) -> dict`` (train, score, write
``result.json``), picklable for submitit (a module's function, or a script's: submitit pickles
it by value).
"""
import dataclasses
import os
import time
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

LAUNCHERS = ("local", "slurm", "debug")
# what sets a local run's thread count (its process inherits them)
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")


class PlanError(ValueError):
    """A comparison that cannot run as declared: one line, raised before anything trains."""


@dataclasses.dataclass(frozen=True)
class Row:
    """One row of a comparison: ``arch`` with ``flags`` (a tuple of strings)."""
    name: str
    arch: str
    flags: Tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class Run:
    """One run: ``row`` in ``setting`` with ``seed``, in its own folder ``run_dir``."""
    setting: str
    row: Row
    seed: int
    run_dir: str

    @property
    def key(self) -> Tuple[str, str, int]:
        return self.setting, self.row.name, self.seed


@dataclasses.dataclass
class Comparison:
    """A comparison's declaration: ``rows`` in order, the ``settings`` they run in, ``seeds``
    and the ``baseline`` row; ``only`` limits a row to some settings ({row: settings}; the
    others run in every setting); ``layout(setting, row, seed)``: a run's folder under the
    output folder."""
    name: str
    rows: Sequence[Row]
    settings: Sequence[str]
    seeds: Sequence[int]
    baseline: str
    only: Mapping[str, Sequence[str]] = dataclasses.field(default_factory=dict)
    # a run's folder under the output folder (default <setting>/<row>/seed<seed>): a script
    # whose earlier runs lie elsewhere keeps resuming them
    layout: Optional[Callable[[str, str, int], str]] = None

    def row(self, name: str) -> Row:
        for row in self.rows:
            if row.name == name:
                return row
        raise PlanError(f"{self.name}: unknown row {name!r}; known: "
                        f"{', '.join(r.name for r in self.rows)}")

    def check(self, build: Optional[Callable[[Row, str], None]] = None):
        """The refusals that need no training, one line each (:class:`PlanError`): duplicate
        rows, an unknown baseline or ``only`` row, a setting in ``only`` that is not declared,
        no seeds; with ``build(row, setting)``, every row's model built once per setting it
        runs in (a flag the family refuses raises there; its message is kept, the row named)."""
        names = [row.name for row in self.rows]
        if len(set(names)) != len(names):
            raise PlanError(f"{self.name}: a row is declared twice: {', '.join(names)}")
        if not self.seeds:
            raise PlanError(f"{self.name}: no seeds")
        self.row(self.baseline)
        for name, settings in self.only.items():
            self.row(name)
            unknown = [s for s in settings if s not in self.settings]
            if unknown:
                raise PlanError(f"{self.name}: row {name} is limited to {', '.join(unknown)}, "
                                f"which is not among the settings {', '.join(self.settings)}")
        if build is not None:
            for setting in self.settings:
                for row in self.rows_in(setting):
                    try:
                        build(row, setting)
                    except (ValueError, SystemExit) as error:
                        message = str(error).strip().splitlines()[-1] if str(error) else \
                            type(error).__name__
                        raise PlanError(f"{self.name}: row {row.name} ({row.arch} "
                                        f"{' '.join(row.flags)}) in {setting}: "
                                        f"{message}") from error

    def rows_in(self, setting: str) -> List[Row]:
        return [row for row in self.rows
                if row.name not in self.only or setting in self.only[row.name]]

    def plan(self, out_dir: str) -> List[Run]:
        """Every run, seed by seed: all rows' first seed (setting by setting) before any
        second seed."""
        def folder(setting, row, seed):
            if self.layout is not None:
                return os.path.join(out_dir, self.layout(setting, row, seed))
            return os.path.join(out_dir, setting, row, f"seed{seed}")
        return [Run(setting, row, seed, folder(setting, row.name, seed))
                for seed in self.seeds for setting in self.settings
                for row in self.rows_in(setting)]


def nearest_width(count: Callable[[int], int], low: int, high: int, target: int) -> int:
    """The width whose parameter ``count(width)`` is nearest ``target``, for a count linear in
    the width (an FFN's: two builds give the line, at ``low`` and ``high``); at least 1. Two
    widths equally near: Python's rounding (to the even one)."""
    at_low, at_high = count(low), count(high)
    per_unit = (at_high - at_low) / (high - low)
    return max(1, round(low + (target - at_low) / per_unit))


def add_matched_baselines(comparison: Comparison, parameters: Callable[[Row, Any], int],
                          matched: Callable[[Any, int], Row], above: float
                          ) -> Dict[Any, Dict[str, str]]:
    """A matched baseline for every row (in every setting it runs in) whose parameters exceed
    the baseline's by more than ``above`` (a fraction), added to ``comparison``'s rows (limited
    by ``only`` to the settings that need it; one row however many share it) -> {setting: {row:
    its matched baseline's name}}. ``parameters(row, setting)``: the row's count there;
    ``matched(setting, target)``: the baseline widened to about ``target`` parameters (its name
    says its width). Rows named like a matched baseline (the baseline's name and ``_``) are not
    matched again."""
    rows = {row.name: row for row in comparison.rows}
    if comparison.baseline not in rows:
        return {}
    out: Dict[Any, Dict[str, str]] = {}
    added: Dict[str, Row] = {}
    needed: Dict[str, List[Any]] = {}
    for setting in comparison.settings:
        base = parameters(rows[comparison.baseline], setting)
        for row in comparison.rows_in(setting):
            if row.name == comparison.baseline or row.name.startswith(
                    f"{comparison.baseline}_"):
                continue
            own = parameters(row, setting)
            if own / base - 1 > above:
                match = matched(setting, own)
                out.setdefault(setting, {})[row.name] = match.name
                added.setdefault(match.name, match)
                needed.setdefault(match.name, [])
                if setting not in needed[match.name]:
                    needed[match.name].append(setting)
    comparison.rows = list(comparison.rows) + [row for name, row in added.items()
                                               if name not in rows]
    comparison.only = {**comparison.only, **{name: tuple(settings)
                                             for name, settings in needed.items()}}
    return out


def finished(run: Run) -> bool:
    return os.path.isfile(os.path.join(run.run_dir, "result.json"))


def read_result(run: Run) -> Optional[dict]:
    """A finished run's ``result.json`` (None: not finished)."""
    import json

    if not finished(run):
        return None
    with open(os.path.join(run.run_dir, "result.json")) as f:
        return json.load(f)


@dataclasses.dataclass
class Launcher:
    """Where the runs go: ``kind`` (:data:`LAUNCHERS`), ``jobs`` at a time, submitit's
    ``folder`` (its logs and pickles), ``time_limit`` in minutes per run (local and Slurm),
    ``cpus``: the threads (and Slurm CPUs) of one run (None: one where several local runs
    share the machine, torch's default for one), and for Slurm the ``partition`` and ``gpus``
    per run."""
    kind: str = "local"
    jobs: int = 1
    folder: str = "submitit"
    partition: Optional[str] = None
    gpus: int = 0
    time_limit: int = 24 * 60
    cpus: Optional[int] = None

    def threads(self) -> Dict[str, str]:
        """The environment a local run starts with (its thread count)."""
        if self.kind != "local" or (self.cpus is None and self.jobs == 1):
            return {}
        return {key: str(self.cpus or 1) for key in THREAD_VARIABLES}

    def __post_init__(self):
        if self.kind not in LAUNCHERS:
            raise PlanError(f"--launcher {self.kind}: one of {', '.join(LAUNCHERS)}")
        if self.jobs < 1:
            raise PlanError(f"--jobs {self.jobs}: at least 1")
        if self.cpus is not None and self.cpus < 1:
            raise PlanError(f"--threads {self.cpus}: at least 1")
        if self.kind != "slurm" and (self.partition or self.gpus):
            raise PlanError("--slurm-partition and --gpus-per-run apply to --launcher slurm")

    def slurm_parameters(self) -> Dict[str, Any]:
        """submitit's Slurm parameters of one run (a job of one task)."""
        out = {"timeout_min": self.time_limit, "cpus_per_task": self.cpus or 1, "nodes": 1,
               "tasks_per_node": 1, "slurm_array_parallelism": self.jobs}
        if self.partition:
            out["slurm_partition"] = self.partition
        if self.gpus:
            out["gpus_per_node"] = self.gpus
        return out

    def executor(self):
        import submitit

        if self.kind == "debug":
            return submitit.DebugExecutor(folder=self.folder)
        if self.kind == "local":
            executor = submitit.LocalExecutor(folder=self.folder)
            # submitit's local jobs time out (5 minutes by default): a run's limit instead
            executor.update_parameters(timeout_min=self.time_limit)
            return executor
        executor = submitit.AutoExecutor(folder=self.folder, cluster="slurm")
        executor.update_parameters(**self.slurm_parameters())
        return executor


def add_launcher_arguments(parser) -> None:
    """The launcher's flags, one set for every comparison script: ``--launcher``, ``--jobs``,
    ``--threads``, ``--slurm-partition``, ``--gpus-per-run``, ``--time-limit`` (read back by
    :func:`launcher_from_args`)."""
    parser.add_argument("--launcher", choices=LAUNCHERS, default="local",
                        help="where the runs go (submitit): local (this machine, --jobs at a "
                             "time), slurm (one job per run), debug (in this process)")
    parser.add_argument("--jobs", type=int, default=1,
                        help="runs at a time (local: on this machine; slurm: the job array's "
                             "parallelism)")
    parser.add_argument("--threads", type=int,
                        help="threads of each run (Slurm: its CPUs); default: the script's "
                             "(the comparisons: the machine's cores / --jobs)")
    parser.add_argument("--slurm-partition", help="--launcher slurm: the partition")
    parser.add_argument("--gpus-per-run", type=int, default=0,
                        help="--launcher slurm: GPUs per run")
    parser.add_argument("--time-limit", type=int, default=24 * 60, help="minutes per run")


def launcher_from_args(args, folder: str, cpus: Optional[int] = None) -> Launcher:
    """The :class:`Launcher` of the flags :func:`add_launcher_arguments` added, with submitit's
    ``folder``, and ``--threads`` per run, or the script's default ``cpus`` where it is not
    given (raises :class:`PlanError` for impossible ones)."""
    return Launcher(args.launcher, args.jobs, folder, args.slurm_partition, args.gpus_per_run,
                    args.time_limit, cpus if args.threads is None else args.threads)


def shared_cores(jobs: int) -> int:
    """The machine's cores shared by ``jobs`` runs at a time: each run's threads (at least
    one), the comparisons' default ``--threads``."""
    return max(1, (os.cpu_count() or 1) // max(1, jobs))


class RunFailed(RuntimeError):
    """A run's work raised: the message names the run and ends with what it raised."""


def launch(runs: Iterable[Run], work: Callable[..., dict], args: tuple = (),
           launcher: Optional[Launcher] = None,
           on_result: Optional[Callable[[Run, dict], None]] = None,
           done: Callable[[Run], Optional[dict]] = read_result,
           on_submit: Optional[Callable[[Run], None]] = None,
           poll: float = 2.0) -> Dict[Tuple[str, str, int], dict]:
    """``work(run, *args)`` for every run of ``runs`` that is not finished (``done(run)``: its
    result, None where it must run; by default its ``result.json``, and a script whose results
    must match its recipe raises there), ``launcher.jobs`` at a time -> {run.key: its result}
    in plan order. ``on_submit(run)`` is called as each run is submitted (its progress line:
    a run's own output goes to its log), ``on_result(run, result)`` as each finishes. A failed
    run: the
    runs not yet submitted are not, the running ones are waited for, then :class:`RunFailed`."""
    launcher = launcher or Launcher()
    runs = list(runs)
    results: Dict[Tuple[str, str, int], dict] = {}
    todo = []
    for run in runs:
        result = done(run)
        if result is not None:
            results[run.key] = result
        else:
            todo.append(run)
    if todo:
        os.makedirs(launcher.folder, exist_ok=True)
        executor = launcher.executor()
        saved = {key: os.environ.get(key) for key in THREAD_VARIABLES}
        os.environ.update(launcher.threads())  # the submitted processes inherit it
        try:
            _submit_all(executor, launcher, todo, work, args, results, on_submit, on_result,
                        poll)
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
    return {run.key: results[run.key] for run in runs}


def _raised(error: Exception) -> str:
    """What a run raised: the exception line of the traceback a failed submitit job carries
    (its last 'SomeError: ...' line), else the error itself."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    for line in reversed(lines):
        name = line.split(":", 1)[0]
        if name.replace(".", "").replace("_", "").isalnum() and (
                name.endswith("Error") or name.endswith("Exception")):
            return line
    return f"{type(error).__name__}: {error}"


def _relay(job):
    """A finished job's own stderr (what its work printed there: notes a run leaves for whoever
    watches the comparison), onto this process's; submitit's lines go to its stdout log."""
    import sys

    text = job.stderr()
    if text:
        sys.stderr.write(text if text.endswith("\n") else text + "\n")
        sys.stderr.flush()


def _submit_all(executor, launcher, todo, work, args, results, on_submit, on_result, poll):
    waiting = list(todo)
    running: List[Tuple[Run, Any]] = []
    failure = None
    while waiting or running:
        while waiting and len(running) < launcher.jobs and failure is None:
            run = waiting.pop(0)
            if on_submit:
                on_submit(run)
            running.append((run, executor.submit(work, run, *args)))
        still = []
        for run, job in running:
            if launcher.kind != "debug" and not job.done():
                still.append((run, job))
                continue
            try:
                result = job.result()
            except Exception as error:  # submitit's FailedJobError carries the traceback
                if failure is None:
                    failure = RunFailed(f"{run.row.name} in {run.setting}, seed {run.seed} "
                                        f"failed ({run.run_dir}): {_raised(error)}")
                continue
            if launcher.kind != "debug":
                _relay(job)
            results[run.key] = result
            if on_result:
                on_result(run, result)
        running = still
        if failure is not None:
            waiting = []
        if running:
            time.sleep(poll)
    if failure is not None:
        raise failure
