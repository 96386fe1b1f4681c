"""Where things are: the repository, its scripts, the plugin directory that ``--user-dir`` takes,
and the fairseq console scripts of the running Python's environment."""
import importlib.util
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = os.path.join(REPO, "scripts")
PLUGIN_DIR = os.path.join(REPO, "fairseq_plugins")
RESULTS = os.path.join(REPO, "results")


def fairseq_command(name):
    """The command that runs fairseq console script ``name`` (``fairseq-train``, ...): the
    executable beside this Python, else ``python -m fairseq_cli.<name>`` of this Python (a venv
    used without activating it still runs its own fairseq)."""
    exe = os.path.join(os.path.dirname(sys.executable), name)
    if os.path.exists(exe):
        return [exe]
    return [sys.executable, "-m", "fairseq_cli." + name.split("-", 1)[1].replace("-", "_")]


def script(*parts):
    """The path of a script under ``scripts/``, e.g. ``script("prepare", "scan.py")``."""
    return os.path.join(SCRIPTS, *parts)


_loaded = {}


def load_script(*parts):
    """A script under ``scripts/`` imported as a module, by its path (scripts are entry points,
    not a package); loaded once per process."""
    path = script(*parts)
    if path not in _loaded:
        spec = importlib.util.spec_from_file_location(os.path.splitext(parts[-1])[0], path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        _loaded[path] = module
    return _loaded[path]
