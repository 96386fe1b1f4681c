"""The decoder of ``layerwise_transformer``: fairseq's, with fusion across its layers, the
cross-attention variants, each layer reading its own bridge memory, and Marian's output bias."""
import torch

from fairseq.models.transformer import TransformerDecoderBase

from ...depth.lrf import LayerHistory
from ...modules.layerwise_layers import LayerwiseDecoderLayer
from ...modules.marian_embeddings import ZeroStartEmbedding
from . import bridge, marian
from .encoder import recording
from .options import resolve_stack


class LayerwiseTransformerDecoder(TransformerDecoderBase):
    """fairseq's decoder; with fusion, its layers see all lower layers' outputs (T x B x C); with
    the bridge, layer i cross-attends to the encoder's memory M_i (see :meth:`for_layers`)."""

    def __init__(self, cfg, dictionary, embed_tokens, no_encoder_attn=False,
                 output_projection=None):
        self.stack_options = resolve_stack(cfg, "decoder")
        self.fusion_history = LayerHistory() if self.stack_options.fusion else None
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
        return LayerwiseDecoderLayer(cfg, layer, self.fusion_history,
                                     no_encoder_attn=no_encoder_attn)

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
        with recording(self.fusion_history):
            return super().extract_features_scriptable(
                prev_output_tokens, self.for_layers(encoder_out, incremental_state),
                incremental_state, full_context_alignment, alignment_layer, alignment_heads)
