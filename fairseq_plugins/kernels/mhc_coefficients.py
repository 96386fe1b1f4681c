"""mHC's coefficients (Xie et al. 2025, arXiv 2512.24880, Eqs. 7-8) in one Triton kernel each
way: the maps' products, the flattened streams' RMS norm, the gates, the biases and the
sigmoids.

For every position's flattened streams x (width D = n C, or C for n equal streams with the
maps' blocks summed) with the maps W (m x D; m = 2n + n^2, or 2n + n! for mHC-lite), the gates
(alpha_pre, alpha_post, alpha_res) and the biases, as
:meth:`fairseq_plugins.depth.mhc.ManifoldHyperConnections.coefficients` computes eagerly:

    r = 1 / sqrt(mean(x^2) + eps),   u = (x W^T) r,
    H_pre = sigmoid(alpha_pre u_pre + b_pre),   H_post = 2 sigmoid(alpha_post u_post + b_post),
    res = alpha_res u_res + b_res   (the logits of H_res: Sinkhorn-Knopp, or mHC-lite's mixture)

Eager PyTorch spends about fifteen operators on this per sub-layer forward and thirty backward
(the norm's, the gates' and biases' broadcast gradients, the sigmoids'). Here one program per
position runs the width through registers in blocks of ``BLOCK_W`` (the sum of squares and the
m products in one pass), float32 accumulation (float64 for float64). The backward recomputes
the products from x (kept by the eager Function too) and writes the gradient of x and, per
position, the gate and bias terms that torch sums over the positions, with the maps' gradient
one GEMM over the positions:

    g_a = grad * (sigmoid' | 2 sigmoid' | 1),   g_u = alpha g_a,   g_P = g_u r,
    g_x = g_P W - (g_u . (x W^T)) r^3 x / D,    g_W = g_P^T x,
    g_alpha = sum over the group of g_a u,      g_b = g_a
"""
import torch
import triton
import triton.language as tl
from torch import Tensor

from . import accumulator
from .row_tiles import row_tile

BLOCK_W = 64
EPS = 1e-6  # mHC's RMSNorm eps (mhc.RMS_EPS; tested equal)


@triton.jit
def _row_products(x_row, w_ptr, width, j, j_mask, M_PAD: tl.constexpr, BLOCK: tl.constexpr,
                  ACC: tl.constexpr):
    """(x W^T, sum x^2) of one row."""
    acc = tl.zeros((M_PAD,), dtype=ACC)
    squares = tl.zeros((BLOCK,), dtype=ACC)
    for start in range(0, width, BLOCK):
        c, c_mask, x, w = row_tile(x_row, w_ptr, width, j, j_mask, start, BLOCK, ACC)
        acc += tl.sum(w * x[None, :], axis=1)
        squares += x * x
    return acc, tl.sum(squares, axis=0)


@triton.jit
def _epilogue_inputs(gates_ptr, pre_ptr, post_ptr, res_ptr, j, n, M: tl.constexpr):
    """Per column: its group (0 pre, 1 post, 2 res), gate and bias."""
    group = (j >= n).to(tl.int32) + (j >= 2 * n).to(tl.int32)
    gate = tl.load(gates_ptr + group, mask=j < M, other=0.0)
    bias = tl.load(pre_ptr + j, mask=j < n, other=0.0) \
        + tl.load(post_ptr + (j - n), mask=(j >= n) & (j < 2 * n), other=0.0) \
        + tl.load(res_ptr + (j - 2 * n), mask=(j >= 2 * n) & (j < M), other=0.0)
    return group, gate, bias


@triton.jit
def _forward_kernel(x_ptr, w_ptr, gates_ptr, pre_ptr, post_ptr, res_ptr, out_ptr, width, n,
                    eps, M: tl.constexpr, M_PAD: tl.constexpr, BLOCK: tl.constexpr,
                    ACC: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)  # 64-bit: rows x D may exceed 2^31
    j = tl.arange(0, M_PAD)
    j_mask = j < M
    acc, squares = _row_products(x_ptr + row * width, w_ptr, width, j, j_mask, M_PAD, BLOCK,
                                 ACC)
    r = 1.0 / tl.sqrt(squares / width + eps)
    group, gate, bias = _epilogue_inputs(gates_ptr, pre_ptr, post_ptr, res_ptr, j, n, M)
    a = gate.to(ACC) * acc * r + bias.to(ACC)
    out = tl.where(group == 0, tl.sigmoid(a), tl.where(group == 1, 2.0 * tl.sigmoid(a), a))
    tl.store(out_ptr + row * M + j, out.to(out_ptr.dtype.element_ty), mask=j_mask)


