"""opus-mt (Marian) conversion, tested on a tiny MarianMTModel built locally (no download)."""
import json
import os
import shutil

import pytest
import torch
from conftest import run_cli, run_script
from helpers import PLUGIN_DIR, SCRIPTS, beam_search

transformers = pytest.importorskip("transformers")
spm = pytest.importorskip("sentencepiece")

WORDS = ("der die das haus katze hund sieht läuft schnell klein groß the cat dog house sees "
         "runs fast small big a an und and nicht not heute today").split()


@pytest.fixture(scope="module")
def tiny_marian(tmp_path_factory):
    root = tmp_path_factory.mktemp("marian")
    corpus = root / "corpus.txt"
    import random

    rng = random.Random(0)
    corpus.write_text("\n".join(" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 9)))
                                for _ in range(400)), encoding="utf-8")
    spm.SentencePieceTrainer.train(input=str(corpus), model_prefix=str(root / "spm"),
                                   vocab_size=48, model_type="unigram", bos_id=-1, eos_id=-1,
                                   pad_id=-1, unk_id=0, minloglevel=2)
    sp = spm.SentencePieceProcessor(model_file=str(root / "spm.model"))
    vocab = {"</s>": 0, "<unk>": 1}
    for i in range(1, sp.get_piece_size()):
        vocab[sp.id_to_piece(i)] = len(vocab)
    vocab["<pad>"] = len(vocab)
    size = len(vocab)
    config = transformers.MarianConfig(
        vocab_size=size, d_model=16, encoder_layers=2, decoder_layers=2,
        encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32,
        decoder_ffn_dim=32, max_position_embeddings=64, pad_token_id=size - 1, eos_token_id=0,
        decoder_start_token_id=size - 1, activation_function="swish", scale_embedding=True,
        share_encoder_decoder_embeddings=True, init_std=0.3)  # large: logits depend on every part
    torch.manual_seed(0)
    model = transformers.MarianMTModel(config).eval()
    with torch.no_grad():  # non-zero so that the conversion of the bias is tested too
        model.final_logits_bias.normal_(0, 0.5)
    hf_dir = root / "hf"
    model.save_pretrained(hf_dir)
    (hf_dir / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    for name in ("source.spm", "target.spm"):
        shutil.copyfile(root / "spm.model", hf_dir / name)
    return {"dir": hf_dir, "model": model, "vocab": vocab, "sp": sp, "root": root}


def _convert(hf_dir, out_dir, *extra):
    return run_script(os.path.join(SCRIPTS, "convert_opus_mt.py"), hf_dir, out_dir, *extra)


@pytest.fixture(scope="module")
def converted(tiny_marian):
    out = tiny_marian["root"] / "fairseq"
    proc = _convert(tiny_marian["dir"], out)
    assert proc.returncode == 0, proc.stderr
    return out


def _load(converted, arch=None):
    from fairseq import checkpoint_utils

    overrides = {"data": str(converted)}
    if arch:
        overrides.update(arch=arch, bridge="fc", bridge_init="original")
    models, cfg, task = checkpoint_utils.load_model_ensemble_and_task(
        [str(converted / "checkpoint.pt")], arg_overrides=overrides)
    return models[0].eval(), task


def _encode(tiny, sentences):
    """HF-style right-padded Marian ids with </s>, and the same left-padded in fairseq ids."""
    sp, vocab = tiny["sp"], tiny["vocab"]
    rows = [[vocab.get(p, 1) for p in sp.encode(s, out_type=str)] + [0] for s in sentences]
    width = max(map(len, rows))
    pad = len(vocab) - 1
    hf = torch.tensor([r + [pad] * (width - len(r)) for r in rows])
    return hf, rows


def test_conversion_logits_match_hf(tiny_marian, converted):
    model, task = _load(converted)
    d = task.source_dictionary
    inv = {v: k for k, v in tiny_marian["vocab"].items()}
    hf_src, rows = _encode(tiny_marian, ["der hund sieht die katze", "the cat runs fast today"])
    mask = hf_src.ne(len(inv) - 1)
    to_fs = torch.tensor([d.index(inv[m]) if m not in (0, 1, len(inv) - 1) else
                          {0: d.eos(), 1: d.unk(), len(inv) - 1: d.pad()}[m]
                          for m in range(len(inv))])
    fs_src = torch.full_like(hf_src, d.pad())
    for i, r in enumerate(rows):
        fs_src[i, hf_src.size(1) - len(r):] = to_fs[torch.tensor(r)]
    dec = torch.tensor([[len(inv) - 1, 5, 9, 12], [len(inv) - 1, 7, 7, 3]])
    fs_prev = to_fs[dec]
    fs_prev[:, 0] = d.eos()
    with torch.no_grad():
        hf_logits = tiny_marian["model"](input_ids=hf_src, attention_mask=mask.long(),
                                         decoder_input_ids=dec).logits
        fs_logits, _ = model(fs_src, mask.sum(1), fs_prev)
    assert (fs_logits[:, :, to_fs] - hf_logits).abs().max() < 1e-4
    assert fs_logits[:, :, d.bos()].max() < -1e3  # fairseq's extra <s> is never predicted


def test_greedy_outputs_match_hf(tiny_marian, converted):
    model, task = _load(converted)
    d = task.source_dictionary
    inv = {v: k for k, v in tiny_marian["vocab"].items()}
    pad = len(inv) - 1
    sentences = ["das kleine haus", "a dog sees the small cat", "heute nicht"]
    for sentence in sentences:
        hf_src, rows = _encode(tiny_marian, [sentence])
        with torch.no_grad():
            hf_out = tiny_marian["model"].generate(
                hf_src, num_beams=1, do_sample=False, max_new_tokens=8, bad_words_ids=[[pad]])
        hf_tokens = [inv[i] for i in hf_out[0].tolist()[1:] if i != pad]
        src = torch.tensor([[d.index(inv[m]) if m else d.eos() for m in rows[0]]])
        with torch.no_grad():
            fs_out = beam_search(model, task, src, torch.tensor([src.size(1)]), beam=1,
                                 max_len_b=8)[0][0]["tokens"].tolist()
        fs_tokens = [d[i] for i in fs_out]
        n = min(len(hf_tokens), len(fs_tokens), 7)  # both force </s> at their length limit
        assert n > 0 and hf_tokens[:n] == fs_tokens[:n]


def test_interactive_with_sentencepiece(converted):
    out = run_cli("fairseq-interactive", converted, "--user-dir", PLUGIN_DIR,
                  "--path", converted / "checkpoint.pt", "--source-lang", "de",
                  "--target-lang", "en", "--bpe", "sentencepiece",
                  "--sentencepiece-model", converted / "source.spm", "--beam", "2",
                  "--max-len-b", "10", stdin="der hund sieht die katze\ndas haus\n")
    assert sum(line.startswith("H-") for line in out.splitlines()) == 2
    assert sum(line.startswith("D-") for line in out.splitlines()) == 2


def test_bridge_finetune_start_equals_converted_model(tiny_marian, converted):
    plain, task = _load(converted)
    bridged, _ = _load(converted, arch="bridge_opus_mt_de_en")
    assert bridged.encoder.bridge is not None
    src = torch.tensor([[5, 9, 12, 7, 2], [1, 1, 8, 6, 2]])
    prev = torch.tensor([[2, 5, 6], [2, 9, 9]])
    with torch.no_grad():
        expected = plain(src, torch.tensor([5, 3]), prev)[0]
        assert torch.equal(bridged(src, torch.tensor([5, 3]), prev)[0], expected)


def test_swish_is_silu():
    from fairseq import utils

    x = torch.randn(5)
    assert torch.equal(utils.get_activation_fn("swish")(x), torch.nn.functional.silu(x))
    assert utils.get_activation_fn("relu") is torch.nn.functional.relu


def test_marian_positions_match_hf_table(tiny_marian):
    from fairseq_plugins.modules.marian_embeddings import MarianSinusoidalPositionalEmbedding

    hf = tiny_marian["model"].model.encoder.embed_positions.weight.detach()
    ours = MarianSinusoidalPositionalEmbedding.build_table(*hf.shape)
    assert (hf - ours).abs().max() < 1e-6
    module = MarianSinusoidalPositionalEmbedding(64, 16, padding_idx=1)
    left_padded = torch.tensor([[1, 1, 7, 8, 2], [5, 6, 7, 8, 2]])
    out = module(left_padded)
    assert torch.equal(out[0, 2:], ours[:3]) and torch.equal(out[1], ours[:5])
    assert torch.equal(module(left_padded, incremental_state={}), ours[4:5].expand(2, 1, 16))


def test_non_marian_and_missing_files_are_errors(tiny_marian, tmp_path):
    bad = tmp_path / "bart"
    shutil.copytree(tiny_marian["dir"], bad)
    config = json.loads((bad / "config.json").read_text())
    config["model_type"] = "bart"
    (bad / "config.json").write_text(json.dumps(config))
    proc = _convert(bad, tmp_path / "out1")
    assert proc.returncode == 2 and "not a Marian model (config.json model_type='bart')" \
        in proc.stderr
    missing = tmp_path / "nospm"
    shutil.copytree(tiny_marian["dir"], missing)
    (missing / "source.spm").unlink()
    proc = _convert(missing, tmp_path / "out2")
    assert proc.returncode == 2 and "missing source.spm" in proc.stderr
    assert proc.stderr.strip().count("\n") == 0
    assert not (tmp_path / "out1").exists() and not (tmp_path / "out2").exists()
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".tmp")]
