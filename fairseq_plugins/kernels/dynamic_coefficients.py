"""Hyper-Connections' and Frac-Connections' dynamic coefficients in one Triton kernel each way.

For every row x (one stream of one position, width w) with the maps M (r x w) and b (r) that
have the LayerNorm's affine folded in, the static coefficients S and the scales a
(:class:`fairseq_plugins.depth.hyper_connections._DynamicCoefficients`, the eager oracle):

    mu, sigma = the mean and standard deviation of x (eps 1e-5 on the variance)
    u = x M^T - mu M 1,    y = tanh(u / sigma + b),    out = S + a * y

Eager PyTorch spends about ten operators on the forward and thirty on the backward of a
sub-layer (statistics, GEMM, tanh, the folded LayerNorm's gradient); on a GPU at the
comparison's width each is a launch. Here one program per row runs the width through registers
in blocks of ``BLOCK_W``: the statistics, the r dot products and the tanh, accumulating in
float32 (float64 for float64). The backward keeps only x and the row's mu and 1 / sigma, as the
eager Function does, and recomputes the dot products and the tanh in its program; it writes
the gradient of x and, per row, what the parameters' gradients sum over the rows (the maps'
gradient g_P^T x is one GEMM over the rows, done by torch):

    g = a G (1 - y^2),  g_P = g / sigma,  g_mu = -(g_P . M 1),
    g_var = -(g . u) / (2 sigma^3) (0 where the variance is 0),
    g_x = g_P M + g_mu / w + g_var 2 (x - mu) / w

The products are accumulated without rounding to the inputs' dtype in between: in half
precision the kernel is the more exact of the two (the eager GEMM rounds x M^T to half).
"""
import torch
import triton
import triton.language as tl
from torch import Tensor

from . import accumulator
from .row_tiles import row_tile

BLOCK_W = 64
EPS = 1e-5


def _pow2(x: int) -> int:
    return triton.next_power_of_2(max(int(x), 1))


@triton.jit
def _tanh(z):
    # 2 sigmoid(2z) - 1: tanh without an overflowing exp for large |z|
    return 2.0 * tl.sigmoid(2.0 * z) - 1.0


@triton.jit
def _row_products(x_row, w_ptr, width, j, j_mask, R_PAD: tl.constexpr, BLOCK: tl.constexpr,
                  ACC: tl.constexpr):
    """(x M^T, M 1, sum x, sum x^2) of one row."""
    acc = tl.zeros((R_PAD,), dtype=ACC)
    w_sum = tl.zeros((R_PAD,), dtype=ACC)
    s1 = tl.zeros((BLOCK,), dtype=ACC)
    s2 = tl.zeros((BLOCK,), dtype=ACC)
    for start in range(0, width, BLOCK):
        # w: R_PAD x BLOCK
        c, c_mask, x, w = row_tile(x_row, w_ptr, width, j, j_mask, start, BLOCK, ACC)
        acc += tl.sum(w * x[None, :], axis=1)
        w_sum += tl.sum(w, axis=1)
        s1 += x
        s2 += x * x
    return acc, w_sum, tl.sum(s1, axis=0), tl.sum(s2, axis=0)


@triton.jit
def _forward_kernel(x_ptr, w_ptr, b_ptr, y_ptr, mean_ptr, rstd_ptr, width, eps,
                    R: tl.constexpr, R_PAD: tl.constexpr, BLOCK: tl.constexpr,
                    ACC: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)  # 64-bit: rows x w may exceed 2^31
    j = tl.arange(0, R_PAD)
    j_mask = j < R
    acc, w_sum, s1, s2 = _row_products(x_ptr + row * width, w_ptr, width, j, j_mask, R_PAD,
                                       BLOCK, ACC)
    mean = s1 / width
    variance = tl.maximum(s2 / width - mean * mean, 0.0)
    rstd = 1.0 / tl.sqrt(variance + eps)
    b = tl.load(b_ptr + j, mask=j_mask, other=0.0).to(ACC)
    y = _tanh((acc - mean * w_sum) * rstd + b)
    tl.store(y_ptr + row * R + j, y, mask=j_mask)
    tl.store(mean_ptr + row, mean)
    tl.store(rstd_ptr + row, rstd)


