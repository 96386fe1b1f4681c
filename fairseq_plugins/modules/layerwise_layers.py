"""Transformer layers with an explicit sub-layer order, for the layer-relationship features.

Encoder layer: self-attn -> fuse-attn -> FFN (-> DWA). Decoder layer: self-attn -> cross-attn ->
fuse-attn -> FFN (-> DWA). The fuse-attention (LRF) is present only in the layers that fuse, the
depth-weighted average (DenseFormer) only after the layers that have one; the decoder layer's
cross-attention reads a memory of its own when the model has an encoder-decoder bridge. Each layer
is built with its own :class:`LayerOptions` (its index in the stack and its resolved settings).
Every sub-layer is ``x + dropout(f(x))`` with its LayerNorm before (``normalize_before``) or
after, exactly like fairseq's own sub-layers, whose modules and parameter names these layers
keep (``self_attn``, ``encoder_attn``, ``fc1`` ...); the new ones are ``fuse_attn`` and
``fuse_attn_layer_norm``.

fairseq's layers run their sub-layers inside one ``forward`` with no hook between attention and
FFN, so these subclasses override ``forward`` to spell the order out, reusing the parent's
modules. Options of fairseq's layers that have no place in that order (``--cross-self-attention``,
``--scale-attn/-heads/-fc/-resid``) are rejected at model build time (see
``models/layerwise/options.py``).
"""
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import torch
from torch import Tensor

from fairseq.modules import LayerNorm
from fairseq.modules.transformer_layer import (
    TransformerDecoderLayerBase,
    TransformerEncoderLayerBase,
)

from .causal_cross_attention import CausalCrossAttention
from .cross_attention import STANDARD, build_cross_attention
from ..depth.dwa import DepthWeightedAverage
from ..depth.lrf import FuseAttention, LayerHistory


@dataclass(frozen=True)
class LayerOptions:
    """What one layer needs to know about itself: its 0-based ``index`` in the stack, the heads
    of its fuse-attention (None: the layer does not fuse), whether it records its input (for the
    fusing layers above it) and its output (for the depth-weighted averages), the states its
    depth-weighted average combines (None: no average after it), and its cross-attention kind
    (decoder only). ``fusion_first_state``: the state h_j its fuse-attention attends first
    (0: the embedding output; 1 without it)."""
    index: int
    fusion_heads: Optional[int] = None
    fusion_first_state: int = 0
    records_input: bool = False
    cross_attention: str = STANDARD
    records_output: bool = False
    depth_average: Optional[Tuple[int, ...]] = None


class _FusionSublayers:
    """Fuse-attention, FFN and depth-weighted average, shared by the encoder and decoder
    layers."""

    def _init_fusion(self, cfg, embed_dim, options: LayerOptions,
                     history: Optional[LayerHistory]):
        self.options = options
        self.history = history  # plain attribute: shared with the stack, not a sub-module
        if options.fusion_heads is not None:
            self.fuse_attn = FuseAttention(embed_dim, options.fusion_heads,
                                           dropout=cfg.attention_dropout,
                                           first_state=options.fusion_first_state)
            self.fuse_attn_layer_norm = LayerNorm(embed_dim, export=cfg.export)
        else:
            self.fuse_attn = None
            self.fuse_attn_layer_norm = None
        self.depth_average = (DepthWeightedAverage(options.depth_average)
                              if options.depth_average is not None else None)

    def _record_input(self, x: Tensor):
        if self.options.records_input:
            self.history.append(x)

    def _fusion_block(self, x: Tensor) -> Tensor:
        if self.fuse_attn is None:
            return x
        residual = x
        if self.normalize_before:
            x = self.fuse_attn_layer_norm(x)
        x, _ = self.fuse_attn(x, self.history.states)
        x = self.dropout_module(x)
        x = self.residual_connection(x, residual)
        if not self.normalize_before:
            x = self.fuse_attn_layer_norm(x)
        return x

    def _output(self, x: Tensor) -> Tensor:
        """The layer's output: its block output x_s, or the depth-weighted average after it
        (which the next layer receives as its input)."""
        if self.options.records_output:
            self.history.append(x)
        if self.depth_average is None:
            return x
        return self.depth_average(self.history.states)

    def _ffn_block(self, x: Tensor) -> Tensor:
        residual = x
        if self.normalize_before:
            x = self.final_layer_norm(x)
        x = self.activation_fn(self.fc1(x))
        x = self.activation_dropout_module(x)
        x = self.fc2(x)
        x = self.dropout_module(x)
        x = self.residual_connection(x, residual)
        if not self.normalize_before:
            x = self.final_layer_norm(x)
        return x


