"""Depth connections: how the blocks of a stack connect to the blocks below them.

The interface every stack runs is :mod:`.interface`; each method is one module here with its
flags (a dataclass ``CONFIG``), their validation and its :class:`~.interface.Connection`:

- :mod:`.lrf`: LRF's fuse-attention sub-layer over the history (Zheng et al. 2023);
- :mod:`.dwa`: DenseFormer's depth-weighted averages (Pagliardini et al. 2024);
- :mod:`.hyper_connections`: Hyper-Connections (Zhu et al. 2025);
- :mod:`.mhc`: manifold-constrained Hyper-Connections and mHC-lite (Xie et al. 2025);
- :mod:`.frac_connections`: Frac-Connections (Zhu et al. 2025);
- :mod:`.attn_res`: Attention Residuals, full and block (Kimi Team 2026);
- :mod:`.mudd`: MUDD connections (Xiao et al. 2025);
- :mod:`.value_residual`: value residual (Zhou et al. 2024).

:mod:`.recompute` (``--stream-recompute``) trades time for memory in the multi-stream methods;
:mod:`.fused` (``--no-fused-kernels``) chooses where Triton kernels replace eager code.

LRF and DWA share their flags in :mod:`.fusion` (``--encoder-fusion``,
``--fusion-kind``, ...), which every model family reads. :func:`build` turns a model's options
into one stack's :class:`~.interface.Depth`; a model's dataclass composes :data:`CONFIGS`.
"""
from typing import List, Optional

from . import (attn_res, frac_connections, fused, hyper_connections, mhc, mudd, multi_stream,
               recompute, value_residual, weight_decay)
from .dwa import DepthWeightedAverages
from .interface import Connection, Depth, Layout

METHODS = (hyper_connections, mhc, frac_connections, attn_res, mudd, value_residual)
# the methods that own a stack's stream (a Connection each; value residual composes with any)
STREAMS = (hyper_connections, mhc, frac_connections, attn_res, mudd)
CONFIGS = (tuple(method.CONFIG for method in METHODS)
           + (recompute.CONFIG, fused.CONFIG, weight_decay.CONFIG))
# the methods whose streams --stream-recompute rebuilds (multi-stream connections)
RECOMPUTED = (hyper_connections, mhc, frac_connections)
# the methods' presets: {name: options}; every model family registers <family>_<name>_tiny
PRESETS = {name: options for method in METHODS for name, options in method.PRESETS.items()}


def recomputed_flags() -> str:
    """The flags of the methods --stream-recompute applies to, for its errors."""
    flags = [method.FLAG for method in RECOMPUTED]
    return ", ".join(flags[:-1]) + " or " + flags[-1]


def active_flags(args) -> List[str]:
    """The depth-connection flags that are on (the stream methods and value residual)."""
    return [method.FLAG for method in METHODS if method.active(args)]


def validate(args):
    for method in METHODS:
        method.validate(args)
    if recompute.enabled(args) and not any(method.active(args) for method in RECOMPUTED):
        raise ValueError(f"--stream-recompute rebuilds the streams of {recomputed_flags()}"
                         " and none of them is on: add one, or drop --stream-recompute")


def build(args, side: str, layout: Layout, embed_dim: int, fusion=None,
          pre_norm: bool = True, pre_norm_flag: Optional[str] = None) -> Depth:
    """The depth connections of the ``side`` stack (its blocks' sub-layers: ``layout``).

    ``fusion``: the stack's resolved ``FusionOptions`` (LRF or DWA; None: off). At most one
    method owns the stream; value residual composes with any. ``pre_norm``: whether the stack is
    pre-norm (methods defined only there are refused otherwise, naming ``pre_norm_flag``)."""
    chosen = []
    if fusion is not None:
        flag = f"--{side}-fusion" + (" --fusion-kind dwa" if fusion.kind == "dwa" else "")
        if fusion.kind == "dwa":
            chosen.append((flag, DepthWeightedAverages(layout, fusion.layers, fusion.dilation)))
        else:
            chosen.append((flag, Connection(layout, keep_history=True)))
    for method in STREAMS:
        if method.active(args):
            chosen.append((method.FLAG, method.build(args, layout, embed_dim)))
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
    return Depth(connection, value_residual.build(args, len(layout)), first_state)

