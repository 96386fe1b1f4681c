"""``--cuda-graph``: the training forward and backward of ``gpt_baseline_lm``'s blocks as one
CUDA graph each (docs/ideas/fused-kernels.md, "CUDA graph").

Why: on a GPU at the comparison's size a training step is bound by the operators it launches,
not by its arithmetic (an H200 in fp16 took 25 ms for the plain model's update at d = 128 and
at d = 1024 alike; results/gpu_check_h200/). A captured graph replays every kernel of the
blocks with one launch, whatever the depth connection adds.

What is captured: the blocks between the embedding and the final LayerNorm, forward and
backward, with :func:`torch.cuda.make_graphed_callables` (the blocks' parameters are the
graph's; the embedding, the output projection, the criterion, the optimizer and fairseq's
trainer, which syncs on the host, stay outside it). The graph is captured on the first
training batch (its three warm-up passes run there) and replayed for every training batch of
the same shape and dtype: with ``--task language_modeling --sample-break-mode none`` (or
``--pad-to-fixed-length``) every sample is ``--tokens-per-sample`` tokens, so only an epoch's
last, smaller batch differs (``--pad-to-fixed-bsz`` pads it too); it runs eager (said once per
shape in the log). So does a pass while the parameters hold gradients (accumulation over
passes, ``--update-freq`` > 1: the graph's gradient buffers become the parameters' ``.grad``,
and a second replay would overwrite them): only the first pass of an update replays.
Evaluation, validation and decoding (incremental) run eager, as do CPU tensors (said once).
Dropout inside the graph draws from CUDA's generator as eager code does (graph-safe RNG), not
the same numbers.

Refused at build time, one line each: another ``--sample-break-mode`` without
``--pad-to-fixed-length`` (the sample length, so the shape, changes from batch to batch) and
``--log-layer-weights`` (the depth connections hand their statistics to the logger from
Python at the end of a pass, which a replayed graph does not run).
"""
import logging
from dataclasses import dataclass
from typing import Callable, Optional, Tuple

import torch
from torch import Tensor, nn

from fairseq.dataclass import FairseqDataclass

from .config import from_config, option

logger = logging.getLogger(__name__)

# the one sample-break mode whose samples all have --tokens-per-sample tokens
STATIC_BREAK_MODE = "none"


@dataclass
class CudaGraphConfig(FairseqDataclass):
    """Flag ``--cuda-graph``; hydra ``model.cuda_graph``."""
    cuda_graph: Optional[bool] = option(
        False, "run the training forward and backward of the blocks as a CUDA graph (on CUDA; "
               "needs static shapes: --sample-break-mode none or --pad-to-fixed-length); a "
               "batch of another shape, validation and decoding run eager")
    sample_break_mode: Optional[str] = from_config(
        "task.sample_break_mode", "the task's sample-break mode: whether every sample has "
                                  "--tokens-per-sample tokens")
    pad_to_fixed_length: Optional[bool] = from_config(
        "task.pad_to_fixed_length", "whether the task pads every sample to --tokens-per-sample")


def validate(args) -> None:
    """The build-time refusals of ``--cuda-graph`` (ValueError, one line)."""
    if not getattr(args, "cuda_graph", None):
        return
    mode = getattr(args, "sample_break_mode", None)
    if mode is not None and mode != STATIC_BREAK_MODE and not getattr(
            args, "pad_to_fixed_length", None):
        raise ValueError(
            f"--cuda-graph needs static shapes: --sample-break-mode {STATIC_BREAK_MODE} or "
            "--pad-to-fixed-length (every sample --tokens-per-sample tokens); with "
            f"--sample-break-mode {mode} the length changes from batch to batch")
    if getattr(args, "log_layer_weights", None):
        raise ValueError("--cuda-graph with --log-layer-weights: the statistics are handed to "
                         "the logger from Python at the end of a pass, which a replayed graph "
                         "does not run; log without the graph")


