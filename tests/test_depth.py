"""Depth connections (fairseq_plugins.depth) in the language models and in
``layerwise_transformer``: every method's identity setting, incremental decoding, beam search,
build-time errors, training through the CLIs."""
import pytest
import torch
from conftest import assert_lm_evaluates_and_generates, run_cli, train, train_lm
from helpers import (PLUGIN_DIR, assert_batch_equals_one_by_one,
                     assert_lm_beam_search_scores_equal_full_forward,
                     assert_lm_incremental_equals_full_forward,
                     build_language_model, build_translation_model, incremental_decode,
                     move_connections, random_batch)

from fairseq_plugins.depth.interface import Connection

LMS = ("gpt_baseline_lm_tiny", "ar_encdec_lm_tiny")
HC = {"static": ["--hyper-connections", "static"],
      "dynamic": ["--hyper-connections", "dynamic"],
      "dynamic_n2_sum": ["--hyper-connections", "dynamic", "--hc-expansion-rate", "2",
                         "--hc-readout", "sum"]}
MUDD = {"mudd": ["--mudd"], "mudd_r": ["--mudd", "--mudd-ways", "r"]}
MHC = {"mhc": ["--mhc", "sinkhorn"], "mhc_lite": ["--mhc", "lite"],
       "mhc_n2_zeros_sum": ["--mhc", "sinkhorn", "--mhc-expansion-rate", "2", "--mhc-init", "zeros",
                            "--mhc-readout", "sum", "--mhc-sinkhorn-iterations", "3"],
       "mhc_lite_mean": ["--mhc", "lite", "--mhc-expansion-rate", "3", "--mhc-readout", "mean"]}
FRAC = {"frac_static": ["--frac-connections", "static"],
        "frac_dynamic": ["--frac-connections", "dynamic"],
        "frac_m2": ["--frac-connections", "dynamic", "--frac-rate", "2"]}
ATTN_RES = {"attn_res": ["--attn-res", "full"],
            "attn_res_block": ["--attn-res", "block", "--attn-res-blocks", "2"],
            "attn_res_block1": ["--attn-res", "block", "--attn-res-blocks", "1"]}
VALUE = {"value_fixed": ["--value-residual", "fixed"],
         "value_learnable": ["--value-residual", "learnable"]}
LAUREL = {"laurel_rw": ["--laurel", "rw"], "laurel_lr": ["--laurel", "lr", "--laurel-rank", "4"],
          "laurel_rw_lr": ["--laurel", "rw_lr"], "laurel_pa": ["--laurel", "pa"],
          "laurel_rw_lr_pa": ["--laurel", "rw_lr_pa", "--laurel-lags", "2"]}


def fusion_flags(arch, *extra):
    stacks = ["--decoder-fusion"] + (["--encoder-fusion"] if arch.startswith("ar_") else [])
    return stacks + list(extra)


def methods(arch):
    """Every method (and a few compositions) as flags for ``arch``."""
    out = {**HC, **MUDD, **VALUE, **MHC, **FRAC, **ATTN_RES, **LAUREL,
           "dwa": fusion_flags(arch, "--fusion-kind", "dwa"),
           "dwa_dilated": fusion_flags(arch, "--fusion-kind", "dwa", "--dwa-dilation", "2"),
           "lrf": fusion_flags(arch),
           "lrf_all_positions": fusion_flags(arch, "--fusion-reading", "all-positions"),
           "hc_value": HC["dynamic"] + VALUE["value_learnable"],
           "mudd_value": MUDD["mudd"] + VALUE["value_fixed"],
           "mhc_value": MHC["mhc"] + VALUE["value_learnable"],
           "frac_value": FRAC["frac_dynamic"] + VALUE["value_fixed"],
           "attn_res_value": ATTN_RES["attn_res"] + VALUE["value_learnable"],
           "laurel_value": LAUREL["laurel_pa"] + VALUE["value_fixed"],
           "dwa_value": fusion_flags(arch, "--fusion-kind", "dwa") + VALUE["value_fixed"]}
    return out


CASES = [(arch, name) for arch in LMS for name in methods(arch)]


def _lm(arch, extra=(), seed=0, context=16):
    return build_language_model(arch, ["--tokens-per-sample", context, *extra], seed=seed)


def _tokens(bsz=3, length=12, seed=0):
    return torch.randint(4, 24, (bsz, length), generator=torch.Generator().manual_seed(seed))


def _with_plain_weights(arch, extra):
    """(plain model, model with ``extra``) in float64, the second holding the first's weights
    wherever their parameters coincide (the connections keep their initialisation)."""
    plain, _, _ = _lm(arch)
    model, _, _ = _lm(arch, extra, seed=1)
    added = sorted(set(model.state_dict()) - set(plain.state_dict()))
    model.load_state_dict({**model.state_dict(), **plain.state_dict()})
    return plain.double().eval(), model.double().eval(), added


# -- identity -----------------------------------------------------------------------------------
IDENTITY = {  # the methods whose published initialisation is the plain model, and how exactly
    "mudd_r": 0.0, "dwa": 0.0, "dwa_dilated": 0.0,
    # the query/key/value inputs projected by three GEMMs instead of the plain model's one
    # fused GEMM: the same products, summed in another order
    "mudd": 1e-13,
    "static": 1e-14, "dynamic": 1e-14,  # the mean of n equal streams: rounding of the mean only
    # the read weights sum to one and the readout is the mean up to the float32 rounding of the
    # biases (stored in float32 before the model is made float64: logit(1/12) is not exact)
    "mhc": 1e-8, "mhc_lite": 1e-8, "mhc_lite_mean": 1e-8,
    # identity read and mixing weights, write weights 1: the plain model bit for bit
    "frac_static": 0.0, "frac_dynamic": 0.0, "frac_m2": 0.0,
    # alpha = beta = 2 softmax(0) = 1 and B = 0: f(x) + x + 0, bit for bit
    **{name: 0.0 for name in LAUREL},
}


@pytest.mark.parametrize("arch", LMS)
@pytest.mark.parametrize("name", sorted(IDENTITY))
def test_initialisation_is_the_plain_model(arch, name):
    plain, model, added = _with_plain_weights(arch, methods(arch)[name])
    assert added, "the method added no parameters"
    tokens = _tokens()
    with torch.no_grad():
        expected, got = plain(tokens)[0], model(tokens)[0]
    if IDENTITY[name] == 0.0:
        assert torch.equal(got, expected)
    else:
        torch.testing.assert_close(got, expected, rtol=IDENTITY[name], atol=IDENTITY[name])


# how a model with the connection, given a trained plain checkpoint, matches it: IDENTITY's
# bounds (mHC's float32-rounded bias logits weigh more on trained activations: 1e-7), AttnRes
# exactly up to the LayerNorms' eps (set to 0 here) in gpt_baseline_lm; None: not the same
# function (ar_encdec_lm's encoder output, read without a norm, is the plain one / s under
# AttnRes), only the loading is checked
FROM_PLAIN = {**IDENTITY, "mhc": 1e-7, "mhc_lite": 1e-7, "mhc_lite_mean": 1e-7,
              "attn_res": 1e-12, "attn_res_block": 1e-12}


@pytest.mark.parametrize("arch", LMS)
@pytest.mark.parametrize("name", sorted(FROM_PLAIN))
def test_a_plain_checkpoint_continues_with_the_connection_at_its_initialisation(arch, name,
                                                                               caplog):
    """--finetune-from-model / --restore-file of a plain model's checkpoint into a model with a
    depth connection (fairseq's load: the model's upgrade, then a strict load): the shared
    weights are the checkpoint's, the connection starts at its initialisation (one log line
    naming it), and before the first update the model computes the checkpoint's function."""
    import logging

    plain, _, _ = _lm(arch)
    _train_steps(plain, steps=3)  # no LayerNorm left at 1 / 0: copies must be real copies
    model, _, _ = _lm(arch, methods(arch)[name], seed=1)
    with caplog.at_level(logging.INFO):
        model.load_state_dict(plain.state_dict())
    plain, model = plain.double().eval(), model.double().eval()
    if name.startswith("attn_res"):
        _set_layer_norm_eps(0.0, plain, model)
    tokens = _tokens()
    with torch.no_grad():
        expected, got = plain(tokens)[0], model(tokens)[0]
    bound = None if name.startswith("attn_res") and arch.startswith("ar_") else FROM_PLAIN[name]
    if bound == 0.0:
        assert torch.equal(got, expected)
    elif bound is not None:
        torch.testing.assert_close(got, expected, rtol=bound, atol=bound)
    for key, value in plain.state_dict().items():  # the shared weights are the checkpoint's
        assert torch.equal(model.state_dict()[key], value), key
    if not name.startswith("dwa"):  # DWA's averages say so their own way
        assert any("the checkpoint has no" in r.getMessage() and "starts at its "
                   "initialisation" in r.getMessage() for r in caplog.records)


