"""A process that has imported torch and fairseq once and forks a child per fairseq command (or
per ``python SCRIPT`` of this repository's scripts).

Why: on the 2-core CI machine a fairseq console script spends ~5 s importing torch and fairseq
(scikit-learn and SciPy included, through fairseq's task registry) before it reads its first
argument, and the tests run a few hundred of them. The child runs the console script's own entry
point (``fairseq_cli.train:cli_main`` for ``fairseq-train``, looked up in the installed
distribution's metadata) with the command's argv, working directory, environment, stdin, stdout
and stderr, as the script would in a fresh interpreter:

- this package is *not* imported here: ``--user-dir`` loads it in the child, as in a real run, and
  a command without ``--user-dir`` does not see it;
- the root logger is left unconfigured (fairseq's import configures it; a fresh
  ``fairseq-train`` configures it first, before importing fairseq), so each CLI sets up its own;
- at exit the child waits for its threads and runs the ``atexit`` functions (TensorBoard's
  writers flush there), then exits with the command's status.

The table, experiment and quickstart scripts, the documented commands and the interruption tests
still start their commands as real processes.

Protocol: one JSON request per line on stdin (``argv``, ``cwd``, ``env``, ``stdin``, ``stdout``,
``stderr``: paths; ``script``: true to run ``argv[0]`` as ``python argv[0]`` would); on stdout one
line with the child's pid as soon as it is forked (so that the caller can kill a command that
hangs), then one line with its exit status. One command at a time per zygote: commands that must
run side by side (the ranks of a distributed run) go to different zygotes.
"""
import json
import logging
import os
import sys


def run_child(request):
    """In the forked child: become the command, run it, never return."""
    import atexit
    import threading
    from importlib.metadata import entry_points

    code = 1
    try:
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        if "OMP_NUM_THREADS" in os.environ:  # a fresh interpreter's torch takes it at start
            import torch
            torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
        written = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
        for fd, (path, mode) in enumerate([(request["stdin"], os.O_RDONLY),
                                           (request["stdout"], written),
                                           (request["stderr"], written)]):
            opened = os.open(path, mode)
            os.dup2(opened, fd)
            os.close(opened)
        # fresh stream objects on the new descriptors, as an interpreter start makes them
        sys.stdin = open(0, closefd=False)
        sys.stdout = open(1, "w", closefd=False)
        sys.stderr = open(2, "w", closefd=False, buffering=1, errors="backslashreplace")
        sys.argv = list(request["argv"])
        # sys.path[0] as the interpreter sets it: the script's folder (the console script's
        # is the venv's bin/)
        sys.path[0] = os.path.dirname(os.path.abspath(sys.argv[0]))
        try:
            if request.get("script"):  # python SCRIPT ARGS
                import runpy
                runpy.run_path(sys.argv[0], run_name="__main__")
                status = None
            else:  # a console script: its entry point
                name = os.path.basename(sys.argv[0])
                (entry,) = [ep for ep in entry_points(group="console_scripts") if ep.name == name]
                status = entry.load()()
            code = 0 if status is None else status
        except SystemExit as e:
            code = e.code
        if code is None:
            code = 0
        elif not isinstance(code, int):  # sys.exit("message"): printed, status 1
            print(code, file=sys.stderr)
            code = 1
    except BaseException:  # noqa: B902  (an uncaught exception: status 1)
        # as the interpreter: sys.excepthook shows it (a traceback; this package's hook shows its
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


def main():
    import torch  # noqa: F401
    import fairseq  # noqa: F401

    root = logging.getLogger()  # undo the basicConfig that importing fairseq makes
    for handler in list(root.handlers):
        root.removeHandler(handler)
    root.setLevel(logging.WARNING)
    requests, replies = sys.stdin.buffer, sys.stdout.buffer
    for line in requests:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            run_child(request)
        replies.write(f"{pid}\n".encode())
        replies.flush()
        _, status = os.waitpid(pid, 0)
        code = os.waitstatus_to_exitcode(status)
        replies.write(f"{code}\n".encode())
        replies.flush()


if __name__ == "__main__":
    main()
