#!/usr/bin/env python3
"""Convert a Hugging Face Marian (opus-mt) checkpoint into a fairseq checkpoint.

    python scripts/convert_opus_mt.py HF_DIR OUT_DIR [--source-lang de --target-lang en]

HF_DIR is a MarianMTModel directory (config.json, model.safetensors or pytorch_model.bin,
vocab.json, source.spm, target.spm), e.g. a local copy of Helsinki-NLP/opus-mt-de-en; it is read
with ``transformers``. OUT_DIR receives

  checkpoint.pt                  --arch opus_mt_de_en (or bridge_opus_mt_de_en via
                                 --finetune-from-model), sizes taken from config.json
  dict.<src>.txt dict.<tgt>.txt  the joint vocabulary in fairseq order
  source.spm target.spm          the SentencePiece models, for --bpe sentencepiece
  conversion.json                what was converted and the self-check result

and works directly with fairseq-generate / fairseq-interactive:

    fairseq-interactive OUT_DIR --user-dir $PWD/fairseq_plugins --path OUT_DIR/checkpoint.pt \\
        --source-lang de --target-lang en --bpe sentencepiece \\
        --sentencepiece-model OUT_DIR/source.spm --beam 4

Vocabulary: Marian's ids (</s>, <unk>, ..., <pad>) are re-ordered into fairseq's (<s>, <pad>,
</s>, <unk>, then Marian's order); embedding rows and final_logits_bias follow. fairseq's <s>,
unused by Marian, gets a zero embedding and a -1e4 output bias so that it is never predicted.
Before writing, the converted model's logits are compared with the HF model's on a test batch
(the script fails if they differ by more than --tolerance). The output directory is written
under a temporary name and renamed when complete.
"""
import argparse
import json
import os
import shutil
import sys

# (common also configures logging before fairseq is imported: errors stay one line on stderr)
from layerlab import prepare as common  # noqa: E402  (atomic output directories)

NEVER_PREDICTED = -1e4  # finite: label smoothing sums log-probs over the whole vocabulary
ACTIVATIONS = {"swish": "swish", "silu": "swish", "gelu": "gelu", "relu": "relu"}


class ConversionError(ValueError):
    pass


def check_inputs(hf_dir):
    required = ["config.json", "vocab.json", "source.spm", "target.spm"]
    missing = [f for f in required if not os.path.isfile(os.path.join(hf_dir, f))]
    if not any(os.path.isfile(os.path.join(hf_dir, f))
               for f in ("model.safetensors", "pytorch_model.bin")):
        missing.append("model.safetensors (or pytorch_model.bin)")
    if missing:
        raise ConversionError(f"{hf_dir}: missing {', '.join(missing)}")
    with open(os.path.join(hf_dir, "config.json")) as f:
        config = json.load(f)
    if config.get("model_type") != "marian":
        raise ConversionError(f"{hf_dir}: not a Marian model (config.json model_type="
                              f"{config.get('model_type')!r}); only MarianMTModel is supported")
    if not config.get("share_encoder_decoder_embeddings", True):
        raise ConversionError(f"{hf_dir}: separate source and target vocabularies "
                              "(share_encoder_decoder_embeddings=false) are not supported")
    activation = config.get("activation_function", "gelu")
    if activation not in ACTIVATIONS:
        raise ConversionError(f"{hf_dir}: activation {activation!r} has no fairseq equivalent")
    return config


def build_dictionary(vocab, eos, unk, pad):
    """fairseq Dictionary in Marian order and the fairseq index of every Marian id."""
    from fairseq.data import Dictionary

    by_id = sorted(vocab.items(), key=lambda kv: kv[1])
    if [i for _, i in by_id] != list(range(len(by_id))):
        raise ConversionError("vocab.json ids are not 0..V-1")
    d = Dictionary()
    index = {eos: d.eos(), unk: d.unk(), pad: d.pad()}
    for token, mid in by_id:
        if mid in index:
            continue
        if token in (d.bos_word, d.pad_word, d.eos_word, d.unk_word) or not token.strip() \
                or any(c.isspace() for c in token):
            raise ConversionError(f"vocab.json token {token!r} (id {mid}) cannot be a fairseq "
                                  "dictionary entry")
        index[mid] = d.add_symbol(token)
    return d, index