LM_MISMATCHES = [  # (the checkpoint's flags, the model's, what the error says)
    (["--decoder-fusion"], [], "the checkpoint was trained with --encoder-fusion / "
     "--decoder-fusion and this model was built without it (decoder.layers.*.fuse_attn, "
     "decoder.layers.*.fuse_attn_layer_norm)"),
    ([], ["--decoder-fusion"], "this model was built with --encoder-fusion / --decoder-fusion "
     "and the checkpoint was trained without it (decoder.layers.*.fuse_attn"),
    (["--decoder-fusion", "--fusion-kind", "dwa"], [], "trained with --encoder-fusion / "
     "--decoder-fusion with --fusion-kind dwa and this model was built without it "
     "(decoder.depth.connection.averages)"),
    (["--hyper-connections", "dynamic"], [], "trained with --hyper-connections or "
     "--frac-connections and this model was built without it (decoder.depth.connection)"),
    (["--frac-connections", "dynamic"], [], "trained with --hyper-connections or "
     "--frac-connections and this model was built without it (decoder.depth.connection)"),
    (["--mhc", "lite"], [], "trained with --mhc and this model was built without it "
     "(decoder.depth.connection)"),
    (["--attn-res", "full"], [], "trained with --attn-res and this model was built without it"),
    (["--mudd"], [], "trained with --mudd and this model was built without it "
     "(decoder.depth.connection.aggregates, decoder.layers.*.key_layer_norm, "
     "decoder.layers.*.value_layer_norm)"),
    (["--value-residual", "learnable"], [], "trained with --value-residual and this model was "
     "built without it (decoder.depth.value_residual)"),
    ([], ["--value-residual", "learnable"], "this model was built with --value-residual"),
    # a fixed checkpoint into a plain model (fixed stored nothing until the variant was stored)
    (["--value-residual", "fixed"], [], "trained with --value-residual and this model was "
     "built without it (decoder.depth.value_residual)"),
    (["--layers", "3"], [], "the checkpoint lacks weights this model has, of another "
     "architecture or size (decoder.layers.*.ffn.fc1"),
]


@pytest.mark.parametrize("theirs,ours,message", LM_MISMATCHES)
def test_a_checkpoint_of_other_options_is_refused_naming_them(theirs, ours, message):
    """Every idea's weights in a checkpoint loaded into a model built without them (or the
    reverse): one ValueError naming the option and the modules, not torch's key list."""
    checkpoint = _lm("gpt_baseline_lm_tiny", theirs)[0].state_dict()
    model, _, _ = _lm("gpt_baseline_lm_tiny", ours)
    with pytest.raises(ValueError) as error:
        model.load_state_dict(checkpoint)
    text = str(error.value)
    assert text.startswith("the checkpoint does not fit this model: ") and "\n" not in text
    assert message in text
    assert "another architecture" not in text or "--" not in message.split("(")[0]


def test_a_seq2seq_checkpoint_of_other_options_is_refused_naming_each():
    from fairseq_plugins.inprocess import build_translation_model

    theirs = build_translation_model("layerwise_transformer_tiny", [
        "--encoder-fusion", "--bridge", "fc", "--cross-attention", "swapped"])[0]
    plain = build_translation_model("layerwise_transformer_tiny")[0]
    with pytest.raises(ValueError) as error:
        plain.load_state_dict(theirs.state_dict())
    text = str(error.value)
    for part in ("trained with --cross-attention and this model was built without it "
                 "(decoder.layers.*.encoder_attn", "trained with --bridge and this model was "
                 "built without it (encoder.bridge)", "trained with --encoder-fusion / "
                 "--decoder-fusion and this model was built without it (encoder.layers.*."
                 "fuse_attn"):
        assert part in text
    assert "another architecture" not in text


def test_fairseq_train_names_the_option_of_a_mismatched_checkpoint(lm_bin, tmp_path):
    fused = train_lm(lm_bin, tmp_path / "fused", "gpt_baseline_lm_tiny", "--decoder-fusion",
                     updates=2)
    proc = run_cli("fairseq-train", lm_bin, "--user-dir", PLUGIN_DIR, "--task",
                   "language_modeling", "--arch", "gpt_baseline_lm_tiny", "--tokens-per-sample",
                   "32", "--sample-break-mode", "none", "--optimizer", "adam", "--lr", "3e-3",
                   "--batch-size", "8", "--max-update", "2", "--save-dir", tmp_path / "plain",
                   "--num-workers", "0", "--finetune-from-model", fused, check=False)
    # one line as argparse's (fairseq-train's own wrapping exception names it as its cause)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith(
        "fairseq-train: error: the checkpoint does not fit this model: the checkpoint was "
        "trained with --encoder-fusion / --decoder-fusion and this model was built without it")


