"""Transformer layers with an explicit sub-layer order, for the layer-relationship features.

Encoder layer: self-attn -> fuse-attn -> FFN. Decoder layer: self-attn -> cross-attn -> fuse-attn
-> FFN. The fuse-attention (LRF) is present only in the layers that fuse; the decoder layer's
cross-attention reads a memory of its own when the model has an encoder-decoder bridge. Each layer
is built with its own :class:`LayerOptions` (its index in the stack and its resolved settings).

The layers run through their stack's depth connection (:mod:`fairseq_plugins.depth.interface`):
``layer(state, depth, ...)``, every sub-layer reading its input from the connection and writing
``dropout(f(LN(x)))`` back (pre-norm, ``normalize_before``) or writing ``dropout(f(x))`` with its
LayerNorm as the post-norm the connection applies to the stream, ``LN(x + dropout(f(x)))``:
with the plain residual, exactly fairseq's own sub-layers, whose modules and parameter names these
layers keep (``self_attn``, ``encoder_attn``, ``fc1`` ...); the new ones are ``fuse_attn`` and
``fuse_attn_layer_norm``. What lies between the layers (DWA's averages, Hyper-Connections'
streams) belongs to the connection, not to a layer.

fairseq's layers run their sub-layers inside one ``forward`` with no hook between attention and
FFN, so these subclasses override ``forward`` to spell the order out, reusing the parent's
modules. Options of fairseq's layers that have no place in that order (``--cross-self-attention``,
``--scale-attn/-heads/-fc/-resid``) are rejected at model build time (see
``models/layerwise/options.py``).
"""
import copy
from dataclasses import dataclass
from typing import Dict, Optional, Tuple

import torch
from torch import Tensor, nn

from fairseq.modules import LayerNorm, MultiheadAttention
from fairseq.modules.transformer_layer import (
    TransformerDecoderLayerBase,
    TransformerEncoderLayerBase,
)

from .causal_cross_attention import CausalCrossAttention
from .depth_self_attention import DepthSelfAttention, norms_from_self_attention
from .cross_attention import STANDARD, build_cross_attention
from ..depth.interface import CROSS, FFN, FUSE, SELF, Depth, StackState
from ..depth.fusion import FusionOptions
from ..depth.lrf import FuseAttention, run_sublayer


@dataclass(frozen=True)
class LayerOptions:
    """What one layer needs to know about itself: its 0-based ``index`` in the stack and its
    cross-attention kind (decoder
    only). ``fusion``: the stack's resolved ``FusionOptions`` when this layer has a
    fuse-attention sub-layer (its heads, first state, reading; None: it does not fuse)."""
    index: int
    fusion: Optional[FusionOptions] = None
    cross_attention: str = STANDARD


