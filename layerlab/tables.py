"""What every table script shares: the ``--scale`` option, resumable runs through the real
fairseq CLIs, mean/spread over seeds, and the markdown + JSON + PNG outputs.

A table script declares its rows (name, ``--arch``, extra fairseq-train flags), a scale
configuration (model preset, updates, seeds, data recipe) and how one finished run is scored;
``Table`` does the rest. Every run lives in ``<out-dir>/runs/<row>-seed<k>/`` with fairseq's JSON
log (``train.log``), its checkpoints and generations; a ``result.json`` there marks it finished, so
re-running the script skips it (an unfinished run starts again from scratch). ``--dry-run`` runs
nothing and prints the table as a bash script instead: every data, train, generate and score
command in order (``--dry-run > table.sh``; how the ``paper`` scale is checked on a machine
without GPUs).
"""
import argparse
import datetime
import json
import os
import shlex
import shutil
import sys

from . import curves as curve_plots
from . import paths, runs

SCALES = ("smoke", "small", "paper")


class TableError(Exception):
    """A bad input or a failed step: reported as one line ``<table>: error: ...``, exit 2."""


def run_main(main, name, argv=None):
    """``main(argv)``, with :class:`TableError` and missing/unreadable files reported as one
    line on stderr and exit code 2 (no traceback)."""
    try:
        return main(argv) or 0
    except (TableError, runs.StepError, OSError) as e:
        print(f"{name}: error: {e}", file=sys.stderr)
        return 2


def table_parser(description, name):
    p = argparse.ArgumentParser(description=description,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scale", choices=SCALES, default="small",
                   help="smoke: seconds to minutes, proves the script runs (CI); small: a 2-core "
                        "CPU in <= 60 minutes with the substitutions it prints; paper: the "
                        "published setting (GPUs)")
    p.add_argument("--from", dest="from_dir", metavar="DIR",
                   help="folder with the downloaded datasets (one sub-folder per dataset, as "
                        "each scripts/prepare/ script's --from expects); default: download")
    p.add_argument("--data-root", default=".",
                   help="prepared data goes to DATA_ROOT/data/<name> and DATA_ROOT/data-bin/<name>")
    p.add_argument("--out-dir",
                   help=f"runs, table and curves (default: outputs/tables/{name}-SCALE)")
    p.add_argument("--results-dir", help="also copy the table (markdown, JSON, PNGs) here, e.g. "
                                         "results/tables")
    p.add_argument("--seeds", help="comma-separated seeds (default: the scale's)")
    p.add_argument("--rows", help="comma-separated subset of the rows (default: all)")
    p.add_argument("--dry-run", action="store_true",
                   help="run nothing; print every command in order as a bash script "
                        "(--dry-run > table.sh)")
    return p


