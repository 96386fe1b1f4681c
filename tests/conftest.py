"""Shared fixtures: real CLIs run with the venv's executables and no torch.load override."""
import os
import re
import subprocess
import sys
import tempfile

import pytest
from layerlab import warm

from helpers import PLUGIN_DIR, SCRIPTS

BIN = os.path.dirname(sys.executable)
TESTS = os.path.dirname(os.path.abspath(__file__))

# Under xdist every core already runs a worker: one intra-op thread per worker and per CLI it
# starts (they inherit the variable). Torch's default, one thread per core in each of them,
# oversubscribes the cores: measured on 2 cores, the three table smokes and the quick benchmark
# suite under -n 2 took 275 s of wall time and 7.6 min of CPU, with one thread each 218 s and
# 5.5 min. An explicit OMP_NUM_THREADS is kept.
if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

# tests/kernels/ runs where its Triton kernels can: on a GPU, or in test_kernels.py's child
# process under Triton's interpreter (TRITON_INTERPRET=1)
if os.environ.get("TRITON_INTERPRET") != "1":
    import torch
    if not torch.cuda.is_available():
        collect_ignore = ["kernels"]


def cli_env():
    env = dict(os.environ)
    env.pop("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", None)
    env["PYTHONWARNINGS"] = "ignore"
    return env


def forked_env():
    """``cli_env()`` in which the experiment library forks its commands (``layerlab.warm``)."""
    return dict(cli_env(), **{warm.ENV: "1"})


class _Zygote:
    """One ``layerlab.warm`` server of this test process (started at its first command): it
    forks a child per fairseq command instead of a new interpreter importing torch and fairseq
    again. A server runs one command at a time: commands side by side go to different zygotes
    (``ZYGOTES``)."""

    def __init__(self):
        self.server = None

    @property
    def running(self):
        return self.server.running if self.server else None

    def start(self, argv, stdin, cwd, kind="console", env=None):
        """Start the command (``kind`` as ``layerlab.warm.how`` names it: ``console``, a console
        script's path and its arguments; ``path``, ``python argv[0] ...``; ``module``,
        ``python -m argv[0] ...``); returns the ``_Command`` to ``wait()`` for. A command of
        this zygote's that nobody waited for (its test failed first) is killed."""
        if self.server is None:
            self.server = warm.Server(env=cli_env())
        tmp = tempfile.TemporaryDirectory()
        paths = {key: os.path.join(tmp.name, key) for key in ("stdin", "stdout", "stderr")}
        with open(paths["stdin"], "w") as f:  # the child writes the other two
            f.write(stdin or "")
        argv = [str(a) for a in argv]
        forked = self.server.start(warm.request(kind, argv, cwd=cwd, env=env or cli_env(),
                                                **paths))
        return _Command(forked, tmp, paths)

    def run(self, argv, stdin, cwd, kind="console", env=None):
        return self.start(argv, stdin, cwd, kind, env).wait()


class _Command:
    """A command running in a child of a zygote (``_Zygote.start``)."""

    def __init__(self, forked, tmp, paths):
        self.forked, self.pid, self.tmp, self.paths = forked, forked.pid, tmp, paths

    def wait(self, timeout=None):
        """Its CompletedProcess (text stdout and stderr); past ``timeout`` s the child is killed
        and subprocess.TimeoutExpired raised, as ``Popen.communicate`` does."""
        try:
            code = self.forked.wait(timeout)
        except subprocess.TimeoutExpired:
            code = None
        out, err = (warm.read_output(self.paths[key]) for key in ("stdout", "stderr"))
        self.tmp.cleanup()
        if code is None:  # what it wrote before, for the failure's message
            raise subprocess.TimeoutExpired(self.forked.argv, timeout, output=out, stderr=err)
        return subprocess.CompletedProcess(self.forked.argv, code, out, err)


ZYGOTES = (_Zygote(), _Zygote())


