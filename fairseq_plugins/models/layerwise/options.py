"""Resolved options of one ``layerwise_transformer`` stack (encoder or decoder).

Each feature (``fusion``, ``bridge``, ``cross_attention``, ``marian``) owns its flags, their
defaults and their validation in its own module beside this one, and says through
``active(args, side)`` which of its flags change a stack's layers (and through
``new_attention(args)`` whether it builds attention modules of its own). Here they are put
together:
:func:`add_args`, :func:`set_defaults` and :func:`validate` for the model, and
:func:`resolve_stack`, which turns a stack's flags into one :class:`StackOptions` at build time:
for every layer, its 0-based index and its settings
(:class:`~fairseq_plugins.modules.layerwise_layers.LayerOptions`). A stack resolves its options
once, in its constructor, and hands each layer its own entry; nothing is derived again later.
"""
from dataclasses import dataclass
from typing import Optional, Tuple

from fairseq.models.transformer import TransformerConfig

from ... import config, depth, weight_logging
from ...modules.layerwise_layers import LayerOptions
from ...depth import fusion, registry
from . import bridge, cross_attention, marian

# the seq2seq features (the depth connections, fusion among them, are depth.METHODS; a fusion
# flag also changes the layers: their fuse-attention sub-layers, resolved by fusion.resolve)
FEATURES = (bridge, cross_attention, marian)

# what this family's stacks do not offer a depth connection (depth.registry.NEEDS), and why: its
# self-attention (modules/depth_self_attention.py) takes separate key / value inputs and a
# values' hook on both of its paths, so nothing
LACKS = {}

# fairseq's transformer options, flattened as its flags (--encoder-embed-dim, ...)
FairseqTransformerOptions = config.flat_dataclass("FairseqTransformerOptions", TransformerConfig)


@dataclass
class LayerwiseTransformerConfig(*reversed(depth.CONFIGS),
                                 *(feature.CONFIG for feature in reversed(FEATURES)),
                                 weight_logging.WeightLoggingConfig, FairseqTransformerOptions):
    """Every option of ``layerwise_transformer``: fairseq's transformer's, each feature's, the
    depth connections' and the values it reads from the rest of the configuration."""
    finetune_from_model: Optional[str] = config.from_config(
        "checkpoint.finetune_from_model", "checked against this model at build time")

# fairseq layer options that the explicit sub-layer order of LayerwiseEncoder/DecoderLayer (used
# with fusion, the bridge or a cross-attention variant) does not implement, and would otherwise
# silently ignore
UNSUPPORTED_WITH_LAYERWISE = (
    "cross_self_attention", "scale_attn", "scale_heads", "scale_fc", "scale_resid",
    "checkpoint_activations",
)
# quant-noise's hooks would miss the Linear layers of a feature's new_attention
UNSUPPORTED_WITH_NEW_ATTENTION = ("quant_noise_pq",)


@dataclass(frozen=True)
class StackOptions:
    """A stack's resolved options. ``layerwise``: the layers are this package's (explicit
    sub-layer order); otherwise they are fairseq's own, unchanged."""
    layers: Tuple[LayerOptions, ...]
    fusion: Optional["fusion.FusionOptions"]
    layerwise: bool


def add_args(parser):
    """The flags of every feature (fairseq's transformer adds its own)."""
    for feature in FEATURES:
        config.add_flags(parser, feature.CONFIG)
    for depth_config in depth.CONFIGS:
        config.add_flags(parser, depth_config)
    config.add_flags(parser, weight_logging.WeightLoggingConfig)


def set_defaults(args):
    """Every feature's defaults on ``args`` (options already set are kept)."""
    config.set_defaults(args, LayerwiseTransformerConfig)


def validate(args):
    """The checks that need the whole model's flags (each feature's, and fairseq options none of
    the layerwise layers implements); raise ValueError naming the flag and the allowed values."""
    flags = depth.active_flags(args)
    flags += [flag for feature in FEATURES for flag in feature.active(args)]
    unsupported = UNSUPPORTED_WITH_LAYERWISE if flags else ()
    if fusion.new_attention(args) or any(feature.new_attention(args) for feature in FEATURES):
        unsupported += UNSUPPORTED_WITH_NEW_ATTENTION
    for name in unsupported:
        if getattr(args, name, False):
            raise ValueError(f"--{name.replace('_', '-')} is not supported together with "
                             f"{', '.join(flags)} (the layers those build do not implement it)")
    for feature in FEATURES:
        feature.validate(args)
    depth.validate(args)
    depth.refuse_unmet(args, LACKS, "layerwise_transformer")


def resolve_stack(cfg, side: str) -> StackOptions:
    """The options of the ``side`` ('encoder' or 'decoder') stack, validated."""
    num_layers = getattr(cfg, f"{side}_layers")
    stack_fusion = fusion.resolve(cfg, side, num_layers)
    kinds = cross_attention.resolve(cfg, num_layers) if side == "decoder" else {}
    layers = tuple(
        LayerOptions(
            index=i,
            fusion=(stack_fusion if stack_fusion and stack_fusion.kind == "attention"
                    and i in stack_fusion.layers else None),
            cross_attention=kinds.get(i, cross_attention.STANDARD))
        for i in range(num_layers))
    layerwise = (bool(depth.active_flags(cfg, side))
                 or any(feature.active(cfg, side) for feature in FEATURES))
    return StackOptions(layers, stack_fusion, layerwise)
