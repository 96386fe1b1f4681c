"""Attention Residuals' weighted sum kernel (fairseq_plugins/kernels/weighted_sum.py) against the
eager code (fairseq_plugins.depth.attn_res._WeightedSum). See test_stream_products.py for how
this folder runs."""
import pytest
import torch

from fairseq_plugins.depth import attn_res, fused
from fairseq_plugins.kernels import weighted_sum as kernel
from helpers import build_language_model

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
pytestmark = pytest.mark.skipif(not fused.runs_on(torch.zeros(1, device=DEVICE)),
                                reason="needs a GPU or TRITON_INTERPRET=1")


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("sources,width", [(1, 5), (3, 128), (7, 200), (25, 16)])
def test_forward_and_backward_equal_the_eager_sum(sources, width, dtype):
    generator = torch.Generator().manual_seed(sources * 1000 + width)
    alpha = torch.softmax(torch.randn(3, 2, sources, dtype=dtype, generator=generator), -1)
    values = [torch.randn(3, 2, width, dtype=dtype, generator=generator) for _ in range(sources)]
    grad = torch.randn(3, 2, width, dtype=dtype, generator=generator)
    runs = []
    for fn in (kernel.weighted_sum, attn_res._WeightedSum.apply):
        leaves = [t.to(DEVICE).requires_grad_() for t in [alpha, *values]]
        out = fn(*leaves)
        out.backward(grad.to(DEVICE))
        runs.append((out, [t.grad for t in leaves]))
    tol = dict(rtol=0, atol=1e-12) if dtype == torch.float64 else dict(rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(runs[0][0], runs[1][0], **tol)
    for got, want in zip(runs[0][1], runs[1][1]):
        torch.testing.assert_close(got, want, **tol)


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
    alpha = torch.rand(5, 3, dtype=torch.float64, device=DEVICE, requires_grad=True)
    values = [torch.randn(5, 9, dtype=torch.float64, device=DEVICE, requires_grad=True)
              for _ in range(3)]
    assert torch.autograd.gradcheck(kernel.WeightedSum.apply, (alpha, *values))


@pytest.mark.parametrize("variant", [["--attn-res", "full"],
                                     ["--attn-res", "block", "--attn-res-blocks", "2"]])
def test_an_attn_res_model_with_the_kernel_computes_the_eager_models_function(variant,
                                                                             monkeypatch):
    calls = []
    original = fused.weighted_sum
    monkeypatch.setattr(fused, "weighted_sum",
                        lambda alpha, *v: calls.append(len(v)) or original(alpha, *v))
    models = [build_language_model("gpt_baseline_lm_tiny", variant + extra, seed=5)[0]
              .double().to(DEVICE) for extra in ([], ["--no-fused-kernels"])]
    # queries away from zero (uniform weights at initialisation), the same in both models
    torch.nn.init.normal_(models[0].decoder.depth.connection.queries, std=0.5)
    models[1].load_state_dict(models[0].state_dict())
    tokens = torch.randint(4, 24, (2, 9), device=DEVICE)
    outs = []
    for model in models:
        logits = model(tokens)[0]
        logits.square().sum().backward()
        outs.append((logits, {n: p.grad for n, p in model.named_parameters()}))
    assert len(calls) == 2 * 4 + 1  # every sub-layer and the readout, fused model only
    torch.testing.assert_close(outs[0][0], outs[1][0], rtol=0, atol=1e-10)
    for name, grad in outs[0][1].items():
        torch.testing.assert_close(grad, outs[1][1][name], rtol=1e-9, atol=1e-10, msg=name)
