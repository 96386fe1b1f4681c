"""layerlab.warm, which runs the tests' fairseq commands and scripts in forked children (and the
experiment library's with LAYERLAB_FORK_COMMANDS=1): each child starts as a fresh interpreter would (no plugin loaded, no logging configured, the
script's folder first on sys.path, the given cwd, environment and stdin) and ends with the
command's exit status, its output flushed and its atexit functions run; two zygotes run
commands side by side, and a command past its timeout is killed. With the variable set,
the experiment library's commands are forked too, with the same logs, statuses and CPU
seconds as fresh processes (and a training's parameters bit for bit); without it they are fresh
processes."""
import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest
from conftest import ZYGOTES, cli_env, run_cli, run_script
from helpers import PLUGIN_DIR
from layerlab import runs, warm

PROBE = '''
import atexit, json, logging, os, sys
state = {"plugin": "fairseq_plugins" in sys.modules, "fairseq": "fairseq" in sys.modules,
         "handlers": len(logging.getLogger().handlers), "path0": sys.path[0],
         "cwd": os.getcwd(), "argv": sys.argv[1:], "stdin": sys.stdin.read(),
         "env": os.environ.get("PROBE_VAR")}
atexit.register(lambda: open("atexit.txt", "w").write("ran"))
print(json.dumps(state))
print("to stderr", file=sys.stderr)
sys.exit(int(sys.argv[1]))
'''


def test_a_child_starts_like_a_fresh_interpreter_and_ends_with_the_scripts_status(tmp_path):
    script = tmp_path / "scripts" / "probe.py"
    script.parent.mkdir()
    script.write_text(PROBE)
    work = tmp_path / "work"
    work.mkdir()
    proc = run_script(script, 3, "x y", stdin="some input\n", cwd=work,
                      env=dict(cli_env(), PROBE_VAR="set"))
    assert proc.returncode == 3 and proc.stderr == "to stderr\n"
    state = json.loads(proc.stdout)
    # torch and fairseq are imported once in the zygote; the plugin is not
    assert state["fairseq"] and not state["plugin"] and state["handlers"] == 0
    assert state["path0"] == str(script.parent) and state["cwd"] == str(work)
    assert state["argv"] == ["3", "x y"] and state["stdin"] == "some input\n"
    assert state["env"] == "set" and "PROBE_VAR" not in os.environ
    assert (work / "atexit.txt").read_text() == "ran"
    # an uncaught exception: its traceback on stderr, status 1, as python would
    script.write_text("raise RuntimeError('boom')\n")
    proc = run_script(script)
    assert proc.returncode == 1 and "RuntimeError: boom" in proc.stderr
    assert "Traceback" in proc.stderr


def test_fairseq_commands_run_their_console_script_entry_points(tmp_path):
    proc = run_cli("fairseq-train", "--user-dir", PLUGIN_DIR, "--arch", "no_such_arch",
                   check=False)
    assert proc.returncode == 2 and "invalid choice: 'no_such_arch'" in proc.stderr
    # with the plugin's --user-dir its architectures are choices; without it they are not
    # (the previous child's import of the plugin did not leak into this one)
    out = run_cli("fairseq-train", "--user-dir", PLUGIN_DIR, "--arch", "fusion_transformer_tiny",
                  "--help")
    assert out.startswith("usage: fairseq-train") and "invalid choice" not in out
    proc = run_cli("fairseq-train", "--arch", "fusion_transformer_tiny", check=False)
    assert proc.returncode == 2
    assert "invalid choice: 'fusion_transformer_tiny'" in proc.stderr


