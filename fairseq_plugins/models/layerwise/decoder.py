"""The decoder of ``layerwise_transformer``: fairseq's, with fusion across its layers, the
cross-attention variants, each layer reading its own bridge memory, and Marian's output bias."""
from typing import List, Optional

import torch
from torch import Tensor

from fairseq.models.transformer import TransformerDecoderBase

from ...depth.interface import run_blocks
from ...modules.layerwise_layers import LayerwiseDecoderLayer
from ...modules.marian_embeddings import ZeroStartEmbedding
from . import bridge, marian
from .encoder import build_depth, move_depth_averages
from .options import resolve_stack


class LayerwiseTransformerDecoder(TransformerDecoderBase):
    """fairseq's decoder; with any layer-relationship feature its layers run through the stack's
    depth connection (``self.depth``: fusion, DWA, Hyper-Connections ...); with the bridge,
    layer i cross-attends to the encoder's memory M_i (see :meth:`for_layers`)."""

    def __init__(self, cfg, dictionary, embed_tokens, no_encoder_attn=False,
                 output_projection=None):
        self.stack_options = resolve_stack(cfg, "decoder")
        # fairseq's __init__ builds the layers in order through build_decoder_layer(cfg), which
        # passes no index: each call takes the next layer's resolved options
        self._options_of_next_layer = iter(self.stack_options.layers)
        if getattr(cfg, "decoder_start_zero_embedding", False):
            embed_tokens = ZeroStartEmbedding(embed_tokens, start_idx=dictionary.eos())
        super().__init__(cfg, dictionary, embed_tokens, no_encoder_attn=no_encoder_attn,
                         output_projection=output_projection)
        del self._options_of_next_layer
        self.embed_positions = marian.positions(cfg, self, cfg.max_target_positions,
                                                cfg.decoder.embed_dim)
        self.depth = build_depth(
            cfg, "decoder", self.stack_options,
            [LayerwiseDecoderLayer.layout(layer.fusion is not None, not no_encoder_attn)
             for layer in self.stack_options.layers], cfg.decoder.embed_dim, self.layers)
        if getattr(cfg, "final_logits_bias", False):
            # a buffer: saved and loaded with the model, never trained (as in Marian)
            self.register_buffer("final_logits_bias", torch.zeros(len(dictionary)))
        else:
            self.final_logits_bias = None

    def output_layer(self, features):
        logits = super().output_layer(features)
        if self.final_logits_bias is not None:
            logits = logits + self.final_logits_bias
        return logits

    def build_decoder_layer(self, cfg, no_encoder_attn=False):
        layer = next(self._options_of_next_layer)
        if not self.stack_options.layerwise:
            return super().build_decoder_layer(cfg, no_encoder_attn)
        return LayerwiseDecoderLayer(cfg, layer, no_encoder_attn=no_encoder_attn)

    def upgrade_state_dict_named(self, state_dict, name):
        move_depth_averages(state_dict, name)
        return super().upgrade_state_dict_named(state_dict, name)

    def for_layers(self, encoder_out, incremental_state):
        """``encoder_out`` as the layers read it. With the bridge, in a full forward and at the
        first incremental step, the encoder output's place holds the per-layer memories, gathered
        to the current rows: S x B x N_dec x C, layer i reading [:, :, i]. From the second step
        on the layers' cross-attention reads the keys/values it cached at the first (static_kv),
        so the decoder passes ``encoder_out`` unchanged and gathers nothing: it remembers the
        first step in its own incremental state."""
        if encoder_out is None or not encoder_out.get(bridge.MEMORIES):
            return encoder_out
        if incremental_state is not None:
            if self.get_incremental_state(incremental_state, "bridge_memories_read") is not None:
                return encoder_out
            self.set_incremental_state(incremental_state, "bridge_memories_read", {})
        memories = encoder_out[bridge.MEMORIES][0].index_select(2, encoder_out[bridge.INDEX][0])
        return dict(encoder_out, encoder_out=[memories.permute(1, 2, 0, 3)])

    def extract_features_scriptable(self, prev_output_tokens, encoder_out, incremental_state=None,
                                    full_context_alignment=False, alignment_layer=None,
                                    alignment_heads=None):
        encoder_out = self.for_layers(encoder_out, incremental_state)
        if self.depth is None:
            return super().extract_features_scriptable(
                prev_output_tokens, encoder_out, incremental_state, full_context_alignment,
                alignment_layer, alignment_heads)
        return self._features_depth(prev_output_tokens, encoder_out, incremental_state,
                                    full_context_alignment, alignment_layer, alignment_heads)

    def _embed(self, prev_output_tokens, incremental_state) -> Tensor:
        """fairseq's decoder input: the tokens (only the newest one incrementally) embedded,
        scaled, with positions and dropout; T x B x C."""
        positions = None
        if self.embed_positions is not None:
            positions = self.embed_positions(prev_output_tokens,
                                             incremental_state=incremental_state)
        if incremental_state is not None:
            prev_output_tokens = prev_output_tokens[:, -1:]
            if positions is not None:
                positions = positions[:, -1:]
        x = self.embed_scale * self.embed_tokens(prev_output_tokens.contiguous())
        if self.quant_noise is not None:
            x = self.quant_noise(x)
        if self.project_in_dim is not None:
            x = self.project_in_dim(x)
        if positions is not None:
            x += positions
        if self.layernorm_embedding is not None:
            x = self.layernorm_embedding(x)
        return self.dropout_module(x).transpose(0, 1)

    def _features_depth(self, prev_output_tokens, encoder_out, incremental_state,
                        full_context_alignment: bool, alignment_layer: Optional[int],
                        alignment_heads: Optional[int]):
        """fairseq's ``extract_features_scriptable`` (same inputs, masks, alignment and output)
        with the layer loop run through the depth connection; ``inner_states`` are its block
        views."""
        if alignment_layer is None:
            alignment_layer = self.num_layers - 1
        enc = padding_mask = None
        if encoder_out is not None and len(encoder_out["encoder_out"]) > 0:
            enc = encoder_out["encoder_out"][0]
        if encoder_out is not None and len(encoder_out["encoder_padding_mask"]) > 0:
            padding_mask = encoder_out["encoder_padding_mask"][0]
        x = self._embed(prev_output_tokens, incremental_state)
        tokens = prev_output_tokens if incremental_state is None else prev_output_tokens[:, -1:]
        pads = tokens.eq(self.padding_idx)
        self_attn_padding_mask = pads if pads.any() else None
        self_attn_mask = (self.buffered_future_mask(x)
                          if incremental_state is None and not full_context_alignment else None)
        inner_states: List[Tensor] = []
        attns: List[Optional[Tensor]] = []
        x = run_blocks(self.depth, self.layers, x, lambda i: dict(
            encoder_out=enc, encoder_padding_mask=padding_mask,
            incremental_state=incremental_state, self_attn_mask=self_attn_mask,
            self_attn_padding_mask=self_attn_padding_mask,
            need_attn=i == alignment_layer, need_head_weights=i == alignment_layer),
            states=inner_states, returns=attns)
        attn = attns[alignment_layer] if 0 <= alignment_layer < len(attns) else None
        if attn is not None:
            attn = attn.float().to(x)
            if alignment_heads is not None:
                attn = attn[:alignment_heads]
            attn = attn.mean(dim=0)  # average probabilities over heads
        if self.layer_norm is not None:
            x = self.layer_norm(x)
        x = x.transpose(0, 1)  # T x B x C -> B x T x C
        if self.project_out_dim is not None:
            x = self.project_out_dim(x)
        return x, {"attn": [attn], "inner_states": inner_states}
