"""The multi-stream product kernel (fairseq_plugins/kernels/stream_products.py) against the
eager einsum it replaces, and the dispatch (fairseq_plugins/depth/fused.py).

Run by tests/test_kernels.py under Triton's interpreter (TRITON_INTERPRET=1, CPU tensors, tiny
shapes), or directly on a GPU with the real compiler (scripts/bench/gpu_check.sh)."""
import os

import pytest
import torch

from fairseq_plugins.depth import fused
from fairseq_plugins.kernels import stream_products as kernel
from helpers import build_language_model, build_translation_model
from twins import DEVICE, assert_same_function, count_calls, twin_language_models
pytestmark = pytest.mark.skipif(not fused.runs_on(torch.zeros(1, device=DEVICE)),
                                reason="needs a GPU or TRITON_INTERPRET=1")


def _einsum(alpha, stream):
    if alpha.dim() == 2:
        alpha = alpha.expand(*stream.shape[:-2], *alpha.shape)
    return torch.einsum("...nk,...nc->...kc", alpha, stream)


# (streams n, weight columns K, width w): HC / mHC (K = n + 1), Frac-Connections (K = 2n),
# widths below, at and across the kernel's block, the largest n it takes
SHAPES = [(4, 5, 40), (4, 8, 70), (2, 3, 64), (8, 9, 5), (8, 16, 129), (1, 2, 3)]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("static", [False, True])
@pytest.mark.parametrize("n,k,width", SHAPES)
def test_forward_and_backward_equal_the_eager_product(n, k, width, static, dtype):
    generator = torch.Generator().manual_seed(n * 1000 + k * 10 + width)
    stream = torch.randn(3, 2, n, width, dtype=dtype, generator=generator).to(DEVICE)
    alpha = torch.randn(*(() if static else (3, 2)), n, k, dtype=dtype,
                        generator=generator).to(DEVICE)
    grad = torch.randn(3, 2, k, width, dtype=dtype, generator=generator).to(DEVICE)
    leaves = [(alpha.clone().requires_grad_(), stream.clone().requires_grad_())
              for _ in range(2)]
    out = kernel.stream_products(*leaves[0])
    ref = _einsum(*leaves[1])
    out.backward(grad)
    ref.backward(grad)
    # float64: equal up to the order of n products; float32: accumulated in float32 both ways
    tol = dict(rtol=0, atol=1e-12) if dtype == torch.float64 else dict(rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out, ref, **tol)
    torch.testing.assert_close(leaves[0][0].grad, leaves[1][0].grad, **tol)
    torch.testing.assert_close(leaves[0][1].grad, leaves[1][1].grad, **tol)
    assert out.dtype == dtype and leaves[0][0].grad.shape == alpha.shape


def test_the_hand_written_backward_passes_gradcheck():
    torch.manual_seed(0)
    alpha = torch.randn(5, 3, 4, dtype=torch.float64, device=DEVICE, requires_grad=True)
    stream = torch.randn(5, 3, 7, dtype=torch.float64, device=DEVICE, requires_grad=True)
    # fast mode (a random projection of the Jacobian): the full check ran the interpreted
    # kernel for half a minute of CI; the float64 comparison above checks every gradient
    assert torch.autograd.gradcheck(kernel.StreamProducts.apply, (alpha, stream), fast_mode=True)
    static = torch.randn(3, 4, dtype=torch.float64, device=DEVICE, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda a, s: kernel.StreamProducts.apply(a.expand(5, 3, 4), s), (static, stream),
        fast_mode=True)


def test_half_precision_accumulates_in_float32():
    torch.manual_seed(0)
    stream = torch.randn(4, 4, 96, device=DEVICE)
    alpha = torch.randn(4, 4, 5, device=DEVICE)
    out = kernel.stream_products(alpha.half(), stream.half())
    assert out.dtype == torch.float16
    # the float32 product rounded once to float16
    torch.testing.assert_close(out, _einsum(alpha.half().float(), stream.half().float()).half(),
                               rtol=0, atol=0)


# mHC and mHC-lite: test_mhc_coefficients.py (the same twins, with all three of their kernels)
@pytest.mark.parametrize("method", [["--hyper-connections", "static"],
                                    ["--hyper-connections", "dynamic"],
                                    ["--frac-connections", "dynamic"]])
def test_a_model_with_the_fused_path_computes_the_eager_models_function(method, monkeypatch):
    """Same seed with and without --no-fused-kernels: the same parameters, outputs and
    gradients (float64, where both are exact up to summation order); the kernel ran in every
    sub-layer, but the first where the stack starts as n equal streams (they take a sum; Frac-
    Connections start from the fractions); the dynamic variants' coefficients kernel
    (kernels/dynamic_coefficients.py) in every sub-layer."""
    calls = count_calls(monkeypatch, "stream_products", lambda alpha, stream: stream.shape)
    coefficients = count_calls(monkeypatch, "dynamic_coefficients", lambda x, *rest: x.shape)
    # 2 layers: under the interpreter each sub-layer's kernels cost seconds, and two layers
    # have the first sub-layer and the ones after it
    models = twin_language_models(method + ["--layers", "2"], seed=3)
    assert models[0].decoder.depth.connection.fused
    assert not models[1].decoder.depth.connection.fused
    assert_same_function(models)
    sub_layers = 2 * 2
    assert len(calls) == sub_layers - (method[0] != "--frac-connections")
    assert len(coefficients) == (sub_layers if method[1] == "dynamic" else 0)


def test_the_seq2seq_family_takes_the_fused_path(monkeypatch):
    calls = count_calls(monkeypatch, "stream_products", lambda alpha, stream: stream.shape)
    model, task, _ = build_translation_model("hyper_connections_transformer_tiny")
    assert model.encoder.depth.connection.fused and model.decoder.depth.connection.fused
    model.to(DEVICE)  # a CPU tensor takes the eager path with the real compiler
    src = torch.randint(4, 20, (2, 5), device=DEVICE)
    model(src, torch.tensor([5, 5], device=DEVICE), torch.randint(4, 20, (2, 4), device=DEVICE))
    assert calls


def test_more_streams_than_the_kernel_takes_run_the_eager_path_said_once(caplog):
    import logging

    with caplog.at_level(logging.INFO, logger="fairseq_plugins.depth.fused"):
        model = build_language_model("gpt_baseline_lm_tiny", ["--hyper-connections", "static",
                                                              "--hc-expansion-rate", "9"])[0]
    assert not model.decoder.depth.connection.fused
    lines = [r.getMessage() for r in caplog.records if r.name == "fairseq_plugins.depth.fused"]
    assert lines == ["decoder --hyper-connections: 9 streams are more than the fused kernel's 8;"
                     " the eager path runs"]


def test_the_interpreter_is_what_runs_on_cpu():
    assert fused.interpreting() == (os.environ.get("TRITON_INTERPRET") == "1")
