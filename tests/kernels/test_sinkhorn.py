"""mHC's Sinkhorn-Knopp kernel (fairseq_plugins/kernels/sinkhorn.py) against the eager
iterations (fairseq_plugins.depth.mhc.sinkhorn). See test_stream_products.py for how this
folder runs."""
import pytest
import torch

from fairseq_plugins.depth import fused, mhc
from fairseq_plugins.kernels import sinkhorn as kernel
from twins import DEVICE
pytestmark = pytest.mark.skipif(not fused.runs_on(torch.zeros(1, device=DEVICE)),
                                reason="needs a GPU or TRITON_INTERPRET=1")


# (n, positions, iterations): mHC's n = 4 and 20 iterations across the kernel's position block,
# a non-power-of-two n, the largest n, one iteration
CASES = [(4, 37, 20), (3, 5, 7), (8, 9, 3), (2, 64, 1), (4, 1, 20)]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("n,positions,iterations", CASES)
def test_forward_and_backward_equal_the_eager_iterations(n, positions, iterations, dtype):
    generator = torch.Generator().manual_seed(n * 100 + positions)
    logits = (3 * torch.randn(2, positions, n, n, dtype=dtype, generator=generator)).to(DEVICE)
    grad = torch.randn(2, positions, n, n, dtype=dtype, generator=generator).to(DEVICE)
    eager, fused_logits = logits.clone().requires_grad_(), logits.clone().requires_grad_()
    ref = mhc.sinkhorn(eager, iterations)
    out = mhc.sinkhorn(fused_logits, iterations, fused_kernel=True)
    ref.backward(grad)
    out.backward(grad)
    tol = dict(rtol=0, atol=1e-13) if dtype == torch.float64 else dict(rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out, ref, **tol)
    torch.testing.assert_close(fused_logits.grad, eager.grad, **tol)
    if iterations >= 20:  # near doubly stochastic: the rows exact after the rows' step
        torch.testing.assert_close(out.sum(-1), torch.ones_like(out.sum(-1)), rtol=0,
                                   atol=1e-6 if dtype == torch.float32 else 1e-12)


def test_the_hand_written_backward_passes_gradcheck():
    torch.manual_seed(0)
    m = torch.rand(2, 3, 3, dtype=torch.float64, device=DEVICE) + 0.1
    m.requires_grad_()
    assert torch.autograd.gradcheck(lambda x: kernel.SinkhornScaling.apply(x, 5), (m,))
