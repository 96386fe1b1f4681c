"""The multi-stream connections' per-position product in one Triton kernel each way.

For every position p, with the weights ``alpha[p]`` (n x K: K = R + n columns, the read weights
A_m and the mixing A_r of :class:`~fairseq_plugins.depth.multi_stream.MultiStream`) and the
streams ``stream[p]`` (n x w):

    out[p] = alpha[p]^T stream[p]                          (K x w)

which eager PyTorch computes as ``einsum("...nk,...nc->...kc")``: a batched matrix product of
tiny matrices (n <= 8: ``fairseq_plugins.depth.fused.MAX_STREAMS``), bound on a GPU by its
launches and by reading the expanded weights. Here one program per position reads its n x K
weights once and streams the width through registers in blocks of ``BLOCK_W``, accumulating
in float32 (float64 for float64 inputs). The backward recomputes nothing: the gradients are
two such products per position,

    grad_stream[p] = alpha[p] grad[p]          (n x w),
    grad_alpha[p]  = stream[p] grad[p]^T       (n x K, summed over the width in the program),

in one kernel. Static weights (one n x K for every position) are passed with a zero position
stride: no copy per position; autograd sums their per-position gradient.

Triton is imported when this module is: :mod:`fairseq_plugins.depth.fused` imports it only when
a fused path can run. Under ``TRITON_INTERPRET=1`` (set before this module is imported) the
kernels run on CPU tensors in Triton's interpreter: that is how the tests check them without a
GPU (tests/test_kernels.py).
"""
import torch
import triton
import triton.language as tl
from torch import Tensor

from . import accumulator

BLOCK_W = 64


def _pow2(x: int) -> int:
    return triton.next_power_of_2(max(int(x), 1))


@triton.jit
def _forward_kernel(alpha_ptr, stream_ptr, out_ptr, width, alpha_stride_p,
                    N: tl.constexpr, K: tl.constexpr, N_PAD: tl.constexpr, K_PAD: tl.constexpr,
                    BLOCK: tl.constexpr, ACC: tl.constexpr):
    p = tl.program_id(0)
    rows = tl.arange(0, N_PAD)
    cols = tl.arange(0, K_PAD)
    a_mask = (rows[:, None] < N) & (cols[None, :] < K)
    alpha = tl.load(alpha_ptr + p * alpha_stride_p + rows[:, None] * K + cols[None, :],
                    mask=a_mask, other=0.0).to(ACC)  # N_PAD x K_PAD
    stream_row = stream_ptr + p.to(tl.int64) * N * width  # 64-bit: P n w may exceed 2^31
    out_row = out_ptr + p.to(tl.int64) * K * width
    for start in range(0, width, BLOCK):
        c = start + tl.arange(0, BLOCK)
        c_mask = c < width
        s = tl.load(stream_row + rows[:, None] * width + c[None, :],
                    mask=(rows[:, None] < N) & c_mask[None, :], other=0.0).to(ACC)  # N x BLOCK
        out = tl.sum(alpha[:, :, None] * s[:, None, :], axis=0)  # K_PAD x BLOCK
        tl.store(out_row + cols[:, None] * width + c[None, :],
                 out.to(out_ptr.dtype.element_ty), mask=(cols[:, None] < K) & c_mask[None, :])