def test_a_bad_option_ends_in_one_line_on_every_argparse_entry_point(lm_bin, tmp_path,
                                                                     monkeypatch):
    """fairseq-train, fairseq-eval-lm, fairseq-generate, fairseq-interactive (a model override):
    a refusal of the package's options is `<program>: error: <message>`, status 2, no traceback;
    with FAIRSEQ_PLUGINS_TRACEBACK=1 the trace is shown; an error that is not a refusal keeps its
    traceback."""
    train = ["fairseq-train", lm_bin, "--user-dir", PLUGIN_DIR, "--task", "language_modeling",
             "--arch", "gpt_baseline_lm_tiny", "--tokens-per-sample", "32", "--optimizer",
             "adam", "--lr", "1e-3", "--batch-size", "4", "--max-update", "1", "--save-dir",
             tmp_path / "bad", "--num-workers", "0", "--hyper-connections", "dynamic",
             "--hc-expansion-rate", "0"]
    proc = run_cli(*train, check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith(
        "fairseq-train: error: --hc-expansion-rate must be >= 1, got 0")
    ckpt = train_lm(lm_bin, tmp_path / "hc", "gpt_baseline_lm_tiny", "--hyper-connections",
                    "static", updates=2)
    override = ["--model-overrides", "{'hc_expansion_rate': 0}"]
    for name, extra in (("fairseq-eval-lm", ["--tokens-per-sample", "32"]),
                        ("fairseq-generate", ["--task", "language_modeling", "--gen-subset",
                                              "valid", "--tokens-per-sample", "32"]),
                        ("fairseq-interactive", ["--task", "language_modeling",
                                                 "--tokens-per-sample", "32"])):
        proc = run_cli(name, lm_bin, "--user-dir", PLUGIN_DIR, "--path", ckpt, *extra,
                       "--num-workers", "0", *override, check=False, stdin="")
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
        assert proc.stderr.strip().splitlines()[-1].startswith(
            f"{name}: error: --hc-expansion-rate must be >= 1, got 0")
    monkeypatch.setenv("FAIRSEQ_PLUGINS_TRACEBACK", "1")
    proc = run_cli(*train, check=False)
    assert proc.returncode == 1 and "Traceback" in proc.stderr
    assert "ConfigError: --hc-expansion-rate must be >= 1, got 0" in proc.stderr


def test_log_layer_weights_without_weights_is_refused_in_one_line(lm_bin, tmp_path):
    """A model with nothing to log is refused when it is built, as every other option is: one
    line naming the options that would add weights, status 2, no traceback."""
    proc = run_cli("fairseq-train", lm_bin, "--user-dir", PLUGIN_DIR, "--task",
                   "language_modeling", "--arch", "gpt_baseline_lm_tiny", "--log-layer-weights",
                   "--tokens-per-sample", "32", "--optimizer", "adam", "--lr", "1e-3",
                   "--batch-size", "4", "--max-update", "1", "--save-dir", tmp_path / "w",
                   "--num-workers", "0", check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("fairseq-train: error: --log-layer-weights: gpt_baseline_lm_tiny has "
                           "no layer-combining weights to log; switch on a method that has them")
    assert "--laurel" in last and "--hyper-connections" in last


def test_fairseq_train_finetunes_a_plain_checkpoint_with_a_connection(lm_bin, tmp_path):
    """fairseq-train --finetune-from-model of a gpt_baseline_lm checkpoint with
    --hyper-connections dynamic trains, says the connection starts at its initialisation, and
    its first update's loss (the model before any update, on the same first batch) is the plain
    model's fine-tuned the same way."""
    import re

    plain = train_lm(lm_bin, tmp_path / "plain", "gpt_baseline_lm_tiny", updates=10)

    def first_loss(name, *flags):
        out = run_cli("fairseq-train", lm_bin, "--user-dir", PLUGIN_DIR, "--task",
                      "language_modeling", "--arch", "gpt_baseline_lm_tiny", *flags,
                      "--tokens-per-sample", "32", "--sample-break-mode", "none", "--optimizer",
                      "adam", "--lr", "3e-3", "--batch-size", "8", "--max-update", "2",
                      "--save-dir", tmp_path / name, "--no-epoch-checkpoints", "--num-workers",
                      "0", "--seed", "1", "--log-format", "json", "--log-interval", "1",
                      "--finetune-from-model", plain, "--disable-validation")
        return out, re.search(r'"loss": "([0-9.]+)"', out).group(1)

    out, hc_loss = first_loss("hc", "--hyper-connections", "dynamic")
    assert "the checkpoint has no --hyper-connections weights: the connection starts at its " \
        "initialisation" in out
    _, plain_loss = first_loss("again")
    assert hc_loss == plain_loss


@pytest.mark.parametrize("arch", LMS)
def test_hyper_connections_sum_readout_is_the_plain_model_up_to_the_final_norms_eps(arch):
    """The paper's sum: n h into the final LayerNorm, LN(n h) with eps = LN(h) with eps / n^2;
    at this init's small activations eps matters (~1e-2 relative). ar_encdec_lm's encoder
    output is read without a norm, so there the sum is a different model."""
    extra = ["--hyper-connections", "static", "--hc-readout", "sum"]
    plain, model, _ = _with_plain_weights(arch, extra)
    tokens = _tokens()
    with torch.no_grad():
        expected, got = plain(tokens)[0], model(tokens)[0]
        assert (got - expected).abs().max() > 1e-3
        if arch.startswith("gpt"):
            plain.decoder.final_layer_norm.eps /= 4 ** 2
            torch.testing.assert_close(got, plain(tokens)[0], rtol=1e-12, atol=1e-12)


def _set_layer_norm_eps(eps, *models):
    for model in models:
        for module in model.modules():
            if isinstance(module, torch.nn.LayerNorm):
                module.eps = eps


@pytest.mark.parametrize("arch", LMS)
@pytest.mark.parametrize("name", sorted(ATTN_RES))
def test_attn_res_initialisation_is_the_plain_model_up_to_the_layer_norms_eps(arch, name):
    """Zero pseudo-queries: every sub-layer reads the mean of its s sources, the plain stream
    / s, which its LayerNorm undoes up to eps. With eps 0 the two models are the same function;
    ar_encdec_lm's encoder output (read without a norm) is the plain one / s."""
    plain, model, added = _with_plain_weights(arch, methods(arch)[name])
    assert added
    tokens = _tokens()
    with torch.no_grad():
        assert (model(tokens)[0] - plain(tokens)[0]).abs().max() > 1e-6  # eps 1e-5 matters
        _set_layer_norm_eps(0.0, plain, model)
        got, extra = model(tokens)
        expected, plain_extra = plain(tokens)
        if arch.startswith("gpt"):
            torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)
        else:
            sources = model.decoder.encoder_depth.connection.sources_at()[-1]
            torch.testing.assert_close(extra["encoder_out"] * sources,
                                       plain_extra["encoder_out"], rtol=1e-12, atol=1e-12)
        with torch.no_grad():  # the pseudo-queries are really in the path
            model.decoder.depth.connection.queries.normal_()
        assert (model(tokens)[0] - got).abs().max() > 1e-3


def test_attn_res_sources_per_sub_layer():
    """Full: sub-layer l attends l sources (x_0 and the l-1 outputs below); Block with one layer
    per group: the completed groups and the open group's partial sum."""
    full = _lm("gpt_baseline_lm_tiny", ATTN_RES["attn_res"] + ["--layers", "3"])[0]
    assert full.decoder.depth.connection.sources_at() == [1, 2, 3, 4, 5, 6, 7]
    block = _lm("gpt_baseline_lm_tiny", ["--attn-res", "block", "--attn-res-blocks", "3",
                                         "--layers", "3"])[0]
    assert block.decoder.depth.connection.sources_at() == [1, 2, 2, 3, 3, 4, 4]
    one = _lm("gpt_baseline_lm_tiny", ATTN_RES["attn_res_block1"] + ["--layers", "3"])[0]
    assert one.decoder.depth.connection.sources_at() == [1, 2, 2, 2, 2, 2, 2]
    # the weights a pass used, per sub-layer and source, handed to whoever started recording
    # (the logger, the layer analysis); nothing of the pass is kept on the module
    from fairseq_plugins.weight_logging import sources, start_recording
    store = start_recording(sources(full))
    with torch.no_grad():
        full.eval()(_tokens())
    weights = store["decoder.depth.connection"]
    assert len(weights) == sum(full.decoder.depth.connection.sources_at())
    assert weights["k3_s0"] == pytest.approx(1 / 4)  # uniform at initialisation
    assert full.decoder.depth.connection.logged_weights() == {}
    assert not any(isinstance(v, torch.Tensor)
                   for v in vars(full.decoder.depth.connection).values())


def test_value_residual_with_lambdas_one_zero_is_the_plain_model():
    for arch in LMS:
        plain, model, _ = _with_plain_weights(arch, VALUE["value_learnable"])
        for depth in (m for m in model.modules() if hasattr(m, "value_residual")
                      and m.value_residual is not None):
            with torch.no_grad():
                depth.value_residual.lambdas.copy_(torch.tensor([1.0, 0.0]))
        tokens = _tokens()
        with torch.no_grad():
            assert torch.equal(model(tokens)[0], plain(tokens)[0])
            depth.value_residual.lambdas[-1, 1] = 0.5  # the last block now reads V_1
            assert not torch.equal(model(tokens)[0], plain(tokens)[0])


def test_value_residual_checkpoints_say_fixed_or_learnable_and_old_ones_load(caplog):
    """The variant is in the checkpoint: fixed continues as learnable (the same function at the
    start), learnable is refused by a fixed model; checkpoints saved before it was stored load
    as they did (a learnable one with its lambdas, a fixed one without any entry, one log line)."""
    import logging

    def lm(kind, seed=0):
        return _lm("gpt_baseline_lm_tiny", VALUE[f"value_{kind}"], seed=seed)[0]

    fixed, learnable = lm("fixed"), lm("learnable")
    assert {"decoder.depth.value_residual.lambdas", "decoder.depth.value_residual.variant"} <= \
        set(fixed.state_dict())
    with torch.no_grad():
        learnable.decoder.depth.value_residual.lambdas.add_(0.1)
    with pytest.raises(ValueError, match="trained with --value-residual learnable, this model "
                                         "has --value-residual fixed"):
        lm("fixed", seed=1).load_state_dict(learnable.state_dict())
    tokens = _tokens()
    continued = lm("learnable", seed=1)
    with caplog.at_level(logging.INFO):
        continued.load_state_dict(fixed.state_dict())
    assert any("continues with learnable lambdas" in r.getMessage() for r in caplog.records)
    with torch.no_grad():
        assert torch.equal(continued.eval()(tokens)[0], fixed.eval()(tokens)[0])
    old = {k: v for k, v in fixed.state_dict().items() if ".value_residual." not in k}
    again = lm("fixed", seed=2)
    again.load_state_dict(old)  # as saved before the variant was stored
    with torch.no_grad():
        assert torch.equal(again.eval()(tokens)[0], fixed(tokens)[0])
    assert any("read as a --value-residual fixed checkpoint" in r.getMessage()
               for r in caplog.records)
    old = {k: v for k, v in learnable.state_dict().items() if not k.endswith(".variant")}
    again = lm("learnable", seed=2)
    again.load_state_dict(old)
    assert torch.equal(again.decoder.depth.value_residual.lambdas,
                       learnable.decoder.depth.value_residual.lambdas)


def _train_steps(model, steps=5, lr=3e-2):
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    model.train()
    for step in range(steps):
        tokens = _tokens(seed=step)
        logits = model(tokens[:, :-1])[0]
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)),
                                                 tokens[:, 1:].reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model.eval()


def _streams(model, tokens):
    """The gpt stack's state at its top: T x B x n x C."""
    decoder = model.decoder
    x = decoder.embed(tokens, torch.arange(tokens.size(1))).transpose(0, 1)
    state = decoder.depth.start(x)
    for i, block in enumerate(decoder.layers):
        block(state, decoder.depth)
        decoder.depth.end_block(state, i)
    return state.stream


