"""One line, not a traceback, for the two mistakes fairseq's programs meet before
``--user-dir`` has imported this package (its own refusals: ``fairseq_plugins/errors.py``).

- A checkpoint saved with the package, loaded without ``--user-dir``: torch's safe loading stops
  at the checkpoint's marker (``fairseq_plugins/checkpoint_marker.py``) with several lines of
  advice about ``add_safe_globals``, which is not what to do.
- A ``--user-dir`` that does not exist: fairseq resolves a relative path against the current
  folder (then against its own installation) and raises a bare ``FileNotFoundError``.

The install puts a ``fairseq_plugins_hints.pth`` beside the package (setup.py) whose one line
imports this module when the interpreter starts, so it must stay cheap: nothing but ``sys`` and
``os`` until an exception is actually shown. :func:`_hook` wraps ``sys.excepthook``: for those
two exceptions it prints ``<program>: error: <what to do>`` and exits with status 2 (argparse's);
every other exception, and these too under ``FAIRSEQ_PLUGINS_TRACEBACK=1``, keeps its traceback.
"""
import os
import sys

MARKER = "fairseq_plugins.checkpoint_marker"


def hint(value, traceback):
    """What to tell the user for this uncaught exception, or None to leave it alone."""
    if MARKER in str(value):
        return ("this checkpoint was saved with the fairseq_plugins package: load it with "
                "--user-dir /absolute/path/to/fairseq_plugins")
    if isinstance(value, FileNotFoundError):
        frame = traceback
        while frame is not None and frame.tb_next is not None:
            frame = frame.tb_next
        if frame is not None and frame.tb_frame.f_code.co_name == "import_user_module":
            return (f"--user-dir: no such folder: {value}; fairseq looks for a relative "
                    f"--user-dir under the current folder ({os.getcwd()}): give the absolute "
                    "path of fairseq_plugins")
    return None


def _program():
    return os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "python"


def _make_hook(previous):
    def _hook(kind, value, traceback):
        message = None
        if os.environ.get("FAIRSEQ_PLUGINS_TRACEBACK", "") in ("", "0"):
            message = hint(value, traceback)
        if message is None:
            return previous(kind, value, traceback)
        import atexit

        print(f"{_program()}: error: {message}", file=sys.stderr)
        atexit._run_exitfuncs()  # what the interpreter runs at its exit
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        os._exit(2)
    _hook.fairseq_plugins_hints = True
    return _hook


if not getattr(sys.excepthook, "fairseq_plugins_hints", False):
    sys.excepthook = _make_hook(sys.excepthook)
