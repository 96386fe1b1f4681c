"""mHC's coefficient kernel (fairseq_plugins/kernels/mhc_coefficients.py) against the paper's
equations written out eagerly, mHC and mHC-lite models against their --no-fused-kernels twins,
and the fallback beyond the kernel's columns. See test_stream_products.py for how this folder
runs."""
import logging

import pytest
import torch

from fairseq_plugins.depth import fused, mhc
from fairseq_plugins.kernels import mhc_coefficients as kernel
from helpers import build_language_model
from twins import (DEVICE, assert_same_forward_and_backward, assert_same_function,
                   count_calls, twin_language_models)
pytestmark = pytest.mark.skipif(not fused.runs_on(torch.zeros(1, device=DEVICE)),
                                reason="needs a GPU or TRITON_INTERPRET=1")


def paper_coefficients(x, weight, gates, pre, post, res):
    """[sigmoid(a_pre u_pre + b_pre) | 2 sigmoid(a_post u_post + b_post) | a_res u_res + b_res]
    with u = RMSNorm(x) W^T (the gain-free norm)."""
    n = pre.numel()
    u = (x / torch.sqrt(x.square().mean(-1, keepdim=True) + mhc.RMS_EPS)) @ weight.t()
    u_pre, u_post, u_res = u.split([n, n, u.size(-1) - 2 * n], dim=-1)
    return torch.cat([torch.sigmoid(gates[0] * u_pre + pre),
                      2 * torch.sigmoid(gates[1] * u_post + post), gates[2] * u_res + res], -1)


def test_the_kernel_uses_the_models_eps():
    assert kernel.EPS == mhc.RMS_EPS


# (n, width D, res columns): mHC n = 4 (n^2), widths below, at and across the block of 64,
# mHC-lite n = 4 (n! = 24), the largest mHC (n = 8: 80 columns), one stream
SHAPES = [(4, 40, 16), (2, 130, 4), (4, 64, 24), (8, 70, 64), (1, 3, 1)]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("n,width,res", SHAPES)
def test_forward_and_backward_equal_the_papers_coefficients(n, width, res, dtype):
    generator = torch.Generator().manual_seed(n * 1000 + width)
    m = 2 * n + res
    inputs = [torch.randn(3, 2, width, generator=generator), torch.randn(m, width,
                                                                         generator=generator),
              torch.randn(3, generator=generator), torch.randn(n, generator=generator),
              torch.randn(n, generator=generator), torch.randn(res, generator=generator)]
    grad = torch.randn(3, 2, m, dtype=dtype, generator=generator)
    assert_same_forward_and_backward(kernel.mhc_coefficients, paper_coefficients,
                                     [t.to(dtype) for t in inputs], grad)


def test_the_hand_written_backward_passes_gradcheck():
    torch.manual_seed(0)
    inputs = [torch.randn(4, 10), torch.randn(7, 10), torch.randn(3), torch.randn(2),
              torch.randn(2), torch.randn(3)]
    leaves = [t.double().to(DEVICE).requires_grad_() for t in inputs]
    # fast mode (a few random directions): the float64 comparisons above check every gradient
    assert torch.autograd.gradcheck(kernel.MHCCoefficients.apply, leaves, fast_mode=True)


def maps_away_from_zero(model):  # the maps start at zero, the gates at 0.01
    connection = model.decoder.depth.connection
    torch.nn.init.normal_(connection.maps, std=0.3)
    torch.nn.init.normal_(connection.gates, std=1.0)


@pytest.mark.parametrize("kind", ["sinkhorn", "lite"])
def test_an_mhc_model_with_the_kernels_computes_the_eager_models_function(kind, monkeypatch):
    """Same weights with and without --no-fused-kernels: the same outputs and gradients
    (float64). The fused model runs the coefficient kernel in every sub-layer (the first on the
    n equal streams: the maps' blocks summed, D = C; the learned readout keeps its own eager
    product), the stream product in every sub-layer but the first (n equal streams take a sum)
    and mHC's Sinkhorn kernel in every sub-layer (not mHC-lite's permutation mixture)."""
    calls = count_calls(monkeypatch, "mhc_coefficients", lambda x, w, *rest: tuple(w.shape))
    products = count_calls(monkeypatch, "stream_products", lambda alpha, stream: 1)
    sinkhorn = count_calls(monkeypatch, "sinkhorn_scaling", lambda m, iterations: 1)
    dynamic = count_calls(monkeypatch, "dynamic_coefficients", lambda *args: 1)
    # 2 layers, as the stream-product kernel's model test
    models = twin_language_models(["--mhc", kind, "--layers", "2"], seed=5,
                                  prepare=maps_away_from_zero)
    assert models[0].decoder.depth.connection.fused
    assert not models[1].decoder.depth.connection.fused
    assert_same_function(models)
    sub_layers, m = 2 * 2, 2 * 4 + (24 if kind == "lite" else 16)
    assert len(calls) == sub_layers and all(shape[0] == m for shape in calls)
    assert calls[0][1] * 4 == calls[1][1]
    assert len(products) == sub_layers - 1 and not dynamic
    assert len(sinkhorn) == (0 if kind == "lite" else sub_layers)


def test_more_columns_than_the_kernel_takes_run_the_eager_coefficients_said_once(monkeypatch,
                                                                                 caplog):
    monkeypatch.setattr(fused, "MAX_COEFFICIENTS", 16)
    with caplog.at_level(logging.INFO, logger="fairseq_plugins.depth.fused"):
        model = build_language_model("gpt_baseline_lm_tiny", ["--mhc", "sinkhorn"])[0]
    lines = [r.getMessage() for r in caplog.records if r.name == "fairseq_plugins.depth.fused"]
    assert lines == ["decoder --mhc: 24 coefficient columns are more than the fused kernel's "
                     "16; the coefficients run eagerly"]
    connection = model.decoder.depth.connection
    assert connection.fused and not connection.fused_coefficients  # the other kernels run
    calls = count_calls(monkeypatch, "mhc_coefficients", lambda *args: 1)
    sinkhorn = count_calls(monkeypatch, "sinkhorn_scaling", lambda *args: 1)
    model.to(DEVICE)(torch.randint(4, 24, (2, 5), device=DEVICE))
    assert calls == [] and len(sinkhorn) == 2 * 4