def run_cli(name, *args, stdin=None, cwd=None, check=True):
    """Run a fairseq console script (its entry point in a child of a ``layerlab.warm`` server:
    see there what is and is not as in a fresh interpreter); return stdout + stderr (asserting
    success if ``check``), or the CompletedProcess if not."""
    proc = ZYGOTES[0].run([os.path.join(BIN, name), *map(str, args)], stdin, cwd)
    if check:
        assert proc.returncode == 0, f"{name} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout + proc.stderr if check else proc


def start_cli(name, *args, zygote=0, env=None):
    """Start a fairseq console script in a child of ``ZYGOTES[zygote]`` and return at once (the
    ``_Command``: ``.wait(timeout)`` gives its CompletedProcess). For commands that run side by
    side: each on its own zygote, which is busy until it is waited for."""
    return ZYGOTES[zygote].start([os.path.join(BIN, name), *map(str, args)], None, None,
                                 env=env)


def run_command(cmd, cwd=None, env=None):
    """What ``subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, env=env or
    cli_env())`` gives, for a command a fresh interpreter would start (a console script beside
    this Python, ``python SCRIPT ...``, ``python -m MODULE ...``), run in a child of a
    ``layerlab.warm`` server: torch's and fairseq's imports are not paid again, the rest is as
    in a fresh process (see there). For what a command does and says; a test of what starting
    an interpreter does (a ``.pth`` file, an import a module must not make) starts one."""
    how = warm.how(cmd)
    assert how is not None, f"not a command a layerlab.warm server runs: {cmd}"
    kind, argv = how
    return ZYGOTES[0].run(argv, None, cwd, kind, env)


def run_script(path, *args, stdin=None, cwd=None, env=None):
    """``python PATH ARGS`` (one of this repository's scripts) in a child of a ``layerlab.warm``
    server: the CompletedProcess (text stdout and stderr)."""
    return ZYGOTES[0].run([path, *args], stdin, cwd, "path", env)


@pytest.fixture(scope="session")
def shared_root(tmp_path_factory):
    """A folder that every xdist worker of this test run shares (the workers' temporary folders
    sit side by side in the run's: pytest-xdist's recipe for a session fixture made once), this
    process's own without xdist. What goes in is made by :func:`made_once` and only read."""
    base = tmp_path_factory.getbasetemp()
    root = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "made-once"
    root.mkdir(exist_ok=True)
    return root


def made_once(shared_root, key, make):
    """``shared_root / key``, filled by ``make(folder)`` in the first worker that asks for it
    while the others wait (a file lock): data that every worker's tests read and none writes
    is prepared once per run, not once per worker. Returns (folder, what ``make`` returned:
    JSON, stored for the workers that did not make it). A ``make`` that fails leaves nothing
    behind, so the next one asking tries again (and fails the same way)."""
    import json
    import shutil

    from filelock import FileLock

    folder, done = shared_root / key, shared_root / f"{key}.json"
    with FileLock(str(shared_root / f"{key}.lock")):
        if not done.exists():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            try:
                value = make(folder)
            except BaseException:
                shutil.rmtree(folder, ignore_errors=True)
                raise
            done.write_text(json.dumps(value))
        return folder, json.loads(done.read_text())


def _prepared_real(shared_root, name, script, *flags):
    """``scripts/prepare/<script> --from ../shared/data/<name> FLAGS`` into ``data/`` and
    ``data-bin/`` of a folder made once per run (its preparation is tested in test_prepare.py;
    the table smokes in test_tables.py read it too, instead of preparing it again)."""
    from helpers import SHARED_DATA

    def make(folder):
        proc = run_script(os.path.join(SCRIPTS, "prepare", script), "--from",
                          os.path.join(SHARED_DATA, name), *flags, "--out-dir",
                          str(folder / "data"), "--dest-dir", str(folder / "data-bin"))
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        return proc.stdout

    # a key without commas: fairseq-preprocess reads a comma in a path as a list
    key = re.sub(r"[^\w.-]+", "_", "-".join((script, *flags)))
    folder, stdout = made_once(shared_root, key, make)
    return folder / "data", folder / "data-bin", stdout


