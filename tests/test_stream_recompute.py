"""--stream-recompute (fairseq_plugins.depth.recompute): the multi-stream connections rebuild
the sub-layers' inputs and the streams inside a block in the backward pass. The same loss and
bitwise the same gradients as without it, in every family (blocks of two and of three
sub-layers) and under autocast; what it rebuilds is freed after the forward pass; the errors."""
import gc
import weakref

import pytest
import torch
from helpers import (build_language_model, build_translation_model, move_connections,
                     random_batch)

from fairseq_plugins.depth import recompute
from fairseq_plugins.depth.multi_stream import MultiStream

PRE_NORM = ["--encoder-normalize-before", "--decoder-normalize-before"]
CASES = {
    "gpt_hc_dynamic": ("gpt_baseline_lm_tiny", ["--hyper-connections", "dynamic"]),
    "gpt_hc_static": ("gpt_baseline_lm_tiny", ["--hyper-connections", "static"]),
    "gpt_mhc": ("gpt_baseline_lm_tiny", ["--mhc", "sinkhorn"]),
    "gpt_mhc_lite_learned": ("gpt_baseline_lm_tiny", ["--mhc", "lite", "--mhc-readout", "learned"]),
    "gpt_frac_dynamic": ("gpt_baseline_lm_tiny", ["--frac-connections", "dynamic"]),
    "gpt_frac_static": ("gpt_baseline_lm_tiny", ["--frac-connections", "static"]),
    # a decoder of three sub-layers per block (self, cross, FFN) and an encoder of two
    "ar_encdec_hc_dynamic": ("ar_encdec_lm_tiny", ["--hyper-connections", "dynamic"]),
    "ar_encdec_mhc": ("ar_encdec_lm_tiny", ["--mhc", "sinkhorn"]),
    "seq2seq_hc_dynamic": ("layerwise_transformer_tiny", PRE_NORM + ["--hyper-connections",
                                                                      "dynamic"]),
    "seq2seq_frac": ("layerwise_transformer_tiny", PRE_NORM + ["--frac-connections", "dynamic"]),
}


def _build(arch, extra):
    if arch.startswith("layerwise"):
        return build_translation_model(arch, extra, seed=1)
    return build_language_model(arch, ["--tokens-per-sample", 16, *extra], seed=1)


class _Counter:
    """Counts the tensors the backward pass rebuilds (each recipe computes once)."""

    def __init__(self, monkeypatch):
        self.computed = 0
        call = recompute._Recipe.__call__

        def counted(recipe):
            if recipe.value is None:
                self.computed += 1
            return call(recipe)

        monkeypatch.setattr(recompute._Recipe, "__call__", counted)


def _loss_and_grads(arch, extra, autocast=False):
    model, task, _ = _build(arch, extra)
    move_connections(model)
    model.train()  # dropout on: the same mask in both runs (the same seed before each)
    torch.manual_seed(5)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        if arch.startswith("layerwise"):
            src, lengths, prev = random_batch(task.source_dictionary, task.target_dictionary)
            logits = model(src, lengths, prev)[0]
        else:
            tokens = torch.randint(4, 24, (3, 13), generator=torch.Generator().manual_seed(0))
            logits = model(tokens[:, :-1])[0]
        loss = logits.float().log_softmax(-1).square().mean()
    loss.backward()
    stacks = [m for m in model.modules() if isinstance(m, MultiStream)]
    grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    return loss.detach(), grads, stacks


@pytest.mark.parametrize("name", sorted(CASES))
def test_same_gradients_bitwise_and_every_input_and_inner_stream_rebuilt(name, monkeypatch):
    arch, extra = CASES[name]
    loss, grads, stacks = _loss_and_grads(arch, extra)
    assert stacks and not any(s.recompute for s in stacks)
    counter = _Counter(monkeypatch)
    loss_r, grads_r, stacks_r = _loss_and_grads(arch, extra + ["--stream-recompute"])
    assert all(s.recompute for s in stacks_r)
    assert torch.equal(loss, loss_r)
    assert grads.keys() == grads_r.keys() and len(grads) > 10
    for key in grads:
        assert torch.equal(grads[key], grads_r[key]), key
    # every sub-layer's input, and the streams after every sub-layer but each block's last
    expected = sum(2 * len(block) - 1 for s in stacks_r for block in s.layout)
    assert counter.computed == expected


