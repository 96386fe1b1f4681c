"""Commands forked from a warm process: fairseq's console scripts and ``python`` scripts run in a
child forked from a server that has imported torch and fairseq once (and torch._dynamo, which
the optimizer of every training imports), instead of in a fresh interpreter that spends ~5 s (on
a 2-core machine) importing them before it reads an argument, and a training ~3 s more.

Opt-in: with ``LAYERLAB_FORK_COMMANDS=1`` in the environment, :func:`layerlab.runs.run_logged`,
the scorers, ``fairseq-preprocess`` of the data scripts and the benchmark suite's ``--quick``
workers fork their commands (for many short commands: the smoke scales, the test suite).
Without it, the default, every command is a fresh process, exactly as a user starts it. The
test suite's own fairseq commands use the same servers (``tests/conftest.py``).

The child starts as a fresh interpreter would and ends as the command would:

- this repository's plugin package is *not* imported in the server: ``--user-dir`` loads it in
  the child, as in a real run, and a command without ``--user-dir`` does not see it;
- the root logger is unconfigured (fairseq's import configures it; a fresh ``fairseq-train``
  configures it first, before importing fairseq), so each command sets up its own;
- argv, working directory, environment (``OMP_NUM_THREADS`` applied to torch, which a fresh
  interpreter's torch reads at start), stdin, stdout and stderr are the command's, and
  ``sys.path[0]`` is what the interpreter would put there (the script's folder; the console
  script's is the environment's ``bin/``; the working directory for ``python -m``);
- at exit it waits for its threads and runs the ``atexit`` functions (TensorBoard's writers flush
  there), then exits with the command's status;
- a Ctrl-C stops the command (Python's handler: ``KeyboardInterrupt``), not the server, which
  ignores it and waits for the next command; one sent in the microseconds between the fork and
  the command's start is held (SIGINT blocked) and raised as the command starts, not lost.

What differs: the import time is not paid (nor counted in the command's CPU seconds), and
modules the server imported are not imported again (their import-time side effects happened in
the server).

Protocol (one server runs one command at a time; commands side by side need one server each):
the client writes one JSON request per line to the server's request pipe (:func:`request`);
the server forks, writes the child's pid on one line of its reply pipe as soon as it is forked
(so that a client can kill a command that hangs), then one line ``STATUS CPU_SECONDS`` when it
ends: its exit status (negative: the signal that killed it) and its CPU time, user + system,
its own waited-for children included.
"""
import contextlib
import json
import logging
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading

ENV = "LAYERLAB_FORK_COMMANDS"


def enabled():
    """Whether this process's commands are forked (``LAYERLAB_FORK_COMMANDS=1``)."""
    return os.environ.get(ENV) == "1"


_console_scripts = None


def _console_script(name):
    """The installed console script ``name``'s entry point (None: there is none)."""
    global _console_scripts
    if _console_scripts is None:
        from importlib.metadata import entry_points
        _console_scripts = {ep.name: ep for ep in entry_points(group="console_scripts")}
    return _console_scripts.get(name)


def read_output(path):
    """What a command wrote into ``path`` ("" where it never opened it: a child killed at
    once)."""
    if not os.path.exists(path):
        return ""
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read()


def how(cmd):
    """How a command runs in a forked child: ``("console", argv)`` for a console script beside
    this Python (``fairseq-train`` ...), ``("path", argv)`` for ``python SCRIPT ARGS``,
    ``("module", argv)`` for ``python -m MODULE ARGS`` (``argv``: the child's ``sys.argv``,
    the module's name first); None for any other command (it runs as a fresh process)."""
    cmd = [str(c) for c in cmd]
    if not cmd:
        return None
    exe = os.path.abspath(cmd[0])
    if exe == os.path.abspath(sys.executable):
        if len(cmd) > 2 and cmd[1] == "-m":
            return "module", cmd[2:]
        if len(cmd) > 1 and not cmd[1].startswith("-"):
            return "path", cmd[1:]
        return None
    if (os.path.dirname(exe) == os.path.dirname(os.path.abspath(sys.executable))
            and _console_script(os.path.basename(exe)) is not None):
        return "console", [exe, *cmd[1:]]
    return None


def request(kind, argv, cwd=None, env=None, stdin=None, stdout=None, stderr=None, append=False):
    """One command for a server: ``kind`` and ``argv`` as :func:`how` gives them; ``stdin``,
    ``stdout``, ``stderr``: paths (None: the server's own, which it inherited from the process
    that started it); ``stderr="stdout"``: into the same file as stdout; ``append``: after what
    the output files hold."""
    return dict(kind=kind, argv=[str(a) for a in argv], cwd=str(cwd or os.getcwd()),
                env=dict(os.environ if env is None else env),
                stdin=None if stdin is None else str(stdin),
                stdout=None if stdout is None else str(stdout),
                stderr=stderr if stderr in (None, "stdout") else str(stderr), append=append)


