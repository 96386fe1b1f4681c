"""A refusal of this package's options ends as argparse's own refusals do: ``<program>: error:
<the message>`` on one line of stderr and exit status 2, not a Python traceback.

:class:`OptionError` is such a refusal: every ValueError raised while a model of this package is
built from its options, or while a checkpoint is loaded into it (:func:`refusals`), and every
:class:`~fairseq_plugins.config.ConfigError`. Importing the package (``--user-dir``) installs
:func:`install`'s ``sys.excepthook``: an uncaught exception that is, or was raised from, an
OptionError (fairseq-train wraps a failed checkpoint load in its own exception) is shown as that
one line, after the process's exit functions have run; any other exception keeps its traceback.
``FAIRSEQ_PLUGINS_TRACEBACK=1`` shows the full trace of refusals too (docs/reliability.md). In
process (a notebook, a test) an OptionError is an ordinary exception.
"""
import atexit
import os
import sys
from contextlib import contextmanager

TRACEBACK_VARIABLE = "FAIRSEQ_PLUGINS_TRACEBACK"
EXIT_STATUS = 2  # argparse's


class OptionError(ValueError):
    """A refusal of one of this package's options, or of a checkpoint that does not fit them."""


# hydra's wrapper reports every exception of a job itself (a stack trace, status 1) before the
# interpreter's hook could see it: under this program a refusal ends the process where it is
# raised (the model's build, a checkpoint's load: nothing in fairseq catches either)
HYDRA_PROGRAM = "fairseq-hydra-train"


def program() -> str:
    """The running program's name, as argparse shows it."""
    return os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "python"


def traceback_asked() -> bool:
    return os.environ.get(TRACEBACK_VARIABLE, "") not in ("", "0")


@contextmanager
def refusals():
    """ValueErrors raised inside (the options' validation at build time, a checkpoint refused
    when loaded) leave as :class:`OptionError` with the same message; under
    ``fairseq-hydra-train`` the process ends there with the one line and status 2."""
    try:
        yield
    except ValueError as error:
        refusal = error if isinstance(error, OptionError) else OptionError(str(error))
        if program() == HYDRA_PROGRAM and not traceback_asked():
            _exit_with(refusal)
        if refusal is error:
            raise
        raise refusal from error


def refusal_in(error):
    """The OptionError that ``error`` is or was raised from (its cause or context), or None."""
    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, OptionError):
            return error
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return None


def one_line(error) -> str:
    """``<program>: error: <message>``, the message on one line."""
    return f"{program()}: error: {' '.join(str(error).split())}"


_previous_hook = sys.__excepthook__


def _exit_with(refusal):
    """The one line on stderr, the exit functions run, status 2."""
    print(one_line(refusal), file=sys.stderr)
    atexit._run_exitfuncs()  # what the interpreter would run at its exit
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(EXIT_STATUS)


def _hook(kind, value, traceback):
    refusal = refusal_in(value)
    if refusal is None or traceback_asked():
        return _previous_hook(kind, value, traceback)
    _exit_with(refusal)


def install():
    """Make uncaught refusals one line and status 2 (idempotent)."""
    global _previous_hook
    if sys.excepthook is not _hook:
        _previous_hook = sys.excepthook
        sys.excepthook = _hook
