"""Encoder-decoder FC bridge (Song 2024, arXiv 2405.08570): the flags, their defaults and
validation, resolved into :class:`BridgeOptions`.

``--bridge fc`` gives every decoder layer its own cross-attention memory, a bias-free projection
of all encoder layers (:class:`fairseq_plugins.modules.layer_bridge.LayerBridge`), computed once
per source sentence; see docs/ideas/bridge.md.
"""
import argparse
from dataclasses import dataclass
from typing import Optional

from ...modules.layer_bridge import BRIDGE_INITS, LayerBridge

DEFAULTS = {"bridge": "none", "bridge_init": None, "bridge_include_embedding": False}
DEFAULT_INIT = "original"  # the model without a bridge, exactly
# the encoder_out entries the encoder writes and the decoder reads: [N_dec x S x B0 x C] and [B]
MEMORIES, INDEX = "bridge_memories", "bridge_index"


def add_args(parser):
    parser.add_argument("--bridge", choices=["none", "fc"],
                        help="fc: every decoder layer cross-attends to its own bias-free "
                             "projection of all encoder layers' outputs (default: none)")
    parser.add_argument("--bridge-init", choices=BRIDGE_INITS,
                        help="initialisation of the bridge: original = read the last encoder "
                             "layer (the model without a bridge), gca = decoder layer j reads "
                             "encoder layer N+1-j, uniform = average, random (default: "
                             f"{DEFAULT_INIT})")
    parser.add_argument("--bridge-include-embedding", action=argparse.BooleanOptionalAction,
                        help="also project the embedding output h_0 (default: off, as the paper)")


def enabled(args) -> bool:
    return getattr(args, "bridge", "none") == "fc"


NEW_ATTENTION = False  # the decoder's cross-attention is fairseq's, reading another memory


def active(args, side=None):
    """['--bridge fc'] when the bridge is on (it changes the decoder's layers only)."""
    return ["--bridge fc"] if enabled(args) and side in (None, "decoder") else []


@dataclass(frozen=True)
class BridgeOptions:
    """``init``: one of BRIDGE_INITS; ``include_embedding``: h_0 is block 0 of the projection."""
    init: str
    include_embedding: bool

    @property
    def first_layer_index(self) -> int:
        """The encoder layer number of block 0 (0: the embedding output)."""
        return 0 if self.include_embedding else 1


def validate(args):
    if not enabled(args):
        if args.bridge_init is not None or args.bridge_include_embedding:
            raise ValueError("--bridge-init/--bridge-include-embedding were given but --bridge is "
                             f"{args.bridge!r}; add --bridge fc")
        return
    if getattr(args, "no_cross_attention", False):
        raise ValueError("--bridge fc feeds the cross-attention: not with --no-cross-attention")
    for name in ("encoder_layerdrop", "encoder_layers_to_keep"):
        if getattr(args, name, None):
            raise ValueError(f"--{name.replace('_', '-')} is not supported with --bridge fc: the "
                             "bridge reads every encoder layer")


def record_init(args):
    """With the bridge on, write the initialisation used into ``args`` (so that a checkpoint's
    args say which one it started from)."""
    if enabled(args) and args.bridge_init is None:
        args.bridge_init = DEFAULT_INIT


def resolve(cfg) -> BridgeOptions:
    """The bridge of a model whose args went through :func:`record_init`, validated against the
    stack depths."""
    options = BridgeOptions(cfg.bridge_init, bool(cfg.bridge_include_embedding))
    if options.init == "gca" and cfg.encoder_layers != cfg.decoder_layers:
        raise ValueError(f"--bridge-init gca pairs decoder layer j with encoder layer N+1-j and "
                         f"needs --encoder-layers == --decoder-layers (got "
                         f"{cfg.encoder_layers} and {cfg.decoder_layers})")
    return options


def build(cfg) -> Optional[LayerBridge]:
    """The encoder's bridge (None without ``--bridge fc``)."""
    if not enabled(cfg):
        return None
    options = resolve(cfg)
    return LayerBridge(cfg.encoder.embed_dim, cfg.encoder.layers + options.include_embedding,
                       cfg.decoder.layers, options.init,
                       first_layer_index=options.first_layer_index)