class LayerwiseEncoderLayer(_FusionSublayers, TransformerEncoderLayerBase):
    """Encoder layer: self-attn -> fuse-attn -> FFN. Input/output T x B x C."""

    def __init__(self, cfg, options: LayerOptions, history: Optional[LayerHistory]):
        super().__init__(cfg)
        self._init_fusion(cfg, self.embed_dim, options, history)

    def forward(self, x, encoder_padding_mask: Optional[Tensor], attn_mask: Optional[Tensor] = None):
        self._record_input(x)
        if attn_mask is not None:
            # as fairseq: a large negative number, not -inf, so padded query rows stay finite
            attn_mask = attn_mask.masked_fill(attn_mask.to(torch.bool),
                                              -1e8 if x.dtype == torch.float32 else -1e4)
        residual = x
        if self.normalize_before:
            x = self.self_attn_layer_norm(x)
        x, _ = self.self_attn(query=x, key=x, value=x, key_padding_mask=encoder_padding_mask,
                              need_weights=False, attn_mask=attn_mask)
        x = self.dropout_module(x)
        x = self.residual_connection(x, residual)
        if not self.normalize_before:
            x = self.self_attn_layer_norm(x)
        x = self._fusion_block(x)
        return self._output(self._ffn_block(x))


class LayerwiseDecoderLayer(_FusionSublayers, TransformerDecoderLayerBase):
    """Decoder layer: self-attn -> cross-attn -> fuse-attn -> FFN. Input/output T x B x C.

    Incremental decoding uses fairseq's caches for self- and cross-attention; the fuse-attention
    needs none (it attends over the current step's lower-layer outputs only).

    ``encoder_out`` is the encoder output (S x B x C) or, with the encoder-decoder bridge, every
    decoder layer's memory stacked (S x B x N_dec x C): this layer reads its own,
    ``[:, :, index]`` (the bridge's M_i). The decoder passes the stack only while the
    cross-attention has not cached its source keys/values (the first incremental step).

    ``cross_attention`` other than 'standard' replaces fairseq's cross-attention module by a
    variant of :mod:`cross_attention` (same parameter names, plus its own); the variants also
    receive the target padding mask.
    """

    def __init__(self, cfg, options: LayerOptions, history: Optional[LayerHistory],
                 no_encoder_attn: bool = False):
        # read by build_encoder_attention, which the parent's __init__ calls
        self.cross_attention_kind = options.cross_attention
        super().__init__(cfg, no_encoder_attn=no_encoder_attn)
        self._init_fusion(cfg, self.embed_dim, options, history)

    def build_encoder_attention(self, embed_dim, cfg):
        if self.cross_attention_kind == STANDARD:
            return super().build_encoder_attention(embed_dim, cfg)
        return build_cross_attention(self.cross_attention_kind, embed_dim, cfg)

    def forward(
        self,
        x,
        encoder_out: Optional[Tensor] = None,
        encoder_padding_mask: Optional[Tensor] = None,
        incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None,
        prev_self_attn_state: Optional[List[Tensor]] = None,
        prev_attn_state: Optional[List[Tensor]] = None,
        self_attn_mask: Optional[Tensor] = None,
        self_attn_padding_mask: Optional[Tensor] = None,
        need_attn: bool = False,
        need_head_weights: bool = False,
    ):
        if prev_self_attn_state is not None or prev_attn_state is not None:
            raise NotImplementedError("LayerwiseDecoderLayer does not take prev_*_attn_state")
        if need_head_weights:
            need_attn = True
        self._record_input(x)

        residual = x
        if self.normalize_before:
            x = self.self_attn_layer_norm(x)
        x, _ = self.self_attn(query=x, key=x, value=x, key_padding_mask=self_attn_padding_mask,
                              incremental_state=incremental_state, need_weights=False,
                              attn_mask=self_attn_mask)
        x = self.dropout_module(x)
        x = self.residual_connection(x, residual)
        if not self.normalize_before:
            x = self.self_attn_layer_norm(x)

        attn = None
        if encoder_out is not None and encoder_out.dim() == 4:  # the bridge's memories
            encoder_out = encoder_out[:, :, self.options.index]
        if self.encoder_attn is not None and encoder_out is not None:
            residual = x
            if self.normalize_before:
                x = self.encoder_attn_layer_norm(x)
            extra = ({"query_padding_mask": self_attn_padding_mask}
                     if isinstance(self.encoder_attn, CausalCrossAttention) else {})
            x, attn = self.encoder_attn(
                query=x, key=encoder_out, value=encoder_out, key_padding_mask=encoder_padding_mask,
                incremental_state=incremental_state, static_kv=True,
                need_weights=need_attn or (not self.training and self.need_attn),
                need_head_weights=need_head_weights, **extra,
            )
            x = self.dropout_module(x)
            x = self.residual_connection(x, residual)
            if not self.normalize_before:
                x = self.encoder_attn_layer_norm(x)

        x = self._fusion_block(x)
        return self._output(self._ffn_block(x)), attn, None
