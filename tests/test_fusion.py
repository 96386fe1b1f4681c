import pytest
import torch

from conftest import run_cli, train
from helpers import (PLUGIN_DIR, assert_batch_equals_one_by_one, build_translation_model, incremental_decode,
                     make_dict, random_batch)


def _copy_shared_weights(src_model, dst_model):
    """Load every parameter of ``src_model`` into ``dst_model``; return the keys only dst has."""
    missing, unexpected = dst_model.load_state_dict(src_model.state_dict(), strict=False)
    assert unexpected == []
    return missing


def _randomise_layer_norms(model, seed=1):
    g = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        if "layer_norm" in name:
            p.data.copy_(torch.randn(p.shape, generator=g) * 0.3 + (1.0 if "weight" in name else 0))


@pytest.mark.parametrize("normalize_before", [True, False])
def test_zero_fusion_output_equals_transformer(normalize_before):
    extra = ["--encoder-normalize-before", "--decoder-normalize-before"] if normalize_before else []
    base, task, _ = build_translation_model("transformer_tiny", extra, seed=3)
    fused, _, _ = build_translation_model("fusion_transformer_tiny", extra,
                                          task.source_dictionary, task.target_dictionary, seed=4)
    if normalize_before:
        # pre-norm: a zero fuse output is an exact identity, whatever the LayerNorms hold
        _randomise_layer_norms(base)
    missing = _copy_shared_weights(base, fused)
    assert missing and all(".fuse_attn" in k for k in missing)
    src, lengths, prev = random_batch(task.source_dictionary, task.target_dictionary)
    base.eval(), fused.eval()
    out_base, _ = base(src, lengths, prev)
    out_fused, _ = fused(src, lengths, prev)
    assert (out_base - out_fused).abs().max() > 1e-3  # the fusion sub-layers do contribute

    for name, p in fused.named_parameters():
        if "fuse_attn.attn.out_proj" in name:
            p.data.zero_()
    out_fused, _ = fused(src, lengths, prev)
    # post-norm adds LN(LN(x)) with a fresh LN (weight 1, bias 0): identity up to LN's eps
    tol = 1e-6 if normalize_before else 1e-4
    assert (out_base - out_fused).abs().max() < tol


@pytest.mark.parametrize("arch", ["fusion_transformer_tiny", "fusion_enc_transformer_tiny",
                                  "fusion_dec_transformer_tiny"])
@pytest.mark.parametrize("extra", [[], ["--encoder-normalize-before", "--decoder-normalize-before"],
                                   ["--fusion-layers", "1", "--no-fusion-include-embedding"]])
def test_incremental_equals_full_forward(arch, extra):
    model, task, _ = build_translation_model(arch, extra)
    model.eval()
    src, lengths, prev = random_batch(task.source_dictionary, task.target_dictionary, tgt_len=9)
    full, _ = model(src, lengths, prev)
    inc = incremental_decode(model, src, lengths, prev)
    assert (full - inc).abs().max() < 1e-5


def test_beam_search_batch_equals_one_by_one():
    torch.manual_seed(0)
    model, task, _ = build_translation_model("fusion_transformer_tiny")
    model.eval()
    src, lengths, _ = random_batch(task.source_dictionary, task.target_dictionary, bsz=3)
    assert_batch_equals_one_by_one(model, task, src, lengths, beam=4)


def _param_count(model):
    return sum(p.numel() for p in model.parameters())


def test_parameter_count_matches_paper_formula():
    src, tgt = make_dict(30, "s"), make_dict(30, "t")
    base, _, _ = build_translation_model("transformer", [], src, tgt)
    fused, _, _ = build_translation_model("fusion_transformer", [], src, tgt)
    d = 512
    assert _param_count(fused) - _param_count(base) == 12 * (4 * d * d + 6 * d) == 12_619_776