@pytest.mark.parametrize("kind", ["static", "dynamic", "mhc", "mhc_lite"])
def test_hyper_connection_streams_become_different_in_training(kind):
    """Hyper-Connections' one-hot read and mHC's home-stream read weights break the symmetry of
    the n equal streams the stack starts from."""
    model, _, _ = _lm("gpt_baseline_lm_tiny", {**HC, **MHC}[kind])
    model.eval()
    with torch.no_grad():
        streams = _streams(model, _tokens())
    assert streams.size(-2) == 4
    # mHC's doubly stochastic mixing keeps equal streams equal up to rounding
    assert all(torch.allclose(streams[..., 0, :], streams[..., s, :], rtol=1e-6, atol=1e-6)
               for s in range(1, 4))
    _train_steps(model)
    with torch.no_grad():
        streams = _streams(model, _tokens())
    assert min((streams[..., 0, :] - streams[..., s, :]).abs().max() for s in range(1, 4)) > 1e-4


# -- mHC: Sinkhorn in float32, how doubly stochastic ----------------------------------------------
def _mhc_mixing(model, tokens):
    """H_res (float tensors, ... x n x n) of every sub-layer of the gpt stack, computed under
    bf16 autocast."""
    decoder, out = model.decoder, []
    connection = decoder.depth.connection
    x = decoder.embed(tokens, torch.arange(tokens.size(1))).transpose(0, 1)
    state = decoder.depth.start(x)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        for i, block in enumerate(decoder.layers):
            for name in connection.layout[i]:
                out.append(connection.coefficients(state.stream, connection.sites[(i, name)],
                                                   state.slot(connection))[2])
            block(state, decoder.depth)
            decoder.depth.end_block(state, i)
    return out


def test_mhc_sinkhorn_runs_in_float32_under_autocast_rows_exact_columns_within_the_stated_error():
    """docs/ideas/mhc.md: the rows (normalised last) sum to 1 within 1e-5; the columns after the
    paper's 20 iterations within 1e-2 on N(0, 1) logits and 0.1 in a model trained 50 steps at a
    high learning rate (measured 4.7e-3 and 5.7e-2)."""
    from fairseq_plugins.depth.mhc import sinkhorn

    logits = torch.randn(20000, 4, 4, generator=torch.Generator().manual_seed(0))
    mixing = sinkhorn(logits, 20)
    assert (mixing.sum(-1) - 1).abs().max() < 1e-5
    assert 1e-4 < (mixing.sum(-2) - 1).abs().max() < 1e-2  # approximate, and as stated
    assert (sinkhorn(logits, 1).sum(-2) - 1).abs().max() > 0.1  # the iterations matter
    model, _, _ = _lm("gpt_baseline_lm_tiny", MHC["mhc"])
    model = _train_steps(model, steps=50)
    for h_res in _mhc_mixing(model, _tokens()):
        assert h_res.dtype == torch.float32 and (h_res >= 0).all()
        assert (h_res.sum(-1) - 1).abs().max() < 1e-5
        assert (h_res.sum(-2) - 1).abs().max() < 0.1


@pytest.mark.parametrize("iterations", [1, 2, 20])
def test_sinkhorn_values_and_gradient_are_those_of_the_plain_iterations(iterations):
    """The scaling form and its hand-written backward compute the paper's iterations (columns,
    then rows, on exp(logits)) and their exact gradient (float64)."""
    from fairseq_plugins.depth.mhc import sinkhorn

    g = torch.Generator().manual_seed(iterations)
    logits = (2 * torch.randn(5, 3, 4, 4, generator=g, dtype=torch.float64)).requires_grad_()
    upstream = torch.randn(5, 3, 4, 4, generator=g, dtype=torch.float64)
    m = torch.exp(logits)
    for _ in range(iterations):
        m = m / m.sum(-2, keepdim=True)
        m = m / m.sum(-1, keepdim=True)
    expected = torch.autograd.grad(m, logits, upstream)[0]
    got = sinkhorn(logits, iterations)
    torch.testing.assert_close(got, m, rtol=0, atol=1e-14)
    torch.testing.assert_close(torch.autograd.grad(got, logits, upstream)[0], expected,
                               rtol=0, atol=1e-12)
    assert torch.autograd.gradcheck(lambda x: sinkhorn(x, iterations), (logits[:2, :1],))


def test_sinkhorn_products_are_the_same_in_the_cpu_and_the_gpu_form():
    """mHC's per-position products M^T x and M x: the CPU form (n multiply-adds of slices) and
    the GPU form (a product and one reduction: fewer kernel launches) against einsum."""
    from fairseq_plugins.depth.mhc import _MatVec

    g = torch.Generator().manual_seed(0)
    m = torch.rand(4, 4, 50, generator=g, dtype=torch.float64)
    x = torch.randn(4, 50, generator=g, dtype=torch.float64)
    expected = {0: torch.einsum("ijp,ip->jp", m, x), 1: torch.einsum("ijp,jp->ip", m, x)}
    sliced, reduced = _MatVec(m), _MatVec(m)
    reduced.slices = None  # what a CUDA tensor gets
    assert sliced.slices is not None
    for dim in (0, 1):
        for form in (sliced, reduced):
            out = torch.full_like(x, float("nan"))
            assert form(x, dim, out) is out
            torch.testing.assert_close(out, expected[dim], rtol=0, atol=1e-14)


def test_hand_written_backward_passes_are_the_gradients_of_their_forward_passes():
    """Hyper-Connections' / Frac-Connections' dynamic coefficients (LayerNorm folded into the
    maps, recomputed in the backward pass), AttnRes's weighted sum and mHC's maps of the
    RMS-normalised streams: gradcheck in float64, and the folded forms equal the unfolded
    formulas."""
    from fairseq_plugins.depth import mhc
    from fairseq_plugins.depth.attn_res import _WeightedSum
    from fairseq_plugins.depth.hyper_connections import _DynamicCoefficients

    g = torch.Generator().manual_seed(0)

    def rand(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64, requires_grad=True)

    for streams in (4, 1):  # n streams, or one standing for n equal ones
        x, weight, bias, static, scale = rand(3, 2, streams, 8), rand(6, 8), rand(6), \
            rand(4, 6), rand(6)
        got = _DynamicCoefficients.apply(x, weight, bias, static, scale)
        normed = torch.nn.functional.layer_norm(x, (8,), eps=1e-5)
        expected = static + scale * torch.tanh(normed @ weight.t() + bias)
        torch.testing.assert_close(got, expected.expand(3, 2, 4, 6), rtol=1e-12, atol=1e-12)
        assert torch.autograd.gradcheck(_DynamicCoefficients.apply,
                                        (x, weight, bias, static, scale))
    alpha = torch.softmax(rand(3, 2, 4), -1).detach().requires_grad_()
    sources = [rand(3, 2, 5) for _ in range(4)]
    assert torch.autograd.gradcheck(_WeightedSum.apply, (alpha, *sources))
    x, weight = rand(3, 2, 8), rand(5, 8)  # mHC's maps of the RMS-normalised streams
    rms = x.square().mean(-1, keepdim=True).add(mhc.RMS_EPS).sqrt()
    torch.testing.assert_close(mhc._RMSMaps.apply(x, weight), (x / rms) @ weight.t(),
                               rtol=1e-12, atol=1e-12)
    assert torch.autograd.gradcheck(mhc._RMSMaps.apply, (x, weight))


def test_mhc_initialisation_is_exact_in_float64():
    """The residual initialisation's H_res logits are built in the parameters' dtype: a model
    cast to float64 and initialised again starts exactly at the documented H_res (3/4 on the
    diagonal, 1/12 elsewhere at n = 4), not a float32 constant's 1e-8 away."""
    import math

    from fairseq_plugins.depth import mhc

    model, _, _ = _lm("gpt_baseline_lm_tiny", MHC["mhc"])
    connection = model.decoder.depth.connection.double()
    connection.reset_parameters()
    n = connection.streams
    assert connection.bias_res.dtype == torch.float64
    exact = math.log(mhc.HOME / (1 - mhc.HOME) * (n - 1))
    assert torch.equal(connection.bias_res, torch.eye(n, dtype=torch.float64).expand_as(
        connection.bias_res) * exact)
    h_res = mhc.sinkhorn(connection.bias_res, connection.iterations)
    documented = torch.full((n, n), (1 - mhc.HOME) / (n - 1), dtype=torch.float64)
    documented.fill_diagonal_(mhc.HOME)
    assert (h_res - documented).abs().max() < 1e-15


def test_mhc_lite_is_exactly_doubly_stochastic():
    model, _, _ = _lm("gpt_baseline_lm_tiny", MHC["mhc_lite"])
    model = _train_steps(model, steps=20)
    for h_res in _mhc_mixing(model, _tokens()):
        assert (h_res.sum(-1) - 1).abs().max() < 1e-5 and (h_res.sum(-2) - 1).abs().max() < 1e-5


