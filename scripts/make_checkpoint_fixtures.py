#!/usr/bin/env python3
"""Write the stored checkpoints of tests/fixtures/ (run only when adding an architecture).

    python scripts/make_checkpoint_fixtures.py [--out tests/fixtures]

For every fixture below: a tiny model (d=16) of that architecture, its dictionaries, and the
decoder output (log-probabilities) on a fixed batch. tests/test_checkpoint_fixtures.py loads each
stored checkpoint with fairseq's own loader and checks it still gives the stored outputs, so a
change that breaks loading old checkpoints (renamed parameters, changed defaults, new required
flags) or silently changes their numbers fails CI. Never regenerate the fixtures to make that
test pass: keep old checkpoints loadable (``upgrade_state_dict_named``) instead.
"""
import argparse
import os
import sys

import torch

from fairseq_plugins.inprocess import (  # noqa: E402
    build_language_model,
    build_translation_model,
    make_dict,
)

SIZES = ["--encoder-embed-dim", "16", "--decoder-embed-dim", "16", "--encoder-ffn-embed-dim", "32",
         "--decoder-ffn-embed-dim", "32", "--encoder-attention-heads", "2",
         "--decoder-attention-heads", "2", "--encoder-layers", "2", "--decoder-layers", "2"]
FIXTURES = {
    "fusion_transformer": ("fusion_transformer_tiny", SIZES),
    "bridge_transformer": ("bridge_transformer_tiny", SIZES + ["--bridge-init", "random"]),
    "fusion_bridge_transformer": ("bridge_transformer_tiny",
                                  SIZES + ["--encoder-fusion", "--decoder-fusion",
                                           "--encoder-normalize-before",
                                           "--decoder-normalize-before", "--bridge-init", "gca"]),
    "opus_mt_de_en": ("opus_mt_de_en", SIZES + ["--max-source-positions", "32",
                                                 "--max-target-positions", "32"]),
    "swapped_transformer": ("swapped_transformer_tiny", SIZES + ["--cross-attention-chunk-size",
                                                                 "2"]),
    "inverted_transformer": ("inverted_transformer_tiny", SIZES),
    "decoder_values_transformer": ("decoder_values_transformer_tiny",
                                   SIZES + ["--cross-attention-layers", "1"]),
    "dwa_transformer": ("dwa_transformer_tiny", SIZES + ["--encoder-layers", "3",
                                                         "--dwa-dilation", "2"]),
    "transparent_transformer": ("transparent_transformer_tiny", SIZES),
    # the depth connections in layerwise_transformer (pre-norm presets)
    "hyper_connections_transformer": ("hyper_connections_transformer_tiny", SIZES),
    # the preset's residual way, as the fixture was written (the preset is the four ways since)
    "mudd_transformer": ("mudd_transformer_tiny", SIZES + ["--mudd-ways", "r"]),
    "mhc_lite_transformer": ("mhc_lite_transformer_tiny", SIZES),
    # separate key / value inputs and the values' hook in the seq2seq self-attention
    "mudd_qkvr_value_transformer": ("mudd_transformer_tiny",
                                    SIZES + ["--mudd-ways", "qkvr", "--value-residual",
                                             "learnable"]),
}
# parameters whose initialisation is a constant (the DWA identity, transparent attention's zero
# logits): drawn at random in the fixture, so that loading them is really checked
RANDOMISED = ("depth.connection.averages.", "bridge.weight")
LM_SIZES = ["--embed-dim", "16", "--layers", "2", "--attention-heads", "2",
            "--tokens-per-sample", "16"]
# language models: (arch, flags); the checkpoint's dictionary is dict.txt
LM_FIXTURES = {
    "ar_encdec_lm": ("ar_encdec_lm_tiny", LM_SIZES + [
        "--cross-attention-heads", "4", "--pos-embed-subtraction", "yes_ln", "--criterion",
        "lm_embedding_loss", "--embedding-loss", "cosine"]),
    "gpt_baseline_lm": ("gpt_baseline_lm_tiny", LM_SIZES),
    # the depth connections (fairseq_plugins.depth), one per method
    "gpt_hyper_connections_lm": ("gpt_baseline_lm_tiny", LM_SIZES + [
        "--hyper-connections", "dynamic", "--hc-expansion-rate", "2"]),
    "gpt_mudd_lm": ("gpt_baseline_lm_tiny", LM_SIZES + ["--mudd"]),
    "gpt_mhc_lm": ("gpt_baseline_lm_tiny", LM_SIZES + ["--mhc", "sinkhorn"]),
    "gpt_frac_connections_lm": ("gpt_baseline_lm_tiny", LM_SIZES + [
        "--frac-connections", "dynamic", "--frac-rate", "2"]),
    "gpt_attn_res_lm": ("gpt_baseline_lm_tiny", LM_SIZES + ["--attn-res", "full"]),
    "ar_attn_res_block_lm": ("ar_encdec_lm_tiny", LM_SIZES + [
        "--cross-attention-heads", "2", "--attn-res", "block", "--attn-res-blocks", "2"]),
    "ar_value_residual_lm": ("ar_encdec_lm_tiny", LM_SIZES + [
        "--cross-attention-heads", "2", "--value-residual", "learnable"]),
    "gpt_laurel_lm": ("gpt_baseline_lm_tiny", LM_SIZES + [
        "--laurel", "rw_lr_pa", "--laurel-rank", "4", "--laurel-lags", "2"]),
    # the encoder-decoder bridge over ar_encdec_lm's encoder
    "ar_transparent_lm": ("ar_encdec_lm_transparent_tiny", LM_SIZES + [
        "--cross-attention-heads", "2"]),
}
# the depth connections' parameters start at the identity (or a constant): moved off it in the
# fixtures, so that loading them is really checked
RANDOMISED_LM = ("depth.connection.", "depth.value_residual.", "decoder.bridge.")


