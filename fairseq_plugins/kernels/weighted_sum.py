"""Per-position weighted sums of separate source tensors in one Triton kernel each way: Attention
Residuals' depth mix (Kimi Team 2026), ``sum_i alpha_i v_i`` with the depth-softmax weights,
and MUDD's dense mix (Xiao et al. 2025), W = 4 such sums (query, key, value, residual) over the
same states with W rows of weights, each source read once for all W.

The eager code (``fairseq_plugins.depth.attn_res._WeightedSum``) runs one multiply-add per
source forward and one dot product and one scaled copy per source backward: 3 s operators per
read for s sources, O(K^2) over a stack of K sub-layers. Here the sources stay separate tensors
(stacking them would be a copy autograd keeps per read): the kernel receives a table of their
addresses, and one program per position runs over the sources and the width in blocks of
``BLOCK_C``, accumulating in float32 (float64 for float64). Backward, in one kernel per read:

    grad_alpha[p, w, i] = grad_w[p] . v_i[p],     grad_v_i[p] = sum_w alpha[p, w, i] grad_w[p].
"""
from typing import Tuple

import torch
import triton
import triton.language as tl
from torch import Tensor

from . import accumulator

BLOCK_C = 128


@triton.jit
def _forward_kernel(alpha_ptr, table_ptr, out_table_ptr, sources, width,
                    WAYS: tl.constexpr, WAYS_PAD: tl.constexpr, BLOCK: tl.constexpr,
                    ACC: tl.constexpr, ELEMENT: tl.constexpr):
    p = tl.program_id(0)
    row = p.to(tl.int64) * width
    way = tl.arange(0, WAYS_PAD)
    way_ok = way < WAYS
    element = ELEMENT
    # each way's output is a tensor of its own (its address in the table)
    outs = tl.load(out_table_ptr + way, mask=way_ok, other=0).to(tl.pointer_type(element))
    for start in range(0, width, BLOCK):
        c = start + tl.arange(0, BLOCK)
        mask = c < width
        acc = tl.zeros((WAYS_PAD, BLOCK), dtype=ACC)
        for i in range(0, sources):
            weight = tl.load(alpha_ptr + (p * WAYS + way) * sources + i, mask=way_ok,
                             other=0.0).to(ACC)
            source = tl.load(table_ptr + i).to(tl.pointer_type(element))
            value = tl.load(source + row + c, mask=mask, other=0.0).to(ACC)
            acc += weight[:, None] * value[None, :]
        tl.store(outs[:, None] + row + c[None, :], acc.to(element),
                 mask=way_ok[:, None] & mask[None, :])


@triton.jit
def _backward_kernel(alpha_ptr, table_ptr, grad_table_ptr, grad_out_table_ptr, grad_alpha_ptr,
                     sources, width, WAYS: tl.constexpr, WAYS_PAD: tl.constexpr,
                     BLOCK: tl.constexpr, ACC: tl.constexpr, ELEMENT: tl.constexpr):
    p = tl.program_id(0)
    row = p.to(tl.int64) * width
    way = tl.arange(0, WAYS_PAD)
    way_ok = way < WAYS
    element = ELEMENT
    grad_outs = tl.load(grad_out_table_ptr + way, mask=way_ok, other=0).to(
        tl.pointer_type(element))
    for i in range(0, sources):
        weight = tl.load(alpha_ptr + (p * WAYS + way) * sources + i, mask=way_ok,
                         other=0.0).to(ACC)
        source = tl.load(table_ptr + i).to(tl.pointer_type(element))
        grad_source = tl.load(grad_table_ptr + i).to(tl.pointer_type(element))
        dot = tl.zeros((WAYS_PAD, BLOCK), dtype=ACC)
        for start in range(0, width, BLOCK):
            c = start + tl.arange(0, BLOCK)
            mask = c < width
            g = tl.load(grad_outs[:, None] + row + c[None, :],
                        mask=way_ok[:, None] & mask[None, :], other=0.0).to(ACC)
            value = tl.load(source + row + c, mask=mask, other=0.0).to(ACC)
            dot += g * value[None, :]
            tl.store(grad_source + row + c, tl.sum(weight[:, None] * g, axis=0).to(element),
                     mask=mask)
        tl.store(grad_alpha_ptr + (p * WAYS + way) * sources + i, tl.sum(dot, axis=1),
                 mask=way_ok)


