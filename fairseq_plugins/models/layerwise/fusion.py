"""Layer-wise representation fusion (LRF; Zheng et al. 2023, arXiv 2307.10799): the flags, their
defaults and validation, resolved per stack into :class:`FusionOptions`.

``--encoder-fusion`` / ``--decoder-fusion`` add a fuse-attention sub-layer
(:mod:`fairseq_plugins.modules.fuse_attention`) to every layer (or the ``--fusion-layers``) of
that stack; see docs/ideas/fusion.md.
"""
import argparse
from dataclasses import dataclass
from typing import FrozenSet, Optional

from .indices import parse_layer_indices

DEFAULTS = {"encoder_fusion": False, "decoder_fusion": False, "fusion_heads": None,
            "fusion_layers": None, "fusion_include_embedding": True}


def add_args(parser):
    # fairseq hands add_args its model argument group already (nesting groups is deprecated)
    parser.add_argument("--encoder-fusion", action=argparse.BooleanOptionalAction,
                        help="add a fuse-attention sub-layer (over all lower layers' outputs, "
                             "per token) to the encoder layers (default: off; on in fusion_* "
                             "presets)")
    parser.add_argument("--decoder-fusion", action=argparse.BooleanOptionalAction,
                        help="the same for the decoder layers")
    parser.add_argument("--fusion-heads", type=int, metavar="N",
                        help="attention heads of the fuse-attention (default: the stack's "
                             "--encoder/decoder-attention-heads); must divide the embedding dim")
    parser.add_argument("--fusion-layers", type=str, metavar="IDX,IDX,...",
                        help="0-based indices of the layers that fuse, in every fused stack, "
                             "like --encoder-layers-to-keep (default: all layers)")
    parser.add_argument("--fusion-include-embedding", action=argparse.BooleanOptionalAction,
                        help="include the embedding output h_0 among the fused states "
                             "(default: on, as in the paper)")


@dataclass(frozen=True)
class FusionOptions:
    """One stack's fusion: the 0-based ``layers`` that fuse, the fuse-attention ``heads``, and
    whether the embedding output h_0 is among the fused states."""
    layers: FrozenSet[int]
    heads: int
    include_embedding: bool

    def records_input_of(self, index: int) -> bool:
        """Layer ``index`` records its input for the layers above it (the first layer's input is
        the embedding output h_0, recorded only when it is fused)."""
        return index > 0 or self.include_embedding


# the fuse-attention reads its K/V weights directly (see FuseAttention): hooks on fairseq's
# Linear layers (quant-noise) would miss them
NEW_ATTENTION = True


def active(args, side=None):
    """The flags that turn fusion on (in ``side``'s stack, or in either), e.g.
    ['--encoder-fusion']; empty when it is off."""
    sides = (side,) if side else ("encoder", "decoder")
    return [f"--{s}-fusion" for s in sides if getattr(args, f"{s}_fusion", False)]


def validate(args):
    if not (args.encoder_fusion or args.decoder_fusion) and (args.fusion_layers
                                                            or args.fusion_heads):
        raise ValueError("--fusion-layers/--fusion-heads were given but neither "
                         "--encoder-fusion nor --decoder-fusion is on")


def resolve(args, side: str, num_layers: int) -> Optional[FusionOptions]:
    """``side``'s fusion (None when that stack does not fuse), validated."""
    if not getattr(args, f"{side}_fusion"):
        return None
    if num_layers < 2:
        raise ValueError(
            f"--{side}-fusion needs at least 2 {side} layers (--{side}-layers={num_layers}): "
            "with one layer there is nothing below it to fuse")
    first = 0 if args.fusion_include_embedding else 1
    layers = parse_layer_indices(args.fusion_layers, "--fusion-layers")
    if layers is None:
        layers = list(range(first, num_layers))
    for idx in layers:
        if not first <= idx < num_layers:
            why = "" if first == 0 else " (layer 0 has nothing below it without the embedding)"
            raise ValueError(f"--fusion-layers index {idx} is out of range for the {side}: "
                             f"allowed {first}..{num_layers - 1}{why}")
    heads = args.fusion_heads or getattr(args, f"{side}_attention_heads")
    dim = getattr(args, f"{side}_embed_dim")
    if heads <= 0 or dim % heads != 0:
        divisors = [h for h in range(1, dim + 1) if dim % h == 0 and h <= 64]
        raise ValueError(f"--fusion-heads={heads} must divide --{side}-embed-dim={dim}; "
                         f"allowed: {divisors}")
    return FusionOptions(frozenset(layers), heads, bool(args.fusion_include_embedding))
