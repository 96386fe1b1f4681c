"""Depth-weighted averaging (DenseFormer) and transparent attention as switches of
layerwise_transformer: exact start as the transformer (DWA), the combinations they compute,
incremental decoding, beam search, the real CLIs, and build-time errors."""
import pytest
import torch
from conftest import run_cli, train
from helpers import (PLUGIN_DIR, assert_batch_equals_one_by_one, assert_starts_as,
                     build_translation_model, calls_in_one_beam_search, incremental_decode,
                     random_batch)

from fairseq_plugins.depth.dwa import (DepthWeightedAverage, dwa_inputs,
                                                             has_dwa)

PRE_NORM = ["--encoder-normalize-before", "--decoder-normalize-before"]
DWA_BOTH = ["--encoder-fusion", "--decoder-fusion", "--fusion-kind", "dwa"]


def _randomise(model, skip, seed=1):
    """Random weights everywhere except the parameters whose name contains ``skip``."""
    g = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        if skip not in name:
            p.data.copy_(torch.randn(p.shape, generator=g) * 0.3 + ("layer_norm" in name and
                                                                  "weight" in name))


def _randomise_dwa(model, seed=3):
    g = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        if "depth.connection.averages." in name:
            p.data.copy_(torch.randn(p.shape, generator=g) * 0.5)


def test_dwa_inputs_follow_dilation_and_period():
    assert dwa_inputs(1, 1) == (0, 1) and dwa_inputs(3, 1) == (0, 1, 2, 3)
    assert dwa_inputs(4, 2) == (0, 2, 4) and dwa_inputs(3, 2) == (1, 3)
    assert dwa_inputs(5, 3) == (2, 5)
    assert [b for b in range(1, 7) if has_dwa(b, 2)] == [2, 4, 6]
    dwa = DepthWeightedAverage((0, 2, 4))
    assert dwa.weight.tolist() == [0.0, 0.0, 1.0]
    states = [torch.randn(3, 2, 4) for _ in range(5)]
    with torch.no_grad():
        dwa.weight.copy_(torch.tensor([0.5, -2.0, 0.25]))
    expected = 0.5 * states[0] - 2.0 * states[2] + 0.25 * states[4]
    assert torch.allclose(dwa(states), expected, atol=1e-6)


@pytest.mark.parametrize("extra", [[], PRE_NORM])
@pytest.mark.parametrize("stacks", [["--encoder-fusion"], ["--decoder-fusion"],
                                    ["--encoder-fusion", "--decoder-fusion"]])
def test_dwa_starts_as_the_transformer_exactly(stacks, extra):
    base, task, _ = build_translation_model("transformer_tiny", extra, seed=1)
    _randomise(base, skip="depth.connection")
    dense, _, _ = build_translation_model("layerwise_transformer_tiny",
                                          stacks + ["--fusion-kind", "dwa"] + extra,
                                          task.source_dictionary, task.target_dictionary)
    # a transformer checkpoint loads strictly: the DWA weights get their initialisation
    difference = assert_starts_as(dense, base, task)
    _randomise_dwa(dense)  # and the averages are really in the path
    assert difference() > 1e-4


