"""``--torch-compile``: the training forward and backward of ``gpt_baseline_lm``'s blocks
through ``torch.compile`` (docs/ideas/fused-kernels.md, "torch.compile").

Why: the other way to cut the launches that bind a GPU step at small width (``--cuda-graph``
is the first). Inductor traces the depth connections' eager code (the oracle of the fused
kernels) and writes its own fused kernels; ``--torch-compile-mode reduce-overhead`` adds
torch's own CUDA graphs. Which of the two options comes closer to the plain model's time is
measured on a GPU (scripts/bench/gpu_check.sh), not here.

What is compiled: the same function ``--cuda-graph`` captures, the blocks between the
embedding and the final LayerNorm (the embedding, the output projection, the criterion, the
optimizer and fairseq's trainer stay eager), compiled on the first training pass. A batch of
another shape is compiled again by torch (dynamic shapes after the second), not refused.
Evaluation, validation and decoding (incremental) run eager, as do passes a layer analysis
observes. Inside a compiled pass the fused Triton kernels are not called
(:func:`fairseq_plugins.depth.fused.runs_on` is False while torch traces): inductor fuses the
eager code itself. Dropout inside a compiled pass draws other numbers than eager code.
Any device: on the CPU inductor writes C++ (it needs a compiler, and the first pass takes
minutes).

Refused at build time, one line each: ``--torch-compile`` with ``--cuda-graph`` (two captures
of one function; ``--torch-compile-mode reduce-overhead`` is compile's own graph), with
``--log-layer-weights`` (the statistics are kept from Python during the pass), and
``--torch-compile-mode`` without ``--torch-compile``.
"""
import logging
from dataclasses import dataclass
from typing import Callable, Optional

import torch
from torch import Tensor, nn

from fairseq.dataclass import FairseqDataclass

from .config import option
from .cuda_graph import BlocksModule

logger = logging.getLogger(__name__)

# torch.compile's modes (torch.compile(mode=...)); None: its default
MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


@dataclass
class TorchCompileConfig(FairseqDataclass):
    """Flags ``--torch-compile``, ``--torch-compile-mode``; hydra ``model.torch_compile``,
    ``model.torch_compile_mode``."""
    torch_compile: Optional[bool] = option(
        False, "run the training forward and backward of the blocks through torch.compile "
               "(inductor fuses the depth connections' eager code; validation and decoding "
               "run eager)")
    torch_compile_mode: Optional[str] = option(
        None, "torch.compile's mode for --torch-compile (reduce-overhead adds torch's CUDA "
              "graphs)", choices=MODES, default_text="torch's default")


def validate(args) -> None:
    """The build-time refusals of ``--torch-compile`` (ValueError, one line)."""
    mode = getattr(args, "torch_compile_mode", None)
    if not getattr(args, "torch_compile", None):
        if mode is not None:
            raise ValueError(f"--torch-compile-mode {mode} without --torch-compile: nothing "
                             "is compiled; add --torch-compile or drop the mode")
        return
    if getattr(args, "cuda_graph", None):
        raise ValueError("--torch-compile with --cuda-graph: both capture the same blocks; "
                         "choose one (--torch-compile-mode reduce-overhead is torch.compile's "
                         "own CUDA graph)")
    if getattr(args, "log_layer_weights", None):
        raise ValueError("--torch-compile with --log-layer-weights: the statistics are kept "
                         "from Python during the pass, which compiled code does not run as "
                         "written; log without compiling")


def compile_module(module: nn.Module, mode: Optional[str]) -> nn.Module:
    """``torch.compile(module, mode=mode)`` (the point the tests replace: inductor's code
    generation takes minutes on these CPUs)."""
    return torch.compile(module, mode=mode)


class CompiledBlocks:
    """Runs ``run(x)`` (x: T x B x C, the embedding output; the blocks' output T x B x C)
    through ``torch.compile`` in training passes, eagerly otherwise. Not a module: it keeps
    no state a checkpoint would hold, and a copy of the model (``copy.deepcopy``) starts
    uncompiled."""

    def __init__(self, where: str, mode: Optional[str]):
        self.where = where
        self.mode = mode
        self.compiled: Optional[nn.Module] = None

    def __deepcopy__(self, memo):
        return CompiledBlocks(self.where, self.mode)

    def __call__(self, run: Callable[[Tensor], Tensor], parts, x: Tensor, training: bool
                 ) -> Tensor:
        """``run(x)``; ``parts``: the modules whose parameters ``run`` uses."""
        if not training:
            return run(x)
        if self.compiled is None:
            self.compiled = compile_module(BlocksModule(run, parts), self.mode)
            logger.info("%s --torch-compile: the blocks' training passes are compiled (mode "
                        "%s) on the first one", self.where, self.mode or "default")
        return self.compiled(x)


def compiled_for(args, where: str) -> Optional[CompiledBlocks]:
    """A :class:`CompiledBlocks` when ``--torch-compile`` is on, else None."""
    if not getattr(args, "torch_compile", None):
        return None
    return CompiledBlocks(where, getattr(args, "torch_compile_mode", None))