@pytest.mark.parametrize("name", ["gpt_hc_dynamic", "gpt_mhc", "ar_encdec_hc_dynamic"])
def test_same_gradients_under_bf16_autocast(name, monkeypatch):
    """The recipes replay under the forward pass's autocast state (a rebuilt bfloat16 tensor
    is rebuilt in bfloat16)."""
    arch, extra = CASES[name]
    loss, grads, _ = _loss_and_grads(arch, extra, autocast=True)
    counter = _Counter(monkeypatch)
    loss_r, grads_r, _ = _loss_and_grads(arch, extra + ["--stream-recompute"], autocast=True)
    assert counter.computed > 0
    assert torch.equal(loss, loss_r)
    for key in grads:
        assert torch.equal(grads[key], grads_r[key]), key


def test_a_rebuilt_tensor_is_freed_after_the_forward_pass_and_rebuilt_once():
    x = torch.randn(5, 8, requires_grad=True)
    norm = torch.nn.LayerNorm(8)
    calls = []

    def double(t):
        calls.append(1)
        return t * 2

    def forward(register):
        with register.hooks() if register else torch.enable_grad():
            y = x * 2
            z = y + 1
            if register:
                register.add(y, double, x)
                # a tensor rebuilt from a rebuilt one: its recipe holds y's recipe, not y
                register.add(z, lambda t: t + 1, y)
            # y saved as itself and as a view, z saved
            out = norm(y).sum() + norm(y.view(40).view(5, 8)).sum() + norm(z).sum()
        kept = weakref.ref(y), weakref.ref(z)
        del y, z
        gc.collect()
        return out, kept

    expected, kept = forward(None)
    assert all(ref() is not None for ref in kept)  # autograd keeps them
    (grad,) = torch.autograd.grad(expected, x)
    out, kept = forward(recompute.Recompute())
    assert all(ref() is None for ref in kept)  # nothing keeps them: autograd holds recipes
    assert not calls
    (rebuilt_grad,) = torch.autograd.grad(out, x)
    assert len(calls) == 1  # y: three savers (two directly, z's recipe), one rebuild
    assert torch.equal(rebuilt_grad, grad)


def test_the_register_and_its_recipes_die_with_the_graph():
    """The pack hook holds the register weakly: no register or recipe outlives a step."""
    model, _, _ = _build("gpt_baseline_lm_tiny", ["--mhc", "sinkhorn", "--stream-recompute"])
    tokens = torch.randint(4, 24, (2, 9))
    for _ in range(2):
        model(tokens)[0].sum().backward()
    gc.collect()
    assert not [o for o in gc.get_objects()
                if isinstance(o, (recompute.Recompute, recompute._Recipe))]


def test_nothing_is_registered_without_a_gradient():
    model, _, _ = _build("gpt_baseline_lm_tiny", ["--hyper-connections", "dynamic",
                                                   "--stream-recompute"])
    depth = model.decoder.depth
    stack = depth.connection
    x = torch.randn(4, 2, stack.reads * stack.width)
    with torch.no_grad():
        assert depth.start(x).slot(stack).recompute is None
    assert depth.start(x).slot(stack).recompute is not None  # with a gradient: the hooks' home


@pytest.mark.parametrize("arch,extra", [
    ("gpt_baseline_lm_tiny", ["--stream-recompute"]),
    ("gpt_baseline_lm_tiny", ["--attn-res", "full", "--stream-recompute"]),
    ("ar_encdec_lm_tiny", ["--mudd", "--stream-recompute"]),
    ("layerwise_transformer_tiny", PRE_NORM + ["--stream-recompute"]),
])
def test_without_a_multi_stream_method_it_is_a_build_time_error(arch, extra):
    with pytest.raises(ValueError, match="--stream-recompute rebuilds the streams of "
                                         "--hyper-connections, --mhc or --frac-connections"):
        _build(arch, extra)


@pytest.mark.parametrize("arch,values", [
    ("gpt_baseline_lm_mhc_tiny", {}), ("ar_encdec_lm_hyper_connections_tiny", {}),
    ("gpt_baseline_lm_tiny", {"frac_connections": "static"}),
    ("hyper_connections_transformer_tiny", {}),
])
def test_both_entry_points_turn_it_on(arch, values):
    """fairseq-train's flag and fairseq-hydra-train's model.stream_recompute (a plain getattr of
    an unset option would be None there: the option must resolve the same)."""
    from test_entry_points import build, hydra_model_config, make_task, parse

    for on in (False, True):
        settings = {**values, **({"stream_recompute": True} if on else {})}
        args = parse(arch, settings)
        task = make_task(args)
        for model in (build(task, args), build(task, hydra_model_config(arch, settings))):
            stacks = [m for m in model.modules() if isinstance(m, MultiStream)]
            assert stacks and all(s.recompute is on for s in stacks), (arch, on)