# -- incremental decoding, beam search ----------------------------------------------------------
@pytest.mark.parametrize("arch,name", CASES)
def test_incremental_equals_full_forward(arch, name):
    model, _, _ = _lm(arch, methods(arch)[name])
    # trained a little, so that no connection is at its (often trivial) initialisation
    model = _train_steps(model, steps=3).double()
    # fairseq's MultiheadAttention (the all-positions fuse-attention's, with a cache) takes its
    # softmax in float32 when decoding incrementally, also in a float64 model
    atol = 1e-6 if name == "lrf_all_positions" else 1e-10
    assert_lm_incremental_equals_full_forward(model, _tokens(length=14), atol=atol)


@pytest.mark.parametrize("arch,name", [("gpt_baseline_lm_tiny", "hc_value"),
                                       ("ar_encdec_lm_tiny", "mudd_value"),
                                       ("gpt_baseline_lm_tiny", "attn_res_value"),
                                       ("ar_encdec_lm_tiny", "attn_res_block"),
                                       ("ar_encdec_lm_tiny", "frac_value"),
                                       ("ar_encdec_lm_tiny", "lrf"),
                                       ("gpt_baseline_lm_tiny", "lrf_all_positions"),
                                       ("ar_encdec_lm_tiny", "laurel_rw_lr_pa"),
                                       ("gpt_baseline_lm_tiny", "laurel_value")])
def test_beam_search_with_batch_and_beam_scores_equal_full_forward(arch, name):
    model, task, _ = _lm(arch, methods(arch)[name], context=24)
    model = _train_steps(model, steps=2)
    assert_lm_beam_search_scores_equal_full_forward(model, task, _tokens(bsz=3, length=4))


# -- what each method builds --------------------------------------------------------------------
def test_each_stack_gets_its_own_connection_and_the_plain_model_the_residual():
    plain, _, _ = _lm("ar_encdec_lm_tiny")
    assert type(plain.decoder.depth.connection) is Connection
    assert type(plain.decoder.encoder_depth.connection) is Connection
    model, _, _ = _lm("ar_encdec_lm_tiny", HC["dynamic"] + ["--hc-expansion-rate", "3"])
    enc, dec = model.decoder.encoder_depth.connection, model.decoder.depth.connection
    assert enc.streams == dec.streams == 3 and enc is not dec
    assert len(enc.sites) == 2 * 2 and len(dec.sites) == 2 * 3  # (self, ffn); (self, cross, ffn)
    # the paper's init: sub-layer k reads stream k mod n
    assert [int(enc.static_alpha[k, :, 0].argmax()) for k in range(4)] == [0, 1, 2, 0]


def test_block_views_are_computed_only_while_observed():
    """Hyper-Connections' view (the streams' mean) costs a reduction per block: run_blocks skips
    it unless someone observes; an observer gets every block's input and output view."""
    model, _, _ = _lm("gpt_baseline_lm_tiny", HC["dynamic"])
    model.eval()
    depth, calls = model.decoder.depth, []
    view = depth.connection.view
    depth.connection.view = lambda state: calls.append(1) or view(state)
    with torch.no_grad():
        unobserved = model(_tokens())[0]
        assert calls == []
        seen = []
        handle = depth.observe(lambda x, block, where: seen.append((block, where, x.shape)))
        observed = model(_tokens())[0]
        handle.remove()
        model(_tokens())
    blocks = len(model.decoder.layers)
    assert [(b, w) for b, w, _ in seen] == [(b, w) for b in range(blocks)
                                            for w in ("input", "output")]
    embed_dim = model.decoder.final_layer_norm.normalized_shape[0]
    assert all(shape == (12, 3, embed_dim) for _, _, shape in seen)  # T x B x C
    assert len(calls) == blocks + 1  # once per block boundary, then no more after remove()
    torch.testing.assert_close(observed, unobserved, rtol=0, atol=0)


def test_mudd_builds_separate_key_value_norms_from_the_second_block():
    model, _, _ = _lm("gpt_baseline_lm_tiny", MUDD["mudd"])
    blocks = model.decoder.layers
    assert blocks[0].key_layer_norm is None
    assert all(b.key_layer_norm is not None and b.value_layer_norm is not None
               for b in blocks[1:])
    das = model.decoder.depth.connection.aggregates
    assert [(da.ways, da.states) for da in das] == [(4, 2), (4, 3), (4, 4), (1, 5)]
    assert das[-1].w1.out_features == 4 * 5  # the last DA: 4x hidden width
    assert all(torch.count_nonzero(da.w2.weight) == 0 for da in das)


@pytest.mark.parametrize("arch,extra,message", [
    ("gpt_baseline_lm_tiny", ["--hyper-connections", "static", "--hc-expansion-rate", "0"],
     "hc-expansion-rate"),
    ("gpt_baseline_lm_tiny", ["--hc-expansion-rate", "2"], "add --hyper-connections"),
    ("gpt_baseline_lm_tiny", ["--hc-readout", "sum"], "add --hyper-connections"),
    ("gpt_baseline_lm_tiny", ["--mudd-ways", "r"], "add --mudd"),
    ("ar_encdec_lm_tiny", ["--mudd", "--decoder-block-order", "alt"],
     "--decoder-block-order original"),
    ("gpt_baseline_lm_tiny", ["--mudd", "--hyper-connections", "static"], "choose one"),
    ("gpt_baseline_lm_tiny", ["--decoder-fusion", "--mudd"], "choose one"),
    ("gpt_baseline_lm_tiny", ["--encoder-fusion"], "no encoder stack"),
    ("gpt_baseline_lm_tiny", ["--fusion-kind", "dwa"], "neither --encoder-fusion"),
    ("gpt_baseline_lm_tiny", ["--decoder-fusion", "--fusion-heads", "3"], "must divide --embed-dim"),
    ("gpt_baseline_lm_tiny", ["--mhc", "lite", "--mhc-expansion-rate", "5"], "must be <= 4"),
    ("gpt_baseline_lm_tiny", ["--mhc", "sinkhorn", "--mhc-expansion-rate", "1"],
     "--mhc-expansion-rate must be >= 2"),
    ("gpt_baseline_lm_tiny", ["--mhc", "sinkhorn", "--mhc-sinkhorn-iterations", "0"],
     "--mhc-sinkhorn-iterations must be >= 1"),
    ("gpt_baseline_lm_tiny", ["--mhc", "lite", "--mhc-sinkhorn-iterations", "5"],
     "applies to --mhc sinkhorn"),
    ("gpt_baseline_lm_tiny", ["--mhc-init", "zeros"], "add --mhc sinkhorn or lite"),
    ("gpt_baseline_lm_tiny", ["--mhc", "sinkhorn", "--hyper-connections", "static"], "choose one"),
    ("gpt_baseline_lm_tiny", ["--mhc", "sinkhorn", "--decoder-fusion"], "choose one"),
    ("gpt_baseline_lm_tiny", ["--frac-connections", "static", "--frac-rate", "0"],
     "--frac-rate must be >= 1"),
    ("gpt_baseline_lm_tiny", ["--frac-connections", "static", "--frac-rate", "3"],
     "--frac-rate 3 must divide the embedding dimension"),
    ("gpt_baseline_lm_tiny", ["--frac-rate", "2"], "add --frac-connections"),
    ("gpt_baseline_lm_tiny", ["--frac-connections", "static", "--mhc", "lite"], "choose one"),
    ("ar_encdec_lm_tiny", ["--attn-res", "block", "--attn-res-blocks", "3"],
     "--attn-res-blocks 3 does not divide the stack's 2 layers: use one of [1, 2]"),
    ("gpt_baseline_lm_tiny", ["--attn-res", "block", "--attn-res-blocks", "0"],
     "--attn-res-blocks must be >= 1"),
    ("gpt_baseline_lm_tiny", ["--attn-res", "full", "--attn-res-blocks", "2"],
     "add --attn-res block"),
    ("gpt_baseline_lm_tiny", ["--attn-res", "full", "--hyper-connections", "static"],
     "choose one"),
    ("ar_encdec_lm_tiny", ["--attn-res", "full", "--encoder-fusion"], "choose one"),
])
def test_build_time_errors(arch, extra, message):
    with pytest.raises((ValueError, SystemExit)) as info:
        _lm(arch, extra)
    if info.type is ValueError:
        assert message in str(info.value)


@pytest.mark.parametrize("flags,message", [
    (["--mudd-ways", "qkv"], "invalid choice"),
    (["--hyper-connections", "yes"], "invalid choice"),
    (["--value-residual", "on"], "invalid choice"),
    (["--mhc", "on"], "invalid choice"),
    (["--frac-connections", "on"], "invalid choice"),
    (["--attn-res", "yes"], "invalid choice"),
    (["--laurel", "rw-lr"], "invalid choice"),
])
def test_unknown_values_are_refused_by_the_parser(flags, message, capsys):
    with pytest.raises(SystemExit):
        _lm("gpt_baseline_lm_tiny", flags)
    assert message in capsys.readouterr().err


