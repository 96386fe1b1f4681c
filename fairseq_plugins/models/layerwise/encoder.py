"""The encoder of ``layerwise_transformer``: fairseq's, with fusion across its layers and the
bridge's per-decoder-layer memories in its output."""
from typing import Dict, List, Optional

import torch
from torch import Tensor

from fairseq.models.transformer import TransformerEncoderBase

from ... import config
from ... import depth as depth_connections
from ...depth.interface import run_blocks
from ...modules.layerwise_layers import LayerwiseEncoderLayer
from . import bridge, marian
from .options import resolve_stack


def build_depth(cfg, side: str, stack_options, layouts, embed_dim: int, layers):
    """The stack's depth connections (None where its layers are fairseq's own); ``layers``,
    built before them, are told which of their self-attentions read separate inputs."""
    if not stack_options.layerwise:
        return None
    depth = depth_connections.build(cfg, side, layouts, embed_dim, fusion=stack_options.fusion,
                                    pre_norm=getattr(cfg, f"{side}_normalize_before"),
                                    pre_norm_flag=config.both_spellings(f"{side}_normalize_before"))
    for i, layer in enumerate(layers):
        if depth.separate_inputs(i):
            layer.read_separate_inputs()
    return depth


def move_depth_averages(state_dict, name: str):
    """Checkpoints written before the stacks ran the depth interface kept DWA's weights in the
    layers (``<name>.layers.<i>.depth_average.weight``); they are the stack's connection's now
    (``<name>.depth.connection.averages.<i>.weight``), same values."""
    prefix, suffix = f"{name}.layers.", ".depth_average.weight"
    for key in [k for k in state_dict if k.startswith(prefix) and k.endswith(suffix)]:
        index = key[len(prefix):-len(suffix)]
        state_dict[f"{name}.depth.connection.averages.{index}.weight"] = state_dict.pop(key)


class LayerwiseTransformerEncoder(TransformerEncoderBase):
    """fairseq's encoder; with any layer-relationship feature its layers run through the
    stack's depth connection (``self.depth``: fusion, DWA, Hyper-Connections ...); with the
    bridge, its output also holds every decoder layer's cross-attention memory.

    ``encoder_out[bridge.MEMORIES]`` = [N_dec x S x B0 x C], computed once per source batch, and
    ``encoder_out[bridge.INDEX]`` = [B]: the row of B0 each current row (hypothesis) reads.
    :meth:`reorder_encoder_out` (called at every beam-search step) only reorders that index, so
    the memories are never copied; the decoder gathers them when its layers read them.
    """

    def __init__(self, cfg, dictionary, embed_tokens, return_fc=False):
        self.stack_options = resolve_stack(cfg, "encoder")
        # fairseq's __init__ builds the layers in order through build_encoder_layer(cfg), which
        # passes no index: each call takes the next layer's resolved options
        self._options_of_next_layer = iter(self.stack_options.layers)
        super().__init__(cfg, dictionary, embed_tokens, return_fc=return_fc)
        del self._options_of_next_layer
        self.embed_positions = marian.positions(cfg, self, cfg.max_source_positions,
                                                cfg.encoder.embed_dim)
        self.depth = build_depth(
            cfg, "encoder", self.stack_options,
            [LayerwiseEncoderLayer.layout(layer.fusion is not None)
             for layer in self.stack_options.layers], cfg.encoder.embed_dim, self.layers)
        self.bridge = bridge.build(cfg)

    def upgrade_state_dict_named(self, state_dict, name):
        move_depth_averages(state_dict, name)
        return super().upgrade_state_dict_named(state_dict, name)

    def build_encoder_layer(self, cfg):
        layer = next(self._options_of_next_layer)
        if not self.stack_options.layerwise:
            return super().build_encoder_layer(cfg)
        return LayerwiseEncoderLayer(cfg, layer)

    def forward_scriptable(self, src_tokens, src_lengths: Optional[Tensor] = None,
                           return_all_hiddens: bool = False,
                           token_embeddings: Optional[Tensor] = None):
        run = super().forward_scriptable if self.depth is None else self._forward_depth
        out = run(src_tokens, src_lengths, return_all_hiddens or self.bridge is not None,
                  token_embeddings)
        if self.bridge is not None:
            # [h_0, h_1, ..., h_N], h_N as the decoder sees it (after a final LayerNorm, if
            # any), so that the "original" init is exactly the model without a bridge
            states = out["encoder_states"][:-1] + [out["encoder_out"][0]]
            out[bridge.MEMORIES] = [self.bridge(bridge.bridge_inputs(self.bridge, states))]
            out[bridge.INDEX] = [torch.arange(src_tokens.size(0), device=src_tokens.device)]
            if not return_all_hiddens:
                out["encoder_states"] = []
        return out

    def _forward_depth(self, src_tokens, src_lengths: Optional[Tensor],
                       return_all_hiddens: bool, token_embeddings: Optional[Tensor]):
        """fairseq's ``forward_scriptable`` (same embedding, masks and output dict) with the layer
        loop run through the depth connection; ``encoder_states`` are its block views."""
        encoder_padding_mask = src_tokens.eq(self.padding_idx)
        has_pads = encoder_padding_mask.any()
        x, encoder_embedding = self.forward_embedding(src_tokens, token_embeddings)
        # account for padding while computing the representation (as fairseq)
        x = x * (1 - encoder_padding_mask.unsqueeze(-1).type_as(x) * has_pads.type_as(x))
        x = x.transpose(0, 1)  # B x T x C -> T x B x C
        mask = encoder_padding_mask if has_pads else None
        encoder_states: List[Tensor] = [] if return_all_hiddens else None
        x = run_blocks(self.depth, self.layers, x,
                       lambda i: {"encoder_padding_mask": mask}, states=encoder_states)
        if self.layer_norm is not None:
            x = self.layer_norm(x)
        src_lengths = (src_tokens.ne(self.padding_idx).sum(dim=1, dtype=torch.int32)
                       .reshape(-1, 1).contiguous())
        return {
            "encoder_out": [x],  # T x B x C
            "encoder_padding_mask": [encoder_padding_mask],  # B x T
            "encoder_embedding": [encoder_embedding],  # B x T x C
            "encoder_states": encoder_states or [],  # List[T x B x C]
            "fc_results": [],
            "src_tokens": [],
            "src_lengths": [src_lengths],
        }

    def reorder_encoder_out(self, encoder_out: Dict[str, List[Tensor]], new_order):
        reordered = super().reorder_encoder_out(encoder_out, new_order)
        if encoder_out.get(bridge.MEMORIES):
            reordered[bridge.MEMORIES] = encoder_out[bridge.MEMORIES]
            reordered[bridge.INDEX] = [encoder_out[bridge.INDEX][0].index_select(0, new_order)]
        return reordered