# the pinned address tables copied while a CUDA graph was captured (--cuda-graph)
_CAPTURED_TABLES = []


def _table(tensors) -> Tensor:
    """The tensors' addresses, int64, on their device (the kernel reads the sources through it).
    To a GPU through pinned memory (torch's caching host allocator) without a host sync: a copy
    from pageable memory would wait for the stream at every read."""
    addresses = torch.tensor([t.data_ptr() for t in tensors], dtype=torch.int64)
    if not tensors[0].is_cuda:
        return addresses
    pinned = addresses.pin_memory()
    if torch.cuda.is_current_stream_capturing():
        # a captured copy reads this host memory again at every replay: it must outlive the
        # graph, not go back to the allocator for another table to overwrite (a few bytes per
        # read, once per captured shape)
        _CAPTURED_TABLES.append(pinned)
    return pinned.to(tensors[0].device, non_blocking=True)


# Triton's element types of the torch dtypes the kernels take
_ELEMENT = {torch.float16: tl.float16, torch.bfloat16: tl.bfloat16, torch.float32: tl.float32,
            torch.float64: tl.float64}


class WeightedSums(torch.autograd.Function):
    """(alpha P x W x s, v_1 .. v_s P x C each, one dtype, contiguous) -> W sums
    ``sum_i alpha[:, w, i] v_i``, P x C each in the sources' dtype (each source read once for
    all W). The sums are separate tensors, not planes of one: a consumer that keeps one sum
    for its backward (a LayerNorm of MUDD's key) then keeps that sum alone, not all W."""

    @staticmethod
    def forward(ctx, alpha: Tensor, *sources: Tensor):
        positions, width = sources[0].shape
        ways = alpha.size(1)
        alpha = alpha.contiguous()
        outs = [sources[0].new_empty(positions, width) for _ in range(ways)]
        meta = dict(WAYS=ways, WAYS_PAD=triton.next_power_of_2(ways), BLOCK=BLOCK_C,
                    ACC=accumulator(sources[0].dtype), ELEMENT=_ELEMENT[sources[0].dtype])
        _forward_kernel[(positions,)](alpha, _table(sources), _table(outs), len(sources),
                                      width, **meta)
        ctx.save_for_backward(alpha, *sources)
        ctx.meta = meta
        return tuple(outs)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, *grad_outs: Tensor):
        alpha, *sources = ctx.saved_tensors
        positions, width = sources[0].shape
        # a way nobody used has a zero gradient (autograd materialises it)
        grad_outs = [g.contiguous().to(sources[0].dtype) for g in grad_outs]
        grads = [torch.empty_like(v) for v in sources]
        grad_alpha = torch.empty(alpha.shape, dtype=torch.promote_types(alpha.dtype,
                                                                        torch.float32),
                                 device=alpha.device)
        _backward_kernel[(positions,)](alpha, _table(sources), _table(grads), _table(grad_outs),
                                       grad_alpha, len(sources), width, **ctx.meta)
        return (grad_alpha.to(alpha.dtype), *grads)


def weighted_sums(alpha: Tensor, *sources: Tensor, with_weights_dtype: bool = False
                  ) -> Tuple[Tensor, ...]:
    """``sum_i alpha[..., w, i] sources[i]`` for every w: ``alpha`` ... x W x s, each source
    ... x C (the same leading dimensions) -> W tensors ... x C (separate storages), in the
    widest of the sources' dtypes
    (AttnRes's eager rule), or of theirs and alpha's (``with_weights_dtype``: the type
    promotion of MUDD's eager products)."""
    dtype = alpha.dtype if with_weights_dtype else sources[0].dtype
    for v in sources:
        dtype = torch.promote_types(dtype, v.dtype)
    lead, width = sources[0].shape[:-1], sources[0].size(-1)
    flat = [v.to(dtype).reshape(-1, width).contiguous() for v in sources]
    outs = WeightedSums.apply(alpha.reshape(-1, *alpha.shape[-2:]), *flat)
    return tuple(out.view(*lead, width) for out in outs)


def weighted_sum(alpha: Tensor, *sources: Tensor) -> Tensor:
    """``sum_i alpha[..., i] sources[i]``: ``alpha`` ... x s -> ... x C (one way)."""
    return weighted_sums(alpha.unsqueeze(-2), *sources)[0]
