"""A checkpoint loaded into a model built with other options fails with an error that names the
options, not with torch's list of missing and unexpected keys.

Each idea declares them beside its flags (``CHECKPOINT_NAMES``; a depth connection in its
:class:`~fairseq_plugins.depth.registry.Method`): the names its weights carry in a
state-dict key (a module or parameter name, e.g. ``fuse_attn``) and the option that makes them.
:class:`NamesCheckpointMismatch` (a base of every model of this package) catches fairseq's strict
load failing on keys one side lacks and says which option each group of keys belongs to, and in
which direction: the checkpoint was trained with it and the model built without, or the reverse.
"""
import re
from typing import Dict, Iterable, List

from . import depth
from .errors import OptionError, refusals
from .models.layerwise import bridge, cross_attention

# the seq2seq features whose weights a checkpoint can carry (the depth connections declare
# theirs: depth.METHODS)
FEATURES = (bridge, cross_attention)


def owners() -> Dict[str, str]:
    """{weight name: its option}, merged over the ideas (a name two ideas share names both)."""
    out: Dict[str, str] = {}
    declared = [method.checkpoint_names for method in depth.METHODS]
    for names in declared + [feature.CHECKPOINT_NAMES for feature in FEATURES]:
        for name, flag in names.items():
            if name in out and flag not in out[name].split(" or "):
                out[name] = f"{out[name]} or {flag}"
            else:
                out.setdefault(name, flag)
    return out


def _owner(parts: List[str], names: Dict[str, str]):
    """(index of the first component of a key that an idea owns, or None)."""
    return next((i for i, p in enumerate(parts) if p in names), None)


def _groups(keys: Iterable[str], names: Dict[str, str]) -> Dict[str, List[str]]:
    """{option (or '' for keys no idea owns): the keys' module paths, layer indices as '*'}.
    A key that names no idea but sits in the module of one that does (Hyper-Connections'
    ``static_beta`` beside its ``static_alpha``) belongs to the same option."""
    keys = [(parts, _owner(parts, names)) for parts in (key.split(".") for key in keys)]
    # the module holding an owned weight or module -> its option
    anchors = {".".join(parts[:i]): names[parts[i]] for parts, i in keys if i is not None}
    out: Dict[str, List[str]] = {}
    for parts, i in keys:
        module = ".".join(parts[:-1])
        if i is not None:  # an owned parameter is shown as its module, an owned module as such
            flag, path = names[parts[i]], ".".join(parts[:i + 1] if i < len(parts) - 1
                                                   else parts[:-1])
        else:
            flag, path = anchors.get(module, ""), module or ".".join(parts)
        path = re.sub(r"\.\d+(?=\.|$)", ".*", path)
        if path not in out.setdefault(flag, []):
            out[flag].append(path)
    return out


def explain(missing: List[str], unexpected: List[str]) -> str:
    """One line: which options the keys the checkpoint lacks (``missing``) and the keys only the
    checkpoint has (``unexpected``) belong to."""
    names, parts = owners(), []
    for keys, side in ((unexpected, "the checkpoint was trained with {} and this model was "
                                    "built without it"),
                       (missing, "this model was built with {} and the checkpoint was trained "
                                 "without it")):
        for flag, paths in _groups(keys, names).items():
            where = ", ".join(paths[:4]) + (f" and {len(paths) - 4} more" if len(paths) > 4 else "")
            if flag:
                parts.append(f"{side.format(flag)} ({where})")
            else:
                what = "has weights this model lacks" if keys is unexpected else \
                    "lacks weights this model has"
                parts.append(f"the checkpoint {what}, of another architecture or size ({where})")
    return ("the checkpoint does not fit this model: " + "; ".join(parts)
            + ". Build the model with the checkpoint's options (docs/scale.md)")


class NamesCheckpointMismatch:
    """Mixed into a fairseq model: its strict ``load_state_dict`` failing on keys that one side
    lacks raises an OptionError (a ValueError) from :func:`explain` instead (fairseq's upgrade
    of the state dict runs first, in place: what it fills in, e.g. a depth connection's
    initialisation for a plain checkpoint, is not a mismatch)."""

    def load_state_dict(self, state_dict, strict=True, model_cfg=None, args=None):
        try:
            with refusals():  # an idea's own refusal while upgrading (another variant, size)
                return super().load_state_dict(state_dict, strict=strict, model_cfg=model_cfg,
                                               args=args)
        except RuntimeError as error:
            ours, theirs = set(self.state_dict()), set(state_dict)
            missing, unexpected = sorted(ours - theirs), sorted(theirs - ours)
            if not strict or not (missing or unexpected):
                raise
            with refusals():
                raise OptionError(explain(missing, unexpected)) from error
