"""The weighted-sum kernel (fairseq_plugins/kernels/weighted_sum.py) against the eager code
(fairseq_plugins.depth.attn_res._WeightedSum): Attention Residuals' sum where a read is not one
kernel (test_depth_attention.py), MUDD's dense mix. See test_stream_products.py for how
this folder runs."""
import pytest
import torch

from fairseq_plugins.depth import attn_res, fused
from fairseq_plugins.kernels import weighted_sum as kernel
from twins import (DEVICE, assert_same_forward_and_backward, assert_same_function,
                   count_calls, twin_language_models)
pytestmark = pytest.mark.skipif(not fused.runs_on(torch.zeros(1, device=DEVICE)),
                                reason="needs a GPU or TRITON_INTERPRET=1")


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("sources,width", [(1, 5), (3, 128), (7, 200), (25, 16)])
def test_forward_and_backward_equal_the_eager_sum(sources, width, dtype):
    generator = torch.Generator().manual_seed(sources * 1000 + width)
    alpha = torch.softmax(torch.randn(3, 2, sources, dtype=dtype, generator=generator), -1)
    values = [torch.randn(3, 2, width, dtype=dtype, generator=generator) for _ in range(sources)]
    grad = torch.randn(3, 2, width, dtype=dtype, generator=generator)
    assert_same_forward_and_backward(kernel.weighted_sum, attn_res._WeightedSum.apply,
                                     [alpha, *values], grad)


def test_sources_of_different_dtypes_are_summed_in_the_widest():
    """As under autocast: the embedding output float32, a sub-layer's output half."""
    torch.manual_seed(0)
    alpha = torch.softmax(torch.randn(4, 3), -1).to(DEVICE)
    values = [torch.randn(4, 8).to(DEVICE), torch.randn(4, 8).half().to(DEVICE),
              torch.randn(4, 8).half().to(DEVICE)]
    out = kernel.weighted_sum(alpha, *values)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, attn_res._WeightedSum.apply(alpha, *values), rtol=1e-6,
                               atol=1e-6)


def test_the_hand_written_backward_passes_gradcheck():
    torch.manual_seed(0)
    for ways in (1, 3):  # one sum (AttnRes), several (MUDD; 3: a padded ways dimension)
        alpha = torch.rand(3, ways, 3, dtype=torch.float64, device=DEVICE, requires_grad=True)
        values = [torch.randn(3, 5, dtype=torch.float64, device=DEVICE, requires_grad=True)
                  for _ in range(3)]
        # fast mode: the float64 comparisons above check every gradient
        assert torch.autograd.gradcheck(kernel.WeightedSums.apply, (alpha, *values),
                                        fast_mode=True)


def test_several_ways_equal_the_sums_one_by_one():
    torch.manual_seed(0)
    alpha = torch.randn(3, 2, 4, 5, dtype=torch.float64, device=DEVICE)  # 4 ways, 5 states
    values = [torch.randn(3, 2, 33, dtype=torch.float64, device=DEVICE) for _ in range(5)]
    sums = kernel.weighted_sums(alpha, *values)
    assert len(sums) == 4 and all(way.shape == (3, 2, 33) for way in sums)
    # separate storages: keeping one way (for a backward) does not keep the others alive
    assert len({way.untyped_storage().data_ptr() for way in sums}) == 4
    for way in range(4):
        torch.testing.assert_close(sums[way], kernel.weighted_sum(alpha[..., way, :], *values),
                                   rtol=0, atol=1e-13)
        torch.testing.assert_close(
            sums[way], sum(alpha[..., way, j:j + 1] * v for j, v in enumerate(values)),
            rtol=0, atol=1e-12)


@pytest.mark.parametrize("ways", ["qkvr", "r"])
def test_a_mudd_model_with_the_kernel_computes_the_eager_models_function(ways, monkeypatch):
    calls = count_calls(monkeypatch, "weighted_sums", lambda alpha, *v: alpha.size(-2))

    def maps_away_from_zero(model):  # the dynamic maps start at zero
        for da in model.decoder.depth.connection.aggregates:
            torch.nn.init.normal_(da.w2.weight, std=0.3)

    assert_same_function(twin_language_models(["--mudd", "--mudd-ways", ways], seed=5,
                                               prepare=maps_away_from_zero))
    # every block's aggregate: 4 ways but the last block's (the residual only), or 1 way
    assert calls == ([4, 4, 4, 1] if ways == "qkvr" else [1, 1, 1, 1])
