"""``--no-fused-kernels``: where the depth connections run Triton kernels instead of eager
PyTorch (docs/ideas/fused-kernels.md).

A fused path replaces one computation of a connection by a kernel with its own backward
(:mod:`fairseq_plugins.kernels`) and computes the same function: the eager code is its oracle
in the tests. It is chosen automatically where it can run: a CUDA tensor with Triton
installed, or any tensor under Triton's interpreter (``TRITON_INTERPRET=1`` in the environment
before the process starts: the kernels then run on CPU tensors, slowly; that is how the tests
check them without a GPU). On a plain CPU the eager code runs. ``--no-fused-kernels`` (hydra:
``model.fused_kernels=false``) keeps the eager code everywhere.

What is fused so far: the multi-stream connections' per-position product of the weights and
the streams (Hyper-Connections static and dynamic, mHC, mHC-lite, Frac-Connections), the
dynamic coefficients of Hyper- and Frac-Connections, mHC's and mHC-lite's coefficients (up to
``MAX_COEFFICIENTS`` map rows) and mHC's Sinkhorn-Knopp, for up to ``MAX_STREAMS`` streams
(beyond that the eager path runs, said once in the log at build);
Attention Residuals' read (the keys' norms, the logits, the depth softmax and the weighted sum
over the sources, one kernel up to a width of ``DEPTH_ATTENTION_MAX_WIDTH``; the weighted sum
alone beyond it and while the weights are logged) and MUDD's dense mix.
"""
import importlib.util
import logging
import os
from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor

from fairseq.dataclass import FairseqDataclass

from ..config import option

logger = logging.getLogger(__name__)

# the stream kernels hold n x K weights per position in registers (n, K unrolled when compiled)
MAX_STREAMS = 8
# mHC's coefficient kernel holds a block of the m maps' rows in registers: mHC up to n = 8
# (m = 80), mHC-lite up to n = 4 (m = 32)
MAX_COEFFICIENTS = 128


@dataclass
class FusedKernelsConfig(FairseqDataclass):
    """Flag ``--fused-kernels`` / ``--no-fused-kernels``; hydra ``model.fused_kernels``."""
    fused_kernels: Optional[bool] = option(
        True, "run the depth connections' fused Triton kernels where they can run (CUDA with "
              "Triton installed; the CPU keeps the eager code); --no-fused-kernels: the eager "
              "code everywhere (the same function)")


CONFIG = FusedKernelsConfig


def enabled(args) -> bool:
    """Whether the options allow the fused paths (the default)."""
    return getattr(args, "fused_kernels", None) is not False


def triton_installed() -> bool:
    return importlib.util.find_spec("triton") is not None


def interpreting() -> bool:
    """Triton's interpreter is on (it runs kernels on CPU tensors)."""
    return os.environ.get("TRITON_INTERPRET", "") == "1"


def runs_on(tensor: Tensor) -> bool:
    """Whether a fused kernel can run on ``tensor``'s device in this process: not while
    ``torch.compile`` traces (``--torch-compile``), which fuses the eager code itself."""
    return ((tensor.is_cuda or interpreting()) and triton_installed()
            and not torch.compiler.is_compiling())


def streams_supported(streams: int, columns: int, where: str) -> bool:
    """Whether the stream-product kernel handles ``streams`` streams and ``columns`` weight
    columns; if not, one log line saying that ``where`` runs the eager path."""
    if max(streams, columns) <= 2 * MAX_STREAMS and streams <= MAX_STREAMS:
        return True
    logger.info("%s: %d streams are more than the fused kernel's %d; the eager path runs",
                where, streams, MAX_STREAMS)
    return False


def stream_products(alpha: Tensor, stream: Tensor) -> Tensor:
    """The fused ``einsum("...nk,...nc->...kc", alpha, stream)``
    (:func:`fairseq_plugins.kernels.stream_products.stream_products`)."""
    from ..kernels.stream_products import stream_products as kernel

    return kernel(alpha, stream)


def dynamic_coefficients(x: Tensor, weight: Tensor, bias: Tensor, static: Tensor,
                         scale: Tensor) -> Tensor:
    """The fused dynamic coefficients of Hyper- and Frac-Connections, ``static + scale *
    tanh(LN(x) maps)`` with the LayerNorm folded into the maps
    (:func:`fairseq_plugins.kernels.dynamic_coefficients.dynamic_coefficients`)."""
    from ..kernels.dynamic_coefficients import dynamic_coefficients as kernel

    return kernel(x, weight, bias, static, scale)


def sinkhorn_scaling(m: Tensor, iterations: int) -> Tensor:
    """The fused Sinkhorn iterations on M = exp(logits) ... x n x n
    (:func:`fairseq_plugins.kernels.sinkhorn.sinkhorn_scaling`)."""
    from ..kernels.sinkhorn import sinkhorn_scaling as kernel

    return kernel(m, iterations)


def coefficients_supported(columns: int, where: str) -> bool:
    """Whether mHC's coefficient kernel takes ``columns`` map rows (m = 2n + n^2, or 2n + n!
    for lite); if not, one log line saying that ``where`` computes them eagerly."""
    if columns <= MAX_COEFFICIENTS:
        return True
    logger.info("%s: %d coefficient columns are more than the fused kernel's %d; the "
                "coefficients run eagerly", where, columns, MAX_COEFFICIENTS)
    return False


def mhc_coefficients(x: Tensor, weight: Tensor, gates: Tensor, pre: Tensor, post: Tensor,
                     res: Tensor) -> Tensor:
    """mHC's fused coefficients [H_pre | H_post | H_res's logits] from the flattened streams
    (:func:`fairseq_plugins.kernels.mhc_coefficients.mhc_coefficients`)."""
    from ..kernels.mhc_coefficients import mhc_coefficients as kernel

    return kernel(x, weight, gates, pre, post, res)


def depth_attention_supported(width: int, where: str) -> bool:
    """Whether Attention Residuals' one-kernel read holds rows of ``width``; if not, one log
    line saying that ``where`` computes the logits and the softmax eagerly."""
    from ..kernels import DEPTH_ATTENTION_MAX_WIDTH

    if width <= DEPTH_ATTENTION_MAX_WIDTH:
        return True
    logger.info("%s: width %d is more than the depth-attention kernel's %d; the logits and the "
                "softmax run eagerly, the weighted sum as a kernel", where, width,
                DEPTH_ATTENTION_MAX_WIDTH)
    return False


def depth_attention(query: Tensor, *sources: Tensor) -> Tensor:
    """Attention Residuals' read in one kernel: the keys' RMS norms, the logits against
    ``query``, the depth softmax and the weighted sum
    (:func:`fairseq_plugins.kernels.depth_attention.depth_attention`)."""
    from ..kernels.depth_attention import depth_attention as kernel

    return kernel(query, *sources)


def weighted_sum(alpha: Tensor, *sources: Tensor) -> Tensor:
    """The fused ``sum_i alpha[..., i] sources[i]``
    (:func:`fairseq_plugins.kernels.weighted_sum.weighted_sum`)."""
    from ..kernels.weighted_sum import weighted_sum as kernel

    return kernel(alpha, *sources)


def weighted_sums(alpha: Tensor, *sources: Tensor):
    """The fused ``sum_i alpha[..., w, i] sources[i]`` for every w, W tensors ... x C, in the type
    promotion of the weights and the sources
    (:func:`fairseq_plugins.kernels.weighted_sum.weighted_sums`)."""
    from ..kernels.weighted_sum import weighted_sums as kernel

    return kernel(alpha, *sources, with_weights_dtype=True)