def test_fusion_layers_and_embedding_switches():
    model, _, _ = build_translation_model(
        "fusion_enc_transformer_tiny",
        ["--encoder-layers", "4", "--fusion-layers", "1,3", "--no-fusion-include-embedding"])
    has_fuse = [layer.fuse_attn is not None for layer in model.encoder.layers]
    assert has_fuse == [False, True, False, True]
    assert all(not hasattr(layer, "fuse_attn") for layer in model.decoder.layers)
    model.eval()
    model.record_fusion_weights()
    src, lengths, prev = random_batch(make_dict(20, "s"), make_dict(20, "t"))
    model(src, lengths, prev)
    weights = model.fusion_weights()["encoder"]
    # without h_0, layer 1 sees [h_1], layer 3 sees [h_1, h_2, h_3]
    assert sorted(weights) == [1, 3]
    assert weights[1].shape[-1] == 1 and weights[3].shape[-1] == 3


def test_fusion_weights_shape_and_normalisation():
    model, task, _ = build_translation_model("fusion_transformer_tiny")
    model.eval()
    src, lengths, prev = random_batch(task.source_dictionary, task.target_dictionary, bsz=2,
                                      src_len=5, tgt_len=4)
    model(src, lengths, prev)
    assert model.fusion_weights() == {"encoder": {}, "decoder": {}}  # nothing kept by default
    model.record_fusion_weights()
    model(src, lengths, prev)
    w = model.fusion_weights()
    for layer in (0, 1):
        enc, dec = w["encoder"][layer], w["decoder"][layer]
        assert enc.shape == (2, 2, 5, layer + 1)  # B x H x T x (h_0 .. h_layer)
        assert dec.shape == (2, 2, 4, layer + 1)
        torch.testing.assert_close(enc.sum(-1), torch.ones(2, 2, 5))
    model.record_fusion_weights(False)
    model(src, lengths, prev)
    assert model.fusion_weights() == {"encoder": {}, "decoder": {}}


@pytest.mark.parametrize("extra,message", [
    (["--fusion-heads", "3"], "--fusion-heads=3 must divide --encoder-embed-dim=64"),
    (["--fusion-layers", "2"], "--fusion-layers index 2 is out of range for the encoder"),
    (["--fusion-layers", "0", "--no-fusion-include-embedding"], "index 0 is out of range"),
    (["--fusion-layers", "a,b"], "--fusion-layers must be comma-separated"),
    (["--encoder-layers", "1"], "--encoder-fusion needs at least 2 encoder layers"),
    (["--decoder-layers", "1"], "--decoder-fusion needs at least 2 decoder layers"),
    (["--checkpoint-activations"], "--checkpoint-activations is not supported"),
    (["--cross-self-attention"], "--cross-self-attention is not supported"),
])
def test_build_time_errors(extra, message):
    with pytest.raises(ValueError, match=message.replace("-", r"\-").replace(".", r"\.")):
        build_translation_model("fusion_transformer_tiny", extra)


def test_fusion_flags_without_fusion_are_rejected():
    with pytest.raises(ValueError, match="neither --encoder-fusion nor --decoder-fusion"):
        build_translation_model("layerwise_transformer", ["--fusion-heads", "4"])


def test_layerwise_transformer_without_features_is_fairseq_transformer():
    base, task, _ = build_translation_model("transformer_tiny", seed=5)
    plain, _, _ = build_translation_model(
        "layerwise_transformer",
        ["--encoder-embed-dim", "64", "--encoder-ffn-embed-dim", "64", "--encoder-layers", "2",
         "--encoder-attention-heads", "2", "--decoder-layers", "2",
         "--decoder-attention-heads", "2"], task.source_dictionary, task.target_dictionary)
    assert plain.state_dict().keys() == base.state_dict().keys()
    plain.load_state_dict(base.state_dict())
    src, lengths, prev = random_batch(task.source_dictionary, task.target_dictionary)
    base.eval(), plain.eval()
    assert torch.equal(base(src, lengths, prev)[0], plain(src, lengths, prev)[0])


