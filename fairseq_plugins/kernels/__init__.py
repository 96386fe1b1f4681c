"""Triton kernels for the depth connections' GPU paths (``fairseq_plugins.depth.fused`` chooses
when they run). Nothing here is imported unless a fused path can run: Triton ships with torch's
CUDA wheels, not with its CPU wheels, and the CPU keeps the eager code."""

# Attention Residuals' one-kernel read holds a row in registers (the kernel and its dispatch
# read this; the module itself imports Triton)
DEPTH_ATTENTION_MAX_WIDTH = 4096


def accumulator(dtype):
    """The Triton type the kernels accumulate in for inputs of torch ``dtype``: float64 for
    float64, else float32 (half-precision inputs too)."""
    import torch
    import triton.language as tl

    return tl.float64 if dtype == torch.float64 else tl.float32