@pytest.mark.parametrize("dilation,period", [(1, 1), (2, 1), (1, 2), (2, 3)])
def test_dwa_encoder_computes_the_weighted_averages(dilation, period):
    """The DWA encoder against fairseq's own layers with the averages applied by hand."""
    flags = ["--encoder-layers", "4", "--encoder-fusion", "--fusion-kind", "dwa",
             "--dwa-dilation", str(dilation), "--dwa-period", str(period)]
    base, task, _ = build_translation_model("transformer_tiny", ["--encoder-layers", "4"], seed=1)
    _randomise(base, skip="depth.connection")
    dense, _, _ = build_translation_model("layerwise_transformer_tiny", flags,
                                          task.source_dictionary, task.target_dictionary)
    dense.load_state_dict(base.state_dict(), strict=True)
    _randomise_dwa(dense)
    base.eval(), dense.eval()
    src, lengths, _ = random_batch(task.source_dictionary, task.target_dictionary)
    padding = src.eq(task.source_dictionary.pad())
    x, _ = base.encoder.forward_embedding(src)
    x = (x * (1 - padding.unsqueeze(-1).type_as(x))).transpose(0, 1)  # as fairseq's encoder
    states = [x]
    averages = {int(i): average
                for i, average in dense.encoder.depth.connection.averages.items()}
    assert sorted(averages) == [b - 1 for b in range(1, 5) if b % period == 0]
    for i, layer in enumerate(base.encoder.layers):
        states.append(layer(x, encoder_padding_mask=padding))
        block = i + 1
        x = states[-1]
        if i in averages:
            assert averages[i].inputs == dwa_inputs(block, dilation)
            w = averages[i].weight
            x = sum(w[k] * states[j] for k, j in enumerate(averages[i].inputs))
    with torch.no_grad():
        out = dense.encoder(src, src_lengths=lengths)["encoder_out"][0]
    assert torch.allclose(out, x, atol=1e-5)


@pytest.mark.parametrize("extra", [
    DWA_BOTH, DWA_BOTH + PRE_NORM + ["--dwa-dilation", "2", "--dwa-period", "2",
                                     "--encoder-layers", "4", "--decoder-layers", "4"],
    DWA_BOTH + ["--bridge", "fc", "--bridge-init", "random"],
    ["--decoder-fusion", "--fusion-kind", "dwa", "--cross-attention", "swapped"],
    ["--bridge", "transparent"], ["--bridge", "transparent"] + DWA_BOTH + PRE_NORM,
])
def test_incremental_equals_full_forward(extra):
    model, task, _ = build_translation_model("layerwise_transformer_tiny", extra, seed=2)
    _randomise_dwa(model)
    _randomise_transparent(model)
    model.eval()
    src, lengths, prev = random_batch(task.source_dictionary, task.target_dictionary, tgt_len=8)
    full, _ = model(src, lengths, prev)
    assert (full - incremental_decode(model, src, lengths, prev)).abs().max() < 1e-5


@pytest.mark.parametrize("extra", [DWA_BOTH, ["--bridge", "transparent"]])
def test_beam_search_batch_equals_one_by_one(extra):
    model, task, _ = build_translation_model("layerwise_transformer_tiny", extra, seed=2)
    _randomise_dwa(model)
    _randomise_transparent(model)
    model.eval()
    src, lengths, _ = random_batch(task.source_dictionary, task.target_dictionary, bsz=3, seed=5)
    assert_batch_equals_one_by_one(model, task, src, lengths, beam=4)


def _randomise_transparent(model, seed=4):
    bridge = getattr(model.encoder, "bridge", None)
    if bridge is not None and hasattr(bridge, "combination_weights"):
        g = torch.Generator().manual_seed(seed)
        bridge.weight.data.copy_(torch.randn(bridge.weight.shape, generator=g))


def test_transparent_memories_are_softmax_weighted_encoder_states():
    model, task, _ = build_translation_model("layerwise_transformer_tiny",
                                             ["--bridge", "transparent", "--encoder-layers", "3",
                                              "--decoder-layers", "2"], seed=1)
    bridge = model.encoder.bridge
    assert bridge.weight.shape == (2, 4)  # N_dec x (N + 1): h_0 .. h_3
    assert torch.equal(bridge.combination_weights(), torch.full((2, 4), 0.25))  # uniform start
    _randomise_transparent(model)
    model.eval()
    src, lengths, _ = random_batch(task.source_dictionary, task.target_dictionary)
    with torch.no_grad():
        out = model.encoder(src, src_lengths=lengths, return_all_hiddens=True)
    states = out["encoder_states"][:-1] + [out["encoder_out"][0]]  # h_0 .. h_N as the decoder sees
    weights = torch.softmax(bridge.weight, dim=-1)
    assert torch.allclose(weights.sum(-1), torch.ones(2))
    for i in range(2):
        expected = sum(weights[i, j] * states[j] for j in range(4))
        assert torch.allclose(out["bridge_memories"][0][i], expected, atol=1e-5)