@pytest.fixture(scope="session")
def multi30k_prepared(shared_root):
    """Multi30k De-En from ../shared/data as scripts/prepare/multi30k.py prepares it by default:
    (text folder, data-bin folder, the script's stdout), read-only."""
    return _prepared_real(shared_root, "multi30k", "multi30k.py")


@pytest.fixture(scope="session")
def cognition_small_prepared(shared_root):
    """CoGnition's small-scale recipe (``--train-on valid,test``) from ../shared/data: (text
    folder, data-bin folder, the script's stdout), read-only."""
    return _prepared_real(shared_root, "cognition", "cognition.py", "--train-on", "valid,test")


@pytest.fixture(scope="session")
def scan_bin(tmp_path_factory, shared_root):
    """SCAN length split prepared by the real script (fairseq-preprocess), valid = 200 examples:
    ``bin/`` and ``text/`` (made once per run, read-only) in a folder of this worker's, where
    tests write their checkpoints."""
    def make(folder):
        proc = subprocess.run(
            [sys.executable, os.path.join(SCRIPTS, "prepare_scan.py"), "--split", "length",
             "--out-dir", str(folder / "text"), "--dest-dir", str(folder / "bin"),
             "--valid-size", "200"], capture_output=True, text=True, env=cli_env())
        assert proc.returncode == 0, proc.stderr

    prepared, _ = made_once(shared_root, "scan-length", make)
    root = tmp_path_factory.mktemp("scan")
    for sub in ("bin", "text"):
        (root / sub).symlink_to(prepared / sub, target_is_directory=True)
    return root


@pytest.fixture(scope="session")
def lm_bin(shared_root):
    """A small synthetic corpus prepared by scripts/prepare/lm.py (SentencePiece + binarised):
    its data-bin, made once per run and only read."""
    def make(root):
        import torch

        g = torch.Generator().manual_seed(0)
        words = ["the", "cat", "dog", "sat", "on", "mat", "a", "ran", "to", "house", "big",
                 "small"]
        lines = [" ".join(words[int(i)] for i in torch.randint(0, len(words), (int(n),),
                                                               generator=g))
                 for n in torch.randint(4, 14, (6000,), generator=g)]
        (root / "corpus.txt").write_text("\n".join(lines) + "\n")
        proc = subprocess.run([sys.executable, os.path.join(SCRIPTS, "prepare", "lm.py"),
                               "--text", root / "corpus.txt", "--name", "toy", "--vocab-size",
                               "30"], capture_output=True, text=True, env=cli_env(), cwd=root)
        assert proc.returncode == 0, proc.stdout + proc.stderr

    root, _ = made_once(shared_root, "lm-toy", make)
    return root / "data-bin" / "toy"


def train(scan_bin, arch, *extra, updates=20, name=None):
    """fairseq-train --user-dir on the SCAN fixture; returns checkpoint_last.pt (log: train.log
    beside it)."""
    save_dir = scan_bin / f"ckpt-{name or arch}"
    out = run_cli("fairseq-train", scan_bin / "bin", "--user-dir", PLUGIN_DIR, "--arch", arch,
                  "--optimizer", "adam", "--lr", "1e-3", "--max-tokens", "1024",
                  "--max-update", updates, "--save-dir", save_dir, "--no-epoch-checkpoints",
                  "--num-workers", "0", "--seed", "1", *extra)
    (save_dir / "train.log").write_text(out)
    ckpt = save_dir / "checkpoint_last.pt"
    assert ckpt.exists()
    return ckpt


