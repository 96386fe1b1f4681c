"""The depth-connection interface: how the blocks of a stack read and write its residual stream(s).

Every stack of the package (the encoder and the decoder of ``layerwise_transformer``, the blocks
of ``gpt_baseline_lm``, both stacks of ``ar_encdec_lm``) runs its blocks the same way::

    state = depth.start(x0)                   # x0: T x B x C, the embedding output
    for i, block in enumerate(blocks):
        block(state, depth, ...)              # every sub-layer: read -> f -> write (below)
        depth.end_block(state, i)
    x = depth.finish(state)                   # T x B x C: to the final norm / the other stack

and inside block i, every pre-norm sub-layer named s (:data:`SELF`, :data:`CROSS`, :data:`FUSE`,
:data:`FFN`)::

    inputs, token = depth.read(state, i, s)   # Inputs(query, key, value), T x B x C each
    out = f(LN(inputs.query), ...)            # the sub-layer (its keys/values from inputs.key/.value
                                              # where the connection gives them separately)
    depth.write(state, i, s, dropout(out), token)

:class:`Connection` is the plain residual (``x + f(LN(x))``); a method subclasses it and
overrides the hooks it changes (and is a ``weight_logging.WeightSource`` where it has weights to
show, for ``--log-layer-weights``):

- what block i reads from the history of the stack (``history``: x_0 and every block's output,
  kept where a method asks for it): :meth:`Connection.end_block` (DWA, MUDD);
- what the stack hands on: :meth:`Connection.finish`;
- what autograd keeps of the stack's forward pass for the backward pass: :meth:`Connection.saving`
  (a multi-stream connection rebuilds what it can recompute cheaply);
- several residual streams per position (``state.stream`` T x B x n x C): :meth:`read` /
  :meth:`write` (Hyper-Connections);
- separate inputs for a block's query, key, value and residual paths: ``Inputs.key`` /
  ``Inputs.value`` and the residual base in ``state.stream`` (MUDD);
- per-token attention over the history: the history itself, read by a sub-layer (LRF's
  fuse-attention, :meth:`Depth.fused_states`).

A value handed from the first block's attention to later blocks' attention (value residual) is
not a connection of the stream but of the attention: :class:`Depth` holds it beside the
connection and gives each self-attention its :meth:`Depth.value_mix`.

The state is created per forward pass and passed explicitly; nothing is stored on a module
between calls. Incremental decoding: every connection here works per position (a step reads the
step's own lower states), so the state needs no cache; the attention caches hold what the
attention projected from what it read (for value residual, the mixed values; for LRF's
all-positions reading, the earlier steps' lower-layer keys and values).
"""
import logging
from collections import OrderedDict
from contextlib import nullcontext
from typing import Any, Callable, ContextManager, Dict, List, Optional, Sequence, Tuple

from torch import Tensor, nn
from torch.utils.hooks import RemovableHandle

logger = logging.getLogger(__name__)

SELF, CROSS, FUSE, FFN = "self", "cross", "fuse", "ffn"
SUBLAYERS = (SELF, CROSS, FUSE, FFN)

Layout = Tuple[Tuple[str, ...], ...]  # the sub-layer names of every block, bottom up


class Inputs:
    """What one sub-layer reads, each T x B x C, before its LayerNorm: the ``query`` (also the
    keys and values of a self-attention), and separate ``key`` / ``value`` inputs where the
    connection gives them (None: the query's)."""
    __slots__ = ("query", "key", "value")

    def __init__(self, query: Tensor, key: Optional[Tensor] = None,
                 value: Optional[Tensor] = None):
        self.query, self.key, self.value = query, key, value