def test_commands_on_two_zygotes_run_side_by_side_and_a_hung_one_is_killed(tmp_path):
    # each script waits for the file the other writes: they finish only if they run together
    script = tmp_path / "meet.py"
    script.write_text("import os, sys, time\n"
                      "open(sys.argv[1], 'w').close()\n"
                      "for _ in range(600):\n"
                      "    if os.path.exists(sys.argv[2]): sys.exit(0)\n"
                      "    time.sleep(0.05)\n"
                      "sys.exit(4)\n")
    a, b = tmp_path / "a", tmp_path / "b"
    runs = [ZYGOTES[0].start([script, a, b], None, tmp_path, kind="path"),
            ZYGOTES[1].start([script, b, a], None, tmp_path, kind="path")]
    assert [run.wait(timeout=60).returncode for run in runs] == [0, 0]
    # a command past its timeout is killed, and its zygote runs the next one
    hang = tmp_path / "hang.py"
    hang.write_text("import time\nprint('waiting', flush=True)\ntime.sleep(600)\n")
    run = ZYGOTES[1].start([hang], None, tmp_path, kind="path")
    with pytest.raises(subprocess.TimeoutExpired) as info:
        run.wait(timeout=1)
    assert info.value.output == "waiting\n"  # what it wrote before
    with pytest.raises(ProcessLookupError):  # killed and reaped
        os.kill(run.pid, 0)
    # one nobody waited for is killed when its zygote is given the next command
    forgotten = ZYGOTES[1].start([hang], None, tmp_path, kind="path")
    proc = ZYGOTES[1].run([script, a, b], None, tmp_path, kind="path")
    assert proc.returncode == 0
    with pytest.raises(ProcessLookupError):
        os.kill(forgotten.pid, 0)
    assert ZYGOTES[1].running is None


def test_which_commands_can_be_forked():
    python, bin_dir = sys.executable, os.path.dirname(sys.executable)
    assert warm.how([os.path.join(bin_dir, "fairseq-train"), "data"]) == (
        "console", [os.path.join(bin_dir, "fairseq-train"), "data"])
    assert warm.how([python, "scripts/x.py", "--a"]) == ("path", ["scripts/x.py", "--a"])
    assert warm.how([python, "-m", "layerlab.cut_lines", "a"]) == (
        "module", ["layerlab.cut_lines", "a"])
    # anything else starts as a fresh process: other programs, python with its own options,
    # a script of that name outside this environment
    assert warm.how(["bash", "-c", "true"]) is None
    assert warm.how([python, "-c", "print(1)"]) is None
    assert warm.how(["/usr/bin/fairseq-train", "data"]) is None


BURN = """import sys, time
print("fairseq imported:", "fairseq" in sys.modules, flush=True)
print("to stderr", file=sys.stderr, flush=True)
end = time.process_time() + float(sys.argv[1])
while time.process_time() < end:
    pass
sys.exit(int(sys.argv[2]))
"""


@pytest.mark.parametrize("forked", [True, False])
def test_run_logged_forks_only_when_asked_with_the_same_log_status_and_cpu(tmp_path,
                                                                           monkeypatch, forked):
    if forked:
        monkeypatch.setenv(warm.ENV, "1")
    else:
        monkeypatch.delenv(warm.ENV, raising=False)
    script = tmp_path / "burn.py"
    script.write_text(BURN)
    log = tmp_path / "log.txt"
    log.write_text("earlier\n")
    cpu = runs.run_logged([sys.executable, script, 0.5, 0], log, append=True)
    # a forked child has fairseq already (the server's); a fresh interpreter has not
    assert log.read_text() == f"earlier\nfairseq imported: {forked}\nto stderr\n"
    assert 0.5 <= cpu < 3.0  # the burn, not the server's imports
    with pytest.raises(runs.StepError, match=r"(?s)exit 3\).*log.txt.*to stderr"):
        runs.run_logged([sys.executable, script, 0, 3], log)  # without append: a new log
    assert log.read_text().startswith("fairseq imported")


def test_a_forked_command_without_a_log_writes_to_the_callers_output(tmp_path):
    script = tmp_path / "burn.py"
    script.write_text(BURN)
    proc = subprocess.run([sys.executable, "-c", "import sys; from layerlab import runs; "
                           "runs.run_logged(sys.argv[1:])", sys.executable, script, "0", "0"],
                          capture_output=True, text=True, env=dict(cli_env(), **{warm.ENV: "1"}))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "fairseq imported: True\n" and proc.stderr.endswith("to stderr\n")