def train_lm(lm_bin, save_dir, arch, *extra, updates=20):
    """fairseq-train --user-dir a language model on the ``lm_bin`` corpus; returns
    checkpoint_last.pt."""
    run_cli("fairseq-train", lm_bin, "--user-dir", PLUGIN_DIR, "--task", "language_modeling",
            "--arch", arch, "--tokens-per-sample", "32", "--sample-break-mode", "none",
            "--optimizer", "adam", "--lr", "3e-3", "--batch-size", "8", "--max-update", updates,
            "--save-dir", save_dir, "--no-epoch-checkpoints", "--num-workers", "0", "--seed", "1",
            "--log-format", "simple", "--log-interval", "10", *extra)
    return save_dir / "checkpoint_last.pt"


def assert_lm_evaluates_and_generates(lm_bin, ckpt):
    """fairseq-eval-lm and fairseq-generate (beam 3, batches of 4) with only --user-dir."""
    out = run_cli("fairseq-eval-lm", lm_bin, "--user-dir", PLUGIN_DIR, "--path", ckpt,
                  "--tokens-per-sample", "32", "--batch-size", "8", "--num-workers", "0")
    assert "Perplexity:" in out
    out = run_cli("fairseq-generate", lm_bin, "--user-dir", PLUGIN_DIR, "--task",
                  "language_modeling", "--path", ckpt, "--tokens-per-sample", "32",
                  "--batch-size", "4", "--max-len-b", "10", "--prefix-size", "3", "--beam", "3",
                  "--sample-break-mode", "eos", "--gen-subset", "valid", "--num-workers", "0",
                  "--skip-invalid-size-inputs-valid-test")
    assert sum(line.startswith("H-") for line in out.splitlines()) >= 4


# The tests that run whole tables, the benchmark suite or end-to-end CLI pipelines (each 35-135 s
# on 2 cores, `--durations` of CI): started first, longest first, so that `-n 2` workers do not
# end with one of them still running a long test while the other is idle (~4 min of CI's wall
# time when they were collected last). Order: the suite's `--durations` on 2026-12-06 (the runs
# paused; the encoder-decoder comparison's end-to-end test, then the longest and missing here,
# has run on toy data since). dev.sh hands the tests out one at a time (`--maxschedchunk 1`):
# xdist's first chunk, an eighth of the suite per worker, gave the first worker all of these.
LONG_FIRST = ("test_tables.py::test_lrf_cognition_smoke", "test_end_to_end.py::test_quickstart",
              "test_bench.py::test_bench_suite_quick",
              "test_kernels.py::test_kernels_under_the_triton_interpreter",
              "test_tables.py::test_bridge_table_smoke",
              "test_encdec_comparison.py::test_both_tasks_end_to_end",
              "test_tables.py::test_lm_table_smoke",
              "test_lm_depth_comparison.py::test_a_tiny_comparison",
              "test_lm_depth_comparison.py::test_a_longer_run", "test_interrupted.py::",
              "test_end_to_end.py::test_compare_seeds_summarises",
              "test_prepare.py::test_wikitext2_real_files",
              "test_lm_depth_comparison.py::test_an_interrupted_run",
              "test_prepare.py::test_cfq_mcd1_real_preprocessed_files",
              "test_docs.py::test_documented_commands_run", "test_tables.py::test_smoke_dry_run",
              "test_end_to_end.py::test_compare_seeds_linear_decay",
              "test_end_to_end.py::test_checkpoint_loaded_without_user_dir",
              "test_bench.py::test_the_encdec_bench", "test_tables.py::test_lrf_cfq_smoke")


def pytest_collection_modifyitems(items):
    """Move the long tests to the front, in LONG_FIRST's order (a stable sort: the same order on
    every xdist worker, as it requires)."""
    def rank(item):
        name = item.nodeid.split("/")[-1]
        return next((i for i, prefix in enumerate(LONG_FIRST) if name.startswith(prefix)),
                    len(LONG_FIRST))
    items.sort(key=rank)
