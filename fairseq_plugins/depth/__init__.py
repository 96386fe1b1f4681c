"""Depth connections: how the blocks of a stack connect to the blocks below them.

The interface every stack runs is :mod:`.interface`; each method is one module here with its
flags (a dataclass), their validation, its :class:`~.interface.Connection` and its declaration
(a :class:`~.registry.Method`, ``METHOD``), listed once in :data:`METHODS`:

- :mod:`.hyper_connections`: Hyper-Connections (Zhu et al. 2025);
- :mod:`.mhc`: manifold-constrained Hyper-Connections and mHC-lite (Xie et al. 2025);
- :mod:`.frac_connections`: Frac-Connections (Zhu et al. 2025);
- :mod:`.attn_res`: Attention Residuals, full and block (Kimi Team 2026);
- :mod:`.mudd`: MUDD connections (Xiao et al. 2025);
- :mod:`.value_residual`: value residual (Zhou et al. 2024);
- :mod:`.laurel`: LAuReL, learned augmented residual layers (Menghani et al. 2025);
- :mod:`.fusion`: LRF's fuse-attention over the history (Zheng et al. 2023; the sub-layer in
  :mod:`.lrf`) and DenseFormer's depth-weighted averages (Pagliardini et al. 2024; :mod:`.dwa`),
  with a flag per stack (``--encoder-fusion``, ``--decoder-fusion``, ``--fusion-kind``), which
  every family also reads to lay out its blocks.

:mod:`.multi_stream` is the machinery of the methods with several streams;
:mod:`.recompute` (``--stream-recompute``) trades time for memory in them; :mod:`.fused`
(``--no-fused-kernels``) chooses where Triton kernels replace eager code. :func:`build` turns a
model's options into one stack's :class:`~.interface.Depth`; a model's dataclass composes
:data:`CONFIGS`; the rest of the package reads the methods only through :data:`METHODS` and the
functions here.
"""
from typing import List, Mapping, Optional, Tuple

from . import (attn_res, frac_connections, fused, fusion, hyper_connections, laurel, mhc, mudd,
               multi_stream, recompute, value_residual, weight_decay)
from .interface import Connection, Depth, Layout
from . import registry
from .registry import STREAM, Method, Stack, unmet

# every depth connection, one line each: a new method is its module and one line here
METHODS: Tuple[Method, ...] = (
    fusion.METHOD,
    hyper_connections.METHOD,
    mhc.METHOD,
    frac_connections.METHOD,
    attn_res.METHOD,
    mudd.METHOD,
    value_residual.METHOD,
    laurel.METHOD,
)

# the options every model family composes: the methods' and the machinery's
CONFIGS = (tuple(method.config for method in METHODS)
           + (recompute.CONFIG, fused.CONFIG, weight_decay.CONFIG))
# the methods' presets: {name: options}; every model family registers <family>_<name>_tiny
PRESETS = {name: options for method in METHODS for name, options in method.presets.items()}
# the methods whose streams --stream-recompute rebuilds (multi-stream connections)
RECOMPUTED = tuple(method for method in METHODS if method.recomputable)


def recomputed_flags() -> str:
    """The flags of the methods --stream-recompute applies to, for its errors."""
    return registry.flags(RECOMPUTED)


def active_flags(args, side: Optional[str] = None) -> List[str]:
    """The depth-connection flags that are on (in the ``side`` stack only, where given)."""
    return [flag for method in METHODS for flag in method.on(args, side)]


def weight_flags(sides, lacks: Mapping[str, str] = {}) -> List[str]:
    """The options that add weights for --log-layer-weights to a model whose stacks are
    ``sides`` and which lacks ``lacks`` (as in :func:`refuse_unmet`), for its refusal when it
    has none: a method that needs what the family lacks is named with its remedy's options
    (:attr:`~.registry.Method.reduced`), or not at all."""
    out = []
    for method in METHODS:
        extra = method.options_without({}, lacks) if method.logs_weights else None
        if extra is None:
            continue
        options = "".join(f" --{key.replace('_', '-')} {value}" for key, value in extra.items())
        out += [flag + options for flag in method.flags_for(sides)]
    return out


def validate(args):
    for method in METHODS:
        method.validate(args)
    if recompute.enabled(args) and not any(method.active(args) for method in RECOMPUTED):
        raise ValueError(f"--stream-recompute rebuilds the streams of {recomputed_flags()}"
                         " and none of them is on: add one, or drop --stream-recompute")


def refuse_unmet(args, lacks: Mapping[str, str], family: str):
    """Raise ValueError where an active method needs what ``family`` does not offer
    (``lacks``: {one of :data:`~.registry.NEEDS`: why the family lacks it})."""
    refusal = unmet(METHODS, args, lacks, family)
    if refusal:
        raise ValueError(refusal)


def presets_for(lacks: Mapping[str, str]) -> dict:
    """The presets a family lacking ``lacks`` (as in :func:`refuse_unmet`) can build, each as
    :meth:`~.registry.Method.options_without` gives it; {name: options}."""
    out = {}
    for method in METHODS:
        for name, options in method.presets.items():
            buildable = method.options_without(options, lacks)
            if buildable is not None:
                out[name] = buildable
    return out


def build(args, side: str, layout: Layout, embed_dim: int, fusion=None,
          pre_norm: bool = True, pre_norm_flag: Optional[str] = None) -> Depth:
    """The depth connections of the ``side`` stack (its blocks' sub-layers: ``layout``).

    ``fusion``: the stack's resolved ``FusionOptions`` (LRF or DWA; None: off). At most one
    method owns the stream (:data:`~.registry.STREAM`); the others
    (:data:`~.registry.VALUES`) compose with it. ``pre_norm``: whether the stack is pre-norm
    (connections defined only there are refused otherwise, naming ``pre_norm_flag``)."""
    stack = Stack(side, layout, embed_dim, fusion)
    chosen, values = [], None
    for method in METHODS:
        if not method.active(args):
            continue
        module = method.build(args, stack)
        if module is None:
            continue
        if method.role == STREAM:
            chosen.append((getattr(module, "flag", None) or method.flag, module))
        else:
            values = module
    if len(chosen) > 1:
        raise ValueError(f"{' and '.join(flag for flag, _ in chosen)} both decide what the "
                         f"{side}'s blocks read from the blocks below: choose one")
    flag, connection = chosen[0] if chosen else (None, Connection(layout))
    if recompute.enabled(args):
        if not isinstance(connection, multi_stream.MultiStream):
            raise ValueError(f"--stream-recompute needs {recomputed_flags()} on the "
                             f"{side}, which has {flag or 'the plain residual'}")
        connection.recompute = True
    connection.fused = fused.enabled(args) and connection.accepts_fused(f"{side} {flag}")
    if connection.needs_pre_norm and not pre_norm:
        raise ValueError(f"{flag} is defined for pre-norm stacks only and the {side} is "
                         f"post-norm: add {pre_norm_flag}")
    first_state = 0 if fusion is None else fusion.first_state
    return Depth(connection, values, first_state)