class StackState:
    """One stack's state during one forward pass (created by :meth:`Depth.start`).

    ``stream``: the residual stream, T x B x C (T x B x n x C with n streams); ``history``: the
    states kept for the connection or the fuse-attention ([x_0, x_1, ...], T x B x C each; None
    when nothing needs it). Everything else a part of the stack's depth connections keeps
    during the pass (the connection, value residual) is in that part's own slot: what its
    ``new_slot(x)`` returned at the start of the pass, handed back by :meth:`slot`."""
    __slots__ = ("stream", "history", "_slots")

    def __init__(self, stream: Tensor, history: Optional[List[Tensor]],
                 slots: Optional[Dict[int, Any]] = None):
        self.stream = stream
        self.history = history
        self._slots: Dict[int, Any] = {} if slots is None else slots

    def open_slot(self, owner: nn.Module, value: Any):
        """Give ``owner`` its slot for this pass (:meth:`Depth.start` does, once per part)."""
        self._slots[id(owner)] = value

    def slot(self, owner: nn.Module) -> Any:
        """``owner``'s slot in this pass (None where it keeps nothing)."""
        return self._slots.get(id(owner))

    def sharing_slots(self, stream: Tensor) -> "StackState":
        """A state of ``stream`` without history that shares this one's slots (a sub-layer run
        again in the backward pass on its own copy of the stream)."""
        return StackState(stream, None, self._slots)


class Connection(nn.Module):
    """The plain pre-norm residual: every sub-layer reads the stream and adds its output to it.

    ``layout``: every block's sub-layer names (:data:`Layout`); ``keep_history``: keep x_0 and
    every block's output in ``state.history`` (for a fuse-attention that reads them)."""

    name = "residual"
    streams = 1  # residual streams per position
    # a block's output is its input plus its sub-layers' outputs (and a DWA's change): the layer
    # analysis can decompose it (Hyper-Connections and MUDD mix the streams instead)
    additive = True
    needs_pre_norm = False  # defined only for pre-norm stacks (a build-time check)
    flag: Optional[str] = None  # the option that turns the connection on (messages name it)
    # whether its fused GPU kernels may run (set at build time from --fused-kernels and
    # accepts_fused; each call still checks the tensor's device: depth/fused.py)
    fused = False

    def __init__(self, layout: Layout, keep_history: bool = False):
        super().__init__()
        self.layout = tuple(tuple(block) for block in layout)
        self.keep_history = keep_history
        for block in self.layout:
            for name in block:
                if name not in SUBLAYERS:
                    raise ValueError(f"unknown sub-layer {name!r}; known: {SUBLAYERS}")
        # the 0-based index of every (block, sub-layer) in stack order (Hyper-Connections' k)
        self.sites: Dict[Tuple[int, str], int] = {}
        for i, block in enumerate(self.layout):
            for name in block:
                self.sites[(i, name)] = len(self.sites)

    @property
    def num_blocks(self) -> int:
        return len(self.layout)

    def accepts_fused(self, where: str) -> bool:
        """Whether this connection has fused kernels for its configuration (``where``: the stack
        and flag, for the line that says why not)."""
        return False

    def separate_inputs(self, block: int) -> bool:
        """Whether ``block``'s self-attention reads separate query/key/value inputs (then the
        block normalises each with its own LayerNorm)."""
        return False

    def start(self, x: Tensor) -> StackState:
        """x: T x B x C, the embedding output (after its dropout) -> the pass's state (its
        stream and history; :meth:`Depth.start` then opens every part's slot)."""
        if not self.keep_history:
            return StackState(x, None)
        # the history is read by every later sub-layer, and the kernels read rows: x is the
        # embedding output transposed (a strided view), which every read would otherwise copy
        # and its backward keep (one copy per read: O(K) copies of x in memory)
        x = x.contiguous()
        return StackState(x, [x])

    def new_slot(self, x: Tensor) -> Any:
        """What this connection keeps during one forward pass from the embedding output ``x``
        on (its slot in the state, ``state.slot(self)``); None: nothing."""
        return None

    def read(self, state: StackState, block: int, sublayer: str) -> Tuple[Inputs, Any]:
        """The inputs of ``sublayer`` of ``block`` and a token for :meth:`write`."""
        return Inputs(state.stream), None

    def write(self, state: StackState, block: int, sublayer: str, out: Tensor, token: Any,
              post_norm: Optional[nn.Module] = None):
        """Add ``out`` (T x B x C, the sub-layer's output after its dropout) to the stream; in a
        post-norm stack, ``post_norm`` (the sub-layer's LayerNorm) then normalises the stream
        (fairseq's ``LN(x + f(x))``). Only connections without ``needs_pre_norm`` receive one."""
        state.stream = state.stream + out
        if post_norm is not None:
            state.stream = post_norm(state.stream)

    def saving(self, state: StackState) -> ContextManager:
        """The context the stack's forward pass runs in: where a connection has autograd
        rebuild, in the backward pass, tensors it can recompute cheaply instead of keeping
        them (:class:`~.recompute.Recompute`'s hooks); the plain residual keeps what autograd
        keeps."""
        return nullcontext()

    def end_block(self, state: StackState, block: int):
        """After ``block``: keep its output where the history is kept."""
        if state.history is not None:
            state.history.append(state.stream)

    def finish(self, state: StackState) -> Tensor:
        """What the stack hands on, T x B x C."""
        return state.stream

    def view(self, state: StackState) -> Tensor:
        """The state as one T x B x C tensor (what the stack would hand on if it ended here):
        what the layer analysis reads as a block's input and output."""
        return self.finish(state)

    def start_from_plain(self, state_dict, name: str) -> bool:
        """Continue a checkpoint that has no weight of this connection at all (nothing under
        ``name``: a model trained without it, e.g. with ``--finetune-from-model`` or
        ``--restore-file`` of a plain checkpoint): the connection's own weights as they are
        (in a model just built, its initialisation) go into ``state_dict``, with one log line,
        and True is returned; False when the checkpoint has weights under ``name`` (whose the
        caller checks). For a connection whose initialisation is the plain model this is the
        pretrained function at the first update."""
        prefix = f"{name}." if name else ""
        if not prefix or any(k.startswith(prefix) for k in state_dict):
            return False
        state_dict.update({prefix + k: v for k, v in self.state_dict().items()})
        logger.info(f"{name}: the checkpoint has no {self.flag or self.name} weights: the "
                    "connection starts at its initialisation, the rest from the checkpoint")
        return True

    def connection_parameters(self) -> List[nn.Parameter]:
        """The parameters of the connection itself (excluded from weight decay)."""
        return list(self.parameters())

    def macs(self, embed_dim: int) -> int:
        """Forward multiply-accumulates per token of the whole stack's connection (0: the plain
        residual's additions are not counted)."""
        return 0


