import pytest
import torch

from fairseq_plugins.modules.log_cumsum import causal_logcumsumexp


@pytest.mark.parametrize("shape,dim", [((3, 7), 1), ((2, 3, 9, 4), 2), ((2, 3, 4, 9), -1),
                                       ((1, 5), 0), ((4, 1), 1)])
def test_values_and_gradients_equal_torch_logcumsumexp(shape, dim):
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(*shape, generator=g, dtype=torch.float64) * 5).requires_grad_()
    torch.testing.assert_close(causal_logcumsumexp(x, dim), torch.logcumsumexp(x, dim))
    upstream = torch.randn(*shape, generator=g, dtype=torch.float64)
    ours = torch.autograd.grad(causal_logcumsumexp(x, dim), x, upstream)[0]
    theirs = torch.autograd.grad(torch.logcumsumexp(x, dim), x, upstream)[0]
    torch.testing.assert_close(ours, theirs)
    assert torch.autograd.gradcheck(lambda t: causal_logcumsumexp(t, dim), (x,))


def test_stable_over_a_huge_range_and_masked_positions():
    """Logits 1000 apart (exp overflows in float32) and the -1e9 that masks padding: finite
    values and gradients, equal to the exact result."""
    x = torch.tensor([[-1e9, -1000.0, 0.0, 1000.0, -1e9, 5.0]], requires_grad=True)
    y = causal_logcumsumexp(x, 1)
    torch.testing.assert_close(y.detach(), torch.logcumsumexp(x.detach().double(), 1).float())
    y.sum().backward()
    assert torch.isfinite(x.grad).all()
    # d/dx_j sum_t y_t = sum_{t>=j} (weight of x_j in y_t): a masked position counts only
    # where it is all there is (y_0 = x_0)
    assert x.grad[0, 0] == 1 and x.grad[0, 4] == 0
    torch.testing.assert_close(x.grad[0, 3], torch.tensor(3.0))  # dominates y_3, y_4, y_5
