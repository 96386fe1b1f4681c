"""--torch-compile with the fused kernels on: a compiled pass traces the depth connections'
eager code (inductor fuses it itself), never the Triton kernels (fused.runs_on is False while
torch traces); the eager passes of the same model keep the kernels. Run by
tests/test_kernels.py under Triton's interpreter."""
import pytest
import torch

from fairseq_plugins.depth import fused
from helpers import build_language_model, compile_with_eager_backend
from twins import DEVICE, count_calls
pytestmark = pytest.mark.skipif(not fused.runs_on(torch.zeros(1, device=DEVICE)),
                                reason="needs a GPU or TRITON_INTERPRET=1")


def test_a_compiled_pass_runs_the_eager_code_and_an_eager_pass_the_kernels(monkeypatch):
    traced = compile_with_eager_backend(monkeypatch)
    kernels = [count_calls(monkeypatch, name, lambda *args: 1)
               for name in ("mhc_coefficients", "stream_products", "sinkhorn_scaling")]
    model = build_language_model("gpt_baseline_lm_mhc_tiny",
                                 ["--torch-compile", "--layers", "1"])[0].to(DEVICE)
    assert model.decoder.depth.connection.fused
    eager_code = build_language_model("gpt_baseline_lm_mhc_tiny",
                                      ["--no-fused-kernels", "--layers", "1"])[0].to(DEVICE)
    eager_code.load_state_dict(model.state_dict())
    tokens = torch.randint(4, 20, (2, 6), device=DEVICE)
    compiled = model.train()(tokens)[0]
    # one graph (no break) of the eager code: bitwise the --no-fused-kernels model
    assert len(traced) == 1 and not any(kernels)
    torch.testing.assert_close(compiled, eager_code.train()(tokens)[0], rtol=0, atol=0)
    eager = model.eval()(tokens)[0]  # the model has no dropout: the same function
    assert all(kernels), "the eager pass did not run the kernels"
    torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-5)
