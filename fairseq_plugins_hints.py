"""One line, not a traceback, for the two mistakes fairseq's programs meet before
``--user-dir`` has imported this package (its own refusals: ``fairseq_plugins/errors.py``).

- A checkpoint saved with the package, loaded without ``--user-dir``: torch's safe loading stops
  at the checkpoint's marker (``fairseq_plugins/checkpoint_marker.py``) with several lines of
  advice about ``add_safe_globals``, which is not what to do.
- A ``--user-dir`` that does not exist: fairseq resolves a relative path against the current
  folder (then against its own installation) and raises a bare ``FileNotFoundError``.

Two of fairseq's own failures that a new user meets first get the same treatment, whatever the
``--user-dir`` (fairseq's behaviour is otherwise unchanged: the same exceptions, only shown as
one line):

- A data folder without the dictionary the task reads (``dict.txt``, ``dict.<lang>.txt``): a
  ``FileNotFoundError`` from fairseq's ``Dictionary.add_from_file``.
- A ``--path`` that is not a checkpoint: whatever ``torch.load`` raised while fairseq's
  ``load_checkpoint_to_cpu`` read it (an unpickling error, a ``KeyError`` of the safe loader).

The install puts a ``fairseq_plugins_hints.pth`` beside the package (setup.py) whose one line
imports this module when the interpreter starts, so it must stay cheap: nothing but ``sys`` and
``os`` until an exception is actually shown. :func:`_hook` wraps ``sys.excepthook``: for those
two exceptions it prints ``<program>: error: <what to do>`` and exits with status 2 (argparse's);
every other exception, and these too under ``FAIRSEQ_PLUGINS_TRACEBACK=1``, keeps its traceback.
"""
import os
import sys

MARKER = "fairseq_plugins.checkpoint_marker"


def _frames(traceback):
    """The frames of ``traceback``, outermost first."""
    out = []
    while traceback is not None:
        out.append(traceback.tb_frame)
        traceback = traceback.tb_next
    return out


def _in(frame, name, path_end):
    """Whether ``frame`` runs the function ``name`` of a file whose path ends in
    ``path_end``."""
    code = frame.f_code
    return code.co_name == name and code.co_filename.replace(os.sep, "/").endswith(path_end)


def hint(value, traceback):
    """What to tell the user for this uncaught exception, or None to leave it alone."""
    if MARKER in str(value):
        return ("this checkpoint was saved with the fairseq_plugins package: load it with "
                "--user-dir /absolute/path/to/fairseq_plugins")
    frames = _frames(traceback)
    if isinstance(value, FileNotFoundError) and frames:
        if frames[-1].f_code.co_name == "import_user_module":
            return (f"--user-dir: no such folder: {value}; fairseq looks for a relative "
                    f"--user-dir under the current folder ({os.getcwd()}): give the absolute "
                    "path of fairseq_plugins")
        if any(_in(f, "add_from_file", "fairseq/data/dictionary.py") for f in frames):
            name = value.filename or str(value)
            return (f"no dictionary {name}: the data folder was not made by "
                    "fairseq-preprocess for this task (it writes dict.txt for "
                    "language_modeling, dict.<lang>.txt per language for translation); give "
                    "that folder as the first argument")
    for index, frame in enumerate(frames):
        if _in(frame, "load_checkpoint_to_cpu", "fairseq/checkpoint_utils.py") and any(
                _in(inner, "load", "torch/serialization.py") for inner in frames[index + 1:]):
            reason = (str(value).strip().splitlines() or [""])[0]
            return (f"--path {frame.f_locals.get('path')}: not a checkpoint (torch.load "
                    f"cannot read it: {type(value).__name__}: {reason}); give a checkpoint "
                    "saved by fairseq-train, e.g. checkpoints/checkpoint_best.pt")
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