class Depth(nn.Module):
    """A stack's depth connections: one :class:`Connection` (the stream) and, optionally, value
    residual (the attention's values). Blocks call :meth:`read` / :meth:`write` around each
    sub-layer and :meth:`value_mix` in their self-attention; the stack calls :meth:`start`,
    :meth:`end_block` after each block and :meth:`finish`.

    ``fusion_first_state``: the first state a fuse-attention sub-layer attends (0: x_0; 1: not
    the embedding output)."""

    def __init__(self, connection: Connection, value_residual: Optional[nn.Module] = None,
                 fusion_first_state: int = 0):
        super().__init__()
        self.connection = connection
        self.value_residual = value_residual
        self.fusion_first_state = fusion_first_state
        self._observers: Dict[int, Callable[[Tensor, int, str], None]] = OrderedDict()

    def observe(self, fn: Callable[[Tensor, int, str], None]) -> RemovableHandle:
        """Have :func:`run_blocks` call ``fn(view, block, where)`` with every block's input and
        output view (T x B x C; ``where`` 'input' or 'output'): the layer analysis. Returns a
        handle whose ``remove()`` stops it. The views are computed only while someone observes
        (for n streams each costs a reduction over them)."""
        handle = RemovableHandle(self._observers)
        self._observers[handle.id] = fn
        return handle

    @property
    def observed(self) -> bool:
        return bool(self._observers)

    def notify(self, view: Tensor, block: int, where: str):
        for fn in self._observers.values():
            fn(view, block, where)

    @property
    def layout(self) -> Layout:
        return self.connection.layout

    def start(self, x: Tensor) -> StackState:
        state = self.connection.start(x)
        state.open_slot(self.connection, self.connection.new_slot(x))
        if self.value_residual is not None:
            state.open_slot(self.value_residual, self.value_residual.new_slot(x))
        return state

    def read(self, state: StackState, block: int, sublayer: str) -> Tuple[Inputs, Any]:
        return self.connection.read(state, block, sublayer)

    def write(self, state: StackState, block: int, sublayer: str, out: Tensor, token: Any,
              post_norm: Optional[nn.Module] = None):
        if post_norm is not None and self.connection.needs_pre_norm:
            raise RuntimeError(f"{type(self.connection).__name__} runs in pre-norm stacks only")
        self.connection.write(state, block, sublayer, out, token, post_norm)

    def saving(self, state: StackState) -> ContextManager:
        return self.connection.saving(state)

    def end_block(self, state: StackState, block: int):
        self.connection.end_block(state, block)

    def finish(self, state: StackState) -> Tensor:
        return self.connection.finish(state)

    def view(self, state: StackState) -> Tensor:
        return self.connection.view(state)

    def separate_inputs(self, block: int) -> bool:
        return self.connection.separate_inputs(block)

    def value_mix(self, state: StackState, block: int) -> Optional[Callable[[Tensor], Tensor]]:
        """What ``block``'s self-attention applies to the values it projects for the positions
        of this call (B x H x T x hp), before it caches them; None: nothing."""
        if self.value_residual is None:
            return None
        return self.value_residual.mix(state, block)

    def fused_states(self, state: StackState, block: int) -> List[Tensor]:
        """The states a fuse-attention sub-layer of ``block`` attends: [h_first, ..., h_block]
        (h_0 = the embedding output, h_j = block j-1's output: every block below it and its own
        input)."""
        if state.history is None:
            raise RuntimeError("the stack keeps no history: build its Connection with "
                               "keep_history=True when a block fuses")
        return state.history[self.fusion_first_state:block + 1]

    def connection_parameters(self) -> List[nn.Parameter]:
        params = self.connection.connection_parameters()
        if self.value_residual is not None:
            params += list(self.value_residual.parameters())
        return params


def run_blocks(depth: Depth, blocks: Sequence[nn.Module], x: Tensor,
               block_args: Callable[[int], Dict[str, Any]] = lambda i: {},
               states: Optional[List[Tensor]] = None,
               returns: Optional[List[Any]] = None) -> Tensor:
    """The stack's loop: x (T x B x C, the embedding output) through ``blocks`` (each called as
    ``block(state, depth, **block_args(i))``) -> what the stack hands on (T x B x C).

    ``states``: a list that receives x and every block's output view (T x B x C each; fairseq's
    ``encoder_states`` / ``inner_states``); ``returns``: a list that receives what every block
    returned (e.g. its attention weights)."""
    state = depth.start(x)
    if states is not None:
        states.append(x)
    watched = states is not None or depth.observed
    # block i's input view is block i-1's output view: computed once, and only when read
    view = depth.view(state) if watched else None
    with depth.saving(state):
        for i, block in enumerate(blocks):
            if view is not None:
                depth.notify(view, i, "input")
            returned = block(state, depth, **block_args(i))
            depth.end_block(state, i)
            if watched:
                view = depth.view(state)
                depth.notify(view, i, "output")
            if states is not None:
                states.append(view)
            if returns is not None:
                returns.append(returned)
        return depth.finish(state)
