"""Swapped-role cross-attention variants (docs/ideas/cross-attention.md): causality, exactness, reordering."""
import pytest
import torch
from helpers import (assert_batch_equals_one_by_one, beam_search, build_translation_model,
                     incremental_decode, random_batch)

from fairseq_plugins.modules.causal_cross_attention import CausalCrossAttention
from fairseq_plugins.modules.decoder_values_cross_attention import DecoderValuesCrossAttention
from fairseq_plugins.modules.inverted_cross_attention import InvertedCrossAttention
from fairseq_plugins.modules.swapped_cross_attention import SwappedCrossAttention

VARIANTS = ["swapped", "inverted", "decoder_values"]
MODULES = {"swapped": SwappedCrossAttention, "inverted": InvertedCrossAttention,
           "decoder_values": DecoderValuesCrossAttention}


def _module(kind, dim=8, heads=2, seed=0, **kw):
    torch.manual_seed(seed)
    module = MODULES[kind](dim, heads, **kw).double().eval()
    with torch.no_grad():  # a non-zero sink, so that the tests see it
        module.sink.copy_(torch.linspace(-1.0, 1.0, heads))
    return module


def _reference(module, x, memory):
    """The variants' formulas, written out per target step t (float64, no tricks)."""
    heads, hd = module.num_heads, module.head_dim
    T, S = x.size(0), memory.size(0)
    split = lambda y: y.view(y.size(0), heads, hd).transpose(0, 1)  # noqa: E731  (L x C -> H x L x d)
    q, k = split(module.q_proj(x[:, 0]) * module.scaling), split(module.k_proj(memory[:, 0]))
    read = torch.softmax(q @ k.transpose(1, 2), dim=-1)  # H x T x S
    sink = module.sink[:, None, None]
    outs = []
    for t in range(T):
        if isinstance(module, InvertedCrossAttention):
            s = q @ k.transpose(1, 2)  # H x T x S
            norm = torch.logsumexp(torch.cat([sink.expand(-1, 1, S), s[:, :t + 1]], 1), 1)
            w = torch.softmax(s[:, t] - norm, dim=-1)  # H x S
            outs.append((w[:, None] @ split(module.v_proj(memory[:, 0])))[:, 0])
            continue
        p = split(module.source_query_proj(memory[:, 0]) * module.scaling)
        c, u = split(module.target_key_proj(x[:, 0])), split(module.target_value_proj(x[:, 0]))
        e = p @ c[:, :t + 1].transpose(1, 2)  # H x S x (t+1)
        a = torch.softmax(torch.cat([sink.expand(-1, S, 1), e], dim=-1), dim=-1)[..., 1:]
        slots = a @ u[:, :t + 1]  # H x S x d
        if module.source_values:
            slots = slots + split(module.v_proj(memory[:, 0]))
        outs.append((read[:, t:t + 1] @ slots)[:, 0])
    out = torch.stack(outs, 1).transpose(0, 1).reshape(T, 1, heads * hd)
    return module.out_proj(out)


