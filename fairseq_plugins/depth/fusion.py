"""Fusion across the layers of a stack: the flags, their defaults and validation, resolved per
stack into :class:`FusionOptions`. Two kinds (``--fusion-kind``):

- ``attention``: layer-wise representation fusion (LRF; Zheng et al. 2023, arXiv 2307.10799).
  ``--encoder-fusion`` / ``--decoder-fusion`` add a fuse-attention sub-layer
  (:mod:`fairseq_plugins.depth.lrf`) to every layer (or the ``--fusion-layers``) of
  that stack; see docs/ideas/fusion.md.
- ``dwa``: depth-weighted averaging (DenseFormer; Pagliardini et al. 2024, arXiv 2402.02622).
  After every ``--dwa-period``-th layer, a learned scalar combination of the embedding output and
  the layers' outputs so far (every ``--dwa-dilation``-th one) becomes the next layer's input
  (:mod:`fairseq_plugins.depth.dwa`); see docs/ideas/dwa.md.
"""
from dataclasses import dataclass
from typing import FrozenSet, Optional

from fairseq.dataclass import FairseqDataclass

from ..config import option, parse_layer_indices
from .dwa import DepthWeightedAverages, has_dwa
from .interface import Connection
from .registry import Method, Stack

KINDS = ("attention", "dwa")
# the two readings of LRF's fuse-attention (docs/ideas/fusion.md); the first is the default
READINGS = ("per-token", "all-positions")
DWA_DEFAULTS = {"dwa_dilation": 1, "dwa_period": 1}  # every layer, every state: the paper's 1x1


@dataclass
class FusionConfig(FairseqDataclass):
    """The fusion options (flags ``--encoder-fusion`` ...; hydra ``model.encoder_fusion`` ...)."""
    encoder_fusion: Optional[bool] = option(
        False, "add a fuse-attention sub-layer (over all lower layers' outputs, per token) to "
               "the encoder layers (on in the fusion_* presets)")
    decoder_fusion: Optional[bool] = option(False, "the same for the decoder layers")
    fusion_heads: Optional[int] = option(
        None, "attention heads of the fuse-attention; must divide the embedding dim",
        minimum=1, metavar="N", default_text="the stack's --encoder/decoder-attention-heads")
    fusion_layers: Optional[str] = option(
        None, "0-based indices of the layers that fuse, in every fused stack, like "
              "--encoder-layers-to-keep", metavar="IDX,IDX,...", default_text="all layers")
    fusion_include_embedding: Optional[bool] = option(
        True, "include the embedding output h_0 among the fused states (as in the paper)")
    fusion_kind: Optional[str] = option(
        KINDS[0], "attention: LRF's fuse-attention sub-layer; dwa: DenseFormer's "
                  "depth-weighted average after the layers", choices=KINDS)
    # stays None unless given, so that giving it with dwa is caught; resolve reads READINGS[0]
    fusion_reading: Optional[str] = option(
        None, "with --fusion-kind attention: per-token = each position attends over its own "
              "outputs of the lower layers (l keys); all-positions = over every position of "
              "the lower layers' outputs (l x T keys, causal in decoders, cached when decoding "
              "incrementally)", choices=READINGS, default_text=READINGS[0])
    fusion_recompute: Optional[bool] = option(
        False, "with --fusion-kind attention: keep only the fuse-attention's inputs for the "
               "backward pass and recompute the rest there (less training memory, one more "
               "fuse-attention forward per update; measured in docs/ideas/fusion.md)")
    # the DWA options stay None unless given, so that giving them without --fusion-kind dwa is
    # caught; dwa itself reads DWA_DEFAULTS for the ones not given
    dwa_dilation: Optional[int] = option(
        None, "with --fusion-kind dwa: average every K-th state only (those congruent to the "
              "layer mod K)", minimum=1, metavar="K", default_text="1, all")
    dwa_period: Optional[int] = option(
        None, "with --fusion-kind dwa: a DWA after every P-th layer only", minimum=1,
        metavar="P", default_text="1, every layer")


CONFIG = FusionConfig  # what options.py composes into the model's dataclass
# the weights' names (a component of their state-dict keys) -> the options that make them: LRF's
# fuse-attention in the blocks, DWA's averages in the stack's connection
CHECKPOINT_NAMES = {"fuse_attn": "--encoder-fusion / --decoder-fusion",
                    "fuse_attn_layer_norm": "--encoder-fusion / --decoder-fusion",
                    "averages": "--encoder-fusion / --decoder-fusion with --fusion-kind dwa"}


@dataclass(frozen=True)
class FusionOptions:
    """One stack's fusion: its ``kind``, the 0-based ``layers`` that fuse (attention) or are
    followed by a DWA (dwa), the fuse-attention ``heads`` (attention only), whether the embedding
    output h_0 is among the fused states, and the DWA ``dilation``."""
    kind: str
    layers: FrozenSet[int]
    heads: Optional[int]
    include_embedding: bool
    dilation: int = 1
    reading: str = READINGS[0]
    recompute: bool = False

    @property
    def first_state(self) -> int:
        """The state h_j a fuse-attention attends first (0: the embedding output)."""
        return 0 if self.include_embedding else 1