def convert_state_dict(hf_model, index, fs_vocab_size):
    import torch

    hf = hf_model.state_dict()
    order = torch.tensor(sorted(index)), torch.tensor([index[m] for m in sorted(index)])
    embed = hf["model.shared.weight"]
    fs_embed = embed.new_zeros(fs_vocab_size, embed.size(1))
    fs_embed[order[1]] = embed[order[0]]
    bias = hf["final_logits_bias"].view(-1)
    fs_bias = bias.new_full((fs_vocab_size,), NEVER_PREDICTED)
    fs_bias[order[1]] = bias[order[0]]
    out = {"encoder.embed_tokens.weight": fs_embed, "decoder.embed_tokens.weight": fs_embed,
           "decoder.output_projection.weight": fs_embed, "decoder.final_logits_bias": fs_bias}
    for key, value in hf.items():
        for side in ("encoder", "decoder"):
            prefix = f"model.{side}.layers."
            if key.startswith(prefix):
                out[f"{side}.layers." + key[len(prefix):]] = value
    return out


def check_positions(hf_model, config):
    from fairseq_plugins.modules.marian_embeddings import MarianSinusoidalPositionalEmbedding

    ours = MarianSinusoidalPositionalEmbedding.build_table(config["max_position_embeddings"],
                                                           config["d_model"])
    for side in ("encoder", "decoder"):
        theirs = hf_model.model.get_submodule(f"{side}.embed_positions").weight.detach()
        if theirs.shape != ours.shape or (theirs.float() - ours).abs().max() > 1e-5:
            raise ConversionError(f"the HF {side} positions are not Marian's sinusoids")


def fairseq_args(config, src, tgt, arch):
    from fairseq_plugins.inprocess import parse_args

    flags = ["--source-lang", src, "--target-lang", tgt,
             "--encoder-layers", config["encoder_layers"], "--decoder-layers", config["decoder_layers"],
             "--encoder-embed-dim", config["d_model"], "--decoder-embed-dim", config["d_model"],
             "--encoder-ffn-embed-dim", config["encoder_ffn_dim"],
             "--decoder-ffn-embed-dim", config["decoder_ffn_dim"],
             "--encoder-attention-heads", config["encoder_attention_heads"],
             "--decoder-attention-heads", config["decoder_attention_heads"],
             "--max-source-positions", config["max_position_embeddings"],
             "--max-target-positions", config["max_position_embeddings"],
             "--dropout", config.get("dropout", 0.1),
             "--attention-dropout", config.get("attention_dropout", 0.0),
             "--activation-dropout", config.get("activation_dropout", 0.0)]
    if not config.get("scale_embedding", False):
        flags.append("--no-scale-embedding")
    args = parse_args(arch, flags)
    # set directly: fairseq's --activation-fn choices do not list swish (see compat.py)
    args.activation_fn = ACTIVATIONS[config.get("activation_function", "gelu")]
    args.data = "."
    return args


def self_check(hf_model, fs_model, index, pad_id):
    """Max |logit difference| on a padded batch of random Marian ids (eval mode)."""
    import torch

    g = torch.Generator().manual_seed(0)
    marian_ids = torch.tensor(sorted(index))
    to_fs = torch.full((int(marian_ids.max()) + 1,), -1, dtype=torch.long)
    to_fs[marian_ids] = torch.tensor([index[m] for m in sorted(index)])
    regular = torch.tensor([m for m in sorted(index) if index[m] >= 4])
    eos, start = hf_model.config.eos_token_id, hf_model.config.decoder_start_token_id
    # HF: right-padded source (row 1 one token shorter); fairseq: the same left-padded
    src = regular[torch.randint(len(regular), (2, 7), generator=g)]
    src[0, -1], src[1, -2], src[1, -1] = eos, eos, pad_id
    mask = src.ne(pad_id)
    fs_src = torch.full_like(src, 1)  # fairseq <pad>
    for row in range(2):
        real = to_fs[src[row][mask[row]]]
        fs_src[row, src.size(1) - len(real):] = real
    dec = regular[torch.randint(len(regular), (2, 5), generator=g)]
    dec[:, 0] = start
    fs_prev = to_fs[dec]
    fs_prev[:, 0] = 2  # fairseq starts from </s>
    with torch.no_grad():
        hf_logits = hf_model(input_ids=src, attention_mask=mask.long(),
                             decoder_input_ids=dec).logits
        fs_logits, _ = fs_model(fs_src, mask.sum(1), fs_prev)
    return (fs_logits[:, :, to_fs[marian_ids]] - hf_logits[:, :, marian_ids]).abs().max().item()