class _DepthSublayers:
    """Running a sub-layer through the depth connection, the fuse-attention and the FFN: shared
    by the encoder and decoder layers."""

    def _init_fusion(self, cfg, embed_dim, options: LayerOptions):
        self.options = options
        self.key_layer_norm = self.value_layer_norm = None  # see read_separate_inputs
        if options.fusion is not None:
            self.fuse_attn = FuseAttention.from_options(embed_dim, options.fusion,
                                                        cfg.attention_dropout)
            self.fuse_attn_layer_norm = LayerNorm(embed_dim, export=cfg.export)
        else:
            self.fuse_attn = None
            self.fuse_attn_layer_norm = None

    @staticmethod
    def _depth_self_attention(attention: MultiheadAttention) -> DepthSelfAttention:
        """fairseq's self-attention module as built by the parent (same arguments, parameters
        and initialisation), with the forward of :class:`DepthSelfAttention`, which adds only
        methods."""
        if type(attention) is not MultiheadAttention:
            raise TypeError(f"expected fairseq's MultiheadAttention, got {type(attention)}")
        attention.__class__ = DepthSelfAttention
        return attention

    def read_separate_inputs(self):
        """Give the self-attention's key and value inputs LayerNorms of their own (the depth
        connection feeds them separately: MUDD), initialised as ``self_attn_layer_norm`` (equal
        inputs then give equal normalised inputs). Called by the stack at build time, once its
        connection is built (after the layers, so that every other parameter keeps its
        initialisation); LayerNorms draw no random numbers."""
        norm = self.self_attn_layer_norm
        self.key_layer_norm = copy.deepcopy(norm)
        self.value_layer_norm = copy.deepcopy(norm)

    def upgrade_separate_inputs(self, state_dict, name):
        """A checkpoint without the key / value LayerNorms (a model trained without separate
        inputs): they start as copies of its self-attention LayerNorm."""
        if self.key_layer_norm is not None:
            norms_from_self_attention(state_dict, name)

    def _self_attention(self, state: StackState, depth: Depth, **attention):
        """The self-attention sub-layer: x -> attn(LN(x)) (or attn(x) post-norm) written back
        through the connection; its keys and values from the connection's separate inputs where
        it gives them, its values through the connection's hook where it has one (value
        residual). ``attention``: the masks and the incremental state."""
        index = self.options.index
        inputs, x, token = self._read(state, depth, SELF, self.self_attn_layer_norm)
        key = value = x
        if inputs.key is not None:
            if self.key_layer_norm is None:
                raise RuntimeError(f"layer {index}: the connection gives separate key / value "
                                   "inputs and the layer has no LayerNorms for them")
            key, value = self.key_layer_norm(inputs.key), self.value_layer_norm(inputs.value)
        out, _ = self.self_attn(query=x, key=key, value=value, need_weights=False,
                                value_mix=depth.value_mix(state, index), **attention)
        self._write(state, depth, SELF, self.self_attn_layer_norm, out, token)

    @staticmethod
    def layout(fuses: bool, cross: bool = False) -> Tuple[str, ...]:
        """A layer's sub-layers in order (the depth connection's layout)."""
        return (SELF,) + ((CROSS,) if cross else ()) + ((FUSE,) if fuses else ()) + (FFN,)

    @staticmethod
    def _check_called_by_stack(state):
        if not isinstance(state, StackState):
            raise TypeError("a layerwise layer runs on its stack's state (StackState), not on a "
                            f"{type(state).__name__}: call the encoder/decoder, whose depth "
                            "connection runs the layers")

    def _sublayer(self, state: StackState, depth: Depth, name: str, norm: nn.Module, f):
        """x -> f(LN(x)) (pre-norm) or f(x) (post-norm), its dropout written back through the
        connection; returns what ``f`` returned besides its output (e.g. attention weights)."""
        _, x, token = self._read(state, depth, name, norm)
        out, extra = f(x)
        self._write(state, depth, name, norm, out, token)
        return extra

    def _read(self, state: StackState, depth: Depth, name: str, norm: nn.Module):
        """(the sub-layer's inputs from the connection, its query x: LN(query) pre-norm, the
        query itself post-norm, the connection's token for :meth:`_write`)."""
        inputs, token = depth.read(state, self.options.index, name)
        return inputs, norm(inputs.query) if self.normalize_before else inputs.query, token

    def _write(self, state: StackState, depth: Depth, name: str, norm: nn.Module, out: Tensor,
               token):
        """The sub-layer's output ``out`` after its dropout written back through the
        connection (post-norm: with ``norm``, fairseq's LN(x + dropout(f(x))))."""
        depth.write(state, self.options.index, name, self.dropout_module(out), token,
                    post_norm=None if self.normalize_before else norm)

    def _fuse(self, state: StackState, depth: Depth, **where):
        """``where``: the positions' key padding mask, whether the stack is causal and its
        incremental state (read by the all-positions reading)."""
        if self.fuse_attn is not None:
            run_sublayer(self.fuse_attn, state, depth.fused_states(state, self.options.index),
                         lambda s, states: self._sublayer(
                             s, depth, FUSE, self.fuse_attn_layer_norm,
                             lambda x: self.fuse_attn(x, states, **where)))

    def _ffn(self, x: Tensor) -> Tuple[Tensor, None]:
        x = self.activation_fn(self.fc1(x))
        x = self.activation_dropout_module(x)
        return self.fc2(x), None


