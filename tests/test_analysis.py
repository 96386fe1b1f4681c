"""The layer analysis (fairseq_plugins/analysis, scripts/analyze_layers.py)."""
import json
import math
import os

import pytest
import torch
from conftest import run_script, train
from helpers import (REPO, SCRIPTS, build_language_model, build_translation_model,
                     make_dict, random_batch)

from fairseq_plugins.analysis.cka import CKAAccumulator, all_pairs, linear_cka
from fairseq_plugins.analysis.layers import LayerAnalysis, decoder_head, entropy
from fairseq_plugins.analysis.updates import UpdateRecorder, check_complete


def _features(n, d, seed):
    return torch.randn(n, d, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def test_cka_of_a_representation_with_itself_is_one():
    x = _features(200, 16, 0)
    assert linear_cka(x, x) == pytest.approx(1.0, abs=1e-12)


def test_cka_is_invariant_to_orthogonal_transforms_and_isotropic_scaling():
    x, y = _features(300, 12, 1), _features(300, 8, 2)
    y = y + x[:, :8] * 0.7  # related, so the value is neither 0 nor 1
    q, _ = torch.linalg.qr(_features(12, 12, 3))
    base = linear_cka(x, y)
    assert 0.1 < base < 0.9
    assert linear_cka(x @ q, y) == pytest.approx(base, abs=1e-10)
    assert linear_cka(3.5 * x, 0.2 * y) == pytest.approx(base, abs=1e-10)
    assert linear_cka(x + 5.0, y - 2.0) == pytest.approx(base, abs=1e-10)  # centred
    # a non-isotropic scaling is not an invariance: the test can tell
    assert abs(linear_cka(x * torch.linspace(0.1, 10, 12, dtype=torch.float64), y) - base) > 1e-3


def test_cka_of_independent_features_is_near_zero_for_many_items():
    small = linear_cka(_features(50, 10, 4), _features(50, 10, 5))
    large = linear_cka(_features(20000, 10, 4), _features(20000, 10, 5))
    assert large < 0.01 and large < small


def test_streamed_sums_equal_one_pass():
    xs = {f"l{i}": _features(240, 6 + i, 10 + i) for i in range(3)}
    xs["l2"][:, :6] += xs["l0"]
    pairs = all_pairs(sorted(xs))
    whole = CKAAccumulator(pairs)
    whole.add(xs)
    streamed = CKAAccumulator(pairs)
    for start in range(0, 240, 70):
        streamed.add({k: v[start:start + 70] for k, v in xs.items()})
    a, b = whole.cka(), streamed.cka()
    assert set(a) == set(pairs) and all(a[p] == pytest.approx(b[p], abs=1e-12) for p in pairs)
    assert a[("l0", "l0")] == pytest.approx(1.0) and a[("l0", "l2")] > a[("l0", "l1")]


# ---- the decomposition, the logit lens and the entropies on real models ----------------------
PRE_NORM = ["--encoder-normalize-before", "--decoder-normalize-before"]
SEQ2SEQ = {
    "transformer post-norm": ("transformer_tiny", []),
    "transformer pre-norm": ("transformer_tiny", PRE_NORM),
    "fusion pre-norm": ("fusion_transformer_tiny", PRE_NORM),
    "dwa": ("dwa_transformer_tiny", []),
    "bridge": ("bridge_transformer_tiny", ["--bridge-init", "random"]),
    "transparent": ("transparent_transformer_tiny", PRE_NORM),
    "swapped": ("swapped_transformer_tiny", []),
    "opus-mt": ("opus_mt_de_en", ["--encoder-layers", "2", "--decoder-layers", "2",
                                  "--encoder-embed-dim", "32", "--decoder-embed-dim", "32",
                                  "--encoder-ffn-embed-dim", "32",
                                  "--decoder-ffn-embed-dim", "32"]),
}
LMS = {"gpt_baseline_lm": ["--embed-dim", "32", "--layers", "2", "--attention-heads", "2"],
       "ar_encdec_lm": ["--embed-dim", "32", "--layers", "2", "--attention-heads", "2",
                        "--cross-attention-heads", "2", "--pos-embed-subtraction", "yes_ln"]}


def _randomise_constant_inits(model, seed=3):
    """DWA weights, transparent logits and Marian's output bias start as constants: draw them."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "depth.connection.averages." in name or name.endswith("bridge.weight"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
        bias = getattr(model.decoder, "final_logits_bias", None)
        if bias is not None:
            bias.copy_(torch.randn(bias.shape, generator=g))


def _seq2seq(family):
    arch, flags = SEQ2SEQ[family]
    shared = make_dict(20, "w") if arch.startswith("opus") else None  # opus-mt: one vocabulary
    model, task, _ = build_translation_model(arch, flags, shared, shared, seed=1)
    _randomise_constant_inits(model)
    model.eval()
    src, lengths, prev = random_batch(task.source_dictionary, task.target_dictionary, tgt_len=7)
    return model, task, src, lengths, prev


def test_uniform_attention_has_entropy_log_s():
    for s in (1, 5, 13):
        assert entropy(torch.full((3, s), 1.0 / s)).tolist() == pytest.approx([math.log(s)] * 3)
    assert entropy(torch.tensor([0.0, 1.0, 0.0])).item() == 0.0  # 0 log 0 = 0, one-hot: 0


@pytest.mark.parametrize("family", sorted(SEQ2SEQ))
def test_sublayer_updates_reproduce_each_layer_output(family):
    model, _, src, lengths, prev = _seq2seq(family)
    with torch.no_grad():
        with UpdateRecorder(model.encoder.layers, getattr(model.encoder, "depth", None)) as enc:
            encoder_out = model.encoder(src, src_lengths=lengths)
        with UpdateRecorder(model.decoder.layers, getattr(model.decoder, "depth", None)) as dec:
            model.decoder(prev, encoder_out=encoder_out)
    for recorder, n in ((enc, len(model.encoder.layers)), (dec, len(model.decoder.layers))):
        assert len(recorder.outputs) == n and check_complete(recorder, atol=1e-5) < 1e-5
    labels = set(dec.terms[0])
    assert {"self-attention", "cross-attention", "FFN"} <= labels
    post_norm = not model.decoder.layers[0].normalize_before
    assert any("LayerNorm" in t for t in labels) == post_norm
    assert ("depth average" in labels) == (family == "dwa")
    # a missing term is caught: the check can fail
    dropped = next(t for t in labels if t != "self-attention")
    del dec.terms[0][dropped]
    with pytest.raises(AssertionError, match="miss"):
        check_complete(dec)
    if getattr(model.encoder, "depth", None) is not None:  # its layers take the stack's state
        with pytest.raises(TypeError, match="pass the stack's depth"), torch.no_grad():
            with UpdateRecorder(model.encoder.layers):
                model.encoder(src, src_lengths=lengths)


def _analyse_lm(model, task):
    """The analysis of one batch of 2 x 9 random tokens (next-token targets; ``add`` checks the
    logit lens against the model's output)."""
    tokens = torch.randint(task.dictionary.nspecial, len(task.dictionary), (2, 9),
                           generator=torch.Generator().manual_seed(0))
    target = torch.cat([tokens[:, 1:], tokens[:, :1]], dim=1)
    analysis = LayerAnalysis(model, task.dictionary.pad())
    analysis.add({"net_input": {"src_tokens": tokens}, "target": target})
    return analysis.result()


@pytest.mark.parametrize("arch", sorted(LMS))
def test_language_model_blocks_decompose_and_their_lens_ends_at_the_output(arch):
    model, task, _ = build_language_model(arch, LMS[arch], seed=1)
    model.eval()
    result = _analyse_lm(model, task)
    assert result["update_decomposition_max_error"] < 1e-5
    assert len(result["logit_lens"]["accuracy"]) == len(model.decoder.layers) + 1
    assert set(result["updates"]["decoder"]["1"]) >= {"self-attention", "FFN"}


@pytest.mark.parametrize("arch,extra,additive", [
    ("gpt_baseline_lm", ["--decoder-fusion", "--fusion-kind", "dwa"], True),
    ("gpt_baseline_lm", ["--hyper-connections", "dynamic", "--value-residual", "learnable"], False),
    ("ar_encdec_lm", ["--mudd"], False),
    ("gpt_baseline_lm", ["--mhc", "sinkhorn"], False),
    ("ar_encdec_lm", ["--attn-res", "block", "--attn-res-blocks", "1"], False),
    ("gpt_baseline_lm", ["--frac-connections", "dynamic"], False),
])
def test_language_models_with_depth_connections_are_analysed(arch, extra, additive):
    model, task, _ = build_language_model(arch, LMS[arch] + extra, seed=1)
    with torch.no_grad():  # off the identity initialisation, so that the weights say something
        for name, p in model.named_parameters():
            if "depth." in name:
                p.add_(0.1 * torch.randn_like(p))
    model.eval()
    result = _analyse_lm(model, task)
    # additive connections decompose exactly; stream-mixing ones have nothing to check
    assert result["update_decomposition_max_error"] < 1e-5
    if additive:
        assert set(result["updates"]["decoder"]["2"]) >= {"self-attention", "FFN",
                                                          "depth average"}
    assert len(result["logit_lens"]["accuracy"]) == len(model.decoder.layers) + 1
    weights = result["layer_weights"]["depth_connections"]["decoder.depth"]
    assert weights and all(v == v for v in weights.values())
    if "--mhc" in extra:  # the static read and write weights, the mixing's diagonal
        assert {"connection.k0_pre0", "connection.k0_post0", "connection.k0_keep"} <= set(weights)
    if "--attn-res" in extra:  # the mean weight on every source, per sub-layer and the readout
        sites = len(model.decoder.depth.connection.sites)
        assert {"connection.k0_s0", f"connection.k{sites}_s0"} <= set(weights)
        readout = [v for k, v in weights.items() if k.startswith(f"connection.k{sites}_s")]
        assert sum(readout) == pytest.approx(1.0, abs=1e-5)


@pytest.mark.parametrize("family", sorted(SEQ2SEQ))
def test_last_layer_logit_lens_is_the_model_output(family):
    model, _, src, lengths, prev = _seq2seq(family)
    with torch.no_grad():
        logits, extra = model(src, lengths, prev)
        lens = decoder_head(model.decoder, extra["inner_states"][-1])
    assert torch.allclose(lens, logits, atol=1e-6)
    # and an earlier layer's is not (the lens really reads the layer it is given)
    assert not torch.allclose(decoder_head(model.decoder, extra["inner_states"][-2]), logits,
                              atol=1e-3)


def test_analysis_result_on_a_batch():
    model, task, src, lengths, prev = _seq2seq("transparent")
    target = torch.cat([prev[:, 1:], torch.full_like(prev[:, :1], task.target_dictionary.eos())],
                       dim=1)
    analysis = LayerAnalysis(model, task.target_dictionary.pad())
    sample = {"net_input": {"src_tokens": src, "src_lengths": lengths,
                            "prev_output_tokens": prev}, "target": target}
    analysis.add(sample)
    analysis.add(sample)
    r = analysis.result()
    n_enc, n_dec = len(model.encoder.layers) + 1, len(model.decoder.layers) + 1
    assert len(r["cka"]["encoder"]) == n_enc and len(r["cka"]["encoder_decoder"][0]) == n_dec
    assert all(r["cka"]["decoder"][i][i] == pytest.approx(1.0) for i in range(n_dec))
    heads = model.decoder.layers[0].encoder_attn.num_heads
    per_head = r["cross_attention_entropy"]["per_layer_and_head"]
    assert len(per_head) == n_dec - 1 and all(len(h) == heads for h in per_head.values())
    # entropies are at most log S of each sentence, whose mean is reported as "uniform"
    assert all(0 <= e <= r["cross_attention_entropy"]["uniform_mean"] + 1e-6
               for h in per_head.values() for e in h)
    weights = r["layer_weights"]["bridge"]["weights"]
    assert len(weights) == n_dec - 1 and all(sum(w) == pytest.approx(1.0) for w in weights)


FIXTURES = os.path.join(REPO, "tests", "fixtures")


@pytest.mark.parametrize("name", sorted(os.listdir(FIXTURES)))
def test_analysis_runs_on_every_stored_fixture(name):
    from fairseq import checkpoint_utils

    d = os.path.join(FIXTURES, name)
    models, _, task = checkpoint_utils.load_model_ensemble_and_task(
        [os.path.join(d, "checkpoint.pt")], arg_overrides={"data": d})
    model = models[0].eval()
    expected = torch.load(os.path.join(d, "expected.pt"))
    if "tokens" in expected:
        tokens = expected["tokens"]
        sample = {"net_input": {"src_tokens": tokens},
                  "target": torch.cat([tokens[:, 1:], tokens[:, :1]], dim=1)}
    else:
        prev = expected["prev_output_tokens"]
        sample = {"net_input": {"src_tokens": expected["src_tokens"],
                                "src_lengths": expected["src_lengths"],
                                "prev_output_tokens": prev},
                  "target": torch.cat([prev[:, 1:], prev[:, :1]], dim=1)}
    analysis = LayerAnalysis(model, task.target_dictionary.pad())
    analysis.add(sample)
    result = analysis.result()
    assert result["update_decomposition_max_error"] < 1e-4
    json.dumps(result)  # JSON-ready


def test_command_line_on_plain_fairseq_and_package_checkpoints(scan_bin, tmp_path):
    plain = train(scan_bin, "transformer_tiny", updates=10, name="analysis-plain")
    dwa = train(scan_bin, "dwa_transformer_tiny", updates=10, name="analysis-dwa")
    proc = run_script(os.path.join(SCRIPTS, "analyze_layers.py"), plain,
                      "--compare", dwa, "--data", scan_bin / "bin", "--subset", "valid",
                      "--max-sentences", "150", "--batch-size", "64", "--labels",
                      "transformer,dwa", "--out-dir", tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((tmp_path / "analysis.json").read_text())
    plain_r, dwa_r = report["analyses"]["transformer"], report["analyses"]["dwa"]
    assert plain_r["sentences"] == dwa_r["sentences"] == 150
    assert plain_r["target_tokens"] == dwa_r["target_tokens"] > 150  # the same sentences
    assert "depth_averages" in dwa_r["layer_weights"] and not plain_r["layer_weights"]
    assert report["peak_memory_mb"] > 0
    assert (tmp_path / "analysis.png").read_bytes()[:4] == b"\x89PNG"
    bad = run_script(os.path.join(SCRIPTS, "analyze_layers.py"),
                     tmp_path / "missing.pt", "--data", scan_bin / "bin")
    assert bad.returncode == 2 and bad.stderr.strip().count("\n") == 0


def test_fuse_attention_depth_weights_are_reported():
    model, task, src, lengths, prev = _seq2seq("fusion pre-norm")
    target = torch.cat([prev[:, 1:], torch.full_like(prev[:, :1], task.target_dictionary.eos())],
                       dim=1)
    analysis = LayerAnalysis(model, task.target_dictionary.pad())
    analysis.add({"net_input": {"src_tokens": src, "src_lengths": lengths,
                                "prev_output_tokens": prev}, "target": target})
    fused = analysis.result()["layer_weights"]["fuse_attention"]
    for side in ("encoder", "decoder"):
        weights = fused[side]
        assert sorted(weights) == ["1", "2"]  # both layers of the tiny stacks fuse
        # layer i attends over h_0 .. h_{i-1}: i states, a distribution over them
        assert [len(weights[i]) for i in ("1", "2")] == [1, 2]
        assert all(sum(w) == pytest.approx(1.0, abs=1e-5) for w in weights.values())


def test_bad_inputs_are_one_line_naming_the_file_and_nothing_is_written(tmp_path):
    """A wrong --data directory, dictionaries that do not match the checkpoint, a data directory
    of another kind, and a truncated checkpoint: each one line on stderr that names the file,
    exit status 2, no traceback, no output folder."""
    fixture = os.path.join(REPO, "tests", "fixtures", "fusion_transformer")
    checkpoint = os.path.join(fixture, "checkpoint.pt")
    other = tmp_path / "other-dicts"  # the fixture's dictionaries with fewer source words
    other.mkdir()
    src = open(os.path.join(fixture, "dict.src.txt")).read().splitlines()
    (other / "dict.src.txt").write_text("\n".join(src[:3]) + "\n")
    (other / "dict.tgt.txt").write_text(open(os.path.join(fixture, "dict.tgt.txt")).read())
    lm_kind = tmp_path / "lm-kind"  # a language-model data-bin: no dict.src.txt
    lm_kind.mkdir()
    (lm_kind / "dict.txt").write_text("a 1\n")
    truncated = tmp_path / "truncated.pt"
    truncated.write_bytes(open(checkpoint, "rb").read()[:20000])
    cases = [(checkpoint, tmp_path / "missing", "no such directory", "data"),
             (checkpoint, other, "its dictionaries do not match", "both"),
             (checkpoint, lm_kind, "was trained on?", "both"),
             (truncated, fixture, "not a readable fairseq checkpoint", "checkpoint")]
    for ckpt, data, what, names in cases:
        out = tmp_path / "out"
        proc = run_script(os.path.join(SCRIPTS, "analyze_layers.py"),
                          ckpt, "--data", data, "--out-dir", out)
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        assert proc.returncode == 2, proc.stderr
        assert "Traceback" not in proc.stderr
        assert lines[-1].startswith("analyze_layers.py: error: ") and what in lines[-1], lines
        named = {"data": [data], "checkpoint": [ckpt], "both": [data, ckpt]}[names]
        assert all(str(path) in lines[-1] for path in named), lines[-1]
        assert not out.exists()


def test_the_learned_weights_panel_reads_each_kind_of_layer_weights():
    from fairseq_plugins.analysis.figure import weights_panel

    dwa = {"depth_averages": {"decoder": {"1": {"states": [0, 1], "weights": [0.2, 0.8]},
                                          "2": {"states": [0, 1, 2], "weights": [0.1, 0.3, 0.6]}}}}
    assert weights_panel(dwa) == ("decoder DWA alphas", "matrix",
                                  [[0.2, 0.8, None], [0.1, 0.3, 0.6]])
    fuse = {"fuse_attention": {"encoder": {"2": [0.4, 0.6], "3": [0.1, 0.2, 0.7]}}}
    assert weights_panel(fuse) == ("encoder fuse-attention", "matrix",
                                   [[0.4, 0.6, None], [0.1, 0.2, 0.7]])
    hc = {"depth_connections": {"decoder.depth": {"connection.k0_read0": 1.0}}}
    assert weights_panel(hc) == ("decoder.depth: connection weights", "bars",
                                 {"connection.k0_read0": 1.0})
    assert weights_panel({}) is None
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from fairseq_plugins.analysis.figure import _layer_weights
    fig, axes = plt.subplots(1, 4)
    for ax, weights in zip(axes, (dwa, fuse, hc, {})):  # each kind draws (or says it has none)
        _layer_weights(ax, weights, "m")
    assert [ax.get_title() for ax in axes] == ["m: decoder DWA alphas", "m: encoder fuse-attention",
                                               "m: decoder.depth: connection weights",
                                               "m: learned layer weights"]
    assert len(axes[2].patches) == 1 and axes[0].images
    plt.close(fig)


@pytest.mark.parametrize("extra", [[], ["--fusion-reading", "all-positions"]])
def test_language_model_fuse_attention_weights_are_averaged_per_layer(extra):
    """ar_encdec_lm with LRF in both stacks: the analysis keeps every fusing block's mean weight
    per lower state (its own input last), each row a distribution; recording is off again."""
    model, task, _ = build_language_model(
        "ar_encdec_lm", LMS["ar_encdec_lm"] + ["--encoder-fusion", "--decoder-fusion", *extra],
        seed=1)
    model.eval()
    fused = _analyse_lm(model, task)["layer_weights"]["fuse_attention"]
    for side in ("encoder", "decoder"):
        assert sorted(fused[side]) == ["1", "2"]  # blocks 1 and 2 attend h_0.. and h_0, h_1
        assert [len(fused[side][k]) for k in ("1", "2")] == [1, 2]
        assert all(abs(sum(row) - 1) < 1e-5 for row in fused[side].values())
    assert not any(m.keep_weights for m in model.modules() if hasattr(m, "keep_weights"))