def convert(hf_dir, out_dir, src, tgt, arch, tolerance, force=False):
    config = check_inputs(hf_dir)
    if os.path.exists(out_dir) and not force:
        raise ConversionError(f"{out_dir} exists (use --force to replace it)")
    try:
        from transformers import MarianMTModel
    except ImportError as e:
        raise ConversionError(f"transformers is needed to read {hf_dir}: pip install "
                              f"'.[hf]' ({e})") from None
    import torch

    from fairseq.tasks.translation import TranslationTask

    hf_model = MarianMTModel.from_pretrained(hf_dir).eval()
    with open(os.path.join(hf_dir, "vocab.json"), encoding="utf-8") as f:
        vocab = json.load(f)
    eos, pad = config["eos_token_id"], config["pad_token_id"]
    if "<unk>" not in vocab:
        raise ConversionError(f"{hf_dir}/vocab.json has no <unk>")
    dictionary, index = build_dictionary(vocab, eos, vocab["<unk>"], pad)
    check_positions(hf_model, config)
    args = fairseq_args(config, src, tgt, arch)
    task = TranslationTask(args, dictionary, dictionary)
    model = task.build_model(args).eval()
    model.load_state_dict(convert_state_dict(hf_model, index, len(dictionary)), strict=True)
    diff = self_check(hf_model, model, index, pad)
    if diff > tolerance:
        raise ConversionError(f"converted logits differ from the HF model's by {diff:.2e} "
                              f"(> {tolerance})")

    with common.atomic_dir(out_dir) as tmp:
        state = {"args": args, "model": model.state_dict(),
                 "optimizer_history": [{"criterion_name": "CrossEntropyCriterion",
                                        "optimizer_name": "none", "lr_scheduler_state": {},
                                        "num_updates": 0}],
                 "extra_state": {"train_iterator": {"epoch": 1}}, "last_optimizer_state": None}
        torch.save(state, os.path.join(tmp, "checkpoint.pt"))
        for lang in (src, tgt):
            dictionary.save(os.path.join(tmp, f"dict.{lang}.txt"))
        for name in ("source.spm", "target.spm"):
            shutil.copyfile(os.path.join(hf_dir, name), os.path.join(tmp, name))
        with open(os.path.join(tmp, "conversion.json"), "w") as f:
            json.dump({"source": os.path.abspath(hf_dir), "arch": arch, "source_lang": src,
                       "target_lang": tgt, "marian_vocab": len(vocab),
                       "fairseq_vocab": len(dictionary), "max_abs_logit_diff": diff}, f, indent=2)
    return diff


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("hf_dir", help="MarianMTModel directory (local)")
    p.add_argument("out_dir", help="where the fairseq checkpoint and dictionaries go")
    p.add_argument("--source-lang", default="de")
    p.add_argument("--target-lang", default="en")
    p.add_argument("--arch", default="opus_mt_de_en", help="fairseq architecture to write")
    p.add_argument("--tolerance", type=float, default=1e-4,
                   help="largest |logit difference| accepted in the self-check")
    p.add_argument("--force", action="store_true", help="replace an existing OUT_DIR")
    args = p.parse_args(argv)
    try:
        diff = convert(args.hf_dir, args.out_dir, args.source_lang, args.target_lang, args.arch,
                       args.tolerance, args.force)
    except (ConversionError, OSError) as e:
        print(f"convert_opus_mt.py: error: {e}", file=sys.stderr)
        return 2
    print(f"converted {args.hf_dir} -> {args.out_dir} (max |logit diff| vs HF: {diff:.1e})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
