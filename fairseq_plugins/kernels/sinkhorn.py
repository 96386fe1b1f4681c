"""mHC's Sinkhorn-Knopp (Xie et al. 2025, arXiv 2512.24880, Eq. 9) in one Triton kernel each
way, the same iterates as the eager code (:func:`fairseq_plugins.depth.mhc.sinkhorn`).

For M = exp(logits) (positive, n x n per position), t iterations of the scaling form, u
starting at 1:

    v_s = 1 / (M^T u_(s-1))  (the columns' step),   u_s = 1 / (M v_s)  (the rows'),

and the output diag(u_t) M diag(v_t). Eager PyTorch runs four operators per iteration and
direction over all positions (about 5,760 of the 8,605 operators of a 12-block mHC step on a
GPU); here one program handles ``BLOCK_P`` positions, their n x n matrices in registers, all t
iterations in one loop. The iterates are written to two buffers (t+1 and t vectors of n per
position, as the eager code keeps them) that the backward kernel reads to run the steps in
reverse: with G the output's gradient and K = G * M,

    g_M = u_t v_t^T * G,  g_u = K v_t,  g_v(direct) = K^T u_t,
    per step s = t .. 1:  g_z = -u_s^2 g_u;  g_v = M^T g_z (+ the direct term at s = t);
                          g_w = -v_s^2 g_v;  g_u = M g_w;
                          g_M += g_z v_s^T + u_(s-1) g_w^T,

the exact gradient of these t iterations. float32 (float64 for float64 inputs) throughout: the
eager code runs Sinkhorn in float32 under every precision.
"""
import torch
import triton
import triton.language as tl
from torch import Tensor

BLOCK_P = 32  # positions per program


@triton.jit
def _forward_kernel(m_ptr, out_ptr, us_ptr, vs_ptr, positions, iterations,
                    N: tl.constexpr, N_PAD: tl.constexpr, BLOCK: tl.constexpr):
    p = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    i = tl.arange(0, N_PAD)
    p_ok = p < positions
    vec_mask = p_ok[:, None] & (i[None, :] < N)  # BLOCK x N_PAD
    mat_mask = vec_mask[:, :, None] & (i[None, None, :] < N)  # BLOCK x N_PAD x N_PAD
    offsets = p[:, None, None] * N * N + i[None, :, None] * N + i[None, None, :]
    m = tl.load(m_ptr + offsets, mask=mat_mask, other=0.0)
    vec = p[:, None] * N + i[None, :]  # a position's n-vector in the iterates' buffers
    stride = positions * N  # one iterate of every position
    u = tl.where(vec_mask, 1.0, 0.0).to(m.dtype)
    tl.store(us_ptr + vec, u, mask=vec_mask)
    v = u
    for s in range(0, iterations):
        # padded entries divide 1 (not 0) and are set to 0 after
        v = tl.where(vec_mask, 1.0 / tl.where(vec_mask, tl.sum(m * u[:, :, None], axis=1), 1.0),
                     0.0)  # 1 / (M^T u)
        tl.store(vs_ptr + s * stride + vec, v, mask=vec_mask)
        u = tl.where(vec_mask, 1.0 / tl.where(vec_mask, tl.sum(m * v[:, None, :], axis=2), 1.0),
                     0.0)  # 1 / (M v)
        tl.store(us_ptr + (s + 1) * stride + vec, u, mask=vec_mask)
    tl.store(out_ptr + offsets, u[:, :, None] * m * v[:, None, :], mask=mat_mask)


@triton.jit
def _backward_kernel(m_ptr, grad_ptr, us_ptr, vs_ptr, grad_m_ptr, positions, iterations,
                     N: tl.constexpr, N_PAD: tl.constexpr, BLOCK: tl.constexpr):
    p = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    i = tl.arange(0, N_PAD)
    p_ok = p < positions
    vec_mask = p_ok[:, None] & (i[None, :] < N)
    mat_mask = vec_mask[:, :, None] & (i[None, None, :] < N)
    offsets = p[:, None, None] * N * N + i[None, :, None] * N + i[None, None, :]
    m = tl.load(m_ptr + offsets, mask=mat_mask, other=0.0)
    g = tl.load(grad_ptr + offsets, mask=mat_mask, other=0.0).to(m.dtype)
    vec = p[:, None] * N + i[None, :]
    stride = positions * N
    u = tl.load(us_ptr + iterations * stride + vec, mask=vec_mask, other=0.0)
    v = tl.load(vs_ptr + (iterations - 1) * stride + vec, mask=vec_mask, other=0.0)
    k = g * m
    grad_m = g * u[:, :, None] * v[:, None, :]
    grad_u = tl.sum(k * v[:, None, :], axis=2)  # K v
    direct_v = tl.sum(k * u[:, :, None], axis=1)  # K^T u: only the last v reaches the output
    for back in range(0, iterations):
        s = iterations - back  # 1-based step, last first
        u_s = tl.load(us_ptr + s * stride + vec, mask=vec_mask, other=0.0)
        v_s = tl.load(vs_ptr + (s - 1) * stride + vec, mask=vec_mask, other=0.0)
        u_prev = tl.load(us_ptr + (s - 1) * stride + vec, mask=vec_mask, other=0.0)
        g_z = -u_s * u_s * grad_u  # u_s = 1 / (M v_s)
        grad_v = tl.sum(m * g_z[:, :, None], axis=1)  # M^T g_z
        grad_v += tl.where(back == 0, direct_v, 0.0)
        g_w = -v_s * v_s * grad_v  # v_s = 1 / (M^T u_(s-1))
        grad_u = tl.sum(m * g_w[:, None, :], axis=2)  # M g_w
        grad_m += g_z[:, :, None] * v_s[:, None, :] + u_prev[:, :, None] * g_w[:, None, :]
    tl.store(grad_m_ptr + offsets, grad_m, mask=mat_mask)


class SinkhornScaling(torch.autograd.Function):
    """M (P x n x n, positive, contiguous) -> diag(u_t) M diag(v_t) after ``iterations``
    iterations (module doc), in M's dtype (float32 or float64)."""

    @staticmethod
    def forward(ctx, m: Tensor, iterations: int) -> Tensor:
        positions, n, _ = m.shape
        us = m.new_empty(iterations + 1, positions, n)
        vs = m.new_empty(iterations, positions, n)
        out = torch.empty_like(m)
        meta = dict(N=n, N_PAD=triton.next_power_of_2(n), BLOCK=BLOCK_P)
        grid = (triton.cdiv(positions, BLOCK_P),)
        _forward_kernel[grid](m, out, us, vs, positions, iterations, **meta)
        ctx.save_for_backward(m, us, vs)
        ctx.iterations, ctx.meta, ctx.grid = iterations, meta, grid
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: Tensor):
        m, us, vs = ctx.saved_tensors
        grad_m = torch.empty_like(m)
        _backward_kernel[ctx.grid](m, grad.contiguous(), us, vs, grad_m, m.size(0),
                                   ctx.iterations, **ctx.meta)
        return grad_m, None


def sinkhorn_scaling(m: Tensor, iterations: int) -> Tensor:
    """:class:`SinkhornScaling` for M ... x n x n (any leading dimensions)."""
    shape = m.shape
    flat = m.reshape(-1, shape[-2], shape[-1]).contiguous()
    return SinkhornScaling.apply(flat, iterations).view(shape)
