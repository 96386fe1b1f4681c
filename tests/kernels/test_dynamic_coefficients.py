"""The dynamic-coefficient kernel of Hyper- and Frac-Connections
(fairseq_plugins/kernels/dynamic_coefficients.py) against the eager autograd Function it
replaces (hyper_connections._DynamicCoefficients); the models that call it in every sub-layer:
test_stream_products.py's twin test.

Run by tests/test_kernels.py under Triton's interpreter (TRITON_INTERPRET=1, CPU tensors, tiny
shapes), or directly on a GPU with the real compiler (scripts/bench/gpu_check.sh)."""
import pytest
import torch

from fairseq_plugins.depth import fused
from fairseq_plugins.depth.hyper_connections import _DynamicCoefficients as Eager
from fairseq_plugins.kernels import dynamic_coefficients as kernel
from twins import DEVICE
pytestmark = pytest.mark.skipif(not fused.runs_on(torch.zeros(1, device=DEVICE)),
                                reason="needs a GPU or TRITON_INTERPRET=1")


def _inputs(rows_per_stream, n, reads, width, dtype, seed):
    """x (3 x 2 x s x w; s = n, or 1 for n equal streams), maps r x w, bias r, static n x r,
    scale r (r = reads + n + 1), scaled so that the tanh is neither linear nor saturated."""
    g = torch.Generator().manual_seed(seed)
    r = reads + n + 1
    x = torch.randn(3, 2, rows_per_stream, width, dtype=dtype, generator=g) * 2 + 0.5
    weight = torch.randn(r, width, dtype=dtype, generator=g) / width ** 0.5
    bias = torch.randn(r, dtype=dtype, generator=g) * 0.3
    static = torch.randn(n, r, dtype=dtype, generator=g)
    scale = torch.randn(r, dtype=dtype, generator=g)
    grad = torch.randn(3, 2, n, r, dtype=dtype, generator=g)
    return [t.to(DEVICE) for t in (x, weight, bias, static, scale)], grad.to(DEVICE)


# (rows per position s, streams n, read rows R, width w): HC (R = 1) on n equal streams and on n
# streams, Frac-Connections (R = n), widths below, at and across the block, n up to the kernel's 8
SHAPES = [(1, 4, 1, 40), (4, 4, 1, 64), (4, 4, 4, 70), (2, 2, 2, 5), (8, 8, 1, 129),
          (8, 8, 8, 33), (1, 1, 1, 3)]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("s,n,reads,width", SHAPES)
def test_forward_and_backward_equal_the_eager_function(s, n, reads, width, dtype):
    inputs, grad = _inputs(s, n, reads, width, dtype, seed=s * 100 + n * 10 + width)
    leaves = [[t.clone().requires_grad_() for t in inputs] for _ in range(2)]
    out = kernel.dynamic_coefficients(*leaves[0])
    ref = Eager.apply(*leaves[1])
    out.backward(grad)
    ref.backward(grad)
    tol = dict(rtol=0, atol=1e-11) if dtype == torch.float64 else dict(rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(out, ref, **tol)
    for name, a, b in zip(("x", "weight", "bias", "static", "scale"), leaves[0], leaves[1]):
        torch.testing.assert_close(a.grad, b.grad, **tol, msg=name)
    assert out.shape == (3, 2, n, reads + n + 1) and out.dtype == dtype


def test_a_constant_row_has_no_variance_gradient_as_in_the_eager_function():
    inputs, grad = _inputs(4, 4, 1, 16, torch.float64, seed=5)
    inputs[0][0, 0, 1] = 0.7  # one row with zero variance: the clamp's gradient is 0
    leaves = [[t.clone().requires_grad_() for t in inputs] for _ in range(2)]
    kernel.dynamic_coefficients(*leaves[0]).backward(grad)
    Eager.apply(*leaves[1]).backward(grad)
    torch.testing.assert_close(leaves[0][0].grad, leaves[1][0].grad, rtol=0, atol=1e-11)


def test_the_hand_written_backward_passes_gradcheck():
    # fast mode (a random projection of the Jacobian): the full check runs the interpreted
    # kernel a few hundred times, two minutes of CI for what the comparison above also shows
    for s, n, reads in ((1, 3, 1), (3, 3, 3)):
        inputs, _ = _inputs(s, n, reads, 7, torch.float64, seed=n + s)
        leaves = [t.requires_grad_() for t in inputs]
        assert torch.autograd.gradcheck(kernel.DynamicCoefficients.apply, tuple(leaves),
                                        fast_mode=True)
