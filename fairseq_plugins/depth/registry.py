"""What a depth connection declares about itself: one :class:`Method` in its own module.

Everything around the interface (:mod:`.interface`) is derived from these declarations: the
flags every model family composes (``depth.CONFIGS``), the ``<family>_<preset>_tiny``
architectures, which method owns a stack's stream, the build-time refusals (two methods on one
stream, a method on a stack that cannot run it, ``--stream-recompute`` without streams to
rebuild), the options that add weights to ``--log-layer-weights`` and the names a mismatched
checkpoint is explained by. No file outside ``depth/`` names a method; a new one is its module,
one line in ``depth/__init__.py``'s :data:`~fairseq_plugins.depth.METHODS` and its docs page
(docs/adding-an-idea.md).

What a method needs from the stack that runs it (:attr:`Method.needs`) is one of the
requirements below; a model family says which it offers (:func:`unmet`), and a method whose
needs it does not meet is refused when the model is built, with the family's reason.
"""
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, FrozenSet, List, Mapping, Optional, Type

from torch import nn

from .interface import Layout

# what a method may need from a model family's stacks (Method.needs; that a connection runs in
# pre-norm stacks only is its class's ``needs_pre_norm``, checked per stack when it is built)
SEPARATE_INPUTS = "a self-attention that reads separate query, key and value inputs"
VALUE_HOOK = "a self-attention that hands the values it projects to a hook before caching them"
NEEDS = (SEPARATE_INPUTS, VALUE_HOOK)

SIDES = ("encoder", "decoder")  # the stacks a model family may have

# what a method is to a stack (Method.role)
STREAM = "stream"  # decides what the blocks read from the blocks below: at most one per stack
VALUES = "values"  # acts in the self-attentions beside the stream's method: composes with any


@dataclass(frozen=True)
class Stack:
    """What a method's ``build`` knows of the stack it builds for: its ``side`` ('encoder' or
    'decoder'), its blocks' sub-layers (``layout``), its width and its resolved fusion options
    (``fusion``: :class:`~.fusion.FusionOptions` or None)."""
    side: str
    layout: Layout
    embed_dim: int
    fusion: Any = None


def _no_needs(args) -> FrozenSet[str]:
    return frozenset()


def _nothing_to_check(args):
    return None


@dataclass(frozen=True)
class Method:
    """One depth connection's declaration.

    ``name``: its module's name (its docs page: docs/ideas/<name>.md, with hyphens); ``flag``:
    the option that turns it on (messages name it); ``config``: the dataclass of its options (flags
    and hydra keys); ``presets``: {preset name: options}, each registered in every family as
    ``<family>_<preset>_tiny``; ``active(args)``: whether it is on in a model's options;
    ``build(args, stack)``: its module for one stack (a :class:`~.interface.Connection` for
    :data:`STREAM`, the value mixer for :data:`VALUES`), or None where the stack does not have
    it; ``validate(args)``: the checks that need only its options (ranges are the options' own);
    ``needs(args)``: what it needs from a family's stacks, for these options (:data:`NEEDS`);
    ``remedies``: {need: what a user can do instead, in a family without it}; ``reduced``: a
    preset's options with that remedy applied (the preset a family without the need registers);
    ``recomputable``: ``--stream-recompute`` rebuilds its streams; ``logs_weights``: it has
    weights for ``--log-layer-weights``; ``checkpoint_names``: {a name its weights carry in a
    state-dict key: the option that makes them}, for a mismatched checkpoint's error;
    ``per_stack``: the method has a flag per stack, ``flag`` its template ('--{side}-x'; the
    option ``{side}_x`` turns it on in that stack)."""
    name: str
    flag: str
    config: Type
    active: Callable[[Any], bool]
    build: Callable[[Any, Stack], Optional[nn.Module]]
    presets: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    validate: Callable[[Any], None] = _nothing_to_check
    needs: Callable[[Any], FrozenSet[str]] = _no_needs
    remedies: Mapping[str, str] = field(default_factory=dict)
    reduced: Optional[Callable[[Mapping[str, Any]], Mapping[str, Any]]] = None
    role: str = STREAM
    recomputable: bool = False
    logs_weights: bool = True
    checkpoint_names: Mapping[str, str] = field(default_factory=dict)
    per_stack: bool = False

    def on(self, args, side: Optional[str] = None) -> List[str]:
        """The flags that turn it on in ``args`` (empty when it is off), in the ``side`` stack
        only where given."""
        if self.per_stack:
            return [flag for flag in self.flags_for((side,) if side else SIDES)
                    if getattr(args, flag[2:].replace("-", "_"), False)]
        return [self.flag] if self.active(args) else []

    def flags_for(self, sides) -> List[str]:
        """The flags that would turn it on in a model with the stacks ``sides``."""
        if self.per_stack:
            return [self.template.format(side=side) for side in sides]
        return [self.flag]

    def __post_init__(self):
        if self.per_stack:  # flag: the template; the label every message uses: both stacks'
            object.__setattr__(self, "template", self.flag)
            object.__setattr__(self, "flag", " / ".join(self.flags_for(SIDES)))
        if self.role not in (STREAM, VALUES):
            raise ValueError(f"{self.name}: role must be {STREAM!r} or {VALUES!r}")
        if set(self.remedies) - set(NEEDS):
            raise ValueError(f"{self.name}: remedies for unknown needs {set(self.remedies)}")

    def preset_needs(self, options: Mapping[str, Any]) -> FrozenSet[str]:
        """What the method needs under one preset's ``options`` (the others at their default)."""
        return self.needs(_Options(options))

    def options_without(self, options: Mapping[str, Any],
                        lacks: Mapping[str, str]) -> Optional[Dict[str, Any]]:
        """``options`` as a family that lacks ``lacks`` can build them: as they are where the
        method needs none of it, else with the remedy's options (:attr:`reduced`) where those
        need none of it; None where neither can be built."""
        if not self.preset_needs(options) & set(lacks):
            return dict(options)
        if self.reduced is not None:
            reduced = self.reduced(options)
            if not self.preset_needs(reduced) & set(lacks):
                return dict(reduced)
        return None


class _Options:
    """A preset's options read as a model's (an option it does not set reads None, as an
    option left at its flag's None default does)."""

    def __init__(self, options: Mapping[str, Any]):
        self.__dict__.update(options)

    def __getattr__(self, name):
        return None


def unmet(methods, args, lacks: Mapping[str, str], family: str) -> Optional[str]:
    """The refusal (one line) for the first active method of ``methods`` that needs what the
    ``family`` does not offer; ``lacks``: {requirement: why the family does not offer it} for
    each of :data:`NEEDS` it lacks (what it offers is absent). None when every need is met."""
    for method in methods:
        if not method.active(args):
            continue
        for need in NEEDS:
            if need in method.needs(args) and need in lacks:
                remedy = method.remedies.get(need)
                return (f"{method.flag} needs {need}, which {family} does not offer "
                        f"({lacks[need]})" + (f": {remedy}" if remedy else ""))
    return None


def flags(methods) -> str:
    """'--a, --b or --c'."""
    names = [method.flag for method in methods]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]
