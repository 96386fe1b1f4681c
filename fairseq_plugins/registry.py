"""Registration that tolerates this package being imported twice.

fairseq imports ``--user-dir`` as a top-level module named after the folder; an installed copy of
the package (``pip install .``) may already be imported under another path or name. fairseq's
architecture, task and criterion registries raise on a second registration of the same name, so
these wrappers skip a name that *this package's own definition* already registered (same module
path inside the package, same qualified name) and let fairseq raise for any genuine clash.
"""
from fairseq.criterions import CRITERION_REGISTRY, register_criterion as _register_criterion
from fairseq.models import (
    ARCH_CONFIG_REGISTRY,
    MODEL_REGISTRY,
    register_model as _register_model,
    register_model_architecture as _register_model_architecture,
)
from fairseq.tasks import TASK_REGISTRY, register_task as _register_task


def _origin(obj):
    # "fairseq_plugins.models.x" and "plugins_copy.models.x" are the same definition.
    module = obj.__module__.split(".", 1)[-1]
    return module, obj.__qualname__


def _once(registry, name, register):
    def decorator(obj):
        existing = registry.get(name)
        if existing is not None and _origin(existing) == _origin(obj):
            return existing
        return register(obj)

    return decorator


def register_model(name, dataclass=None):
    return _once(MODEL_REGISTRY, name, _register_model(name, dataclass))


def register_model_architecture(model_name, arch_name):
    return _once(ARCH_CONFIG_REGISTRY, arch_name, _register_model_architecture(model_name, arch_name))


def register_task(name, dataclass=None):
    return _once(TASK_REGISTRY, name, _register_task(name, dataclass))


def register_criterion(name, dataclass=None):
    return _once(CRITERION_REGISTRY, name, _register_criterion(name, dataclass))


def import_submodules(package_name, package_dir):
    """Import every public ``*.py`` of a sub-package so that its registrations run."""
    import importlib
    import os

    for fname in sorted(os.listdir(package_dir)):
        if fname.endswith(".py") and not fname.startswith("_"):
            importlib.import_module(f"{package_name}.{fname[:-3]}")
