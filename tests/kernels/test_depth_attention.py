"""Attention Residuals' one-kernel read (fairseq_plugins/kernels/depth_attention.py) against the
paper's equations written out eagerly, the model's eager path (its --no-fused-kernels twin) and
its dispatch: the weighted-sum kernel while the weights are logged and beyond the kernel's width.
See test_stream_products.py for how this folder runs."""
import logging

import pytest
import torch

from fairseq_plugins import kernels
from fairseq_plugins.depth import attn_res, fused
from fairseq_plugins.kernels import depth_attention as kernel
from helpers import build_language_model
from twins import (DEVICE, assert_same_forward_and_backward, assert_same_function,
                   count_calls, twin_language_models)
pytestmark = pytest.mark.skipif(not fused.runs_on(torch.zeros(1, device=DEVICE)),
                                reason="needs a GPU or TRITON_INTERPRET=1")


def paper_read(query, *sources):
    """alpha = softmax_i(q . v_i / rms(v_i)), sum_i alpha_i v_i (the logits in q's dtype)."""
    keys = [v.to(query.dtype) for v in sources]
    logits = torch.stack([(k @ query) * torch.rsqrt(k.square().mean(-1) + attn_res.RMS_EPS)
                          for k in keys], dim=-1)
    alpha = torch.softmax(logits, dim=-1)
    return sum(alpha[..., i:i + 1] * k for i, k in enumerate(keys))


def test_the_kernel_uses_the_models_eps():
    assert kernel.EPS == attn_res.RMS_EPS


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("sources,width", [(1, 5), (3, 16), (7, 33), (25, 64), (2, 1)])
def test_forward_and_backward_equal_the_papers_read(sources, width, dtype):
    generator = torch.Generator().manual_seed(sources * 1000 + width)
    query = torch.randn(width, dtype=dtype, generator=generator)
    # sources of unequal scale: the RMS norm matters, the softmax is far from uniform
    values = [torch.randn(3, 2, width, dtype=dtype, generator=generator) * (1 + i % 3)
              for i in range(sources)]
    grad = torch.randn(3, 2, width, dtype=dtype, generator=generator)
    assert_same_forward_and_backward(kernel.depth_attention, paper_read, [query, *values], grad)


def test_the_hand_written_backward_passes_gradcheck():
    torch.manual_seed(0)
    query = torch.randn(6, dtype=torch.float64, device=DEVICE, requires_grad=True)
    values = [torch.randn(4, 6, dtype=torch.float64, device=DEVICE, requires_grad=True)
              for _ in range(3)]
    # fast mode (a few random directions): the float64 comparisons above check every gradient
    assert torch.autograd.gradcheck(kernel.DepthAttention.apply, (query, *values), fast_mode=True)


def test_large_logits_do_not_overflow():
    """The online softmax subtracts the running maximum: logits of several hundred (a query
    grown large in training) give the eager softmax's weights, not inf / nan."""
    torch.manual_seed(0)
    query = torch.randn(16, device=DEVICE) * 200
    values = [torch.randn(5, 16, device=DEVICE) for _ in range(4)]
    out = kernel.depth_attention(query, *values)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, paper_read(query, *values), rtol=1e-5, atol=1e-5)


def test_sources_of_different_dtypes_are_read_in_the_widest():
    """As under autocast: the embedding output float32, a sub-layer's output half."""
    torch.manual_seed(0)
    query = torch.randn(8, device=DEVICE)
    values = [torch.randn(4, 8).to(DEVICE), torch.randn(4, 8).half().to(DEVICE),
              torch.randn(4, 8).half().to(DEVICE)]
    out = kernel.depth_attention(query, *values)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, paper_read(query, *values), rtol=1e-6, atol=1e-6)


def test_a_row_wider_than_the_kernel_is_refused():
    width = kernels.DEPTH_ATTENTION_MAX_WIDTH + 1
    with pytest.raises(ValueError, match="rows of up to"):
        kernel.depth_attention(torch.zeros(width, device=DEVICE),
                               torch.zeros(1, width, device=DEVICE))


def queries_away_from_zero(model):  # uniform weights at initialisation
    torch.nn.init.normal_(model.decoder.depth.connection.queries, std=0.5)
    torch.nn.init.normal_(model.decoder.depth.connection.key_gains, mean=1.0, std=0.3)


@pytest.mark.parametrize("variant", [["--attn-res", "full"],
                                     ["--attn-res", "block", "--attn-res-blocks", "2"]])
def test_an_attn_res_model_reading_with_the_kernel_computes_the_eager_models_function(
        variant, monkeypatch):
    reads = count_calls(monkeypatch, "depth_attention", lambda query, *v: len(v))
    sums = count_calls(monkeypatch, "weighted_sum", lambda alpha, *v: len(v))
    assert_same_function(twin_language_models(variant, seed=5, prepare=queries_away_from_zero))
    # every sub-layer and the readout read with the kernel, in the fused model only; the
    # sources each reads: Full every output below; Block (2 groups of 2 layers) the completed
    # groups and the open group's partial sum
    assert reads == ([1, 2, 3, 4, 5, 6, 7, 8, 9] if variant[1] == "full" else
                     [1, 2, 2, 2, 2, 3, 3, 3, 3])
    assert sums == []


def test_while_the_weights_are_logged_the_reads_sum_with_the_weighted_sum_kernel(monkeypatch):
    """The logged weights are the softmax's, which the one-kernel read does not keep: a pass
    that logs them computes the logits eagerly and sums with the weighted-sum kernel (the same
    function, and the weights logged)."""
    reads = count_calls(monkeypatch, "depth_attention", lambda query, *v: len(v))
    sums = count_calls(monkeypatch, "weighted_sum", lambda alpha, *v: len(v))
    models = twin_language_models(["--attn-res", "full"], seed=5, prepare=queries_away_from_zero)
    logged = {}
    models[0].decoder.depth.connection.start_logging(logged.update)
    assert_same_function(models)
    assert reads == [] and len(sums) == 9
    assert len(logged) == sum(range(1, 10))  # the weight on every source of every read
    readout = sum(v for k, v in logged.items() if k.startswith("k8_"))  # logged in float32
    torch.testing.assert_close(readout, torch.tensor(1.0), rtol=0, atol=1e-6)


def test_beyond_the_kernels_width_the_reads_sum_with_the_weighted_sum_kernel(monkeypatch,
                                                                            caplog):
    monkeypatch.setattr(kernels, "DEPTH_ATTENTION_MAX_WIDTH", 8)
    with caplog.at_level(logging.INFO, logger="fairseq_plugins.depth.fused"):
        model = build_language_model("gpt_baseline_lm_tiny", ["--attn-res", "full"])[0]
    lines = [r.getMessage() for r in caplog.records if r.name == "fairseq_plugins.depth.fused"]
    width = model.decoder.depth.connection.queries.size(1)
    assert lines == [f"decoder --attn-res: width {width} is more than the depth-attention "
                     "kernel's 8; the logits and the softmax run eagerly, the weighted sum as a "
                     "kernel"]
    reads = count_calls(monkeypatch, "depth_attention", lambda query, *v: len(v))
    sums = count_calls(monkeypatch, "weighted_sum", lambda alpha, *v: len(v))
    model.to(DEVICE)(torch.randint(4, 24, (2, 5), device=DEVICE))
    assert reads == [] and len(sums) == 9
