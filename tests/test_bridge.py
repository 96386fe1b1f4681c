import pytest
import torch
from conftest import assert_lm_evaluates_and_generates, run_cli, run_script, train, train_lm
from helpers import (PLUGIN_DIR, assert_batch_equals_one_by_one,
                     assert_lm_beam_search_scores_equal_full_forward,
                     assert_lm_incremental_equals_full_forward, assert_starts_as,
                     build_language_model, build_translation_model, calls_in_one_beam_search,
                     incremental_decode, random_batch)

from fairseq_plugins.modules.layer_bridge import LayerBridge

PRE_NORM = ["--encoder-normalize-before", "--decoder-normalize-before"]


def _randomise(model, seed=1):
    g = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        if "bridge" not in name:
            p.data.copy_(torch.randn(p.shape, generator=g) * 0.3 + ("layer_norm" in name and
                                                                  "weight" in name))


@pytest.mark.parametrize("extra", [[], PRE_NORM])
def test_original_init_equals_transformer(extra):
    base, task, _ = build_translation_model("transformer_tiny", extra, seed=1)
    _randomise(base)
    bridged, _, _ = build_translation_model("bridge_transformer_tiny", extra,
                                            task.source_dictionary, task.target_dictionary)
    # a fairseq checkpoint without a bridge loads strictly; the bridge gets its original init
    difference = assert_starts_as(bridged, base, task)
    with torch.no_grad():  # and the bridge is really in the path
        bridged.encoder.bridge.weight.add_(0.01)
    assert difference() > 1e-4


def test_gca_init_is_anti_diagonal():
    model, _, _ = build_translation_model("bridge_transformer_tiny",
                                          ["--encoder-layers", "6", "--decoder-layers", "6",
                                           "--bridge-init", "gca"])
    w = model.encoder.bridge.weight.detach()
    d = 64
    assert w.shape == (6, d, 6 * d)
    eye = torch.eye(d)
    for i in range(6):  # decoder layer j = i+1 reads encoder layer 7 - j = block 5 - i
        for k in range(6):
            block = w[i, :, k * d:(k + 1) * d]
            assert torch.equal(block, eye if k == 5 - i else torch.zeros(d, d))
    norms = model.encoder.bridge.block_norms()
    assert torch.equal(norms > 0, torch.eye(6).flip(1).bool())


def test_gca_with_embedding_block_pairs_layers_not_blocks():
    bridge = LayerBridge(4, num_states=4, num_decoder_layers=3, init="gca", first_layer_index=0)
    # blocks [h_0, h_1, h_2, h_3]: decoder layer 1 reads h_3, layer 3 reads h_1 (never h_0)
    assert [bridge.source_block(i) for i in range(3)] == [3, 2, 1]


def test_original_uniform_random_inits():
    d, n = 8, 3
    original = LayerBridge(d, n, 2, "original").weight.detach()
    assert torch.equal(original[:, :, 2 * d:], torch.eye(d).expand(2, d, d))
    assert original[:, :, :2 * d].abs().sum() == 0
    uniform = LayerBridge(d, n, 2, "uniform").weight.detach()
    assert torch.allclose(uniform[0].view(d, n, d).sum(1), torch.eye(d))
    torch.manual_seed(0)
    random = LayerBridge(d, n, 2, "random").weight.detach()
    assert not torch.equal(random[0], random[1]) and random.abs().min() >= 0


@pytest.mark.parametrize("extra", [
    [], PRE_NORM, ["--bridge-init", "gca"], ["--bridge-init", "random", "--bridge-include-embedding"],
    ["--encoder-fusion", "--decoder-fusion", "--bridge-init", "uniform"],
])
def test_incremental_equals_full_forward(extra):
    model, task, _ = build_translation_model("bridge_transformer_tiny", extra)
    model.eval()
    src, lengths, prev = random_batch(task.source_dictionary, task.target_dictionary, tgt_len=8)
    full, _ = model(src, lengths, prev)
    assert (full - incremental_decode(model, src, lengths, prev)).abs().max() < 1e-5


@pytest.mark.parametrize("extra", [["--bridge-init", "random"],
                                   ["--bridge-init", "gca", "--encoder-fusion", "--decoder-fusion"]])
def test_beam_search_batch_equals_one_by_one(extra):
    model, task, _ = build_translation_model("bridge_transformer_tiny", extra, seed=2)
    model.eval()
    src, lengths, _ = random_batch(task.source_dictionary, task.target_dictionary, bsz=3, seed=5)
    assert_batch_equals_one_by_one(model, task, src, lengths, beam=4)


