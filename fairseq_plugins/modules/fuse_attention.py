"""Fuse-attention (LRF, arXiv 2307.10799): attention across depth, per token.

At layer l of a stack, each token's query attends over that same token's outputs of the layers
below it, ``[h_0, h_1, ..., h_{l-1}]`` (``h_0`` = the embedding output). The attention runs over
the depth axis, never over time, so it is causal by construction and incremental decoding needs no
cache: step t only needs step t's own lower-layer outputs.
"""
from contextlib import contextmanager
from typing import List, Optional, Tuple

import torch
from torch import Tensor, nn

from fairseq.modules import MultiheadAttention


class LayerHistory:
    """The per-token outputs of one stack's layers during one forward pass.

    Shared (as a plain attribute, not a sub-module) by the stack and its layers. The stack opens
    :meth:`recording` around its layer loop; each layer :meth:`append` s its input (the previous
    layer's output, or the embedding output for the first layer) before it runs. So when the
    layer with 0-based index i fuses, ``states`` is ``[h_0, ..., h_i]``: the embedding output and
    every lower layer's output, its own input being the newest entry (the paper's layer l = i + 1
    attends over l vectors). The list is dropped when the pass ends so no activations outlive it.

    Args:
        fused_layers: 0-based indices of the layers that fuse.
        include_embedding: record the embedding output ``h_0`` as the first entry.
    """

    def __init__(self, fused_layers, include_embedding: bool = True):
        self.fused_layers = frozenset(fused_layers)
        self.include_embedding = include_embedding
        self.states: Optional[List[Tensor]] = None

    @contextmanager
    def recording(self):
        self.states = []
        try:
            yield self
        finally:
            self.states = None

    def records_input_of(self, layer_idx: int) -> bool:
        return layer_idx > 0 or self.include_embedding

    def append(self, x: Tensor):
        if self.states is None:
            raise RuntimeError(
                "a fusion layer ran outside its stack's forward(): call the encoder/decoder, "
                "not the layer, so that the outputs of the layers below are recorded"
            )
        self.states.append(x)


class FuseAttention(nn.Module):
    """Multi-head attention of each token over its own lower-layer outputs.

    Built on fairseq's :class:`MultiheadAttention` (own Q/K/V/O projections: 4d^2 + 4d
    parameters) with depth as the key axis and the T x B tokens as the batch, so it uses the same
    kernels and fp16 handling as the other attention sub-layers.

    Set ``keep_weights = True`` to keep the last call's attention weights in ``last_weights``
    (B x H x T x L, L = number of lower layers attended); off by default, so no cost otherwise.
    """

    def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0,
                 q_noise: float = 0.0, qn_block_size: int = 8):
        super().__init__()
        self.attn = MultiheadAttention(
            embed_dim, num_heads, dropout=dropout, self_attention=False,
            encoder_decoder_attention=False, q_noise=q_noise, qn_block_size=qn_block_size,
        )
        self.keep_weights = False
        self.last_weights: Optional[Tensor] = None

    @property
    def out_proj(self) -> nn.Linear:
        return self.attn.out_proj

    def forward(self, query: Tensor, history: List[Tensor]) -> Tuple[Tensor, Optional[Tensor]]:
        """
        Args:
            query: T x B x C, the preceding sub-layer's output.
            history: L tensors of T x B x C, the same tokens' lower-layer outputs.
        Returns:
            T x B x C fused representation, and the weights (B x H x T x L) if kept.
        """
        tgt_len, bsz, dim = query.shape
        depth = len(history)
        q = query.reshape(1, tgt_len * bsz, dim)
        kv = torch.stack(history, dim=0).reshape(depth, tgt_len * bsz, dim)
        # fairseq's fast path (torch's fused MHA) only returns head-averaged weights; when the
        # per-head weights are wanted, static_kv=True (no incremental state here, so nothing is
        # cached) routes the call through fairseq's own path, which returns them.
        out, weights = self.attn(
            query=q, key=kv, value=kv, need_weights=self.keep_weights,
            need_head_weights=self.keep_weights, static_kv=self.keep_weights,
        )
        out = out.view(tgt_len, bsz, dim)
        if self.keep_weights:
            # H x (T*B) x 1 x L -> B x H x T x L
            weights = weights.view(-1, tgt_len, bsz, depth).permute(2, 0, 1, 3).detach()
            self.last_weights = weights
        return out, weights