class BlocksModule(nn.Module):
    """The captured function as a module (make_graphed_callables takes a module's parameters
    as the graph's): ``run(x)`` over ``parts``, which stay registered where they were (this
    wrapper is not an attribute of the model: its state dict is unchanged)."""

    def __init__(self, run: Callable[[Tensor], Tensor], parts):
        super().__init__()
        self.parts = nn.ModuleList(parts)
        self.run = run

    def forward(self, x: Tensor) -> Tensor:
        return self.run(x)


def graphable(x: Tensor) -> bool:
    """Whether a pass on ``x`` can be captured (a CUDA tensor; the tests replace this)."""
    return x.is_cuda


def capture(module: nn.Module, x: Tensor) -> nn.Module:
    """``module`` with its forward replaced by the graphed one, captured on ``x`` (the point
    the tests replace: capturing needs CUDA). A parameter the pass leaves unused (none should)
    keeps no gradient, as in eager code."""
    return torch.cuda.make_graphed_callables(module, (x,), allow_unused_input=True)


class GraphedBlocks:
    """Runs ``run(x)`` (x: T x B x C, the embedding output; the blocks' output T x B x C) as a
    replayed CUDA graph where it can (a CUDA tensor, training, the shape and dtype of the
    captured batch), else eagerly. Not a module: it keeps no state a checkpoint would hold, and
    a copy of the model (``copy.deepcopy``) starts uncaptured."""

    def __init__(self, where: str):
        self.where = where
        self.graphed: Optional[nn.Module] = None
        self.params = []  # the graph's parameters
        self.key: Optional[Tuple] = None
        self.said = set()

    def __deepcopy__(self, memo):
        return GraphedBlocks(self.where)

    def _say_once(self, why: str) -> None:
        if why not in self.said:
            self.said.add(why)
            logger.info("%s --cuda-graph: %s; such passes run eager", self.where, why)

    def __call__(self, run: Callable[[Tensor], Tensor], parts, x: Tensor, training: bool
                 ) -> Tensor:
        """``run(x)``; ``parts``: the modules whose parameters ``run`` uses (the graph's)."""
        if not training:
            return run(x)
        if not graphable(x):
            self._say_once("the model is on the CPU")
            return run(x)
        key = (tuple(x.shape), x.dtype, x.device)
        if self.graphed is None:
            blocks = BlocksModule(run, parts)
            self.params = [p for p in blocks.parameters() if p.requires_grad]
            # the graph's own input buffer (each replay copies the batch into it), not this
            # batch's x, which is part of this pass's autograd graph
            self.graphed = capture(blocks, x.detach().clone().requires_grad_(x.requires_grad))
            self.key = key
            logger.info("%s --cuda-graph: captured the blocks for batches of shape %s (%s)",
                        self.where, "x".join(map(str, x.shape)), x.dtype)
        elif key != self.key:
            self._say_once(f"a batch of shape {'x'.join(map(str, x.shape))} ({x.dtype}), not "
                           f"the captured {'x'.join(map(str, self.key[0]))} ({self.key[1]})")
            return run(x)
        elif any(p.grad is not None for p in self.params):
            # the replayed backward hands the parameters its own gradient buffers, which a
            # parameter without a gradient takes over as its .grad (no copy): a second replay
            # before the optimizer has consumed them would overwrite the first pass's gradients
            # and add them to themselves. So a pass that accumulates (--update-freq > 1, or an
            # optimizer that zeroes instead of freeing gradients) runs eager: its gradients are
            # added to the first pass's, as they must be.
            self._say_once("the parameters hold gradients (accumulating over passes, e.g. "
                           "--update-freq > 1)")
            return run(x)
        return self.graphed(x)


def graph_for(args, where: str) -> Optional[GraphedBlocks]:
    """A :class:`GraphedBlocks` when ``--cuda-graph`` is on, else None."""
    return GraphedBlocks(where) if getattr(args, "cuda_graph", None) else None