def test_bridge_runs_once_per_source_and_reorder_copies_no_memory():
    model, task, _ = build_translation_model("bridge_transformer_tiny", ["--bridge-init", "random"])
    calls, src, lengths = calls_in_one_beam_search(model, task, model.encoder.bridge)
    assert calls == 1
    enc = model.encoder(src, src_lengths=lengths)
    reordered = model.encoder.reorder_encoder_out(enc, torch.tensor([1, 1, 0]))
    assert reordered["bridge_memories"][0] is enc["bridge_memories"][0]
    assert reordered["bridge_index"][0].tolist() == [1, 1, 0]
    assert enc["encoder_states"] == []  # not carried through beam search unless asked for


@pytest.mark.parametrize("extra,message", [
    (["--bridge-init", "gca", "--decoder-layers", "3"], "needs --encoder-layers == --decoder-layers"),
    (["--encoder-layerdrop", "0.1"], "--encoder-layerdrop is not supported with --bridge fc"),
    (["--checkpoint-activations"], "--checkpoint-activations is not supported"),
])
def test_build_time_errors(extra, message):
    with pytest.raises(ValueError, match=message.replace("-", r"\-")):
        build_translation_model("bridge_transformer_tiny", extra)


def test_bridge_flags_without_bridge_are_rejected():
    with pytest.raises(ValueError, match="add --bridge fc"):
        build_translation_model("layerwise_transformer", ["--bridge-init", "gca"])


@pytest.mark.parametrize("flags,message", [
    (["--encoder-layers", "3"], "checkpoint has 2 encoder layers, the bridge reads 3"),
    (["--encoder-embed-dim", "32", "--decoder-embed-dim", "32"], "width 64, the model's is 32"),
])
def test_finetune_from_checkpoint_that_does_not_fit(flags, message):
    base, task, _ = build_translation_model("transformer_tiny")
    bridged, _, _ = build_translation_model("bridge_transformer_tiny", flags,
                                            task.source_dictionary, task.target_dictionary)
    with pytest.raises(ValueError, match=message):
        bridged.load_state_dict(base.state_dict(), strict=True)


def test_finetune_from_model_end_to_end(scan_bin):
    plain = train(scan_bin, "transformer_tiny", updates=10, name="plain-for-bridge")
    ckpt = train(scan_bin, "bridge_transformer_tiny", "--finetune-from-model", plain,
                 "--bridge-init", "gca", updates=15, name="bridge-ft")
    log = (ckpt.parent / "train.log").read_text()
    assert "encoder.bridge.weight is not in the checkpoint: initialised with --bridge-init gca" \
        in log
    out = run_cli("fairseq-generate", scan_bin / "bin", "--user-dir", PLUGIN_DIR, "--path", ckpt,
                  "--gen-subset", "valid", "--beam", "3", "--batch-size", "64",
                  "--required-batch-size-multiple", "1", "--max-len-b", "60")
    assert sum(line.startswith("H-") for line in out.splitlines()) == 200


def test_finetune_from_a_checkpoint_of_another_depth_ends_with_the_precise_message(scan_bin):
    """fairseq-train stops at build time with the bridge's message as the last line (not
    fairseq's generic "ensure that the architectures match" raised around its load)."""
    plain = train(scan_bin, "transformer_tiny", updates=1, name="plain-2-layers")
    proc = run_cli("fairseq-train", scan_bin / "bin", "--user-dir", PLUGIN_DIR,
                   "--arch", "bridge_transformer_tiny", "--encoder-layers", "3",
                   "--finetune-from-model", plain, "--optimizer", "adam", "--lr", "1e-3",
                   "--max-tokens", "1024", "--max-update", "1", "--num-workers", "0",
                   "--save-dir", scan_bin / "ckpt-bridge-3-layers", check=False)
    assert proc.returncode != 0
    assert proc.stderr.strip().splitlines()[-1] == (
        "ValueError: checkpoint has 2 encoder layers, the bridge reads 3 (--encoder-layers): "
        "cannot add a bridge to it")
    assert not (scan_bin / "ckpt-bridge-3-layers" / "checkpoint_last.pt").exists()


def _save_checkpoint(model, args, path):
    torch.save({"args": args, "model": model.state_dict()}, path)


def test_plot_bridge_heatmap(tmp_path):
    import json

    from helpers import SCRIPTS

    paths = []
    for init in ("original", "gca"):
        model, _, args = build_translation_model(
            "bridge_transformer_tiny", ["--encoder-layers", "3", "--decoder-layers", "3",
                                        "--bridge-init", init])
        paths.append(tmp_path / f"{init}.pt")
        _save_checkpoint(model, args, paths[-1])
    out, norms = tmp_path / "bridge.png", tmp_path / "norms.json"
    proc = run_script(f"{SCRIPTS}/plot_bridge.py", *paths, "--titles", "original,gca",
                      "--out", out, "--json", norms)
    assert proc.returncode == 0, proc.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    data = json.loads(norms.read_text())
    d = 64 ** 0.5  # Frobenius norm of a 64 x 64 identity block
    assert data["original"]["norms"] == [[0.0, 0.0, d]] * 3
    assert data["gca"]["norms"] == [[0.0, 0.0, d], [0.0, d, 0.0], [d, 0.0, 0.0]]

    plain, _, plain_args = build_translation_model("transformer_tiny")
    _save_checkpoint(plain, plain_args, tmp_path / "plain.pt")
    proc = run_script(f"{SCRIPTS}/plot_bridge.py", tmp_path / "plain.pt",
                      "--out", tmp_path / "x.png")
    assert proc.returncode == 2 and "has no bridge" in proc.stderr