# -- the CLIs -----------------------------------------------------------------------------------
@pytest.mark.parametrize("arch,extra", [
    ("gpt_baseline_lm_tiny", ["--mudd", "--value-residual", "learnable"]),
    ("ar_encdec_lm_tiny", ["--hyper-connections", "dynamic"]),
    ("gpt_baseline_lm_tiny", ["--mhc", "sinkhorn"]),
    ("ar_encdec_lm_tiny", ["--attn-res", "block", "--attn-res-blocks", "2"]),
    ("gpt_baseline_lm_tiny", ["--frac-connections", "dynamic", "--frac-rate", "2",
                              "--stream-recompute"]),
    ("ar_encdec_lm_tiny", ["--laurel", "rw_lr_pa", "--value-residual", "learnable"]),
])
def test_train_then_eval_lm_and_generate_with_only_the_user_dir(lm_bin, tmp_path, arch, extra):
    assert_lm_evaluates_and_generates(lm_bin, train_lm(lm_bin, tmp_path / "ckpt", arch, *extra))


# -- weight decay -------------------------------------------------------------------------------
def _fairseq_optimizer(params, name="adam", weight_decay=0.1):
    from argparse import Namespace

    from fairseq import optim
    cfg = Namespace(optimizer=name, lr=[1e-2], weight_decay=weight_decay, adam_betas="(0.9, 0.98)",
                    adam_eps=1e-8, momentum=0.9, use_old_adam=False, fp16_adam_stats=False,
                    tpu=False)
    return optim.build_optimizer(cfg, params)


@pytest.mark.parametrize("optimizer,extra,tensors", [
    ("adam", HC["dynamic"] + VALUE["value_learnable"], 8 + 1),  # HC dynamic: 8; the lambdas
    ("nag", HC["dynamic"] + VALUE["value_learnable"], 8 + 1),
    ("sgd", HC["dynamic"] + VALUE["value_learnable"], 8 + 1),
    ("adam", MHC["mhc"], 5 + 3),  # maps, gates, three biases; the readout's map, gate, bias
    ("adam", MHC["mhc_lite_mean"], 5),
    ("adam", FRAC["frac_dynamic"], 8),  # as Hyper-Connections'
    ("adam", ATTN_RES["attn_res"] + VALUE["value_learnable"], 2 + 1),  # queries, gains; lambdas
    # RW's logits and PA's gammas; the low-rank maps are weight matrices and are decayed
    ("adam", LAUREL["laurel_rw_lr_pa"] + VALUE["value_learnable"], 2 + 1),
])
def test_connection_parameters_get_no_weight_decay(optimizer, extra, tensors):
    model, _, _ = _lm("gpt_baseline_lm_tiny", extra)
    connection = {id(p) for p in model.decoder.depth.connection_parameters()}
    assert len(connection) == tensors
    params = [p for p in model.parameters() if p.requires_grad]
    opt = _fairseq_optimizer(params, optimizer)
    before = {id(p): p.detach().clone() for p in params}
    for p in params:
        p.grad = torch.zeros_like(p)  # only the decay moves anything
    opt.step()
    for p in params:
        moved = not torch.equal(p, before[id(p)])
        assert moved == (id(p) not in connection and bool(before[id(p)].any())), p.shape
    # the optimizer's groups are fairseq's single group again, in its order (checkpoints)
    assert len(opt.optimizer.param_groups) == 1
    assert [id(p) for p in opt.optimizer.param_groups[0]["params"]] == [id(p) for p in params]
    assert len(opt.state_dict()["param_groups"]) == 1


def test_decay_depth_connections_decays_them_too():
    model, _, _ = _lm("gpt_baseline_lm_tiny", HC["static"] + ["--decay-depth-connections"])
    hc = model.decoder.depth.connection
    opt = _fairseq_optimizer([p for p in model.parameters()])
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    before = hc.static_beta.detach().clone()
    opt.step()
    assert not torch.equal(hc.static_beta, before)


def test_flattened_fp16_with_weight_decay_is_a_build_time_error():
    with pytest.raises(ValueError, match="--fp16-no-flatten-grads"):
        _lm("gpt_baseline_lm_tiny", ["--mudd", "--fp16", "--optimizer", "adam",
                                      "--weight-decay", "0.01"])
    _lm("gpt_baseline_lm_tiny", ["--mudd", "--fp16", "--fp16-no-flatten-grads", "--optimizer",
                                 "adam", "--weight-decay", "0.01"])


@pytest.mark.parametrize("family", ["gpt_baseline_lm", "ar_encdec_lm"])
def test_every_method_has_a_tiny_preset_in_every_family(family):
    """... which turns on exactly that method, named by its flag (an option of its config)."""
    import dataclasses

    from fairseq_plugins import depth
    from fairseq_plugins.config import flag
    for method in depth.METHODS:
        flags = {flag(field.name) for field in dataclasses.fields(method.config)}
        assert set(method.flags_for(depth.registry.SIDES)) <= flags
        for name, options in method.presets.items():
            model, _, args = build_language_model(f"{family}_{name}_tiny",
                                                  ["--tokens-per-sample", 16])
            assert all(getattr(args, key) == value for key, value in options.items())
            assert depth.active_flags(args) == [method.flag]
    # an option given on the command line wins over the preset's
    _, _, args = build_language_model(f"{family}_hyper_connections_tiny",
                                      ["--tokens-per-sample", 16, "--hyper-connections", "static"])
    assert args.hyper_connections == "static"


def test_checkpoints_of_another_variant_load_or_fail_clearly():
    static, _, _ = _lm("gpt_baseline_lm_tiny", HC["static"])
    _train_steps(static, steps=2)
    dynamic, _, _ = _lm("gpt_baseline_lm_tiny", HC["dynamic"], seed=3)
    dynamic.load_state_dict(static.state_dict())  # fairseq's load: upgrade, then strict
    tokens = _tokens()
    with torch.no_grad():  # the dynamic part at its init: the static model's function
        torch.testing.assert_close(dynamic.eval()(tokens)[0], static.eval()(tokens)[0],
                                   rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="not trained with --hyper-connections"):
        dynamic.load_state_dict(_lm("gpt_baseline_lm_tiny", MUDD["mudd"])[0].state_dict())
    two, _, _ = _lm("gpt_baseline_lm_tiny", HC["static"] + ["--hc-expansion-rate", "2"])
    with pytest.raises(ValueError, match="--hc-expansion-rate 2"):
        static.load_state_dict(two.state_dict())


def test_amax_gain_of_the_composite_mixing_is_logged_in_training():
    """The mHC paper's diagnostic: the largest absolute row (forward) and column (backward) sum
    of the product of the mixing matrices across depth, logged with --log-layer-weights."""
    from fairseq.logging import metrics

    def logged(model):
        with metrics.aggregate(new_root=True) as agg:
            model.eval()(_tokens())  # evaluation passes compose nothing
            assert not any("amax" in k for k in agg.get_smoothed_values())
            model.train()(_tokens())
            return {k.split("_connection_")[1]: v for k, v in agg.get_smoothed_values().items()
                    if "amax_gain" in k and k.startswith("lw_decoder_depth")}

    # static Hyper-Connections moved off the identity: the composite is the product of the
    # static A_r^T, the same at every position
    model, _, _ = _lm("gpt_baseline_lm_tiny", HC["static"] + ["--log-layer-weights"])
    hc = model.decoder.depth.connection
    with torch.no_grad():
        hc.static_alpha.add_(0.2 * torch.randn(hc.static_alpha.shape,
                                               generator=torch.Generator().manual_seed(0)))
    composite = torch.eye(4)
    for k in range(len(hc.sites)):
        composite = hc.static_alpha[k, :, 1:].detach().t() @ composite
    gains = logged(model)
    assert gains["amax_gain_forward"] == pytest.approx(composite.abs().sum(1).max().item(),
                                                       rel=1e-4)
    assert gains["amax_gain_backward"] == pytest.approx(composite.abs().sum(0).max().item(),
                                                        rel=1e-4)
    assert gains["amax_gain_forward"] > 1.05
    # mHC-lite: a product of doubly stochastic matrices is doubly stochastic (gains 1)
    model, _, _ = _lm("gpt_baseline_lm_tiny", MHC["mhc_lite"] + ["--log-layer-weights"])
    _train_steps(model, steps=3)
    gains = logged(model)
    assert gains["amax_gain_forward"] == pytest.approx(1.0, abs=1e-5)
    assert gains["amax_gain_backward"] == pytest.approx(1.0, abs=1e-5)