# ---- the child ---------------------------------------------------------------------------------
def _redirect(req):
    """The command's stdin, stdout and stderr on descriptors 0-2, with fresh stream objects on
    them, as an interpreter start makes them."""
    written = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if req["append"] else os.O_TRUNC)
    targets = [(0, req["stdin"], os.O_RDONLY), (1, req["stdout"], written)]
    if req["stderr"] != "stdout":
        targets.append((2, req["stderr"], written))
    for fd, path, mode in targets:
        if path is not None:
            opened = os.open(path, mode, 0o666)
            os.dup2(opened, fd)
            os.close(opened)
    if req["stderr"] == "stdout":
        os.dup2(1, 2)
    sys.stdin = open(0, closefd=False)
    sys.stdout = open(1, "w", closefd=False)
    sys.stderr = open(2, "w", closefd=False, buffering=1, errors="backslashreplace")


def _run(kind, argv):
    """Run the command in this process -> its exit status."""
    import runpy
    sys.argv = list(argv)
    if kind == "console":
        sys.path[0] = os.path.dirname(argv[0])
        return _console_script(os.path.basename(argv[0])).load()()
    if kind == "path":
        sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
        runpy.run_path(argv[0], run_name="__main__")
    elif kind == "module":
        sys.path[0] = os.getcwd()
        runpy.run_module(argv[0], run_name="__main__", alter_sys=True)
    else:
        raise ValueError(f"unknown kind of command: {kind!r}")
    return None


def become(req, close=()):
    """In a forked child: close the server's descriptors ``close``, become the command ``req``
    (:func:`request`), run it, and exit with its status; never returns."""
    import atexit
    code = 1
    try:
        for fd in close:
            os.close(fd)
        # as a fresh interpreter's; SIGINT stays blocked (the server's mask) until the command
        # starts, so that a Ctrl-C from the fork on is delivered then, not lost
        signal.signal(signal.SIGINT, signal.default_int_handler)
        os.chdir(req["cwd"])
        os.environ.clear()
        os.environ.update(req["env"])
        if "OMP_NUM_THREADS" in os.environ:
            import torch
            torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
        _redirect(req)
        try:
            # a SIGINT that came while blocked raises KeyboardInterrupt here, as in the command
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
            status = _run(req["kind"], req["argv"])
            code = 0 if status is None else status
        except SystemExit as e:
            code = e.code
        if code is None:
            code = 0
        elif not isinstance(code, int):  # sys.exit("message"): printed, status 1
            print(code, file=sys.stderr)
            code = 1
    except BaseException:  # noqa: B902  (an uncaught exception: status 1)
        # as the interpreter: sys.excepthook shows it (a traceback; the plugin's hook shows its
        # option refusals as one line and exits with status 2 itself)
        sys.excepthook(*sys.exc_info())
        code = 1
    try:
        threading._shutdown()  # what the interpreter does before atexit
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code & 0xFF)


# ---- the server --------------------------------------------------------------------------------
def hold_interrupts():
    """The server's SIGINT: ignored *and* blocked. A Ctrl-C in the terminal reaches the whole
    process group: the command stops (its child restores Python's handler), the server waits
    for the next one. A child inherits the mask, and Linux keeps a blocked signal pending even
    where it is ignored, so a SIGINT sent to a child before it has restored the handler is
    delivered when :func:`become` unblocks it (ignored alone, it would be discarded: the command
    would run on). The server's own pending SIGINTs are not inherited (fork clears them)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})


def serve(requests_fd, replies_fd):
    """The server's loop: import torch and fairseq, then fork a child per request (read from
    descriptor ``requests_fd``) and report on ``replies_fd`` (see the module's protocol); ends
    when the request pipe closes."""
    import torch  # noqa: F401
    import fairseq  # noqa: F401
    # every fairseq-train builds a torch optimizer, whose constructor imports torch._dynamo
    # (~3 s on a 2-core machine, more than the rest of a tiny training); it starts no thread
    import torch._dynamo  # noqa: F401

    root = logging.getLogger()  # undo the basicConfig that importing fairseq makes
    for handler in list(root.handlers):
        root.removeHandler(handler)
    root.setLevel(logging.WARNING)
    hold_interrupts()
    with os.fdopen(requests_fd, "rb") as requests, os.fdopen(replies_fd, "wb") as replies:
        for line in requests:
            req = json.loads(line)
            pid = os.fork()
            if pid == 0:
                become(req, close=(requests_fd, replies_fd))
            replies.write(f"{pid}\n".encode())
            replies.flush()
            _, status, usage = os.wait4(pid, 0)
            cpu = usage.ru_utime + usage.ru_stime
            replies.write(f"{os.waitstatus_to_exitcode(status)} {cpu:.3f}\n".encode())
            replies.flush()


# ---- the client --------------------------------------------------------------------------------
def _read_line(fd, timeout=None):
    """One line from a pipe, read a byte at a time (a buffered reader could take the next line
    too, which select() would then not see); None if nothing came within ``timeout`` s."""
    line = b""
    while not line.endswith(b"\n"):
        if timeout is not None and not select.select([fd], [], [], timeout)[0]:
            return None
        byte = os.read(fd, 1)
        if not byte:
            raise RuntimeError("the layerlab.warm server ended (see its stderr)")
        line += byte
    return line.decode()


class Server:
    """A ``python -m layerlab.warm`` process of this one, started on its first command with
    ``env`` (default: this process's); it inherits this process's stdin, stdout and stderr
    (a command with no file of its own writes there). ``running``: its command nobody has waited
    for yet."""

    def __init__(self, env=None):
        self.env, self.proc, self.running = env, None, None

    def start(self, req):
        """Start the command ``req`` (:func:`request`) -> its :class:`Forked`. A command of this
        server's that nobody waited for (its caller failed first) is killed."""
        if self.running is not None:
            self.running.kill()
        if self.proc is None or self.proc.poll() is not None:
            if self.proc is not None:  # it ended (killed?): a new one, on new pipes
                os.close(self._requests)
                os.close(self._replies)
            requests_r, self._requests = os.pipe()
            self._replies, replies_w = os.pipe()
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "layerlab.warm", str(requests_r), str(replies_w)],
                pass_fds=(requests_r, replies_w), env=self.env)
            os.close(requests_r)
            os.close(replies_w)
        os.write(self._requests, (json.dumps(req) + "\n").encode())
        self.running = Forked(self, int(_read_line(self._replies)), req["argv"])
        return self.running


