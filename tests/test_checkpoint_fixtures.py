"""Stored checkpoints (tests/fixtures, written by scripts/make_checkpoint_fixtures.py) still load
with fairseq's own loaders and give the outputs they gave when they were written.

If this fails after a change, old checkpoints of users broke: make them load again (fairseq's
``upgrade_state_dict_named``), do not regenerate the fixtures."""
import os

import pytest
import torch
from conftest import made_once, run_cli
from helpers import PLUGIN_DIR, REPO

from fairseq import checkpoint_utils

FIXTURES = os.path.join(REPO, "tests", "fixtures")
NAMES = sorted(os.listdir(FIXTURES))


def test_every_architecture_family_has_a_fixture():
    assert {"fusion_transformer", "bridge_transformer", "fusion_bridge_transformer",
            "opus_mt_de_en", "swapped_transformer", "inverted_transformer",
            "decoder_values_transformer", "ar_encdec_lm", "gpt_baseline_lm",
            "gpt_hyper_connections_lm", "gpt_mudd_lm", "ar_value_residual_lm", "gpt_mhc_lm",
            "mhc_lite_transformer", "gpt_frac_connections_lm", "gpt_attn_res_lm",
            "ar_attn_res_block_lm", "mudd_qkvr_value_transformer"} <= set(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_stored_checkpoint_loads_and_reproduces_outputs(name):
    d = os.path.join(FIXTURES, name)
    models, _, _ = checkpoint_utils.load_model_ensemble_and_task(
        [os.path.join(d, "checkpoint.pt")], arg_overrides={"data": d})
    model = models[0].eval()
    expected = torch.load(os.path.join(d, "expected.pt"))
    with torch.no_grad():
        if "tokens" in expected:  # a language model
            out = model(expected["tokens"])
        else:
            out = model(expected["src_tokens"], expected["src_lengths"],
                        expected["prev_output_tokens"])
        lprobs = model.get_normalized_probs(out, log_probs=True)
    torch.testing.assert_close(lprobs, expected["lprobs"], atol=1e-5, rtol=0)


def test_stored_checkpoint_in_fairseq_interactive():
    d = os.path.join(FIXTURES, "fusion_bridge_transformer")
    out = run_cli("fairseq-interactive", d, "--user-dir", PLUGIN_DIR, "--path",
                  os.path.join(d, "checkpoint.pt"), "--source-lang", "src", "--target-lang",
                  "tgt", "--beam", "2", "--max-len-b", "8", stdin="s3 s4 s5\ns1\n")
    assert sum(line.startswith("H-") for line in out.splitlines()) == 2


def test_hub_interface_translate():
    from fairseq_plugins.models.layerwise_transformer import LayerwiseTransformerModel

    d = os.path.join(FIXTURES, "bridge_transformer")
    hub = LayerwiseTransformerModel.from_pretrained(
        d, checkpoint_file="checkpoint.pt", data_name_or_path=d, source_lang="src",
        target_lang="tgt", beam=2, max_len_b=8)
    translations = hub.translate(["s3 s4 s5", "s9 s1"])
    assert len(translations) == 2
    assert all(tok.startswith("t") for line in translations for tok in line.split())


@pytest.mark.parametrize("name", ["ar_encdec_lm", "gpt_baseline_lm"])
def test_lm_hub_interface_sample(name, tmp_path):
    from fairseq.models import ARCH_MODEL_REGISTRY

    d = os.path.join(FIXTURES, name)
    cls = ARCH_MODEL_REGISTRY[f"{name}_tiny"]
    hub = cls.from_pretrained(d, checkpoint_file="checkpoint.pt", data_name_or_path=d)
    samples = hub.sample(["w3 w4", "w9 w1 w2"], beam=2, max_len_b=6)
    assert len(samples) == 2 and samples[0].startswith("w3 w4")
    assert all(tok.startswith("w") or tok == "<unk>" for s in samples for tok in s.split())


SEQ2SEQ = [n for n in NAMES if os.path.exists(os.path.join(FIXTURES, n, "dict.src.txt"))]


@pytest.fixture(scope="module")
def fixture_bins(shared_root):
    """Every seq2seq fixture's dictionaries, a 4-pair test set binarised with them (made once
    per run, only read)."""
    def make(root):
        for name in SEQ2SEQ:
            d = os.path.join(FIXTURES, name)
            shared = name.startswith("opus")
            text = root / name
            text.mkdir()
            (text / "test.src").write_text("s3 s4 s5\ns1 s2\ns9 s8 s7 s6\ns10\n")
            tgt = "s" if shared else "t"
            (text / "test.tgt").write_text(
                f"{tgt}3 {tgt}4\n{tgt}1\n{tgt}9 {tgt}2 {tgt}5\n{tgt}7\n")
            run_cli("fairseq-preprocess", "--source-lang", "src", "--target-lang", "tgt",
                    "--testpref", text / "test", "--srcdict", os.path.join(d, "dict.src.txt"),
                    "--tgtdict", os.path.join(d, "dict.tgt.txt"), "--destdir", text / "bin")

    root, _ = made_once(shared_root, "fixture-bins", make)
    return {name: root / name / "bin" for name in SEQ2SEQ}


@pytest.mark.parametrize("name", SEQ2SEQ)
def test_stored_checkpoint_in_generate_validate_and_hub(name, fixture_bins):
    from fairseq.hub_utils import from_pretrained

    d = os.path.join(FIXTURES, name)
    ckpt = os.path.join(d, "checkpoint.pt")
    out = run_cli("fairseq-generate", fixture_bins[name], "--user-dir", PLUGIN_DIR, "--path", ckpt,
                  "--gen-subset", "test", "--beam", "3", "--max-len-b", "6", "--num-workers", "0",
                  "--batch-size", "4", "--required-batch-size-multiple", "1")
    assert sum(line.startswith("H-") for line in out.splitlines()) == 4
    out = run_cli("fairseq-validate", fixture_bins[name], "--user-dir", PLUGIN_DIR, "--path", ckpt,
                  "--valid-subset", "test", "--task", "translation", "--num-workers", "0",
                  "--batch-size", "4", "--required-batch-size-multiple", "1")
    assert "valid on 'test' subset" in out
    hub = from_pretrained(d, checkpoint_file="checkpoint.pt", data_name_or_path=d,
                          source_lang="src", target_lang="tgt")
    assert len(hub["models"]) == 1 and hub["task"].source_dictionary is not None