def test_transparent_memories_are_computed_once_per_source():
    model, task, _ = build_translation_model("layerwise_transformer_tiny",
                                             ["--bridge", "transparent"])
    assert calls_in_one_beam_search(model, task, model.encoder.bridge)[0] == 1


@pytest.mark.parametrize("extra,message", [
    (["--dwa-period", "2"], "--dwa-dilation/--dwa-period were given but --fusion-kind is "
                            "attention"),
    (["--fusion-kind", "dwa"], "neither --encoder-fusion nor --decoder-fusion is on"),
    (DWA_BOTH + ["--fusion-heads", "2"], "--fusion-heads applies to --fusion-kind attention"),
    (DWA_BOTH + ["--fusion-layers", "1"], "--fusion-layers applies to --fusion-kind attention"),
    (DWA_BOTH + ["--no-fusion-include-embedding"], "dwa always averages the embedding output"),
    (DWA_BOTH + ["--dwa-period", "3"], "--dwa-period 3 is larger than the 2 encoder layers"),
    (DWA_BOTH + ["--dwa-dilation", "0"], "--dwa-dilation must be >= 1"),
    (["--bridge", "transparent", "--bridge-init", "gca"],
     "--bridge-init applies to --bridge fc"),
    (["--bridge", "transparent", "--no-bridge-include-embedding"],
     "transparent attention always includes the embedding output"),
    (["--bridge", "transparent", "--encoder-layerdrop", "0.1"],
     "--encoder-layerdrop is not supported with --bridge transparent"),
    (DWA_BOTH + ["--checkpoint-activations"],
     "--checkpoint-activations is not supported together with --encoder-fusion, "
     "--decoder-fusion"),
])
def test_build_time_errors(extra, message):
    with pytest.raises(ValueError, match=message.replace("-", r"\-")):
        build_translation_model("layerwise_transformer_tiny", extra)


@pytest.mark.parametrize("flag,value,choices", [
    ("--fusion-kind", "dense", "'attention', 'dwa'"),
    ("--bridge", "weighted", "'none', 'fc', 'transparent'"),
])
def test_unknown_kinds_are_rejected_naming_the_choices(flag, value, choices, capsys):
    with pytest.raises(SystemExit):
        build_translation_model("layerwise_transformer_tiny", [flag, value])
    err = capsys.readouterr().err
    assert f"argument {flag}: invalid choice: '{value}'" in err and choices in err


def test_train_and_generate_with_the_real_clis(scan_bin):
    # both methods in one model (one training run: CI time), each on its own path
    ckpt = train(scan_bin, "dwa_transformer_tiny", "--bridge", "transparent", "--dwa-period", "2",
                 updates=15, name="dwa-transparent")
    out = run_cli("fairseq-generate", scan_bin / "bin", "--user-dir", PLUGIN_DIR, "--path", ckpt,
                  "--gen-subset", "valid", "--beam", "3", "--batch-size", "64",
                  "--required-batch-size-multiple", "1", "--max-len-b", "60")
    assert sum(line.startswith("H-") for line in out.splitlines()) == 200


def test_plot_bridge_shows_the_transparent_weights(tmp_path):
    import json
    import os

    from conftest import run_script
    from helpers import REPO, SCRIPTS

    ckpt = os.path.join(REPO, "tests", "fixtures", "transparent_transformer", "checkpoint.pt")
    proc = run_script(os.path.join(SCRIPTS, "plot_bridge.py"), ckpt, "--titles", "t",
                      "--out", tmp_path / "b.png", "--json", tmp_path / "b.json")
    assert proc.returncode == 0, proc.stderr
    panel = json.loads((tmp_path / "b.json").read_text())["t"]
    logits = torch.load(ckpt, map_location="cpu", weights_only=False)["model"][
        "encoder.bridge.weight"]
    assert panel["first_encoder_layer"] == 0
    assert torch.allclose(torch.tensor(panel["norms"]), torch.softmax(logits, -1), atol=1e-6)
