"""--cuda-graph (fairseq_plugins/cuda_graph.py): the build-time refusals under every entry point,
the CPU path (eager, said once, the same function), and which passes replay the graph: the
capture itself needs CUDA, so here it is replaced by a stand-in that runs the captured
function and counts (the real capture runs in scripts/bench/gpu_check.sh's graph stage)."""
import copy
import logging

import pytest
import torch
from torch import nn

from fairseq_plugins import cuda_graph
from fairseq_plugins.errors import OptionError
from helpers import assert_lm_incremental_equals_full_forward
from fairseq_plugins.inprocess import build_language_model
from test_entry_points import build, hydra_model_config, make_task, parse


def twins(arch="gpt_baseline_lm_mhc_tiny", extra=()):
    """The arch with --cuda-graph and without, the same weights, in training mode."""
    graphed = build_language_model(arch, ["--cuda-graph", *extra])[0]
    plain = build_language_model(arch, list(extra))[0]
    plain.load_state_dict(graphed.state_dict())
    return graphed.train(), plain.train()


def test_on_the_cpu_the_blocks_run_eager_said_once(caplog):
    graphed, plain = twins()
    tokens = torch.randint(4, 20, (2, 7))
    with caplog.at_level(logging.INFO, logger="fairseq_plugins.cuda_graph"):
        outs = [m(tokens)[0] for m in (graphed, plain)] + [graphed(tokens)[0]]
    torch.testing.assert_close(outs[0], outs[1], rtol=0, atol=0)
    said = [r.getMessage() for r in caplog.records if "--cuda-graph" in r.getMessage()]
    assert said == ["gpt_baseline_lm_mhc_tiny --cuda-graph: the model is on the CPU; such "
                    "passes run eager"]
    # the flag adds nothing a checkpoint keeps
    assert list(graphed.state_dict()) == list(plain.state_dict())


class StandIn(nn.Module):
    """What capture() returns, without CUDA: runs the module it was given, counting."""

    def __init__(self, module, x):
        super().__init__()
        self.module, self.shape, self.replays = module, tuple(x.shape), 0
        self.sample = x

    def forward(self, x):
        assert tuple(x.shape) == self.shape  # a graph replays one shape only
        self.replays += 1
        return self.module(x)


@pytest.fixture
def stand_in(monkeypatch):
    captured = []

    def capture(module, x):
        captured.append(StandIn(module, x))
        return captured[-1]
    monkeypatch.setattr(cuda_graph, "graphable", lambda x: True)
    monkeypatch.setattr(cuda_graph, "capture", capture)
    return captured


def test_training_passes_of_the_captured_shape_replay_the_graph_and_others_run_eager(
        stand_in, caplog):
    graphed, plain = twins()
    full, short = torch.randint(4, 20, (4, 9)), torch.randint(4, 20, (2, 9))
    with caplog.at_level(logging.INFO, logger="fairseq_plugins.cuda_graph"):
        for tokens in (full, full, short, short, full):
            for model in (graphed, plain):
                model.zero_grad(set_to_none=True)  # as fairseq's optimizers free them
            out = graphed(tokens)[0]
            out.square().sum().backward()
            plain(tokens)[0].square().sum().backward()
            torch.testing.assert_close(out, plain(tokens)[0], rtol=0, atol=0)
            # the gradients through the captured function are the eager model's
            for (name, p), q in zip(graphed.named_parameters(), plain.parameters()):
                torch.testing.assert_close(p.grad, q.grad, rtol=0, atol=0, msg=name)
    assert len(stand_in) == 1 and stand_in[0].shape == (9, 4, 32)  # T x B x C
    assert stand_in[0].replays == 3
    # captured on a buffer of its own, not on the first batch's x (part of that pass's graph)
    assert stand_in[0].sample.grad_fn is None and stand_in[0].sample.requires_grad
    said = [r.getMessage() for r in caplog.records if "--cuda-graph" in r.getMessage()]
    assert said == [
        "gpt_baseline_lm_mhc_tiny --cuda-graph: captured the blocks for batches of shape 9x4x32 "
        "(torch.float32)",
        "gpt_baseline_lm_mhc_tiny --cuda-graph: a batch of shape 9x2x32 (torch.float32), not "
        "the captured 9x4x32 (torch.float32); such passes run eager"]


def test_a_pass_that_accumulates_gradients_runs_eager(stand_in, caplog):
    """The replayed backward's gradient buffers become the parameters' .grad; a second replay
    before the optimizer step would overwrite them, so only the first pass of an update
    replays (--update-freq 2 here)."""
    graphed, plain = twins()
    batches = torch.randint(4, 20, (2, 4, 9))
    with caplog.at_level(logging.INFO, logger="fairseq_plugins.cuda_graph"):
        for model in (graphed, plain):
            for tokens in batches:
                model(tokens)[0].square().sum().backward()
    assert stand_in[0].replays == 1
    for (name, p), q in zip(graphed.named_parameters(), plain.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=0, atol=0, msg=name)
    assert any("the parameters hold gradients (accumulating over passes, e.g. --update-freq > 1)"
               in r.getMessage() for r in caplog.records)
    graphed.zero_grad(set_to_none=True)  # the next update replays again
    graphed(batches[0])
    assert stand_in[0].replays == 2


def test_evaluation_decoding_and_observed_passes_never_replay(stand_in):
    graphed, _ = twins()
    tokens = torch.randint(4, 20, (2, 8))
    graphed(tokens)  # captures, then replays
    graphed.eval()
    graphed(tokens)
    assert_lm_incremental_equals_full_forward(graphed, tokens, atol=1e-6)
    graphed.train()
    handle = graphed.decoder.depth.observe(lambda view, block, where: None)
    graphed(tokens)  # an observer is Python a replayed graph would not call
    handle.remove()
    assert stand_in[0].replays == 1
    graphed(tokens)
    assert stand_in[0].replays == 2
    # a copy of the model (fairseq's EMA, for one) starts uncaptured
    copied = copy.deepcopy(graphed)
    assert copied.decoder.cuda_graph.graphed is None and graphed.decoder.cuda_graph.graphed


def test_shapes_that_change_from_batch_to_batch_are_refused_at_build_time():
    with pytest.raises(OptionError, match="--cuda-graph needs static shapes: --sample-break-mode "
                                         "none or --pad-to-fixed-length"):
        build_language_model("gpt_baseline_lm_tiny", ["--cuda-graph", "--sample-break-mode",
                                                      "eos"])
    # padded to the full length, the shapes are static again
    build_language_model("gpt_baseline_lm_tiny", ["--cuda-graph", "--sample-break-mode", "eos",
                                                  "--pad-to-fixed-length"])
    with pytest.raises(OptionError, match="--cuda-graph with --log-layer-weights"):
        build_language_model("gpt_baseline_lm_tiny", ["--cuda-graph", "--log-layer-weights"])


def test_hydra_refuses_the_same_and_builds_the_same():
    task = make_task(parse("gpt_baseline_lm_tiny", {}))
    with pytest.raises(Exception, match="--cuda-graph needs static shapes"):
        build(task, hydra_model_config("gpt_baseline_lm_tiny", {"cuda_graph": True},
                                       task_values={"sample_break_mode": "eos"}))
    model = build(task, hydra_model_config("gpt_baseline_lm_tiny", {"cuda_graph": True}))
    assert model.decoder.cuda_graph is not None
    assert build(task, hydra_model_config("gpt_baseline_lm_tiny", {})).decoder.cuda_graph is None
