"""Swapped-role cross-attention (docs/ideas/cross-attention.md): the flags, their
defaults and validation, resolved into the kind of every decoder layer.

``--cross-attention swapped|inverted|decoder-values`` replaces the cross-attention of every
decoder layer (or the ``--cross-attention-layers``) by a causally correct variant
(:mod:`fairseq_plugins.modules.cross_attention`); see docs/ideas/cross-attention.md.
"""
from dataclasses import dataclass
from typing import Dict, Optional

from fairseq.dataclass import FairseqDataclass

from ...config import option
from ...modules.cross_attention import CROSS_ATTENTION_KINDS, DEFAULT_CHUNK_SIZE
from ...config import parse_layer_indices

STANDARD = CROSS_ATTENTION_KINDS[0]  # fairseq's own MultiheadAttention


@dataclass
class CrossAttentionConfig(FairseqDataclass):
    """The cross-attention options (flags ``--cross-attention`` ...; hydra
    ``model.cross_attention`` ...)."""
    cross_attention: Optional[str] = option(
        STANDARD, "decoder cross-attention: standard (fairseq's), swapped (source slots that "
                  "also read the target prefix), inverted (causal doubly normalised: a learned "
                  "coverage penalty), decoder-values (values from the decoder only; a negative "
                  "control)", choices=CROSS_ATTENTION_KINDS)
    cross_attention_layers: Optional[str] = option(
        None, "0-based decoder layers that use the --cross-attention variant; the others keep "
              "standard cross-attention", metavar="IDX,IDX,...", default_text="all layers")
    cross_attention_zero_init: Optional[bool] = option(
        False, "swapped: initialise the decoder-value projection to zero, so that the model "
               "starts exactly as standard cross-attention (e.g. to fine-tune a standard model)")
    cross_attention_chunk_size: Optional[int] = option(
        DEFAULT_CHUNK_SIZE, "swapped/decoder-values: target positions processed together in "
                            "training; memory grows as T x S x N per head", minimum=1,
        metavar="N")


CONFIG = CrossAttentionConfig  # what options.py composes into the model's dataclass
# what a mismatched checkpoint is named by: the swapped-role variants' projections
CHECKPOINT_NAMES = {name: "--cross-attention" for name in ("source_query_proj",
                                                            "target_key_proj",
                                                            "target_value_proj")}


def new_attention(args) -> bool:
    """The variants build Linear layers of their own."""
    return bool(active(args))


def active(args, side=None):
    """['--cross-attention KIND'] for a variant (it changes the decoder's layers only)."""
    kind = getattr(args, "cross_attention", STANDARD)
    return [f"--cross-attention {kind}"] if kind != STANDARD and side in (None, "decoder") else []


def validate(args):
    kind = args.cross_attention
    if kind == STANDARD:
        if args.cross_attention_layers or args.cross_attention_zero_init:
            raise ValueError("--cross-attention-layers/--cross-attention-zero-init were given "
                             "but --cross-attention is standard")
        return
    if getattr(args, "no_cross_attention", False):
        raise ValueError(f"--cross-attention {kind} with --no-cross-attention: there is no "
                         "cross-attention to replace")
    if args.cross_attention_zero_init and kind != "swapped":
        raise ValueError(f"--cross-attention-zero-init applies to swapped only (got {kind}): "
                         "inverted has no decoder values, decoder-values has nothing else")
    if getattr(args, "decoder_xformers_att_config", None) or getattr(args, "xformers_att_config",
                                                                        None):
        raise ValueError(f"xformers attention is not supported with --cross-attention {kind}")


def resolve(args, num_layers: int) -> Dict[int, str]:
    """{decoder layer index: kind} of the layers that use a variant (empty for standard)."""
    kind = getattr(args, "cross_attention", STANDARD)
    if kind == STANDARD:
        return {}
    layers = parse_layer_indices(args.cross_attention_layers, "--cross-attention-layers")
    if layers is None:
        return dict.fromkeys(range(num_layers), kind)
    for idx in layers:
        if not 0 <= idx < num_layers:
            raise ValueError(f"--cross-attention-layers index {idx} is out of range: allowed "
                             f"0..{num_layers - 1} (--decoder-layers)")
    return dict.fromkeys(layers, kind)