def test_frac_and_attn_res_checkpoints_of_another_variant_load_or_fail_clearly():
    static, _, _ = _lm("gpt_baseline_lm_tiny", FRAC["frac_static"])
    _train_steps(static, steps=2)
    dynamic, _, _ = _lm("gpt_baseline_lm_tiny", FRAC["frac_dynamic"], seed=3)
    dynamic.load_state_dict(static.state_dict())  # the dynamic part starts at its init
    with torch.no_grad():
        torch.testing.assert_close(dynamic.eval()(_tokens())[0], static.eval()(_tokens())[0],
                                   rtol=1e-5, atol=1e-5)
    for other, message in ((_lm("gpt_baseline_lm_tiny", MHC["mhc"])[0],
                            "not trained with --frac-conn"),
                           (_lm("gpt_baseline_lm_tiny", FRAC["frac_m2"])[0], "--frac-rate"),
                           (_lm("gpt_baseline_lm_tiny", HC["static"])[0], "--frac-rate")):
        with pytest.raises(ValueError, match=message):
            dynamic.load_state_dict(other.state_dict())
    full, _, _ = _lm("gpt_baseline_lm_tiny", ATTN_RES["attn_res"])
    for other, message in ((_lm("gpt_baseline_lm_tiny", MUDD["mudd"])[0],
                            "not trained with --attn-res"),
                           (_lm("gpt_baseline_lm_tiny", ATTN_RES["attn_res_block"])[0],
                            "trained with --attn-res block --attn-res-blocks 2, this model "
                            "has --attn-res full")):
        with pytest.raises(ValueError, match=message):
            full.load_state_dict(other.state_dict())
    full.load_state_dict(_lm("gpt_baseline_lm_tiny", ATTN_RES["attn_res"], seed=4)[0].state_dict())


def test_mhc_checkpoints_of_another_method_or_size_are_refused():
    model, _, _ = _lm("gpt_baseline_lm_tiny", MHC["mhc"])
    for other, message in ((_lm("gpt_baseline_lm_tiny", HC["static"])[0], "not trained with --mhc"),
                           (_lm("gpt_baseline_lm_tiny", MHC["mhc_lite"])[0], "--mhc-expansion-rate"),
                           (_lm("gpt_baseline_lm_tiny", MHC["mhc_n2_zeros_sum"])[0],
                            "--mhc-expansion-rate")):
        with pytest.raises(ValueError, match=message):
            model.load_state_dict(other.state_dict())  # fairseq's load: upgrade, then strict
    same, _, _ = _lm("gpt_baseline_lm_tiny", MHC["mhc"], seed=5)
    model.load_state_dict(same.state_dict())


# -- layerwise_transformer (the seq2seq encoder and decoder) ---------------------------------------
PRE_NORM = ["--encoder-normalize-before", "--decoder-normalize-before"]
SEQ2SEQ = {"hc_static": PRE_NORM + HC["static"], "hc_dynamic": PRE_NORM + HC["dynamic"],
           "hc_n2_sum": PRE_NORM + HC["dynamic_n2_sum"], "mudd_r": PRE_NORM + MUDD["mudd_r"],
           "hc_bridge": PRE_NORM + HC["dynamic"] + ["--bridge", "fc", "--bridge-init", "random"],
           "mudd_r_transparent": PRE_NORM + MUDD["mudd_r"] + ["--bridge", "transparent"],
           "hc_swapped": PRE_NORM + HC["static"] + ["--cross-attention", "swapped"],
           "mhc": PRE_NORM + MHC["mhc"], "mhc_lite_mean": PRE_NORM + MHC["mhc_lite_mean"],
           "mhc_bridge": PRE_NORM + MHC["mhc"] + ["--bridge", "fc", "--bridge-init", "random"],
           "frac_static": PRE_NORM + FRAC["frac_static"], "frac_m2": PRE_NORM + FRAC["frac_m2"],
           "frac_transparent": PRE_NORM + FRAC["frac_dynamic"] + ["--bridge", "transparent"],
           "attn_res": PRE_NORM + ATTN_RES["attn_res"],
           "attn_res_block": PRE_NORM + ATTN_RES["attn_res_block"],
           "attn_res_swapped": PRE_NORM + ATTN_RES["attn_res_block1"] + [
               "--cross-attention", "swapped"],
           # separate key / value inputs and the values' hook (modules/depth_self_attention.py)
           "mudd": PRE_NORM + MUDD["mudd"],
           "mudd_value": PRE_NORM + MUDD["mudd"] + VALUE["value_learnable"],
           "value_post_norm": VALUE["value_fixed"],  # layerwise_transformer's post-norm default
           "hc_value": PRE_NORM + HC["dynamic"] + VALUE["value_learnable"],
           "lrf_value": VALUE["value_learnable"] + ["--encoder-fusion", "--decoder-fusion"],
           "laurel_rw_lr": PRE_NORM + LAUREL["laurel_rw_lr"],
           "laurel_pa": PRE_NORM + LAUREL["laurel_pa"],
           "laurel_pa_swapped": PRE_NORM + LAUREL["laurel_pa"] + ["--cross-attention", "swapped"],
           "laurel_value_bridge": PRE_NORM + LAUREL["laurel_rw_lr_pa"] + VALUE["value_learnable"]
           + ["--bridge", "fc", "--bridge-init", "random"]}
SEQ2SEQ_IDENTITY = {"hc_static": 1e-14, "hc_dynamic": 1e-14, "mudd_r": 0.0,
                    # keys and values from copies of the self-attention's LayerNorm, attended by
                    # the explicit path instead of fairseq's fused one: the same products
                    "mudd": 1e-13,
                    "mhc": 1e-8, "mhc_lite_mean": 1e-8, "frac_static": 0.0, "frac_m2": 0.0,
                    # with every LayerNorm's eps ~0 (the mean of s sources is the stream / s)
                    "attn_res": 1e-12, "attn_res_block": 1e-12,
                    "laurel_rw_lr": 0.0, "laurel_pa": 0.0}


def _seq2seq_with_plain_weights(extra, seed=1):
    """(fairseq's pre-norm transformer, layerwise_transformer with ``extra``) in float64, the
    second holding the first's weights wherever their parameters coincide."""
    plain, task, _ = build_translation_model("transformer_tiny", PRE_NORM, seed=seed)
    model, _, _ = build_translation_model("layerwise_transformer_tiny", extra,
                                          task.source_dictionary, task.target_dictionary,
                                          seed=seed + 1)
    added = sorted(set(model.state_dict()) - set(plain.state_dict()))
    # torch's load (fairseq's would refuse a checkpoint without the connections' weights)
    torch.nn.Module.load_state_dict(model, {**model.state_dict(), **plain.state_dict()})
    return plain.double().eval(), model.double().eval(), task, added


@pytest.mark.parametrize("name", sorted(SEQ2SEQ_IDENTITY))
def test_seq2seq_initialisation_is_the_plain_pre_norm_transformer(name):
    plain, model, task, added = _seq2seq_with_plain_weights(SEQ2SEQ[name])
    assert added and all(".depth.connection." in key or "key_layer_norm" in key
                         or "value_layer_norm" in key for key in added)
    src, lengths, prev = random_batch(task.source_dictionary, task.target_dictionary)
    if name.startswith("attn_res"):  # eps ~0 (0 would divide 0 by 0 at the padded positions)
        _set_layer_norm_eps(1e-30, plain, model)
    with torch.no_grad():
        expected = plain(src, lengths, prev)[0]
        difference = (model(src, lengths, prev)[0] - expected).abs().max().item()
        assert difference <= SEQ2SEQ_IDENTITY[name]
        move_connections(model)  # the connections are really in the path
        assert (model(src, lengths, prev)[0] - expected).abs().max().item() > 1e-3


@pytest.mark.parametrize("name", sorted(SEQ2SEQ))
def test_seq2seq_incremental_equals_full_forward_and_beam_batch_equals_one_by_one(name):
    model, task, _ = build_translation_model("layerwise_transformer_tiny", SEQ2SEQ[name], seed=3)
    move_connections(model.double())
    model.eval()
    src, lengths, prev = random_batch(task.source_dictionary, task.target_dictionary)
    with torch.no_grad():
        full = model(src, lengths, prev)[0]
        # 1e-7: fairseq's sinusoidal positions are float32 tables (its own transformer differs
        # by as much in float64)
        torch.testing.assert_close(incremental_decode(model, src, lengths, prev), full,
                                   rtol=0, atol=1e-6)
    assert_batch_equals_one_by_one(model.float(), task, src, lengths, beam=3)