def _save(out, args, model):
    os.makedirs(out, exist_ok=True)
    torch.save({"args": args, "model": model.state_dict(),
                "optimizer_history": [{"criterion_name": "CrossEntropyCriterion",
                                       "optimizer_name": "none", "lr_scheduler_state": {},
                                       "num_updates": 0}],
                "extra_state": {"train_iterator": {"epoch": 1}}, "last_optimizer_state": None},
               os.path.join(out, "checkpoint.pt"))


def _move_off_identity(model):
    """The depth connections' parameters (RANDOMISED_LM) plus 0.3 seeded Gaussian noise."""
    torch.manual_seed(5)
    with torch.no_grad():
        for key, p in model.named_parameters():
            if any(part in key for part in RANDOMISED_LM):
                p.add_(0.3 * torch.randn_like(p))


def make_lm(name, arch, flags, out_root):
    dictionary = make_dict(16, "w")
    model, _, args = build_language_model(arch, flags, dictionary, seed=7)
    _move_off_identity(model)
    args.data = "."
    out = os.path.join(out_root, name)
    _save(out, args, model)
    dictionary.save(os.path.join(out, "dict.txt"))
    model.eval()
    tokens = torch.tensor([[4, 9, 11, 7, 2, 5], [6, 6, 13, 19, 8, 2]])
    with torch.no_grad():
        lprobs = model.get_normalized_probs(model(tokens), log_probs=True)
    torch.save({"tokens": tokens, "lprobs": lprobs}, os.path.join(out, "expected.pt"))
    print(f"{name}: {arch} -> {out}")


def fixed_batch(dictionary):
    src = torch.tensor([[7, 8, 9, 10, 11, 2], [1, 1, 12, 13, 14, 2]])
    lengths = torch.tensor([6, 4])
    prev = torch.tensor([[2, 7, 9, 11], [2, 12, 14, 8]])
    assert int(src.max()) < len(dictionary)
    return src, lengths, prev


def make(name, arch, flags, out_root):
    shared = arch.startswith("opus")  # opus-mt shares one vocabulary between the languages
    src_dict = make_dict(16, "s")
    tgt_dict = src_dict if shared else make_dict(16, "t")
    model, task, args = build_translation_model(arch, ["--source-lang", "src", "--target-lang",
                                                       "tgt"] + flags, src_dict, tgt_dict, seed=7)
    if getattr(model.decoder, "final_logits_bias", None) is not None:
        torch.manual_seed(3)
        model.decoder.final_logits_bias.normal_()
    if name in ("dwa_transformer", "transparent_transformer"):
        torch.manual_seed(5)
        with torch.no_grad():
            for key, p in model.named_parameters():
                if any(part in key for part in RANDOMISED):
                    p.normal_()
    if name in ("hyper_connections_transformer", "mudd_transformer", "mhc_lite_transformer",
                "mudd_qkvr_value_transformer"):
        _move_off_identity(model)  # as the language models'
    args.data = "."
    out = os.path.join(out_root, name)
    _save(out, args, model)
    src_dict.save(os.path.join(out, "dict.src.txt"))
    tgt_dict.save(os.path.join(out, "dict.tgt.txt"))
    model.eval()
    src, lengths, prev = fixed_batch(src_dict)
    with torch.no_grad():
        lprobs = model.get_normalized_probs(model(src, lengths, prev), log_probs=True)
    torch.save({"src_tokens": src, "src_lengths": lengths, "prev_output_tokens": prev,
                "lprobs": lprobs}, os.path.join(out, "expected.pt"))
    print(f"{name}: {arch} -> {out}")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=os.path.join("tests", "fixtures"))
    p.add_argument("--only", help="comma-separated fixture names (default: all)")
    args = p.parse_args(argv)
    for fixtures, maker in ((FIXTURES, make), (LM_FIXTURES, make_lm)):
        for name, (arch, flags) in fixtures.items():
            if args.only is None or name in args.only.split(","):
                maker(name, arch, flags, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