# -- the bridge over ar_encdec_lm's encoder ---------------------------------------------------------
LM_BRIDGES = {"fc": ["--bridge", "fc"],
              "fc_random_h0": ["--bridge", "fc", "--bridge-init", "random",
                               "--bridge-include-embedding"],
              "fc_gca_hc": ["--bridge", "fc", "--bridge-init", "gca", "--hyper-connections",
                            "dynamic"],
              "transparent": ["--bridge", "transparent"],
              "transparent_dwa": ["--bridge", "transparent", "--encoder-fusion",
                                  "--fusion-kind", "dwa"]}


def _ar_lm(extra=(), seed=0):
    return build_language_model("ar_encdec_lm_tiny", ["--tokens-per-sample", 16, *extra],
                                seed=seed)


def _lm_tokens(bsz=3, length=12, seed=0):
    return torch.randint(4, 24, (bsz, length), generator=torch.Generator().manual_seed(seed))


def test_lm_bridge_original_init_is_the_model_without_a_bridge():
    plain, _, _ = _ar_lm()
    bridged, _, _ = _ar_lm(LM_BRIDGES["fc"], seed=1)
    assert set(bridged.state_dict()) - set(plain.state_dict()) == {"decoder.bridge.weight"}
    torch.nn.Module.load_state_dict(bridged, {**bridged.state_dict(), **plain.state_dict()})
    plain, bridged = plain.double().eval(), bridged.double().eval()
    tokens = _lm_tokens()
    with torch.no_grad():
        expected = plain(tokens)[0]
        # each block's memory projected by its own GEMM instead of one for all: 1e-15 in float64
        assert (bridged(tokens)[0] - expected).abs().max().item() < 1e-14
        # the bridge is really in the path (not a constant: the memory LayerNorm removes that)
        bridged.decoder.bridge.weight.add_(0.05 * torch.randn_like(bridged.decoder.bridge.weight))
        assert (bridged(tokens)[0] - expected).abs().max().item() > 1e-4


@pytest.mark.parametrize("name", sorted(LM_BRIDGES))
def test_lm_bridge_incremental_equals_full_forward_and_beam_scores(name):
    model, task, _ = _ar_lm(LM_BRIDGES[name], seed=2)
    model.double()
    with torch.no_grad():
        for p in model.decoder.bridge.parameters():
            p.add_(0.3 * torch.randn_like(p))
    assert_lm_incremental_equals_full_forward(model, _lm_tokens())
    assert_lm_beam_search_scores_equal_full_forward(model, task, _lm_tokens(bsz=2, length=3))


def test_lm_bridge_reads_every_encoder_block_causally():
    """Changing a later token changes no memory of an earlier position (the bridge is per
    position), whatever the bridge's weights."""
    model, _, _ = _ar_lm(LM_BRIDGES["fc_random_h0"], seed=3)
    model.eval()
    tokens = _lm_tokens(bsz=1)
    changed = tokens.clone()
    changed[0, 7] = 4 if tokens[0, 7] != 4 else 5
    with torch.no_grad():
        a, b = model(tokens)[0], model(changed)[0]
    assert torch.equal(a[:, :7], b[:, :7]) and not torch.equal(a[:, 7:], b[:, 7:])


def test_lm_bridge_build_time_errors():
    with pytest.raises(ValueError, match="--bridge-init applies to --bridge fc"):
        _ar_lm(["--bridge", "transparent", "--bridge-init", "gca"])
    with pytest.raises(ValueError, match="add --bridge fc"):
        _ar_lm(["--bridge-init", "gca"])
    with pytest.raises(SystemExit):  # gpt_baseline_lm has no encoder, and no --bridge
        build_language_model("gpt_baseline_lm_tiny", ["--bridge", "fc"])


def test_lm_bridge_train_then_eval_lm_and_generate_with_only_the_user_dir(lm_bin, tmp_path):
    ckpt = train_lm(lm_bin, tmp_path / "ckpt", "ar_encdec_lm_bridge_tiny", "--bridge-init", "gca",
                    updates=10)
    args = torch.load(ckpt, weights_only=False)["cfg"]["model"]
    assert args["bridge"] == "fc" and args["bridge_init"] == "gca"
    assert_lm_evaluates_and_generates(lm_bin, ckpt)