def test_a_plain_seq2seq_checkpoint_continues_with_separate_inputs_at_their_initialisation():
    """fairseq's load of a pre-norm layerwise_transformer checkpoint into one with MUDD's four
    ways: the connection starts at its initialisation and the key / value LayerNorms as copies
    of the checkpoint's self-attention LayerNorm, so the model computes the checkpoint's
    function (up to the explicit attention's rounding)."""
    plain, task, _ = build_translation_model("layerwise_transformer_tiny",
                                             PRE_NORM + ["--encoder-fusion"], seed=1)
    with torch.no_grad():
        for name, p in plain.named_parameters():
            if "layer_norm" in name:  # not the LayerNorms' own initialisation
                p.add_(0.2 * torch.randn_like(p))
    model, _, _ = build_translation_model("layerwise_transformer_tiny", SEQ2SEQ["mudd"],
                                          task.source_dictionary, task.target_dictionary,
                                          seed=2)
    state = {k: v for k, v in plain.state_dict().items() if "fuse_attn" not in k}
    model.load_state_dict(dict(state))  # fairseq's load: upgrade (in place), then strict
    layer = model.decoder.layers[1]
    assert torch.equal(layer.key_layer_norm.weight, layer.self_attn_layer_norm.weight)
    assert torch.equal(layer.value_layer_norm.bias, layer.self_attn_layer_norm.bias)
    reference, _, _ = build_translation_model("layerwise_transformer_tiny", PRE_NORM,
                                              task.source_dictionary, task.target_dictionary)
    reference.load_state_dict(dict(state))
    src, lengths, prev = random_batch(task.source_dictionary, task.target_dictionary)
    with torch.no_grad():
        torch.testing.assert_close(model.double().eval()(src, lengths, prev)[0],
                                   reference.double().eval()(src, lengths, prev)[0],
                                   rtol=0, atol=1e-12)


def test_mudd_seq2seq_presets_are_the_papers_four_ways_and_old_checkpoints_keep_theirs():
    """mudd_transformer* build Q, K, V and R as the language models' presets do; the stored
    fixture, saved when the preset was the residual way only, loads with its own options."""
    import os

    from fairseq import checkpoint_utils

    model, _, args = build_translation_model("mudd_transformer_tiny")
    assert args.mudd_ways is None or args.mudd_ways == "qkvr"
    ways = [da.ways for da in model.encoder.depth.connection.aggregates]
    assert ways[:-1] == [4] * (len(ways) - 1)
    assert model.encoder.layers[1].key_layer_norm is not None
    fixture = os.path.join(os.path.dirname(__file__), "fixtures", "mudd_transformer",
                           "checkpoint.pt")
    (old,), _ = checkpoint_utils.load_model_ensemble([fixture], arg_overrides={
        "data": os.path.dirname(fixture)})
    assert [da.ways for da in old.encoder.depth.connection.aggregates] == [1] * len(ways)


def test_seq2seq_each_stack_gets_its_own_connection():
    model, _, _ = build_translation_model("hyper_connections_transformer_tiny",
                                          ["--encoder-layers", "3"])
    enc, dec = model.encoder.depth.connection, model.decoder.depth.connection
    assert enc is not dec and enc.layout == (("self", "ffn"),) * 3
    assert dec.layout == (("self", "cross", "ffn"),) * 2
    assert enc.static_alpha.shape[:2] == (6, 4) and dec.static_alpha.shape[:2] == (6, 4)
    plain, _, _ = build_translation_model("layerwise_transformer_tiny")
    assert not hasattr(plain.encoder.layers[0], "options")  # fairseq's own layers, no depth
    assert plain.encoder.depth is None and plain.decoder.depth is None


@pytest.mark.parametrize("extra,message", [
    (HC["static"], "add --encoder-normalize-before"),
    (FRAC["frac_static"], "--frac-connections is defined for pre-norm stacks only"),
    (["--encoder-normalize-before"] + ATTN_RES["attn_res"],
     "--attn-res is defined for pre-norm stacks only and the decoder is post-norm: add "
     "--decoder-normalize-before (model.decoder_normalize_before under hydra)"),
    (["--encoder-normalize-before"] + HC["static"], "add --decoder-normalize-before"),
    (PRE_NORM + HC["static"] + ["--encoder-fusion"], "choose one"),
    (PRE_NORM + MUDD["mudd_r"] + ["--decoder-fusion", "--fusion-kind", "dwa"], "choose one"),
    (PRE_NORM + HC["static"] + ["--cross-self-attention"],
     "--cross-self-attention is not supported together with --hyper-connections"),
])
def test_seq2seq_build_time_errors(extra, message):
    import re

    with pytest.raises(ValueError, match=re.escape(message)):
        build_translation_model("layerwise_transformer_tiny", extra)


def test_seq2seq_connection_parameters_get_no_weight_decay():
    for arch in ("hyper_connections_transformer_tiny", "dwa_transformer_tiny",
                 "mhc_transformer_tiny", "frac_connections_transformer_tiny",
                 "attn_res_block_transformer_tiny"):
        model, _, _ = build_translation_model(arch)
        marked = {name for name, p in model.named_parameters()
                  if getattr(p, "optim_overrides", None)}
        assert marked and marked == {name for name, _ in model.named_parameters()
                                     if ".depth.connection." in name}, arch


def test_dwa_checkpoints_from_before_the_interface_load_into_the_connection():
    model, _, _ = build_translation_model("dwa_transformer_tiny")
    with torch.no_grad():
        for p in model.encoder.depth.connection.parameters():
            p.normal_()
    state = model.state_dict()
    old = {key.replace(".depth.connection.averages.", ".layers.")
           .replace(".weight", ".depth_average.weight") if ".averages." in key else key: value
           for key, value in state.items()}
    assert "encoder.layers.1.depth_average.weight" in old
    fresh, _, _ = build_translation_model("dwa_transformer_tiny", seed=4)
    fresh.load_state_dict(old)  # fairseq's load: upgrade, then strict
    for key, value in state.items():
        assert torch.equal(fresh.state_dict()[key], value), key


@pytest.mark.parametrize("arch,extra", [
    ("hyper_connections_transformer_tiny", []), ("mhc_lite_transformer_tiny", []),
    ("attn_res_transformer_tiny", []), ("laurel_pa_transformer_tiny", []),
    # separate key / value inputs and the values' hook, cached by fairseq's incremental state
    ("mudd_transformer_tiny", ["--mudd-ways", "qkvr", "--value-residual", "fixed"])])
def test_seq2seq_train_then_generate_with_only_the_user_dir(scan_bin, arch, extra):
    ckpt = train(scan_bin, arch, *extra, updates=10)
    out = run_cli("fairseq-generate", scan_bin / "bin", "--user-dir", PLUGIN_DIR, "--path", ckpt,
                  "--gen-subset", "valid", "--beam", "3", "--batch-size", "64",
                  "--required-batch-size-multiple", "1", "--max-len-b", "20")
    assert sum(line.startswith("H-") for line in out.splitlines()) == 200


@pytest.mark.parametrize("flags", [["--hyper-connections", "dynamic"], ["--mhc", "sinkhorn"],
                                   ["--mhc", "lite"], ["--frac-connections", "dynamic"]])
def test_the_stacked_parameters_are_sliced_once_per_pass(flags):
    """A sub-layer's slice of a parameter stacked over the sub-layers (K x ...) comes from one
    unbind per pass (multi_stream._Pass.sublayer; HC's dynamic maps are prepared once per pass
    for all sub-layers): the backward runs no per-slice zero-filled gradient of the whole
    parameter (select_backward: 8 per sub-layer when each sub-layer indexed its slices), fewer
    operators, and the gradients of a model that prepares and indexes per sub-layer."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Names(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.names = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.names.append(func.__name__.split(".")[0])
            return func(*args, **(kwargs or {}))

    from fairseq_plugins.depth import multi_stream

    def gradients(monkeypatch=None):
        model = build_language_model("gpt_baseline_lm_tiny", flags + ["--no-fused-kernels"],
                                     seed=3)[0].double()
        tokens = torch.randint(4, 24, (2, 7), generator=torch.Generator().manual_seed(0))
        loss = model(tokens)[0].square().sum()
        with Names() as seen:
            loss.backward()
        return seen.names, {n: p.grad for n, p in model.decoder.depth.named_parameters()}

    names, unbound = gradients()
    assert "select_backward" not in names and "stack" in names
    # the gradients of a model whose sub-layers index their slices and prepare what the pass
    # prepares once (HC's dynamic maps) for themselves: the former way, another graph
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(multi_stream._Pass, "sublayer",
                      lambda self, connection, name, k: getattr(connection, name)[k])
        patch.setattr(multi_stream._Pass, "once", lambda self, name, make: make())
        reference, indexed = gradients()
    assert len(reference) > len(names)
    assert indexed.keys() == unbound.keys()
    for name, grad in unbound.items():
        torch.testing.assert_close(grad, indexed[name], rtol=1e-12, atol=1e-14, msg=name)