@pytest.mark.parametrize("kind", VARIANTS)
@pytest.mark.parametrize("chunk", [1, 3, 64])
def test_module_equals_spec_formula(kind, chunk):
    kw = {} if kind == "inverted" else {"chunk_size": chunk}
    module = _module(kind, **kw)
    g = torch.Generator().manual_seed(1)
    x, memory = torch.randn(11, 1, 8, generator=g).double(), torch.randn(5, 1, 8, generator=g).double()
    out, _ = module(x, memory, memory)
    torch.testing.assert_close(out, _reference(module, x, memory), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("kind", VARIANTS)
def test_large_logits_over_long_targets_stay_finite_and_exact(kind):
    """Logits of +-1e3 over 300 target positions: a stabiliser taken only over the past (and the
    convex slot recurrence) keeps everything finite, and still equal to the formula."""
    kw = {} if kind == "inverted" else {"chunk_size": 16}
    module = _module(kind, **kw)
    with torch.no_grad():
        for name in ("q_proj", "target_key_proj"):
            if hasattr(module, name):
                getattr(module, name).weight.mul_(300.0)
    g = torch.Generator().manual_seed(2)
    x = torch.randn(300, 1, 8, generator=g).double().requires_grad_()
    memory = torch.randn(7, 1, 8, generator=g).double()
    out, _ = module(x, memory, memory)
    out.float().sum().backward()
    assert torch.isfinite(out).all() and torch.isfinite(x.grad).all()
    torch.testing.assert_close(out, _reference(module, x.detach(), memory), rtol=1e-8, atol=1e-8)


@pytest.mark.parametrize("kind", VARIANTS)
def test_jacobian_is_zero_for_future_positions(kind):
    kw = {} if kind == "inverted" else {"chunk_size": 4}
    module = _module(kind, **kw)
    g = torch.Generator().manual_seed(3)
    x, memory = torch.randn(9, 1, 8, generator=g).double(), torch.randn(5, 1, 8, generator=g).double()
    jac = torch.autograd.functional.jacobian(lambda y: module(y, memory, memory)[0], x)
    jac = jac[:, 0, :, :, 0, :].abs().amax(dim=(1, 3))  # T (out) x T (in)
    assert torch.equal(jac.triu(1), torch.zeros_like(jac))
    # ... and the past does reach the output (through the target-axis normalisation)
    assert (jac.tril(-1).sum(1)[1:] > 0).all()


@pytest.mark.parametrize("kind", VARIANTS)
def test_model_outputs_ignore_future_target_tokens(kind):
    model, task, _ = build_translation_model(f"{kind}_transformer_tiny",
                                             ["--cross-attention-chunk-size", "3"])
    model = model.double().eval()
    src, lengths, prev = random_batch(task.source_dictionary, task.target_dictionary, tgt_len=10)
    base = model(src, lengths, prev)[0]
    for t in range(1, prev.size(1)):
        changed = prev.clone()
        changed[:, t:] = (changed[:, t:] + 1 - task.target_dictionary.nspecial) % 20 + 4
        out = model(src, lengths, changed)[0]
        assert torch.equal(out[:, :t], base[:, :t])
        assert not torch.equal(out[:, t], base[:, t])


def _standard_with_variant(kind, extra=()):
    base, task, _ = build_translation_model("transformer_tiny", seed=1)
    variant, _, _ = build_translation_model(f"{kind}_transformer_tiny", list(extra),
                                            task.source_dictionary, task.target_dictionary)
    # a standard checkpoint loads strictly: the variant's own parameters keep their init
    variant.load_state_dict(base.state_dict(), strict=True)
    return base.eval(), variant.eval(), task


def test_zero_initialised_swapped_equals_standard_exactly():
    """Bit-identical in float32 (fairseq's attention takes its softmax in float32 even for a
    float64 model, so float32 is where the two compute the same thing)."""
    base, swapped, task = _standard_with_variant("swapped", ["--cross-attention-zero-init"])
    src, lengths, prev = random_batch(task.source_dictionary, task.target_dictionary, tgt_len=9)
    expected = base(src, lengths, prev)[0]
    assert torch.equal(swapped(src, lengths, prev)[0], expected)
    with torch.no_grad():  # the decoder values are really in the path
        weight = swapped.decoder.layers[0].encoder_attn.target_value_proj.weight
        weight.add_(0.1 * torch.randn(weight.shape, generator=torch.Generator().manual_seed(0)))
    assert (swapped(src, lengths, prev)[0] - expected).abs().max() > 1e-4


def test_variants_without_zero_init_differ_from_standard():
    for kind in VARIANTS:
        base, variant, task = _standard_with_variant(kind)
        src, lengths, prev = random_batch(task.source_dictionary, task.target_dictionary)
        assert (variant(src, lengths, prev)[0] - base(src, lengths, prev)[0]).abs().max() > 1e-4


@pytest.mark.parametrize("kind", VARIANTS)
@pytest.mark.parametrize("chunk", ["2", "16"])
def test_incremental_equals_full_forward(kind, chunk):
    model, task, _ = build_translation_model(f"{kind}_transformer_tiny",
                                             ["--cross-attention-chunk-size", chunk])
    model = model.double().eval()
    src, lengths, prev = random_batch(task.source_dictionary, task.target_dictionary, tgt_len=9)
    with torch.no_grad():  # fairseq's own self-attention softmax is float32 even here
        torch.testing.assert_close(incremental_decode(model, src, lengths, prev),
                                   model(src, lengths, prev)[0], rtol=1e-6, atol=1e-6)


def _rescore(model, src, lengths, hypos, eos):
    """Per-token log-probabilities of finished hypotheses by one full forward each."""
    diffs = []
    for i, sent in enumerate(hypos):
        n = int(lengths[i])
        for hyp in sent:
            tokens = hyp["tokens"]
            prev = torch.cat([tokens.new_tensor([eos]), tokens[:-1]])[None]
            lprobs = model.get_normalized_probs(model(src[i:i + 1, -n:], lengths[i:i + 1], prev),
                                                log_probs=True)[0]
            scores = lprobs.gather(-1, tokens[:, None])[:, 0]
            diffs.append((scores - hyp["positional_scores"]).abs().max().item())
    return max(diffs)


@pytest.mark.parametrize("kind", VARIANTS)
def test_beam_search_reorders_the_per_hypothesis_state(kind, monkeypatch):
    model, task, _ = build_translation_model(f"{kind}_transformer_tiny", seed=3)
    model.eval()
    src, lengths, _ = random_batch(task.source_dictionary, task.target_dictionary, bsz=3)
    eos = task.target_dictionary.eos()
    with torch.no_grad():
        hypos = beam_search(model, task, src, lengths, beam=4, max_len_b=10)
        assert _rescore(model, src, lengths, hypos, eos) < 1e-4
        assert_batch_equals_one_by_one(model, task, src, lengths)

        # the same search with the per-hypothesis state left in place (fairseq's behaviour for
        # encoder-decoder attention) no longer matches the full forward
        original = CausalCrossAttention.reorder_incremental_state

        def reorder_source_only(self, incremental_state, new_order):
            buffer = self._get_input_buffer(incremental_state)
            kept = {k: buffer[k] for k in self.causal_state_keys if k in buffer}
            original(self, incremental_state, new_order)
            buffer = self._get_input_buffer(incremental_state)
            buffer.update(kept)
            self._set_input_buffer(incremental_state, buffer)
            return incremental_state

        monkeypatch.setattr(CausalCrossAttention, "reorder_incremental_state", reorder_source_only)
        broken = beam_search(model, task, src, lengths, beam=4, max_len_b=10)
        assert _rescore(model, src, lengths, broken, eos) > 1e-3


def test_beam_search_projects_each_source_once_per_sentence():
    """fairseq's generator passes the beam size on: the source projections are computed for
    the 3 sentences, not for their 3 x 4 hypotheses."""
    model, task, _ = build_translation_model("swapped_transformer_tiny", seed=3)
    model.eval()
    rows = []
    layer = model.decoder.layers[0].encoder_attn
    layer.source_query_proj.register_forward_hook(lambda m, i, o: rows.append(i[0].size(1)))
    src, lengths, _ = random_batch(task.source_dictionary, task.target_dictionary, bsz=3)
    with torch.no_grad():
        beam_search(model, task, src, lengths, beam=4, max_len_b=10)
    assert rows == [3]


def test_reorder_keeps_shared_source_rows_and_follows_shrinking_batches():
    module = _module("swapped", dim=8, heads=2).eval()
    module.set_beam_size(3)
    g = torch.Generator().manual_seed(0)
    memory = torch.randn(5, 2, 8, generator=g).double().repeat_interleave(3, dim=1)  # 2 x 3 beams
    state = {}
    with torch.no_grad():
        module(torch.randn(1, 6, 8, generator=g).double(), memory, memory, incremental_state=state)
    key = module._get_input_buffer(state)["prev_key"]
    assert key.size(0) == 2
    module.reorder_incremental_state(state, torch.tensor([2, 2, 0, 3, 5, 4]))  # a beam step
    assert module._get_input_buffer(state)["prev_key"] is key
    module.reorder_incremental_state(state, torch.tensor([4, 3, 3]))  # sentence 0 finished
    assert torch.equal(module._get_input_buffer(state)["prev_key"], key[1:])
    assert module._get_input_buffer(state)["slot_update"].size(0) == 3


@pytest.mark.parametrize("kind", VARIANTS)
def test_left_and_right_padded_targets_agree(kind):
    model, task, _ = build_translation_model(f"{kind}_transformer_tiny",
                                             ["--cross-attention-chunk-size", "2"])
    model = model.double().eval()
    pad = task.target_dictionary.pad()
    src, lengths, prev = random_batch(task.source_dictionary, task.target_dictionary, bsz=2)
    right = prev.clone()
    right[1, 4:] = pad
    left = torch.full_like(prev, pad)
    left[0], left[1, 2:] = prev[0], prev[1, :4]
    a, b = model(src, lengths, right)[0], model(src, lengths, left)[0]
    torch.testing.assert_close(a[0], b[0], rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(a[1, :4], b[1, 2:], rtol=1e-10, atol=1e-10)


def test_decoder_values_carry_at_most_h_directions_at_position_0():
    """Position 0's output over many different sources spans <= H directions for decoder-values
    (H scalars of source information), but the full width for the variants with source values."""
    g = torch.Generator().manual_seed(4)
    x0 = torch.randn(1, 1, 16, generator=g).double()
    sources = [torch.randn(6, 1, 16, generator=g).double() for _ in range(40)]
    ranks = {}
    for kind in VARIANTS:
        module = _module(kind, dim=16, heads=2)
        with torch.no_grad():
            outs = torch.stack([module(x0, m, m)[0][0, 0] - module.out_proj.bias for m in sources])
        ranks[kind] = torch.linalg.matrix_rank(outs, rtol=1e-9).item()
    assert ranks["decoder_values"] <= 2
    assert ranks["swapped"] == ranks["inverted"] == 16


def test_cross_attention_layers_and_weights_for_alignment():
    model, task, _ = build_translation_model("swapped_transformer_tiny",
                                             ["--decoder-layers", "3", "--cross-attention-layers",
                                              "0,2"])
    kinds = [type(layer.encoder_attn).__name__ for layer in model.decoder.layers]
    assert kinds == ["SwappedCrossAttention", "MultiheadAttention", "SwappedCrossAttention"]
    model.eval()
    src, lengths, prev = random_batch(task.source_dictionary, task.target_dictionary)
    _, extra = model.decoder(prev, model.encoder(src, src_lengths=lengths), alignment_layer=2)
    attn = extra["attn"][0]  # B x T x S, as fairseq-generate --print-alignment reads it
    assert attn.shape == (src.size(0), prev.size(1), src.size(1))
    torch.testing.assert_close(attn.sum(-1), torch.ones(attn.shape[:2]))
    assert (attn[-1, :, :2] == 0).all()  # the padded source positions get no weight


@pytest.mark.parametrize("arch,extra,message", [
    ("swapped_transformer_tiny", ["--cross-attention-layers", "5"], "out of range"),
    ("inverted_transformer_tiny", ["--cross-attention-zero-init"], "swapped only"),
    ("decoder_values_transformer_tiny", ["--cross-attention-zero-init"], "swapped only"),
    ("layerwise_transformer", ["--cross-attention-layers", "0"], "standard"),
    ("swapped_transformer_tiny", ["--cross-attention-chunk-size", "0"], "chunk-size"),
    ("swapped_transformer_tiny", ["--quant-noise-pq", "0.1"], "quant-noise-pq"),
    ("inverted_transformer_tiny", ["--cross-self-attention"], "cross-self-attention"),
])
def test_build_time_errors(arch, extra, message):
    with pytest.raises(ValueError, match=message):
        build_translation_model(arch, extra)


def test_standard_checkpoint_finetunes_into_swapped_in_fairseq_train(scan_bin, tmp_path):
    """--finetune-from-model a standard checkpoint with --cross-attention swapped: the new
    parameters are filled in (zero-init: the first validation loss equals the standard one)."""
    from conftest import train
    standard = train(scan_bin, "layerwise_transformer", "--encoder-layers", "2", "--decoder-layers",
                     "2", "--encoder-embed-dim", "32", "--decoder-embed-dim", "32",
                     updates=5, name="xattn-standard")
    tuned = train(scan_bin, "layerwise_transformer", "--encoder-layers", "2", "--decoder-layers",
                  "2", "--encoder-embed-dim", "32", "--decoder-embed-dim", "32",
                  "--cross-attention", "swapped", "--cross-attention-zero-init",
                  "--finetune-from-model", standard, "--lr", "1e-9", updates=1,
                  name="xattn-swapped")
    import re
    loss = lambda path: re.findall(r"valid on 'valid' subset \| loss ([0-9.]+)",  # noqa: E731
                                   (path.parent / "train.log").read_text())
    assert loss(tuned)[0] == loss(standard)[-1]


def test_generate_with_print_alignment_end_to_end(scan_bin):
    """fairseq-train / fairseq-generate --print-alignment with a variant in the alignment layer."""
    from conftest import run_cli, train
    from helpers import PLUGIN_DIR
    ckpt = train(scan_bin, "inverted_transformer_tiny", updates=5, name="xattn-inverted")
    out = run_cli("fairseq-generate", scan_bin / "bin", "--user-dir", PLUGIN_DIR, "--path", ckpt,
                  "--gen-subset", "valid", "--beam", "3", "--batch-size", "16",
                  "--max-len-b", "12", "--print-alignment", "--num-workers", "0",
                  "--max-sentences", "16")
    alignments = [line for line in out.splitlines() if line.startswith("A-")]
    assert len(alignments) == 200
    # every alignment pair is "source-target" with a source index inside the sentence
    assert all("-" in pair for line in alignments for pair in line.split("\t")[1].split())