class Table:
    """One table run at one scale (see the module doc)."""

    def __init__(self, name, args, argv):
        self.name, self.args, self.scale = name, args, args.scale
        self.out_dir = os.path.abspath(args.out_dir or os.path.join("outputs", "tables",
                                                                    f"{name}-{args.scale}"))
        self.data_root = os.path.abspath(args.data_root)
        if args.from_dir and not os.path.isdir(args.from_dir):  # before anything is written
            raise TableError(f"--from {args.from_dir}: no such directory")
        self.command = " ".join(["python", os.path.relpath(sys.argv[0], paths.REPO)
                                 if os.path.isabs(sys.argv[0]) else sys.argv[0],
                                 *(sys.argv[1:] if argv is None else argv)])
        if args.dry_run:
            self._script_header()

    def _script_header(self):
        """The dry run's output is a bash script: its header, before any command."""
        print("\n".join([
            "#!/usr/bin/env bash",
            f"# {self.name}, {self.scale} scale: every data, train, generate and score command in "
            "order,",
            f"# printed by `{self.command}` (fairseq_plugins {runs.package_version()}).",
            "# The same command without --dry-run runs these steps too, skips finished runs and "
            "writes",
            "# the table (markdown, JSON, figures); this script writes no table and no result.json.",
            "set -euo pipefail",
            f"cd {shlex.quote(os.getcwd())}"]), flush=True)

    # ---- paths -------------------------------------------------------------------------------
    def data(self, name):
        return os.path.join(self.data_root, "data", name)

    def data_bin(self, name):
        return os.path.join(self.data_root, "data-bin", name)

    def from_dir(self, sub):
        return os.path.join(self.args.from_dir, sub) if self.args.from_dir else None

    def run_dir(self, row, seed):
        return os.path.join(self.out_dir, "runs", f"{row}-seed{seed}")

    # ---- commands ----------------------------------------------------------------------------
    def run(self, cmd, log=None):
        """Run one command (output to ``log`` when given); stop the table on failure. In a dry
        run, print it as a line of the bash script instead (same redirection, same stop)."""
        cmd = [str(c) for c in cmd]
        if self.args.dry_run:
            print(script_line(cmd, log), flush=True)
            return
        print("[table] " + shlex.join(cmd), flush=True)
        runs.run_logged(cmd, log)

    def cut_lines(self, src, dst, count, skip=0):
        """Lines ``skip+1 .. skip+count`` of ``src`` into ``dst`` (``layerlab.cut_lines``: a
        command, so that the dry run's script makes the same cut)."""
        self.run([sys.executable, "-m", "layerlab.cut_lines", src, dst, "--count", count,
                  "--skip", skip])

    def prepare(self, script, flags):
        """Run a scripts/prepare/ script (it does nothing when its output is complete)."""
        self.run([sys.executable, paths.script("prepare", script), *flags])

    def finished(self, row, seed):
        return runs.load_result(self.run_dir(row, seed))

    def train(self, row, seed, data, flags):
        """fairseq-train --user-dir for one (row, seed) from scratch -> its run directory."""
        run_dir = self.run_dir(row, seed)
        if not self.args.dry_run:
            runs.fresh_run_dir(run_dir)  # an unfinished run starts again
        self.run(runs.train_command(data, run_dir, seed, flags), os.path.join(run_dir, "train.log"))
        return run_dir

    def save_result(self, row, seed, result):
        if self.args.dry_run:
            return result
        return runs.save_result(self.run_dir(row, seed), result)

    def seeds(self, default):
        return [int(s) for s in self.args.seeds.split(",")] if self.args.seeds else list(default)

    def rows(self, all_rows):
        if not self.args.rows:
            return list(all_rows)
        wanted = self.args.rows.split(",")
        unknown = [r for r in wanted if r not in all_rows]
        if unknown:
            raise TableError(f"unknown row(s) {', '.join(unknown)}; rows: "
                             f"{', '.join(all_rows)}")
        return wanted

    # ---- outputs -----------------------------------------------------------------------------
    def curves(self, run_dirs, filename="curves.png", nats=False, title=None, metric="nll_loss"):
        """Training/validation curves of the given {label: run_dir} as a PNG (first seed);
        by default the cross-entropy alone (``nll_loss``) where the criterion logs it."""
        if self.args.dry_run or not run_dirs:
            return None
        labels = list(run_dirs)
        logs = [os.path.join(run_dirs[label], "train.log") for label in labels]
        curves = curve_plots.curves_for(logs, nats, metric)
        path = os.path.join(self.out_dir, filename)  # out_dir exists: the runs are in it
        curve_plots.plot(curves, labels, path, "nats" if nats else "bits",
                         title or f"{self.name} ({self.scale})", metric)
        return path

    def write(self, markdown_lines, report, pictures=()):
        """``<out-dir>/<name>.md`` and ``.json`` (and copies of both and of the pictures in
        --results-dir as ``<name>_<scale>.*``)."""
        if self.args.dry_run:
            print(f"# the table ({self.out_dir}/{self.name}.md and .json): `"
                  f"{self.command.replace(' --dry-run', '')}`")
            return
        report = dict(report, table=self.name, scale=self.scale, command=self.command,
                      package_version=runs.package_version(),
                      date=datetime.date.today().isoformat())
        header = [f"# {report['title']} ({self.scale} scale)", "",
                  f"Command: `{self.command}`  ", f"Package: fairseq_plugins "
                  f"{report['package_version']}, {report['date']}", ""]
        if report.get("substitutions"):
            header += ["**Substitutions at this scale** (the numbers are not comparable to the "
                       "paper's without them in mind):", ""]
            header += [f"- {s}" for s in report["substitutions"]] + [""]
        text = "\n".join(header + markdown_lines) + "\n"
        pictures = [p for p in pictures if p]
        if pictures:
            text += "\n" + "\n".join(f"![{os.path.basename(p)}]({os.path.basename(p)})"
                                     for p in pictures) + "\n"
        targets = [self.out_dir]
        if self.args.results_dir:
            targets.append(os.path.abspath(self.args.results_dir))
        for i, folder in enumerate(targets):
            os.makedirs(folder, exist_ok=True)
            stem = self.name if i == 0 else f"{self.name}_{self.scale}"
            renamed = {os.path.basename(p): (os.path.basename(p) if i == 0
                                             else f"{stem}_{os.path.basename(p)}")
                       for p in pictures}
            body = text
            for old, new in renamed.items():
                body = body.replace(f"]({old})", f"]({new})")
            with open(os.path.join(folder, f"{stem}.md"), "w") as f:
                f.write(body)
            with open(os.path.join(folder, f"{stem}.json"), "w") as f:
                json.dump(report, f, indent=2)
            if i > 0:
                for p in pictures:
                    shutil.copyfile(p, os.path.join(folder, renamed[os.path.basename(p)]))
        print(text)


def generate(table, run_dir, data, subset, flags, checkpoint="checkpoint_best.pt"):
    """fairseq-generate --user-dir on one subset -> the log's path (``flags``: beam, lengths,
    --bpe ...)."""
    log = os.path.join(run_dir, f"generate-{subset}.txt")
    table.run(runs.generate_command(data, os.path.join(run_dir, checkpoint), subset, flags), log)
    return log


def score(table, scorer, flags):
    """Run one of scripts/score_*.py with --json; return its result (None in a dry run)."""
    cmd = runs.score_command(scorer, flags)
    if table.args.dry_run:
        print(script_line(cmd), flush=True)  # the scores (JSON) go to the terminal
        return None
    print("[table] " + shlex.join(cmd), flush=True)
    return runs.run_scorer(cmd)


def script_line(cmd, log=None):
    """One command as a line of a bash script under ``set -euo pipefail``: output into ``log``
    (its folder made first) and, when it fails, the log's tail on stderr before the script stops."""
    line = shlex.join(str(c) for c in cmd)
    if log is None:
        return line
    quoted = shlex.quote(str(log))
    return (f"mkdir -p {shlex.quote(os.path.dirname(str(log)) or '.')}\n"
            f"{line} > {quoted} 2>&1 || {{ tail -n 20 {quoted} >&2; "
            f"echo \"failed; the whole log: \"{quoted} >&2; exit 1; }}")