def test_captured_output_and_a_killed_command(tmp_path, monkeypatch):
    monkeypatch.setenv(warm.ENV, "1")
    script = tmp_path / "burn.py"
    script.write_text(BURN)
    proc = warm.run([sys.executable, script, 0, 5])
    assert (proc.returncode, proc.stdout, proc.stderr) == (5, "fairseq imported: True\n",
                                                            "to stderr\n")
    proc = warm.run([sys.executable, script, 0, 0], merge_stderr=True)
    assert proc.stdout == "fairseq imported: True\nto stderr\n" and proc.stderr is None
    hang = tmp_path / "hang.py"
    hang.write_text("import time\ntime.sleep(600)\n")
    forked = warm.start([sys.executable, hang])
    assert forked.poll() is None and forked.poll() is None  # running: polled, not killed
    os.kill(forked.pid, 0)
    forked.kill()
    assert forked.returncode == -9 and forked.poll() == -9
    with pytest.raises(ProcessLookupError):  # killed and reaped
        os.kill(forked.pid, 0)
    quick = warm.start([sys.executable, script, 0, 3])
    while quick.poll() is None:  # it ends by itself: poll gives its status, as wait would
        time.sleep(0.01)
    assert quick.returncode == 3 and quick.cpu_seconds is not None
    # a Ctrl-C (SIGINT to the process group) stops the command, as Python's handler would,
    # and leaves the server for the next one
    ready = tmp_path / "ready"
    hang.write_text(f"import time\nopen({str(ready)!r}, 'w').close()\ntime.sleep(600)\n")
    interrupted = warm.start([sys.executable, hang])
    assert interrupted.server is forked.server  # the idle server, used again
    server = forked.server.proc
    while not ready.exists():  # the command has started (its handler is Python's)
        time.sleep(0.05)
    os.kill(interrupted.pid, signal.SIGINT)
    os.kill(server.pid, signal.SIGINT)
    assert interrupted.wait(timeout=60) == 1  # KeyboardInterrupt: a traceback, status 1
    assert warm.run([sys.executable, script, 0, 0]).returncode == 0
    assert server.poll() is None and forked.server.proc is server  # not started again
    # the server ignores and blocks SIGINT (its children inherit the mask); a command runs with
    # it unblocked and caught by Python's handler, as in a fresh interpreter
    server_status = pathlib.Path(f"/proc/{server.pid}/status").read_text()
    assert {"SigBlk", "SigIgn"} <= _sigint_in(server_status)
    mask = tmp_path / "mask.py"
    mask.write_text("print(open('/proc/self/status').read())\n")
    child = warm.run([sys.executable, mask]).stdout
    assert _sigint_in(child) == {"SigCgt"}


def _sigint_in(text):
    """The signal sets of a /proc/PID/status text that hold SIGINT."""
    fields = dict(line.split(":\t", 1) for line in text.splitlines() if ":\t" in line)
    return {name for name in ("SigPnd", "SigBlk", "SigIgn", "SigCgt")
            if int(fields[name], 16) & (1 << (signal.SIGINT - 1))}


def test_a_ctrl_c_before_the_command_has_started_is_not_lost(tmp_path):
    # the race a Ctrl-C can meet: SIGINT sent to a child after the fork, before it restores
    # Python's handler. Made certain here: the child of a fork of this process takes the
    # server's disposition and mask (warm.hold_interrupts), is sent SIGINT, then becomes the
    # command
    script = tmp_path / "long.py"
    script.write_text("import time\ntime.sleep(60)\n")
    out = tmp_path / "out.txt"
    req = warm.request("path", [script], stdout=out, stderr="stdout")
    pid = os.fork()
    if pid == 0:
        try:
            warm.hold_interrupts()
            os.kill(os.getpid(), signal.SIGINT)
            warm.become(req)
        finally:
            os._exit(99)
    start = time.monotonic()
    _, status = os.waitpid(pid, 0)
    # KeyboardInterrupt at the command's start (a traceback, status 1), not a minute's sleep
    assert os.waitstatus_to_exitcode(status) == 1, warm.read_output(out)
    assert "KeyboardInterrupt" in warm.read_output(out)
    assert time.monotonic() - start < 30


def test_a_forked_training_is_the_fresh_one_bit_for_bit(lm_bin, tmp_path, monkeypatch):
    import torch

    flags = ["--task", "language_modeling", "--arch", "gpt_baseline_lm_tiny",
             "--tokens-per-sample", "32", "--batch-size", "8", "--optimizer", "adam", "--lr",
             "3e-3", "--max-update", "4", "--no-epoch-checkpoints", "--disable-validation"]
    models = {}
    for forked in ("0", "1"):
        monkeypatch.setenv(warm.ENV, forked)
        run_dir = tmp_path / forked
        run_dir.mkdir()
        runs.run_logged(runs.train_command(lm_bin, run_dir, 1, flags), run_dir / "train.log")
        models[forked] = torch.load(run_dir / "checkpoint_last.pt", weights_only=False)["model"]
    assert models["0"].keys() == models["1"].keys()
    assert all(torch.equal(models["0"][k], models["1"][k]) for k in models["0"])