@triton.jit
def _backward_kernel(x_ptr, w_ptr, b_ptr, a_ptr, grad_ptr, mean_ptr, rstd_ptr, grad_x_ptr,
                     g_ptr, gp_ptr, gy_ptr, width, R: tl.constexpr, R_PAD: tl.constexpr,
                     BLOCK: tl.constexpr, ACC: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    j = tl.arange(0, R_PAD)
    j_mask = j < R
    x_row = x_ptr + row * width
    acc, w_sum, _, s2 = _row_products(x_row, w_ptr, width, j, j_mask, R_PAD, BLOCK, ACC)
    mean = tl.load(mean_ptr + row)
    rstd = tl.load(rstd_ptr + row)
    positive = (s2 / width - mean * mean) > 0  # the clamp's gradient
    b = tl.load(b_ptr + j, mask=j_mask, other=0.0).to(ACC)
    a = tl.load(a_ptr + j, mask=j_mask, other=0.0).to(ACC)
    grad = tl.load(grad_ptr + row * R + j, mask=j_mask, other=0.0).to(ACC)
    u = acc - mean * w_sum
    y = _tanh(u * rstd + b)
    g = grad * a * (1.0 - y * y)
    g_p = g * rstd
    tl.store(gy_ptr + row * R + j, grad * y, mask=j_mask)
    tl.store(g_ptr + row * R + j, g, mask=j_mask)
    tl.store(gp_ptr + row * R + j, g_p, mask=j_mask)
    g_mean = -tl.sum(g_p * w_sum, axis=0)
    g_var = tl.where(positive, -0.5 * tl.sum(g * u, axis=0) * rstd * rstd * rstd, 0.0)
    factor = 2.0 * g_var / width
    shift = g_mean / width - factor * mean
    for start in range(0, width, BLOCK):
        c, c_mask, x, w = row_tile(x_row, w_ptr, width, j, j_mask, start, BLOCK, ACC)
        g_x = tl.sum(g_p[:, None] * w, axis=0) + shift + factor * x
        tl.store(grad_x_ptr + row * width + c, g_x.to(grad_x_ptr.dtype.element_ty),
                 mask=c_mask)


class DynamicCoefficients(torch.autograd.Function):
    """The fused twin of ``_DynamicCoefficients`` (same arguments, same function): ``x`` ... x
    s x w (s = n streams, or 1 standing for n equal ones), ``weight`` r x w, ``bias`` r,
    ``static`` n x r, ``scale`` r -> ``static + scale * y``, ... x n x r in x's dtype."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Tensor, static: Tensor,
                scale: Tensor) -> Tensor:
        width, r = x.size(-1), weight.size(0)
        flat = x.reshape(-1, width).contiguous()
        rows = flat.size(0)
        acc_dtype = torch.promote_types(x.dtype, torch.float32)
        y = flat.new_empty(rows, r, dtype=acc_dtype)
        mean = flat.new_empty(rows, dtype=acc_dtype)
        rstd = torch.empty_like(mean)
        meta = dict(R=r, R_PAD=_pow2(r), BLOCK=BLOCK_W, ACC=accumulator(x.dtype))
        weight_c, bias_c = weight.contiguous(), bias.contiguous()
        _forward_kernel[(rows,)](flat, weight_c, bias_c, y, mean, rstd, width, EPS, **meta)
        ctx.save_for_backward(flat, weight_c, bias_c, static, scale, mean, rstd)
        ctx.meta, ctx.shape = meta, x.shape
        y = y.view(*x.shape[:-1], r)
        return torch.addcmul(static.to(x.dtype), scale.to(x.dtype), y.to(x.dtype))

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: Tensor):
        flat, weight, bias, static, scale, mean, rstd = ctx.saved_tensors
        rows, width = flat.shape
        r = weight.size(0)
        dtype = mean.dtype
        grad = grad.to(dtype)
        g_static = grad.reshape(-1, *static.shape).sum(0)
        if ctx.shape[-2] != grad.size(-2):  # one row standing for n equal streams
            grad = grad.sum(-2, keepdim=True)
        grad = grad.reshape(rows, r).contiguous()
        grad_x = torch.empty_like(flat)
        g, g_p, g_y = (flat.new_empty(rows, r, dtype=dtype) for _ in range(3))
        scale_c = scale.to(dtype).contiguous()
        _backward_kernel[(rows,)](flat, weight, bias, scale_c, grad, mean, rstd, grad_x, g, g_p,
                                  g_y, width, **ctx.meta)
        # what every row contributes to the parameters: summed over the rows here
        g_weight = torch.addmm(-(g_p * mean[:, None]).sum(0)[:, None], g_p.t(), flat.to(dtype))
        return (grad_x.view(ctx.shape), g_weight.to(weight.dtype), g.sum(0).to(bias.dtype),
                g_static.to(static.dtype), g_y.sum(0).to(scale.dtype))


def dynamic_coefficients(x: Tensor, weight: Tensor, bias: Tensor, static: Tensor,
                         scale: Tensor) -> Tensor:
    """:class:`DynamicCoefficients` (the arguments of the eager ``_DynamicCoefficients``)."""
    return DynamicCoefficients.apply(x, weight, bias, static, scale)
