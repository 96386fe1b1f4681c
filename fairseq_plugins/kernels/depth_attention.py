"""Attention Residuals' read (Kimi Team 2026, arXiv 2603.15031) in one Triton kernel each way:
the keys' RMS norm, the logits, the depth softmax and the weighted sum over the sources.

For one position p, the sources v_1 .. v_s (width C each) and the read's query q = w * g (its
pseudo-query times its keys' RMSNorm gains, in the statistics dtype), as
:class:`fairseq_plugins.depth.attn_res.AttentionResiduals` computes eagerly:

    r_i = 1 / sqrt(mean_c v_i^2 + eps),   l_i = r_i (v_i . q),
    alpha = softmax_i(l),                 out = sum_i alpha_i v_i

The eager path computes every completed source's logits for all K+1 queries once (one GEMM),
unbinds them per query and stacks them per read; autograd then spends a zero-filled gradient
and an addition per (source, query) pair, O(K^2) operators per pass, each a launch on a GPU.
Here one program per position keeps the whole row in registers (``BLOCK`` = the width rounded
up to a power of two, at most ``MAX_WIDTH``) and runs over the sources once, with the softmax
kept online (the running maximum rescales the sum so far); it saves only the row's log-sum-exp.
The backward recomputes r_i, the logits and alpha from the sources (one pass for
D = sum_j alpha_j (g . v_j), one writing the gradients):

    dl_i = alpha_i (g . v_i - D),
    grad v_i = alpha_i g + dl_i (r_i q - (v_i . q) r_i^3 v_i / C),
    grad q = sum_p sum_i dl_i r_i v_i   (per position here, summed over positions by torch)

Everything accumulates in float32 (float64 for float64), the sources' rounding only on the way
out: in half precision the kernel is the more exact of the two paths.
"""
import torch
import triton
import triton.language as tl
from torch import Tensor

from . import DEPTH_ATTENTION_MAX_WIDTH as MAX_WIDTH, accumulator
from .weighted_sum import _table

EPS = 1e-6  # the keys' RMSNorm eps (attn_res.RMS_EPS; tested equal)


@triton.jit
def _logit(v, q, width, eps):
    """(l, r, v . q) of one source row (masked lanes hold zeros)."""
    dot = tl.sum(v * q, axis=0)
    r = 1.0 / tl.sqrt(tl.sum(v * v, axis=0) / width + eps)
    return r * dot, r, dot


@triton.jit
def _forward_kernel(q_ptr, table_ptr, out_ptr, lse_ptr, sources, width, eps,
                    BLOCK: tl.constexpr, ACC: tl.constexpr):
    p = tl.program_id(0)
    row = p.to(tl.int64) * width
    c = tl.arange(0, BLOCK)
    mask = c < width
    element = out_ptr.dtype.element_ty
    q = tl.load(q_ptr + c, mask=mask, other=0.0).to(ACC)
    # the first source opens the running softmax: its weight 1 at the maximum so far
    v = tl.load(tl.load(table_ptr).to(tl.pointer_type(element)) + row + c, mask=mask,
                other=0.0).to(ACC)
    top, _, _ = _logit(v, q, width, eps)
    total = top * 0.0 + 1.0
    acc = v
    for i in range(1, sources):
        source = tl.load(table_ptr + i).to(tl.pointer_type(element))
        v = tl.load(source + row + c, mask=mask, other=0.0).to(ACC)
        logit, _, _ = _logit(v, q, width, eps)
        new_top = tl.maximum(top, logit)
        rescale = tl.exp(top - new_top)
        weight = tl.exp(logit - new_top)
        acc = acc * rescale + weight * v
        total = total * rescale + weight
        top = new_top
    tl.store(out_ptr + row + c, (acc / total).to(element), mask=mask)
    tl.store(lse_ptr + p, top + tl.log(total))


