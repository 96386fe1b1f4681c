"""``logcumsumexp`` along one dimension, as an explicit causal scan with a cheap backward.

y_t = log sum_{j<=t} e^{x_j}, computed as y_t = logaddexp(y_{t-1}, x_t): stable for any range
of x and causal (no stabiliser from later positions). ``torch.logcumsumexp`` gives the same
values, but its CPU backward costs ~50x a softmax of the same size (for the target lengths of
translation it dominated the inverted/swapped cross-attention's training step). The backward here
is the reverse recurrence of the gradient,

    dL/dx_j = e^{x_j - y_j} A_j,   A_j = g_j + e^{y_j - y_{j+1}} A_{j+1},

whose factors are all in [0, 1] (y never decreases), so it is as stable as the forward. Both
directions loop over the scanned dimension in Python with one vectorised op per position over
everything else: the scanned dimension should be a sequence length (tens to hundreds), the rest
large. Not twice differentiable.

Precision: the scan runs in float32 (float64 stays float64) whatever the input dtype, and the
result is rounded to the input's dtype once: in float16/bfloat16 a running sum rounded at every
step loses accuracy with length. Positions whose running value is -inf (a prefix of -inf
inputs, e.g. a large negative mask that overflowed in float16) carry no probability mass and
get zero gradient, not 0 * inf = NaN.
"""
import torch
from torch import Tensor
from torch.autograd.function import once_differentiable


class _CausalLogCumSumExp(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, dim: int) -> Tensor:
        steps = x.movedim(dim, 0).contiguous()  # one contiguous slice per position
        out = torch.empty_like(steps)
        out[0] = steps[0]
        for t in range(1, steps.size(0)):
            torch.logaddexp(out[t - 1], steps[t], out=out[t])
        ctx.save_for_backward(steps, out)
        ctx.dim = dim
        return out.movedim(0, dim)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Tensor):
        steps, out = ctx.saved_tensors
        grad = grad.movedim(ctx.dim, 0).contiguous()
        empty = out == float("-inf")  # no mass yet: e^{x - y} and e^{y - y'} are 0/0 there
        decay = torch.exp(out[:-1] - out[1:]).masked_fill_(empty[1:], 0.0)
        acc = torch.empty_like(grad)
        acc[-1] = grad[-1]
        for t in range(grad.size(0) - 2, -1, -1):
            torch.addcmul(grad[t], decay[t], acc[t + 1], out=acc[t])
        share = torch.exp(steps - out).masked_fill_(empty, 0.0)
        return (share * acc).movedim(0, ctx.dim), None


def causal_logcumsumexp(x: Tensor, dim: int) -> Tensor:
    """``torch.logcumsumexp(x, dim)`` (same values, any shape and float dtype; the result has
    ``x``'s dtype), faster to train through on CPU; computed in at least float32, see the
    module doc."""
    if x.size(dim) == 0:
        return x.clone()
    # no autocast switch needed: none of the scan's ops is on autocast's lists
    wide = x.to(torch.promote_types(x.dtype, torch.float32))
    return _CausalLogCumSumExp.apply(wide, dim % x.dim()).to(x.dtype)
