"""``--stream-recompute``: the multi-stream connections (Hyper-Connections, mHC,
Frac-Connections) rebuild in the backward pass what they can recompute cheaply, instead of
keeping it for the backward pass (torch's saved-tensor hooks).

A multi-stream connection makes two kinds of tensors that autograd would keep although the
connection could rebuild them from tensors autograd keeps anyway, at a small fraction of a
sub-layer's work: the copy a sub-layer reads (its LayerNorm keeps it: the read weights times the
streams, which the mixing keeps) and the streams between a block's sub-layers (every reader
keeps them: the block's input streams mixed and the sub-layers' outputs written, which the
writes keep). :class:`Recompute` is one forward pass's register of such tensors; inside
:meth:`Recompute.hooks` autograd saves a registered tensor, or a view of it, as its recipe and
rebuilds it when the backward pass needs it (once, shared by every node that saved it).

Off by default: it trades time for memory (measured on CPU in ``docs/benchmarks.md``). What it
does not change: the forward pass, and the gradients (the rebuilt tensors are recomputed by the
same operations on the same inputs under the forward pass's autocast state: bitwise equal on
CPU, tested). Without a gradient nothing is registered or rebuilt.
"""
import weakref
from dataclasses import dataclass
from typing import Callable, Dict, Optional, Tuple

import torch
from torch import Tensor

from fairseq.dataclass import FairseqDataclass

from ..config import option


@dataclass
class StreamRecomputeConfig(FairseqDataclass):
    """Flag ``--stream-recompute``; hydra ``model.stream_recompute``."""
    stream_recompute: Optional[bool] = option(
        False, "with a multi-stream connection (Hyper-Connections, mHC, Frac-Connections): "
               "rebuild each sub-layer's input and the streams between a block's sub-layers "
               "in the backward pass instead of keeping them (less activation memory, a few "
               "percent more time)")


CONFIG = StreamRecomputeConfig


def enabled(args) -> bool:
    return bool(getattr(args, "stream_recompute", None))


class _Recipe:
    """A registered tensor's recipe, ``fn(*inputs)`` under the forward pass's autocast state;
    computes it once and keeps the result while any autograd node that saved it lives (then the
    nodes free it as they would have freed the original). An input that is itself registered is
    held as its recipe: the recipe keeps no registered tensor alive."""
    __slots__ = ("fn", "inputs", "autocast", "expected", "value")

    def __init__(self, fn: Callable[..., Tensor], inputs: Tuple, like: Tensor):
        self.fn, self.inputs, self.value = fn, inputs, None
        device = like.device.type
        self.autocast = (device, torch.get_autocast_dtype(device),
                         torch.is_autocast_enabled(device))
        self.expected = (like.dtype, like.shape, like.stride())

    def __call__(self) -> Tensor:
        if self.value is None:
            inputs = [x() if isinstance(x, _Recipe) else x for x in self.inputs]
            device, dtype, enabled = self.autocast
            with torch.autocast(device, dtype=dtype, enabled=enabled):
                value = self.fn(*inputs)
            # (a view of it is rebuilt with the original's strides: they must be the same)
            if (value.dtype, value.shape, value.stride()) != self.expected:
                raise RuntimeError(f"a rebuilt tensor is {value.dtype} {tuple(value.shape)} "
                                   f"strides {value.stride()}, the forward pass's was "
                                   f"{self.expected[0]} {tuple(self.expected[1])} strides "
                                   f"{self.expected[2]}")
            self.value = value
            self.fn = self.inputs = None  # the inputs are no longer needed here
        return self.value


class Recompute:
    """The tensors of one forward pass that its backward pass rebuilds.

    ``add(t, fn, *inputs)``: ``fn(*inputs)`` returns t's value again from ``inputs``, tensors
    autograd keeps anyway or tensors registered before (their recipes are used: nothing
    registered is kept alive by another's recipe). ``fn`` must hold no tensor itself; ``t`` is
    referenced weakly. Only a tensor that owns all of its storage is registered (any layout:
    the rebuilt one is checked to have the same); a view (e.g. a product's row that happens to
    be contiguous) is kept as autograd keeps it."""

    def __init__(self):
        self._recipes: Dict[int, Tuple[weakref.ref, _Recipe]] = {}

    def _recipe(self, tensor: Tensor) -> Optional[_Recipe]:
        """The recipe of ``tensor`` (a registered tensor or a view of one), else None."""
        base = tensor if tensor._base is None else tensor._base
        entry = self._recipes.get(id(base))
        # the id alone could be a freed tensor's, reused: the weak reference tells
        if entry is None or entry[0]() is not base:
            return None
        return entry[1]

    def add(self, tensor: Tensor, fn: Callable[..., Tensor], *inputs):
        if (tensor._base is not None or tensor.storage_offset()
                or tensor.untyped_storage().nbytes() != tensor.numel() * tensor.element_size()):
            return  # not a tensor of its own (all of its storage): kept as autograd keeps it
        held = []
        for x in inputs:
            recipe = self._recipe(x) if isinstance(x, Tensor) else None
            if recipe is not None and x._base is not None:
                raise ValueError("a recipe's input is a view of a rebuilt tensor: pass the "
                                 "tensor itself")
            held.append(x if recipe is None else recipe)
        self._recipes[id(tensor)] = (weakref.ref(tensor), _Recipe(fn, tuple(held), tensor))

    def _pack(self, saved: Tensor):
        recipe = self._recipe(saved)
        if recipe is None:
            return saved
        if saved._base is None:
            return recipe
        if saved.dtype != saved._base.dtype:  # a reinterpreting view: kept as it is
            return saved
        # a view (a reader's flatten or reshape): the same view of the rebuilt tensor
        return recipe, saved.size(), saved.stride(), saved.storage_offset()

    @staticmethod
    def _unpack(packed) -> Tensor:
        if isinstance(packed, _Recipe):
            return packed()
        if isinstance(packed, tuple):
            recipe, size, stride, offset = packed
            return recipe().as_strided(size, stride, offset)
        return packed

    def hooks(self):
        """The context in which autograd saves this pass's registered tensors as recipes."""
        # every saved tensor keeps its pack hook: the hook refers to the register weakly, so
        # that the register (and a recipe's rebuilt value) dies with the forward pass's state
        # and each recipe with the last node that saved its tensor, not with the whole graph
        register = weakref.ref(self)

        def pack(saved: Tensor):
            alive = register()
            return saved if alive is None else alive._pack(saved)

        return torch.autograd.graph.saved_tensors_hooks(pack, Recompute._unpack)