@triton.jit
def _backward_kernel(q_ptr, table_ptr, grad_table_ptr, grad_ptr, lse_ptr, grad_q_ptr, sources,
                     width, eps, BLOCK: tl.constexpr, ACC: tl.constexpr):
    p = tl.program_id(0)
    row = p.to(tl.int64) * width
    c = tl.arange(0, BLOCK)
    mask = c < width
    element = grad_ptr.dtype.element_ty
    q = tl.load(q_ptr + c, mask=mask, other=0.0).to(ACC)
    g = tl.load(grad_ptr + row + c, mask=mask, other=0.0).to(ACC)
    lse = tl.load(lse_ptr + p)
    mixed = tl.sum(g * 0.0, axis=0)  # D = sum_j alpha_j (g . v_j)
    for i in range(0, sources):
        source = tl.load(table_ptr + i).to(tl.pointer_type(element))
        v = tl.load(source + row + c, mask=mask, other=0.0).to(ACC)
        logit, _, _ = _logit(v, q, width, eps)
        mixed += tl.exp(logit - lse) * tl.sum(g * v, axis=0)
    grad_q = g * 0.0
    for i in range(0, sources):
        source = tl.load(table_ptr + i).to(tl.pointer_type(element))
        v = tl.load(source + row + c, mask=mask, other=0.0).to(ACC)
        logit, r, dot = _logit(v, q, width, eps)
        alpha = tl.exp(logit - lse)
        grad_logit = alpha * (tl.sum(g * v, axis=0) - mixed)
        grad_v = alpha * g + grad_logit * (r * q - dot * r * r * r / width * v)
        grad_source = tl.load(grad_table_ptr + i).to(tl.pointer_type(element))
        tl.store(grad_source + row + c, grad_v.to(element), mask=mask)
        grad_q += grad_logit * r * v
    tl.store(grad_q_ptr + row + c, grad_q, mask=mask)


def _meta(width: int, dtype: torch.dtype) -> dict:
    block = triton.next_power_of_2(width)
    return dict(BLOCK=block, ACC=accumulator(dtype), num_warps=4 if block <= 1024 else 8)


class DepthAttention(torch.autograd.Function):
    """(q C, v_1 .. v_s P x C each, one dtype, contiguous) -> sum_i softmax_i(l)_i v_i, P x C
    in the sources' dtype, with l_i = (v_i . q) / rms(v_i) (``q`` float32, or float64 for
    float64 sources)."""

    @staticmethod
    def forward(ctx, query: Tensor, *sources: Tensor) -> Tensor:
        positions, width = sources[0].shape
        out = torch.empty_like(sources[0])
        meta = _meta(width, out.dtype)
        lse = torch.empty(positions, dtype=query.dtype, device=query.device)
        _forward_kernel[(positions,)](query, _table(sources), out, lse, len(sources), width, EPS,
                                      **meta)
        ctx.save_for_backward(query, lse, *sources)
        ctx.meta = meta
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: Tensor):
        query, lse, *sources = ctx.saved_tensors
        positions, width = sources[0].shape
        grad = grad.contiguous().to(sources[0].dtype)
        grads = [torch.empty_like(v) for v in sources]
        grad_query_rows = torch.empty(positions, width, dtype=query.dtype, device=query.device)
        _backward_kernel[(positions,)](query, _table(sources), _table(grads), grad, lse,
                                       grad_query_rows, len(sources), width, EPS, **ctx.meta)
        return (grad_query_rows.sum(0), *grads)


def depth_attention(query: Tensor, *sources: Tensor) -> Tensor:
    """Attention Residuals' read of ``sources`` (... x C each, the same leading dimensions)
    with ``query`` (C: the pseudo-query times the keys' gains) -> ... x C, in the widest of the
    sources' dtypes (the eager rule); the logits in ``query``'s dtype."""
    dtype = sources[0].dtype
    for v in sources:
        dtype = torch.promote_types(dtype, v.dtype)
    lead, width = sources[0].shape[:-1], sources[0].size(-1)
    if width > MAX_WIDTH:
        raise ValueError(f"the depth-attention kernel holds rows of up to {MAX_WIDTH} "
                         f"channels, not {width}")
    flat = [v.to(dtype).reshape(-1, width).contiguous() for v in sources]
    out = DepthAttention.apply(query.contiguous(), *flat)
    return out.view(*lead, width)