@triton.jit
def _backward_kernel(x_ptr, w_ptr, gates_ptr, pre_ptr, post_ptr, res_ptr, grad_ptr,
                     grad_x_ptr, g_a_ptr, g_p_ptr, g_gates_ptr, width, n, eps,
                     M: tl.constexpr, M_PAD: tl.constexpr, BLOCK: tl.constexpr,
                     ACC: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    j = tl.arange(0, M_PAD)
    j_mask = j < M
    x_row = x_ptr + row * width
    acc, squares = _row_products(x_row, w_ptr, width, j, j_mask, M_PAD, BLOCK, ACC)
    r = 1.0 / tl.sqrt(squares / width + eps)
    group, gate, bias = _epilogue_inputs(gates_ptr, pre_ptr, post_ptr, res_ptr, j, n, M)
    gate = gate.to(ACC)
    u = acc * r
    s = tl.sigmoid(gate * u + bias.to(ACC))
    slope = tl.where(group == 0, s * (1.0 - s), tl.where(group == 1, 2.0 * s * (1.0 - s), 1.0))
    grad = tl.load(grad_ptr + row * M + j, mask=j_mask, other=0.0).to(ACC)
    g_a = grad * slope
    g_u = gate * g_a
    g_p = g_u * r
    tl.store(g_a_ptr + row * M + j, g_a, mask=j_mask)
    tl.store(g_p_ptr + row * M + j, g_p, mask=j_mask)
    g_au = g_a * u
    for k in range(0, 3):
        tl.store(g_gates_ptr + row * 3 + k, tl.sum(tl.where(group == k, g_au, 0.0), axis=0))
    factor = -tl.sum(g_u * acc, axis=0) * r * r * r / width
    for start in range(0, width, BLOCK):
        c, c_mask, x, w = row_tile(x_row, w_ptr, width, j, j_mask, start, BLOCK, ACC)
        g_x = tl.sum(g_p[:, None] * w, axis=0) + factor * x
        tl.store(grad_x_ptr + row * width + c, g_x.to(grad_x_ptr.dtype.element_ty),
                 mask=c_mask)


class MHCCoefficients(torch.autograd.Function):
    """(x P x D, W m x D, gates 3, b_pre n, b_post n, b_res m - 2n; one dtype) ->
    [H_pre | H_post | res logits], P x m."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, gates: Tensor, pre: Tensor, post: Tensor,
                res: Tensor) -> Tensor:
        positions, width = x.shape
        m, n = weight.size(0), pre.numel()
        x, weight = x.contiguous(), weight.contiguous()
        out = x.new_empty(positions, m)
        meta = dict(M=m, M_PAD=triton.next_power_of_2(m), BLOCK=BLOCK_W,
                    ACC=accumulator(x.dtype))
        _forward_kernel[(positions,)](x, weight, gates, pre, post, res, out, width, n, EPS,
                                      **meta)
        ctx.save_for_backward(x, weight, gates, pre, post, res)
        ctx.meta = meta
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: Tensor):
        x, weight, gates, pre, post, res = ctx.saved_tensors
        positions, width = x.shape
        m, n = weight.size(0), pre.numel()
        grad_x = torch.empty_like(x)
        g_a = x.new_empty(positions, m)
        g_p = x.new_empty(positions, m)
        g_gates = x.new_empty(positions, 3)
        _backward_kernel[(positions,)](x, weight, gates, pre, post, res, grad.contiguous(),
                                       grad_x, g_a, g_p, g_gates, width, n, EPS, **ctx.meta)
        g_bias = g_a.sum(0)
        return (grad_x, g_p.t() @ x, g_gates.sum(0), *g_bias.split([n, n, m - 2 * n]))


def mhc_coefficients(x: Tensor, weight: Tensor, gates: Tensor, pre: Tensor, post: Tensor,
                     res: Tensor) -> Tensor:
    """[H_pre | H_post | res logits] (... x m) of the flattened streams ``x`` (... x D) with the
    maps ``weight`` (m x D), ``gates`` (3) and the biases ``pre`` (n), ``post`` (n), ``res``
    (m - 2n), all in ``x``'s dtype."""
    lead = x.shape[:-1]
    out = MHCCoefficients.apply(x.reshape(-1, x.size(-1)), weight, gates, pre, post, res)
    return out.view(*lead, weight.size(0))
