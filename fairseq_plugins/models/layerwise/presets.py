"""The named architectures (``--arch``) of ``layerwise_transformer``: a preset is a set of flag
defaults (user flags win) on one of fairseq's transformer sizes."""
from fairseq.models.transformer import base_architecture, tiny_architecture, transformer_iwslt_de_en

from ... import config, depth
from ...modules.cross_attention import CROSS_ATTENTION_KINDS
from ...registry import register_model_architecture
from .model import MODEL_NAME, layerwise_base_architecture
from .options import LACKS

# --arch layerwise_transformer: registered by register_model (a dataclass model); its defaults
# are layerwise_base_architecture's, applied at build time


def _iwslt_de_en_shared(args):
    # The LRF paper's CoGnition setting: transformer_iwslt_de_en with shared decoder in/out embed.
    args.share_decoder_input_output_embed = getattr(args, "share_decoder_input_output_embed", True)
    transformer_iwslt_de_en(args)


SIZES = {"": base_architecture, "_iwslt_de_en": _iwslt_de_en_shared, "_tiny": tiny_architecture}


def register_preset(name, size_fn, **defaults):
    """Register ``--arch name``: ``defaults`` (flag -> value, user flags win) on ``size_fn``."""

    def preset(args):
        for key, value in defaults.items():
            setattr(args, key, getattr(args, key, value))
        size_fn(args)
        layerwise_base_architecture(args)

    preset.__qualname__ = preset.__name__ = name
    register_model_architecture(MODEL_NAME, name)(config.architecture(preset))


# fusion_transformer{,_iwslt_de_en,_tiny}: both stacks fuse; fusion_enc_* / fusion_dec_*: the
# paper's ablation (encoder-only / decoder-only fusion).
FUSION_SIDES = {"fusion": (True, True), "fusion_enc": (True, False), "fusion_dec": (False, True)}
for _prefix, (_enc, _dec) in FUSION_SIDES.items():
    for _size, _size_fn in SIZES.items():
        register_preset(f"{_prefix}_transformer{_size}", _size_fn, encoder_fusion=_enc,
                        decoder_fusion=_dec)

# layerwise_transformer_tiny: fairseq's tiny sizes, every feature off (switch them by flags)
register_preset(f"{MODEL_NAME}_tiny", SIZES["_tiny"])

# dwa_transformer{,_iwslt_de_en,_tiny}: DenseFormer's depth-weighted averages in both stacks
for _size, _size_fn in SIZES.items():
    register_preset(f"dwa_transformer{_size}", _size_fn, encoder_fusion=True,
                    decoder_fusion=True, fusion_kind="dwa")

# <preset>_transformer{,_iwslt_de_en,_tiny} for every depth-connection preset, as the language
# models' (depth.presets_for: this family lacks nothing, so MUDD's are the paper's four ways; a
# checkpoint saved while they were the residual way only stores --mudd-ways r in its options and
# loads as it was), in both stacks, which are pre-norm (several methods are defined there only)
LAYERWISE_DEPTH = depth.presets_for(LACKS)
for _name, _options in LAYERWISE_DEPTH.items():
    for _size, _size_fn in SIZES.items():
        register_preset(f"{_name}_transformer{_size}", _size_fn, encoder_normalize_before=True,
                        decoder_normalize_before=True, **_options)

# bridge_transformer{,_tiny}: the FC bridge (original init unless --bridge-init says otherwise);
# transparent_transformer{,_tiny}: transparent attention
for _size in ("", "_tiny"):
    register_preset(f"bridge_transformer{_size}", SIZES[_size], bridge="fc")
    register_preset(f"transparent_transformer{_size}", SIZES[_size], bridge="transparent")

# {swapped,inverted,decoder_values}_transformer{,_iwslt_de_en,_tiny}: the cross-attention
# variants in every decoder layer
for _kind in CROSS_ATTENTION_KINDS[1:]:
    for _size, _size_fn in SIZES.items():
        register_preset(f"{_kind.replace('-', '_')}_transformer{_size}", _size_fn,
                        cross_attention=_kind)


def _opus_mt_sizes(args):
    """Helsinki-NLP opus-mt (Marian) transformer: 6+6 layers, d=512, 8 heads, FFN 2048, SiLU,
    post-norm without final norms, scaled embeddings tied across encoder, decoder and output."""
    for key, value in (("encoder_embed_dim", 512), ("encoder_ffn_embed_dim", 2048),
                       ("encoder_layers", 6), ("encoder_attention_heads", 8),
                       ("decoder_layers", 6), ("decoder_attention_heads", 8),
                       ("activation_fn", "swish"), ("dropout", 0.1), ("attention_dropout", 0.0),
                       ("activation_dropout", 0.0), ("share_all_embeddings", True),
                       ("max_source_positions", 512), ("max_target_positions", 512)):
        setattr(args, key, getattr(args, key, value))
    base_architecture(args)


MARIAN = dict(marian_positions=True, final_logits_bias=True, decoder_start_zero_embedding=True)
# opus_mt_de_en: loads checkpoints written by scripts/convert_opus_mt.py; bridge_opus_mt_de_en:
# the same with the FC bridge (fine-tune it with --finetune-from-model converted.pt)
register_preset("opus_mt_de_en", _opus_mt_sizes, **MARIAN)
register_preset("bridge_opus_mt_de_en", _opus_mt_sizes, bridge="fc", **MARIAN)
