"""Triton kernels for the depth connections' GPU paths (``fairseq_plugins.depth.fused`` chooses
when they run). Nothing here is imported unless a fused path can run: Triton ships with torch's
CUDA wheels, not with its CPU wheels, and the CPU keeps the eager code."""
