"""tests/cli_zygote.py, which runs the tests' fairseq commands and scripts in forked children:
each child starts as a fresh interpreter would (no plugin loaded, no logging configured, the
script's folder first on sys.path, the given cwd, environment and stdin) and ends with the
command's exit status, its output flushed and its atexit functions run; two zygotes run
commands side by side, and a command past its timeout is killed."""
import json
import os
import subprocess

import pytest
from conftest import ZYGOTES, cli_env, run_cli, run_script
from helpers import PLUGIN_DIR

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
    runs = [ZYGOTES[0].start([script, a, b], None, tmp_path, script=True),
            ZYGOTES[1].start([script, b, a], None, tmp_path, script=True)]
    assert [run.wait(timeout=60).returncode for run in runs] == [0, 0]
    # a command past its timeout is killed, and its zygote runs the next one
    hang = tmp_path / "hang.py"
    hang.write_text("import time\nprint('waiting', flush=True)\ntime.sleep(600)\n")
    run = ZYGOTES[1].start([hang], None, tmp_path, script=True)
    with pytest.raises(subprocess.TimeoutExpired) as info:
        run.wait(timeout=1)
    assert info.value.output == "waiting\n"  # what it wrote before
    with pytest.raises(ProcessLookupError):  # killed and reaped
        os.kill(run.pid, 0)
    # one nobody waited for is killed when its zygote is given the next command
    forgotten = ZYGOTES[1].start([hang], None, tmp_path, script=True)
    proc = ZYGOTES[1].run([script, a, b], None, tmp_path, script=True)
    assert proc.returncode == 0
    with pytest.raises(ProcessLookupError):
        os.kill(forgotten.pid, 0)
    assert ZYGOTES[1].running is None