def test_layer_called_outside_stack_is_a_clear_error():
    model, _, _ = build_translation_model("fusion_transformer_tiny")
    with pytest.raises(TypeError, match="call the encoder/decoder"):
        model.encoder.layers[0](torch.zeros(3, 2, 64), model.encoder.depth, None)
    with pytest.raises(TypeError, match="call the encoder/decoder"):
        model.decoder.layers[0](torch.zeros(3, 2, 64), model.decoder.depth)


@pytest.mark.parametrize("depth", [1, 2, 3, 6])
def test_fuse_attention_equals_multihead_attention_over_depth(depth):
    """Both computation paths are the MHA over [h_0..h_l] that the LRF paper defines: values and grads."""
    from fairseq_plugins.depth.lrf import FuseAttention

    torch.manual_seed(depth)
    d, heads, T, B = 32, 4, 5, 3
    fuse = FuseAttention(d, heads).double()
    for p in fuse.parameters():  # non-zero biases so the bias algebra is exercised
        p.data.normal_(0, 0.3)
    assert fuse.use_absorbed(depth) == (depth >= 2)
    query = torch.randn(T, B, d, dtype=torch.double, requires_grad=True)
    history = [torch.randn(T, B, d, dtype=torch.double, requires_grad=True) for _ in range(depth)]

    inputs = [query, *history, *fuse.parameters()]

    def gradients(output):
        # the absorbed path never reads the key bias (the softmax cancels it): None means zero
        grads = torch.autograd.grad(output.square().sum(), inputs, allow_unused=True)
        return [torch.zeros_like(x) if g is None else g for g, x in zip(grads, inputs)]

    out, _ = fuse(query, history)
    grads = gradients(out)

    kv = torch.stack(history, 0).reshape(depth, T * B, d)
    ref, _ = fuse.attn(query=query.reshape(1, T * B, d), key=kv, value=kv, need_weights=False)
    ref = ref.view(T, B, d)
    ref_grads = gradients(ref)
    torch.testing.assert_close(out, ref)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r)


def test_quant_noise_is_rejected_with_fusion():
    with pytest.raises(ValueError, match="--quant-noise-pq is not supported"):
        build_translation_model("fusion_transformer_tiny", ["--quant-noise-pq", "0.1"])


# -- the all-positions reading (--fusion-reading all-positions) ------------------------------------
ALL_POSITIONS = ["--fusion-reading", "all-positions"]


def _naive_all_positions(fuse, query, history, padding=None, causal=False):
    """Query position t, every head, over the keys (s, j) of every position s (<= t if causal,
    not padded) of every state j: written out with explicit projections and a loop over t."""
    a, heads = fuse.attn, fuse.num_heads
    T, B, C = query.shape
    hd = C // heads
    states = torch.stack(history)  # L x S x B x C
    q = (a.q_proj(query) * a.scaling).view(T, B, heads, hd)
    k = a.k_proj(states).view(*states.shape[:3], heads, hd)
    v = a.v_proj(states).view(*states.shape[:3], heads, hd)
    out = torch.zeros(T, B, heads, hd, dtype=query.dtype)
    for t in range(T):
        scores = torch.einsum("bhd,lsbhd->bhls", q[t], k)
        allowed = torch.ones(B, 1, 1, states.size(1), dtype=torch.bool)
        if causal:
            allowed[..., t + 1:] = False
        if padding is not None:
            allowed = allowed & ~padding[:, None, None, :]
        scores = scores.masked_fill(~allowed, float("-inf"))
        p = torch.softmax(scores.flatten(2), -1).view_as(scores)
        out[t] = torch.einsum("bhls,lsbhd->bhd", p, v)
    return a.out_proj(out.reshape(T, B, C))


