"""Bridges from the encoder's layers to each decoder layer's cross-attention memory: the flags,
their defaults and validation, resolved into :class:`BridgeOptions`. Two kinds (``--bridge``):

- ``fc``: the encoder-decoder FC bridge (Song 2024, arXiv 2405.08570), a bias-free projection of
  all encoder layers per decoder layer
  (:class:`fairseq_plugins.modules.layer_bridge.LayerBridge`); see docs/ideas/bridge.md.
- ``transparent``: transparent attention (Bapna et al. 2018, arXiv 1808.07561), a softmax-weighted
  average of the embedding output and all encoder layers per decoder layer
  (:class:`fairseq_plugins.modules.transparent_attention.TransparentAttention`); see
  docs/ideas/transparent-attention.md.

Either is computed once per source sentence (beam search reorders only an index).
"""
from dataclasses import dataclass
from typing import Optional

from fairseq.dataclass import FairseqDataclass

from ...config import option
from ...modules.layer_bridge import BRIDGE_INITS, LayerBridge
from ...modules.transparent_attention import TransparentAttention

KINDS = ("none", "fc", "transparent")
DEFAULT_INIT = "original"  # the model without a bridge, exactly
# the encoder_out entries the encoder writes and the decoder reads: [N_dec x S x B0 x C] and [B]
MEMORIES, INDEX = "bridge_memories", "bridge_index"


@dataclass
class BridgeConfig(FairseqDataclass):
    """The bridge options (flags ``--bridge`` ...; hydra ``model.bridge`` ...)."""
    bridge: Optional[str] = option(
        "none", "fc: every decoder layer cross-attends to its own bias-free projection of all "
                "encoder layers' outputs; transparent: to its own softmax-weighted average of "
                "the embedding output and all encoder layers", choices=KINDS)
    # bridge_init and bridge_include_embedding stay None unless given: fc records its init at
    # build time, fc leaves h_0 out unless asked, transparent always reads it, and an explicit
    # --no-bridge-include-embedding with transparent is an error
    bridge_init: Optional[str] = option(
        None, "initialisation of the fc bridge: original = read the last encoder layer (the "
              "model without a bridge), gca = decoder layer j reads encoder layer N+1-j, "
              "uniform = average, random", choices=BRIDGE_INITS, default_text=DEFAULT_INIT)
    bridge_include_embedding: Optional[bool] = option(
        None, "fc: also project the embedding output h_0; transparent always averages it",
        default_text="off, as the paper")


CONFIG = BridgeConfig  # what options.py composes into the model's dataclass
CHECKPOINT_NAMES = {"bridge": "--bridge"}  # what a mismatched checkpoint is named by


def enabled(args) -> bool:
    return getattr(args, "bridge", "none") != "none"


def new_attention(args) -> bool:
    """False: the decoder's cross-attention stays fairseq's, reading another memory."""
    return False


def active(args, side=None):
    """['--bridge KIND'] when a bridge is on (it changes the decoder's layers only)."""
    return [f"--bridge {args.bridge}"] if enabled(args) and side in (None, "decoder") else []


@dataclass(frozen=True)
class BridgeOptions:
    """``kind``: fc or transparent; ``init``: one of BRIDGE_INITS (fc; None for transparent);
    ``include_embedding``: h_0 is block 0 of the bridge's input."""
    kind: str
    init: Optional[str]
    include_embedding: bool

    @property
    def first_layer_index(self) -> int:
        """The encoder layer number of block 0 (0: the embedding output)."""
        return 0 if self.include_embedding else 1


def validate(args):
    if not enabled(args):
        # (False is what checkpoints written before transparent attention stored by default)
        if args.bridge_init is not None or args.bridge_include_embedding:
            raise ValueError("--bridge-init/--bridge-include-embedding were given but --bridge is "
                             f"{args.bridge!r}; add --bridge fc")
        return
    if args.bridge == "transparent":
        if args.bridge_init is not None:
            raise ValueError("--bridge-init applies to --bridge fc; transparent attention starts "
                             "from the uniform average")
        if args.bridge_include_embedding is False:
            raise ValueError("--no-bridge-include-embedding: transparent attention always "
                             "includes the embedding output h_0")
    if getattr(args, "no_cross_attention", False):
        raise ValueError(f"--bridge {args.bridge} feeds the cross-attention: not with "
                         "--no-cross-attention")
    for name in ("encoder_layerdrop", "encoder_layers_to_keep"):
        if getattr(args, name, None):
            raise ValueError(f"--{name.replace('_', '-')} is not supported with --bridge "
                             f"{args.bridge}: the bridge reads every encoder layer")


def record_init(args):
    """With the bridge on, write the initialisation used into ``args`` (so that a checkpoint's
    args say which one it started from)."""
    if getattr(args, "bridge", "none") == "fc" and args.bridge_init is None:
        args.bridge_init = DEFAULT_INIT


def resolve(cfg) -> BridgeOptions:
    """The bridge of a model whose args went through :func:`record_init`, validated against the
    stack depths."""
    if cfg.bridge == "transparent":
        return BridgeOptions("transparent", None, True)
    options = BridgeOptions("fc", cfg.bridge_init, bool(cfg.bridge_include_embedding))
    # (a language model's two stacks have one depth, --layers: no stack flags to compare)
    if options.init == "gca" and (getattr(cfg, "encoder_layers", None)
                                  != getattr(cfg, "decoder_layers", None)):
        raise ValueError(f"--bridge-init gca pairs decoder layer j with encoder layer N+1-j and "
                         f"needs --encoder-layers == --decoder-layers (got "
                         f"{cfg.encoder_layers} and {cfg.decoder_layers})")
    return options


def build(cfg):
    """The encoder's bridge: a LayerBridge (fc), a TransparentAttention, or None."""
    if not enabled(cfg):
        return None
    return build_sized(resolve(cfg), cfg.encoder.embed_dim, cfg.encoder.layers,
                       cfg.decoder.layers)


def build_sized(options: BridgeOptions, embed_dim: int, encoder_layers: int,
                decoder_layers: int):
    """The bridge ``options`` describe from ``encoder_layers`` blocks (and the embedding output,
    where it is read) to ``decoder_layers`` memories of width ``embed_dim``."""
    if options.kind == "transparent":
        return TransparentAttention(encoder_layers + 1, decoder_layers)
    return LayerBridge(embed_dim, encoder_layers + options.include_embedding, decoder_layers,
                       options.init, first_layer_index=options.first_layer_index)


def bridge_inputs(bridge, states):
    """What the bridge reads from a stack's states [h_0, h_1, ..., h_N] (T x B x C each; h_N as
    the decoder reads it): h_1 .. h_N, after h_0 where the bridge reads the embedding output."""
    return states if bridge.first_layer_index == 0 else states[1:]