def new_attention(args) -> bool:
    """The fuse-attention reads its K/V weights directly (see FuseAttention): hooks on fairseq's
    Linear layers (quant-noise) would miss them. The depth-weighted averages have no Linear."""
    return bool(active(args)) and args.fusion_kind == "attention"


def active(args, side=None):
    """The flags that turn fusion on (in ``side``'s stack, or in either), e.g.
    ['--encoder-fusion']; empty when it is off."""
    sides = (side,) if side else ("encoder", "decoder")
    return [f"--{s}-fusion" for s in sides if getattr(args, f"{s}_fusion", False)]


def validate(args):
    if not (args.encoder_fusion or args.decoder_fusion) and (
            args.fusion_layers or args.fusion_heads or getattr(args, "fusion_reading", None)
            or getattr(args, "fusion_recompute", False)):
        raise ValueError("--fusion-layers/--fusion-heads/--fusion-reading/--fusion-recompute "
                         "were given but neither --encoder-fusion nor --decoder-fusion is on")
    if args.fusion_kind != "dwa":
        if args.dwa_dilation is not None or args.dwa_period is not None:
            raise ValueError(f"--dwa-dilation/--dwa-period were given but --fusion-kind is "
                             f"{args.fusion_kind}; add --fusion-kind dwa")
        return
    if not (args.encoder_fusion or args.decoder_fusion):
        raise ValueError("--fusion-kind dwa was given but neither --encoder-fusion nor "
                         "--decoder-fusion is on")
    for name in ("fusion_heads", "fusion_layers", "fusion_reading", "fusion_recompute"):
        if getattr(args, name):
            raise ValueError(f"--{name.replace('_', '-')} applies to --fusion-kind attention; "
                             "with dwa, --dwa-period and --dwa-dilation choose the averages")
    if not args.fusion_include_embedding:
        raise ValueError("--no-fusion-include-embedding: dwa always averages the embedding "
                         "output x_0 (the states congruent to the layer mod --dwa-dilation)")


def resolve(args, side: str, num_layers: int, heads: Optional[int] = None,
            dim: Optional[int] = None) -> Optional[FusionOptions]:
    """``side``'s fusion (None when that stack does not fuse), validated. ``heads`` / ``dim``:
    the stack's attention heads and width (default: ``args.<side>_attention_heads`` /
    ``args.<side>_embed_dim``)."""
    if not getattr(args, f"{side}_fusion"):
        return None
    if getattr(args, "fusion_kind", KINDS[0]) == "dwa":
        return _resolve_dwa(args, side, num_layers)
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
    heads = args.fusion_heads or heads or getattr(args, f"{side}_attention_heads")
    dim_flag = f"--{side}-embed-dim" if dim is None else "--embed-dim"
    dim = dim or getattr(args, f"{side}_embed_dim")
    if heads <= 0 or dim % heads != 0:
        divisors = [h for h in range(1, dim + 1) if dim % h == 0 and h <= 64]
        raise ValueError(f"--fusion-heads={heads} must divide {dim_flag}={dim}; "
                         f"allowed: {divisors}")
    return FusionOptions("attention", frozenset(layers), heads,
                         bool(args.fusion_include_embedding),
                         reading=getattr(args, "fusion_reading", None) or READINGS[0],
                         recompute=bool(getattr(args, "fusion_recompute", False)))


def _resolve_dwa(args, side: str, num_layers: int) -> FusionOptions:
    dilation, period = (getattr(args, name) or default for name, default in DWA_DEFAULTS.items())
    for flag, value in (("--dwa-period", period), ("--dwa-dilation", dilation)):
        if value > num_layers:
            raise ValueError(f"{flag} {value} is larger than the {num_layers} {side} layers: "
                             f"allowed 1..{num_layers}")
    layers = frozenset(i for i in range(num_layers) if has_dwa(i + 1, period))
    return FusionOptions("dwa", layers, None, True, dilation)


def build(args, stack: Stack) -> Optional[Connection]:
    """The stack's connection where it fuses (None where it does not): DWA's averages, or for
    LRF the plain residual that keeps the history its blocks' fuse-attention reads."""
    if stack.fusion is None:
        return None
    if stack.fusion.kind == "dwa":
        connection = DepthWeightedAverages(stack.layout, stack.fusion.layers,
                                           stack.fusion.dilation)
        connection.flag = f"--{stack.side}-fusion --fusion-kind dwa"
    else:
        connection = Connection(stack.layout, keep_history=True)
        connection.flag = f"--{stack.side}-fusion"
    return connection


# LRF and DWA (--encoder-fusion / --decoder-fusion; the families resolve the options per stack,
# as their blocks' layout depends on them: a fuse-attention is a sub-layer of its block)
METHOD = Method("fusion", "--{side}-fusion", CONFIG, lambda args: bool(active(args)), build,
                validate=validate, checkpoint_names=CHECKPOINT_NAMES, per_stack=True)
