"""--torch-compile (fairseq_plugins/torch_compile.py): the build-time refusals under every entry
point, and which passes are compiled. Inductor's code generation takes minutes per model on
these CPUs, so torch.compile runs here with dynamo's ``eager`` backend (the same tracing, the
traced graph run as it is, which makes the compiled pass bitwise the eager one); the real
compiler runs in scripts/bench/gpu_check.sh."""
import copy
import logging

import pytest
import torch

from fairseq_plugins import torch_compile
from fairseq_plugins.errors import OptionError
from fairseq_plugins.inprocess import build_language_model
from helpers import assert_lm_incremental_equals_full_forward, compile_with_eager_backend
from test_entry_points import build, hydra_model_config, make_task, parse


@pytest.fixture
def traced(monkeypatch):
    return compile_with_eager_backend(monkeypatch)


def twins(arch, extra=()):
    """The arch (2 blocks) with --torch-compile and without, the same weights, training."""
    flags = ["--layers", "2", *extra]
    compiled = build_language_model(arch, ["--torch-compile", *flags])[0]
    plain = build_language_model(arch, flags)[0]
    plain.load_state_dict(compiled.state_dict())
    return compiled.train(), plain.train()


def test_training_passes_are_compiled_and_compute_the_same(traced, caplog):
    # a depth connection's pass traced as one graph: tests/kernels/test_under_torch_compile.py
    arch = "gpt_baseline_lm_tiny"
    compiled, plain = twins(arch)
    tokens = torch.randint(4, 20, (3, 7))
    with caplog.at_level(logging.INFO, logger="fairseq_plugins.torch_compile"):
        for _ in range(2):
            for model in (compiled, plain):
                model.zero_grad(set_to_none=True)
            out = compiled(tokens)[0]
            out.square().sum().backward()
            expected = plain(tokens)[0]
            expected.square().sum().backward()
            torch.testing.assert_close(out, expected, rtol=0, atol=0)
            for (name, p), q in zip(compiled.named_parameters(), plain.parameters()):
                torch.testing.assert_close(p.grad, q.grad, rtol=0, atol=0, msg=name)
    # traced once, on the first pass, as one graph (no break) holding both blocks' attention
    assert len(traced) == 1, f"{len(traced)} graphs traced"
    attention = [node for node in traced[0].graph.nodes
                 if node.target is torch.nn.functional.scaled_dot_product_attention]
    assert len(attention) == 2
    said = [r.getMessage() for r in caplog.records if "--torch-compile" in r.getMessage()]
    assert said == [f"{arch} --torch-compile: the blocks' training passes are compiled (mode "
                    "default) on the first one"]
    assert compiled.state_dict().keys() == plain.state_dict().keys()


def test_evaluation_decoding_and_observed_passes_run_eager(traced):
    compiled, _ = twins("gpt_baseline_lm_tiny")
    tokens = torch.randint(4, 20, (2, 8))
    compiled.eval()
    compiled(tokens)
    assert_lm_incremental_equals_full_forward(compiled, tokens, atol=1e-6)
    assert compiled.decoder.torch_compile.compiled is None and not traced
    compiled.train()
    handle = compiled.decoder.depth.observe(lambda view, block, where: None)
    compiled(tokens)  # an observer is Python the compiled code would not call as written
    handle.remove()
    assert compiled.decoder.torch_compile.compiled is None and not traced
    compiled(tokens)
    assert traced
    # a copy of the model (fairseq's EMA, for one) starts uncompiled
    assert copy.deepcopy(compiled).decoder.torch_compile.compiled is None


def test_the_mode_reaches_torch_compile(monkeypatch):
    modes = []
    monkeypatch.setattr(torch_compile, "compile_module",
                        lambda module, mode: modes.append(mode) or module)
    for extra, mode in (([], None), (["--torch-compile-mode", "reduce-overhead"],
                                     "reduce-overhead")):
        model = build_language_model("gpt_baseline_lm_tiny", ["--torch-compile", *extra])[0]
        model.train()(torch.randint(4, 20, (2, 5)))
        assert modes[-1] == mode


def test_impossible_combinations_are_refused_at_build_time():
    for extra, message in (
            (["--torch-compile", "--cuda-graph"], "--torch-compile with --cuda-graph: both "
                                                  "capture the same blocks; choose one"),
            (["--torch-compile", "--log-layer-weights"], "--torch-compile with "
                                                         "--log-layer-weights"),
            (["--torch-compile-mode", "max-autotune"], "--torch-compile-mode max-autotune "
                                                       "without --torch-compile")):
        with pytest.raises(OptionError, match=message):
            build_language_model("gpt_baseline_lm_mhc_tiny", extra)
    with pytest.raises(SystemExit):  # argparse's choices
        build_language_model("gpt_baseline_lm_tiny", ["--torch-compile", "--torch-compile-mode",
                                                      "fastest"])


def test_hydra_refuses_the_same_and_builds_the_same():
    task = make_task(parse("gpt_baseline_lm_tiny", {}))
    with pytest.raises(Exception, match="--torch-compile with --cuda-graph"):
        build(task, hydra_model_config("gpt_baseline_lm_tiny",
                                       {"torch_compile": True, "cuda_graph": True}))
    with pytest.raises(Exception, match="--torch-compile-mode reduce-overhead without"):
        build(task, hydra_model_config("gpt_baseline_lm_tiny",
                                       {"torch_compile_mode": "reduce-overhead"}))
    model = build(task, hydra_model_config("gpt_baseline_lm_tiny", {
        "torch_compile": True, "torch_compile_mode": "max-autotune"}))
    assert model.decoder.torch_compile.mode == "max-autotune"
    assert build(task, hydra_model_config("gpt_baseline_lm_tiny", {})).decoder.torch_compile is None