@pytest.mark.parametrize("causal", [False, True])
def test_all_positions_reading_is_attention_over_every_position_of_every_state(causal):
    from fairseq_plugins.depth.lrf import FuseAttention

    torch.manual_seed(0)
    fuse = FuseAttention(16, 4, reading="all-positions").double().eval()
    for p in fuse.parameters():
        p.data.normal_(0, 0.3)
    T, B = 5, 3
    query = torch.randn(T, B, 16, dtype=torch.double)
    history = [torch.randn(T, B, 16, dtype=torch.double) for _ in range(3)]
    padding = torch.zeros(B, T, dtype=torch.bool)
    padding[2, -2:] = True  # a shorter last sequence (right-padded)
    with torch.no_grad():
        out, _ = fuse(query, history, key_padding_mask=padding, causal=causal)
        expected = _naive_all_positions(fuse, query, history, padding, causal)
    torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-10)
    # the per-token reading of the same module is another function
    fuse.reading = "per-token"
    with torch.no_grad():
        assert (fuse(query, history)[0] - out).abs().max() > 1e-3


@pytest.mark.parametrize("arch", ["fusion_transformer_tiny", "fusion_dec_transformer_tiny"])
@pytest.mark.parametrize("extra", [[], ["--encoder-normalize-before", "--decoder-normalize-before"]])
def test_all_positions_incremental_equals_full_forward_and_beam(arch, extra):
    model, task, _ = build_translation_model(arch, ALL_POSITIONS + extra, seed=2)
    model.double().eval()
    assert all(layer.fuse_attn.reading == "all-positions" for layer in model.decoder.layers)
    src, lengths, prev = random_batch(task.source_dictionary, task.target_dictionary, tgt_len=9)
    with torch.no_grad():
        full, _ = model(src, lengths, prev)
        torch.testing.assert_close(incremental_decode(model, src, lengths, prev), full,
                                   rtol=0, atol=1e-6)  # fairseq's float32 positions
    assert_batch_equals_one_by_one(model.float(), task, src, lengths, beam=3)


def test_all_positions_decoder_is_causal_and_encoder_reads_the_whole_source():
    model, task, _ = build_translation_model("fusion_transformer_tiny", ALL_POSITIONS, seed=2)
    model.eval()
    src, lengths, prev = random_batch(task.source_dictionary, task.target_dictionary, tgt_len=9)
    changed = prev.clone()
    changed[:, 6] = (prev[:, 6] + 1 - task.target_dictionary.nspecial) % (
        len(task.target_dictionary) - task.target_dictionary.nspecial) + \
        task.target_dictionary.nspecial
    with torch.no_grad():
        a, b = model(src, lengths, prev)[0], model(src, lengths, changed)[0]
        assert torch.equal(a[:, :6], b[:, :6]) and not torch.equal(a[:, 6:], b[:, 6:])
        # the encoder's last position reaches the first through the fuse-attention too
        enc = model.encoder(src, src_lengths=lengths)["encoder_out"][0]
        src2 = src.clone()
        src2[:, -2] = src[:, -3]
        enc2 = model.encoder(src2, src_lengths=lengths)["encoder_out"][0]
        assert (enc[0] - enc2[0]).abs().max() > 0


def test_all_positions_weights_are_per_state_and_sum_to_one():
    model, task, _ = build_translation_model("fusion_transformer_tiny", ALL_POSITIONS, seed=2)
    model.eval()
    model.record_fusion_weights()
    src, lengths, prev = random_batch(task.source_dictionary, task.target_dictionary)
    with torch.no_grad():
        expected = model(src, lengths, prev)[0]
        weights = model.fusion_weights()
        model.record_fusion_weights(False)  # the explicit path computes the fused path's output
        torch.testing.assert_close(model(src, lengths, prev)[0], expected)
    assert sorted(weights["encoder"]) == sorted(weights["decoder"]) == [0, 1]
    for side in ("encoder", "decoder"):
        for i, w in weights[side].items():
            assert w.shape == (3, 2, prev.size(1) if side == "decoder" else src.size(1), i + 1)
            torch.testing.assert_close(w.sum(-1), torch.ones_like(w.sum(-1)))