class Forked:
    """A command running in a child of a :class:`Server`."""

    def __init__(self, server, pid, argv):
        self.server, self.pid, self.argv = server, pid, argv
        self.returncode = self.cpu_seconds = None

    def wait(self, timeout=None):
        """Its exit status (``cpu_seconds`` set beside it); past ``timeout`` s it is killed and
        subprocess.TimeoutExpired raised."""
        if self.returncode is None:
            reply = _read_line(self.server._replies, timeout)
            if reply is None:
                self.kill()
                raise subprocess.TimeoutExpired(self.argv, timeout)
            self._ended(reply)
        return self.returncode

    def poll(self):
        """Its exit status if it has ended (``cpu_seconds`` set beside it), else None: it runs
        on."""
        if self.returncode is None:
            reply = _read_line(self.server._replies, timeout=0)
            if reply is not None:
                self._ended(reply)
        return self.returncode

    def kill(self):
        """Kill it (if it still runs) and reap it."""
        if self.returncode is None:
            reply = _read_line(self.server._replies, timeout=0)  # it may have just ended
            if reply is None:
                # no status line yet: not reaped, so the pid is still the child's
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.pid, signal.SIGKILL)
                reply = _read_line(self.server._replies)
            self._ended(reply)

    def _ended(self, reply):
        code, cpu = reply.split()
        self.returncode, self.cpu_seconds = int(code), float(cpu)
        self.server.running = None
        with _lock:
            if self.server in _pooled:  # (it left _idle when it was given the command)
                _idle.append(self.server)


_lock = threading.Lock()
_pooled, _idle = [], []


def start(cmd, stdout=None, stderr=None, append=False, stdin=os.devnull, env=None):
    """Start ``cmd`` in a child of one of this process's idle servers (a new one when all are
    busy) -> its :class:`Forked`, or None for a command that cannot be forked (:func:`how`).
    ``env``: the command's environment (None: this process's)."""
    plan = how(cmd)
    if plan is None:
        return None
    with _lock:
        server = _idle.pop() if _idle else None
        if server is None:
            server = Server()
            _pooled.append(server)
    return server.start(request(*plan, stdin=stdin, stdout=stdout, stderr=stderr, append=append,
                                env=env))


def run(cmd, merge_stderr=False, env=None):
    """``subprocess.run(cmd, capture_output=True, text=True, env=env)`` (stderr into stdout
    with ``merge_stderr``), forked when :func:`enabled` and the command can be."""
    cmd = [str(c) for c in cmd]
    if enabled() and how(cmd) is not None:
        with tempfile.TemporaryDirectory() as tmp:
            out, err = os.path.join(tmp, "stdout"), os.path.join(tmp, "stderr")
            forked = start(cmd, stdout=out, stderr="stdout" if merge_stderr else err, env=env)
            try:
                forked.wait()
            except BaseException:
                forked.kill()
                raise
            return subprocess.CompletedProcess(cmd, forked.returncode, read_output(out),
                                               None if merge_stderr else read_output(err))
    if merge_stderr:
        return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              env=env)
    return subprocess.run(cmd, capture_output=True, text=True, env=env)


if __name__ == "__main__":
    serve(int(sys.argv[1]), int(sys.argv[2]))