class LayerwiseEncoderLayer(_DepthSublayers, TransformerEncoderLayerBase):
    """Encoder layer: self-attn -> fuse-attn -> FFN, on the stack's state (T x B x C per
    stream)."""

    def __init__(self, cfg, options: LayerOptions):
        super().__init__(cfg)
        self._init_fusion(cfg, self.embed_dim, options)

    def build_self_attention(self, embed_dim, cfg):
        return self._depth_self_attention(super().build_self_attention(embed_dim, cfg))

    def upgrade_state_dict_named(self, state_dict, name):
        super().upgrade_state_dict_named(state_dict, name)
        self.upgrade_separate_inputs(state_dict, name)

    def forward(self, state: StackState, depth: Depth, encoder_padding_mask: Optional[Tensor],
                attn_mask: Optional[Tensor] = None):
        """Runs the layer on ``state``; returns nothing."""
        self._check_called_by_stack(state)
        if attn_mask is not None:
            # as fairseq: a large negative number, not -inf, so padded query rows stay finite
            attn_mask = attn_mask.masked_fill(attn_mask.to(torch.bool),
                                              -1e8 if state.stream.dtype == torch.float32
                                              else -1e4)
        self._self_attention(state, depth, key_padding_mask=encoder_padding_mask,
                             attn_mask=attn_mask)
        self._fuse(state, depth, key_padding_mask=encoder_padding_mask)
        self._sublayer(state, depth, FFN, self.final_layer_norm, self._ffn)


class LayerwiseDecoderLayer(_DepthSublayers, TransformerDecoderLayerBase):
    """Decoder layer: self-attn -> cross-attn -> fuse-attn -> FFN, on the stack's state.

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

    def __init__(self, cfg, options: LayerOptions, no_encoder_attn: bool = False):
        # read by build_encoder_attention, which the parent's __init__ calls
        self.cross_attention_kind = options.cross_attention
        super().__init__(cfg, no_encoder_attn=no_encoder_attn)
        self._init_fusion(cfg, self.embed_dim, options)

    def build_self_attention(self, embed_dim, cfg, add_bias_kv=False, add_zero_attn=False):
        return self._depth_self_attention(super().build_self_attention(
            embed_dim, cfg, add_bias_kv=add_bias_kv, add_zero_attn=add_zero_attn))

    def upgrade_state_dict_named(self, state_dict, name):
        self.upgrade_separate_inputs(state_dict, name)

    def build_encoder_attention(self, embed_dim, cfg):
        if self.cross_attention_kind == STANDARD:
            return super().build_encoder_attention(embed_dim, cfg)
        return build_cross_attention(self.cross_attention_kind, embed_dim, cfg)

    def forward(
        self,
        state: StackState,
        depth: Depth,
        encoder_out: Optional[Tensor] = None,
        encoder_padding_mask: Optional[Tensor] = None,
        incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None,
        self_attn_mask: Optional[Tensor] = None,
        self_attn_padding_mask: Optional[Tensor] = None,
        need_attn: bool = False,
        need_head_weights: bool = False,
    ) -> Optional[Tensor]:
        """Runs the layer on ``state``; returns the cross-attention weights where asked for."""
        self._check_called_by_stack(state)
        if need_head_weights:
            need_attn = True
        self._self_attention(state, depth, key_padding_mask=self_attn_padding_mask,
                             incremental_state=incremental_state, attn_mask=self_attn_mask)
        attn = None
        if encoder_out is not None and encoder_out.dim() == 4:  # the bridge's memories
            encoder_out = encoder_out[:, :, self.options.index]
        if self.encoder_attn is not None and encoder_out is not None:
            extra = ({"query_padding_mask": self_attn_padding_mask}
                     if isinstance(self.encoder_attn, CausalCrossAttention) else {})
            attn = self._sublayer(
                state, depth, CROSS, self.encoder_attn_layer_norm,
                lambda x: self.encoder_attn(
                    query=x, key=encoder_out, value=encoder_out,
                    key_padding_mask=encoder_padding_mask, incremental_state=incremental_state,
                    static_kv=True, need_weights=need_attn or (not self.training and self.need_attn),
                    need_head_weights=need_head_weights, **extra))
        self._fuse(state, depth, key_padding_mask=self_attn_padding_mask, causal=True,
                   incremental_state=incremental_state)
        self._sublayer(state, depth, FFN, self.final_layer_norm, self._ffn)
        return attn
