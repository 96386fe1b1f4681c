"""The encoder of ``layerwise_transformer``: fairseq's, with fusion across its layers and the
bridge's per-decoder-layer memories in its output."""
import contextlib
from typing import Dict, List, Optional

import torch
from torch import Tensor

from fairseq.models.transformer import TransformerEncoderBase

from ...depth.lrf import LayerHistory
from ...modules.layerwise_layers import LayerwiseEncoderLayer
from . import bridge, marian
from .options import resolve_stack


def recording(history: Optional[LayerHistory]):
    """A stack's forward records its layers' inputs only when it fuses."""
    return history.recording() if history is not None else contextlib.nullcontext()


class LayerwiseTransformerEncoder(TransformerEncoderBase):
    """fairseq's encoder; with fusion, its layers see all lower layers' outputs; with the bridge,
    its output also holds every decoder layer's cross-attention memory.

    ``encoder_out[bridge.MEMORIES]`` = [N_dec x S x B0 x C], computed once per source batch, and
    ``encoder_out[bridge.INDEX]`` = [B]: the row of B0 each current row (hypothesis) reads.
    :meth:`reorder_encoder_out` (called at every beam-search step) only reorders that index, so
    the memories are never copied; the decoder gathers them when its layers read them.
    """

    def __init__(self, cfg, dictionary, embed_tokens, return_fc=False):
        self.stack_options = resolve_stack(cfg, "encoder")
        self.fusion_history = LayerHistory() if self.stack_options.fusion else None
        # fairseq's __init__ builds the layers in order through build_encoder_layer(cfg), which
        # passes no index: each call takes the next layer's resolved options
        self._options_of_next_layer = iter(self.stack_options.layers)
        super().__init__(cfg, dictionary, embed_tokens, return_fc=return_fc)
        del self._options_of_next_layer
        self.embed_positions = marian.positions(cfg, self, cfg.max_source_positions,
                                                cfg.encoder.embed_dim)
        self.bridge = bridge.build(cfg)

    def build_encoder_layer(self, cfg):
        layer = next(self._options_of_next_layer)
        if not self.stack_options.layerwise:
            return super().build_encoder_layer(cfg)
        return LayerwiseEncoderLayer(cfg, layer, self.fusion_history)

    def forward_scriptable(self, src_tokens, src_lengths: Optional[Tensor] = None,
                           return_all_hiddens: bool = False,
                           token_embeddings: Optional[Tensor] = None):
        with recording(self.fusion_history):
            out = super().forward_scriptable(src_tokens, src_lengths,
                                             return_all_hiddens or self.bridge is not None,
                                             token_embeddings)
        if self.bridge is not None:
            states = out["encoder_states"]  # [h_0, h_1, ..., h_N]
            # the last block is the output as the decoder sees it (after a final LayerNorm, if
            # any), so that the "original" init is exactly the model without a bridge
            blocks = states[1:-1] + [out["encoder_out"][0]]
            if self.bridge.first_layer_index == 0:
                blocks = [states[0]] + blocks
            out[bridge.MEMORIES] = [self.bridge(blocks)]
            out[bridge.INDEX] = [torch.arange(src_tokens.size(0), device=src_tokens.device)]
            if not return_all_hiddens:
                out["encoder_states"] = []
        return out

    def reorder_encoder_out(self, encoder_out: Dict[str, List[Tensor]], new_order):
        reordered = super().reorder_encoder_out(encoder_out, new_order)
        if encoder_out.get(bridge.MEMORIES):
            reordered[bridge.MEMORIES] = encoder_out[bridge.MEMORIES]
            reordered[bridge.INDEX] = [encoder_out[bridge.INDEX][0].index_select(0, new_order)]
        return reordered