@triton.jit
def _backward_kernel(alpha_ptr, stream_ptr, grad_ptr, grad_alpha_ptr, grad_stream_ptr, width,
                     alpha_stride_p, N: tl.constexpr, K: tl.constexpr, N_PAD: tl.constexpr,
                     K_PAD: tl.constexpr, BLOCK: tl.constexpr, ACC: tl.constexpr):
    p = tl.program_id(0)
    rows = tl.arange(0, N_PAD)
    cols = tl.arange(0, K_PAD)
    a_mask = (rows[:, None] < N) & (cols[None, :] < K)
    alpha = tl.load(alpha_ptr + p * alpha_stride_p + rows[:, None] * K + cols[None, :],
                    mask=a_mask, other=0.0).to(ACC)
    stream_row = stream_ptr + p.to(tl.int64) * N * width  # 64-bit: P n w may exceed 2^31
    grad_row = grad_ptr + p.to(tl.int64) * K * width
    grad_stream_row = grad_stream_ptr + p.to(tl.int64) * N * width
    grad_alpha = tl.zeros((N_PAD, K_PAD), dtype=ACC)
    for start in range(0, width, BLOCK):
        c = start + tl.arange(0, BLOCK)
        c_mask = c < width
        s_mask = (rows[:, None] < N) & c_mask[None, :]
        s = tl.load(stream_row + rows[:, None] * width + c[None, :], mask=s_mask,
                    other=0.0).to(ACC)  # N_PAD x BLOCK
        g = tl.load(grad_row + cols[:, None] * width + c[None, :],
                    mask=(cols[:, None] < K) & c_mask[None, :], other=0.0).to(ACC)  # K_PAD x BLOCK
        grad_s = tl.sum(alpha[:, :, None] * g[None, :, :], axis=1)  # N_PAD x BLOCK
        tl.store(grad_stream_row + rows[:, None] * width + c[None, :],
                 grad_s.to(grad_stream_ptr.dtype.element_ty), mask=s_mask)
        grad_alpha += tl.sum(s[:, None, :] * g[None, :, :], axis=2)  # N_PAD x K_PAD
    tl.store(grad_alpha_ptr + p * N * K + rows[:, None] * K + cols[None, :],
             grad_alpha.to(grad_alpha_ptr.dtype.element_ty), mask=a_mask)


class StreamProducts(torch.autograd.Function):
    """``alpha^T stream`` per position: ``alpha`` P x n x K (a position stride of 0 for static
    weights), ``stream`` P x n x w (contiguous) -> P x K x w in the streams' dtype."""

    @staticmethod
    def forward(ctx, alpha: Tensor, stream: Tensor) -> Tensor:
        positions, n, width = stream.shape
        k = alpha.size(-1)
        alpha_stride = alpha.stride(0)
        if alpha.stride()[1:] != (k, 1):
            alpha, alpha_stride = alpha.contiguous(), n * k
        out = stream.new_empty(positions, k, width)
        meta = dict(N=n, K=k, N_PAD=_pow2(n), K_PAD=_pow2(k), BLOCK=BLOCK_W,
                    ACC=accumulator(stream.dtype))
        _forward_kernel[(positions,)](alpha, stream, out, width, alpha_stride, **meta)
        ctx.save_for_backward(alpha, stream)
        ctx.alpha_stride, ctx.meta = alpha_stride, meta
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):
        alpha, stream = ctx.saved_tensors
        positions, n, width = stream.shape
        grad = grad.contiguous()
        grad_stream = torch.empty_like(stream)
        # per position, in the weights' dtype; static weights' (stride 0) summed by autograd's
        # expand backward
        grad_alpha = alpha.new_empty(positions, n, alpha.size(-1))
        _backward_kernel[(positions,)](alpha, stream, grad, grad_alpha, grad_stream, width,
                                       ctx.alpha_stride, **ctx.meta)
        return grad_alpha, grad_stream


def stream_products(alpha: Tensor, stream: Tensor) -> Tensor:
    """``einsum("...nk,...nc->...kc", alpha, stream)`` for ``stream`` ... x n x w and ``alpha``
    ... x n x K (the same leading dimensions) or n x K (static): ... x K x w."""
    device = stream.device.type
    if torch.is_autocast_enabled(device):  # what autocast does to einsum's inputs
        dtype = torch.get_autocast_dtype(device)
        stream = stream.to(dtype)
    alpha = alpha.to(stream.dtype)
    lead = stream.shape[:-2]
    n, width = stream.shape[-2:]
    flat_stream = stream.reshape(-1, n, width).contiguous()
    positions = flat_stream.size(0)
    if alpha.dim() == 2:
        flat_alpha = alpha.unsqueeze(0).expand(positions, *alpha.shape)
    else:
        flat_alpha = alpha.reshape(positions, n, alpha.size(-1))
    out = StreamProducts.apply(flat_alpha, flat_stream)
    return out.view(*lead, alpha.size(-1), width)