@pytest.mark.parametrize("extra,message", [
    (["--fusion-reading", "all-positions"], "neither --encoder-fusion nor --decoder-fusion"),
    (["--encoder-fusion", "--fusion-kind", "dwa", "--fusion-reading", "all-positions"],
     "--fusion-reading applies to --fusion-kind attention"),
])
def test_all_positions_build_time_errors(extra, message):
    with pytest.raises(ValueError, match=message):
        build_translation_model("layerwise_transformer_tiny", extra)


def test_all_positions_train_then_generate_with_only_the_user_dir(scan_bin):
    ckpt = train(scan_bin, "fusion_transformer_tiny", *ALL_POSITIONS, updates=10,
                 name="fusion-all-positions")
    out = run_cli("fairseq-generate", scan_bin / "bin", "--user-dir", PLUGIN_DIR, "--path", ckpt,
                  "--gen-subset", "valid", "--beam", "3", "--batch-size", "64",
                  "--required-batch-size-multiple", "1", "--max-len-b", "20")
    assert sum(line.startswith("H-") for line in out.splitlines()) == 200


# -- --fusion-recompute -------------------------------------------------------------------------
def _saved_bytes_and_grads(model, batch, seed=0):
    """A training forward + backward: bytes autograd kept for the backward pass, the output and
    every gradient."""
    saved = []

    def pack(t):
        saved.append(t.numel() * t.element_size())
        return t

    model.train()
    torch.manual_seed(seed)  # the same dropout masks
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = model(*batch)[0]
    out.float().pow(2).mean().backward()
    grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    return sum(saved), out.detach(), grads


@pytest.mark.parametrize("reading", ["per-token", "all-positions"])
def test_recompute_gives_the_same_values_and_gradients_and_keeps_less(reading):
    flags = ["--fusion-reading", reading, "--dropout", "0.1", "--attention-dropout", "0.1",
             "--encoder-layers", "4", "--decoder-layers", "4"]
    plain, task, _ = build_translation_model("fusion_transformer_tiny", flags, seed=1)
    recomputed, _, _ = build_translation_model("fusion_transformer_tiny",
                                               flags + ["--fusion-recompute"],
                                               task.source_dictionary, task.target_dictionary)
    recomputed.load_state_dict(plain.state_dict())
    assert all(layer.fuse_attn.recompute for layer in recomputed.encoder.layers)
    batch = random_batch(task.source_dictionary, task.target_dictionary)
    kept, out, grads = _saved_bytes_and_grads(plain, batch)
    kept_recomputed, out_r, grads_r = _saved_bytes_and_grads(recomputed, batch)
    assert torch.equal(out, out_r) and len(grads) == len(grads_r)
    assert all(torch.equal(a, b) for a, b in zip(grads, grads_r))
    assert kept_recomputed < 0.9 * kept, (kept_recomputed, kept)


def test_recompute_in_a_language_model_gives_the_same_gradients():
    from helpers import build_language_model
    flags = ["--tokens-per-sample", 16, "--decoder-fusion", "--dropout", "0.1"]
    plain, _, _ = build_language_model("gpt_baseline_lm_tiny", flags, seed=1)
    recomputed, _, _ = build_language_model("gpt_baseline_lm_tiny",
                                            flags + ["--fusion-recompute"], seed=2)
    recomputed.load_state_dict(plain.state_dict())
    tokens = torch.randint(4, 24, (3, 12), generator=torch.Generator().manual_seed(0))
    kept, out, grads = _saved_bytes_and_grads(plain, (tokens,))
    kept_r, out_r, grads_r = _saved_bytes_and_grads(recomputed, (tokens,))
    assert torch.equal(out, out_r) and all(torch.equal(a, b) for a, b in zip(grads, grads_r))
    assert kept_r < kept


@pytest.mark.parametrize("extra,message", [
    (["--fusion-recompute"], "neither --encoder-fusion nor --decoder-fusion"),
    (["--encoder-fusion", "--fusion-kind", "dwa", "--fusion-recompute"],
     "--fusion-recompute applies to --fusion-kind attention"),
])
def test_recompute_build_time_errors(extra, message):
    with pytest.raises(ValueError, match=message):
        build_translation_model("layerwise_transformer_tiny", extra)
