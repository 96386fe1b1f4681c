"""What the kernel tests share: counting a fused path's calls, and a model with the fused
kernels against its --no-fused-kernels twin (the same function)."""
import torch

from fairseq_plugins.depth import fused
from helpers import build_language_model

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def count_calls(monkeypatch, name, record):
    """Replace ``fused.<name>`` by itself recording ``record(*args)`` per call; the list."""
    calls = []
    original = getattr(fused, name)

    def counting(*args):
        calls.append(record(*args))
        return original(*args)

    monkeypatch.setattr(fused, name, counting)
    return calls


def assert_same_forward_and_backward(kernel, reference, inputs, grad):
    """``kernel(*inputs)`` and ``reference(*inputs)``: the same output and the same gradient of
    every input for the output's gradient ``grad`` (float64 to 1e-12, else 1e-5). Each run gets
    fresh leaves: on the CPU ``.to(DEVICE)`` or ``.to(dtype)`` can return the tensor itself,
    whose ``.grad`` the second run would add to the first's (one tensor compared with itself)."""
    runs = []
    for fn in (kernel, reference):
        leaves = [t.detach().clone().to(DEVICE).requires_grad_() for t in inputs]
        out = fn(*leaves)
        out.backward(grad.to(DEVICE))
        runs.append((out, [t.grad for t in leaves]))
    tol = dict(rtol=0, atol=1e-12) if grad.dtype == torch.float64 else dict(rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(runs[0][0], runs[1][0], **tol)
    for got, want in zip(runs[0][1], runs[1][1]):
        torch.testing.assert_close(got, want, **tol)


def twin_language_models(flags, seed, prepare=None):
    """``gpt_baseline_lm_tiny`` with ``flags``, in float64: with the fused kernels and with
    ``--no-fused-kernels``, the same weights (``prepare(model)`` edits the first's first)."""
    models = [build_language_model("gpt_baseline_lm_tiny", flags + extra, seed=seed)[0]
              .double().to(DEVICE) for extra in ([], ["--no-fused-kernels"])]
    if prepare is not None:
        prepare(models[0])
        models[1].load_state_dict(models[0].state_dict())
    return models


def assert_same_function(models):
    """The two models' outputs and every parameter's gradient on one batch are equal (float64:
    up to the order of summation)."""
    # 10 rows: under Triton's interpreter each row of a kernel's grid costs its own run
    tokens = torch.randint(4, 24, (2, 5), device=DEVICE)
    outs = []
    for model in models:
        logits = model(tokens)[0]
        logits.square().sum().backward()
        outs.append((logits, {n: p.grad for n, p in model.named_parameters()}))
    torch.testing.assert_close(outs[0][0], outs[1][0], rtol=0, atol=1e-10)
    for name, grad in outs[0][1].items():
        torch.testing.assert_close(grad, outs[1][1][name], rtol=1e-9, atol=1e-10, msg=name)
