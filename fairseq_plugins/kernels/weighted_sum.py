"""A per-position weighted sum of separate source tensors in one Triton kernel each way: Attention
Residuals' depth mix (Kimi Team 2026), ``sum_i alpha_i v_i`` with the depth-softmax weights.

The eager code (``fairseq_plugins.depth.attn_res._WeightedSum``) runs one multiply-add per
source forward and one dot product and one scaled copy per source backward: 3 s operators per
read for s sources, O(K^2) over a stack of K sub-layers. Here the sources stay separate tensors
(stacking them would be a copy autograd keeps per read): the kernel receives a table of their
addresses, and one program per position runs over the sources and the width in blocks of
``BLOCK_C``, accumulating in float32 (float64 for float64). Backward, in one kernel per read:

    grad_alpha[p, i] = grad[p] . v_i[p],     grad_v_i[p] = alpha[p, i] grad[p].
"""
import torch
import triton
import triton.language as tl
from torch import Tensor

BLOCK_C = 128


@triton.jit
def _forward_kernel(alpha_ptr, table_ptr, out_ptr, sources, width,
                    BLOCK: tl.constexpr, ACC: tl.constexpr):
    p = tl.program_id(0)
    row = p.to(tl.int64) * width
    element = out_ptr.dtype.element_ty
    for start in range(0, width, BLOCK):
        c = start + tl.arange(0, BLOCK)
        mask = c < width
        acc = tl.zeros((BLOCK,), dtype=ACC)
        for i in range(0, sources):
            weight = tl.load(alpha_ptr + p * sources + i).to(ACC)
            source = tl.load(table_ptr + i).to(tl.pointer_type(element))
            acc += weight * tl.load(source + row + c, mask=mask, other=0.0).to(ACC)
        tl.store(out_ptr + row + c, acc.to(element), mask=mask)


@triton.jit
def _backward_kernel(alpha_ptr, table_ptr, grad_table_ptr, grad_ptr, grad_alpha_ptr, sources,
                     width, BLOCK: tl.constexpr, ACC: tl.constexpr):
    p = tl.program_id(0)
    row = p.to(tl.int64) * width
    element = grad_ptr.dtype.element_ty
    for i in range(0, sources):
        weight = tl.load(alpha_ptr + p * sources + i).to(ACC)
        source = tl.load(table_ptr + i).to(tl.pointer_type(element))
        grad_source = tl.load(grad_table_ptr + i).to(tl.pointer_type(element))
        dot = tl.zeros((BLOCK,), dtype=ACC)
        for start in range(0, width, BLOCK):
            c = start + tl.arange(0, BLOCK)
            mask = c < width
            g = tl.load(grad_ptr + row + c, mask=mask, other=0.0).to(ACC)
            dot += g * tl.load(source + row + c, mask=mask, other=0.0).to(ACC)
            tl.store(grad_source + row + c, (weight * g).to(element), mask=mask)
        tl.store(grad_alpha_ptr + p * sources + i, tl.sum(dot, axis=0))


def _accumulator(dtype: torch.dtype):
    return tl.float64 if dtype == torch.float64 else tl.float32


def _table(tensors) -> Tensor:
    """The tensors' addresses, int64, on their device (the kernel reads the sources through it)."""
    return torch.tensor([t.data_ptr() for t in tensors], dtype=torch.int64,
                        device=tensors[0].device)


class WeightedSum(torch.autograd.Function):
    """(alpha P x s, v_1 .. v_s P x C each, one dtype, contiguous) -> sum_i alpha_i v_i,
    P x C in the sources' dtype."""

    @staticmethod
    def forward(ctx, alpha: Tensor, *sources: Tensor) -> Tensor:
        positions, width = sources[0].shape
        alpha = alpha.contiguous()
        out = torch.empty_like(sources[0])
        acc = _accumulator(out.dtype)
        _forward_kernel[(positions,)](alpha, _table(sources), out, len(sources), width,
                                      BLOCK=BLOCK_C, ACC=acc)
        ctx.save_for_backward(alpha, *sources)
        ctx.acc = acc
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: Tensor):
        alpha, *sources = ctx.saved_tensors
        positions, width = sources[0].shape
        grad = grad.contiguous().to(sources[0].dtype)
        grads = [torch.empty_like(v) for v in sources]
        grad_alpha = torch.empty(positions, len(sources), dtype=torch.promote_types(
            alpha.dtype, torch.float32), device=alpha.device)
        _backward_kernel[(positions,)](alpha, _table(sources), _table(grads), grad,
                                       grad_alpha, len(sources), width, BLOCK=BLOCK_C,
                                       ACC=ctx.acc)
        return (grad_alpha.to(alpha.dtype), *grads)


def weighted_sum(alpha: Tensor, *sources: Tensor) -> Tensor:
    """``sum_i alpha[..., i] sources[i]``: ``alpha`` ... x s, each source ... x C (the same
    leading dimensions); in the widest of the sources' dtypes, as the eager code."""
    dtype = sources[0].dtype
    for v in sources[1:]:
        dtype = torch.promote_types(dtype, v.dtype)
    lead, width = sources[0].shape[:-1], sources[0].size(-1)
    flat = [v.to(dtype).reshape(-1, width).contiguous() for v in sources]
    out = WeightedSum.apply(alpha.reshape(-1, alpha.size(-1)), *flat)
    return out.view(*lead, width)
