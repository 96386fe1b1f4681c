"""Pre-norm blocks of the language models (SPEC section 3): GPT-2 style, optionally bias-free.

All tensors are T x B x C. Attention is causal: position t reads memory positions <= t, where the
memory is the block's own input (self-attention) or another stream of the same length (the
autoregressive encoder-decoder's causally masked cross-attention). With an incremental state,
each call takes the new positions only and the keys/values of earlier positions come from the
cache, so one generation step costs O(context), not a re-run.
"""
from typing import Dict, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fairseq.incremental_decoding_utils import with_incremental_state


def layer_norm(dim: int, bias: bool) -> nn.LayerNorm:
    """LayerNorm with eps 1e-5; weight only when ``bias`` is False (the reference's use_bias)."""
    return nn.LayerNorm(dim, eps=1e-5, bias=bias)


@with_incremental_state
class CausalAttention(nn.Module):
    """Multi-head attention of queries x (T x B x C) over a same-length memory (default: x),
    position t reading memory positions <= t. Incremental: memory positions are appended to a
    cache that beam search reorders."""

    def __init__(self, embed_dim: int, num_heads: int, bias: bool, dropout: float = 0.0):
        super().__init__()
        if embed_dim % num_heads != 0:
            raise ValueError(f"{num_heads} attention heads do not divide the embedding dim "
                             f"{embed_dim}")
        self.num_heads, self.head_dim = num_heads, embed_dim // num_heads
        self.q_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.k_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.v_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.dropout = dropout

    def _heads(self, x: Tensor) -> Tensor:  # T x B x C -> B x H x T x d
        length, bsz, _ = x.shape
        return x.view(length, bsz, self.num_heads, self.head_dim).permute(1, 2, 0, 3)

    def forward(self, x: Tensor, memory: Optional[Tensor] = None,
                incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None):
        memory = x if memory is None else memory
        length, bsz, dim = x.shape
        q, k, v = self._heads(self.q_proj(x)), self._heads(self.k_proj(memory)), \
            self._heads(self.v_proj(memory))
        causal = True
        if incremental_state is not None:
            cache = self.get_incremental_state(incremental_state, "cache")
            if cache is not None:
                if length > 1:
                    raise NotImplementedError("incremental calls take one new position")
                k = torch.cat([cache["k"], k], dim=2)
                v = torch.cat([cache["v"], v], dim=2)
                causal = False  # the one new position reads all of the cache
            self.set_incremental_state(incremental_state, "cache", {"k": k, "v": v})
        out = self._attention(q, k, v, causal)
        return self.out_proj(out.permute(2, 0, 1, 3).reshape(length, bsz, dim))

    def _attention(self, q: Tensor, k: Tensor, v: Tensor, causal: bool) -> Tensor:
        """SDPA over B x H x T x d heads. A head dim that is not a multiple of 8 (the reference's
        150 / 5 = 30 and 150 / 10 = 15) is zero-padded to one, which leaves scores and outputs
        exactly as they were (the scale is set from the true dim) but puts the fused kernels
        on their vectorised path: on CPU 10 heads of 15 train ~25% faster padded to 16."""
        dropout = self.dropout if self.training else 0.0
        pad = -self.head_dim % 8
        if pad == 0:
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, dropout_p=dropout)
        q, k, v = (F.pad(t, (0, pad)) for t in (q, k, v))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=causal, dropout_p=dropout,
                                             scale=self.head_dim ** -0.5)
        return out[..., :self.head_dim]

    def reorder_incremental_state(self, incremental_state, new_order: Tensor):
        cache = self.get_incremental_state(incremental_state, "cache")
        if cache is not None:
            self.set_incremental_state(incremental_state, "cache",
                                       {k: v.index_select(0, new_order) for k, v in cache.items()})
        return incremental_state


class FeedForward(nn.Module):
    """GELU MLP d -> 4d -> d (``fc2`` is a residual projection)."""

    def __init__(self, embed_dim: int, ffn_dim: int, bias: bool, dropout: float):
        super().__init__()
        self.fc1 = nn.Linear(embed_dim, ffn_dim, bias=bias)
        self.fc2 = nn.Linear(ffn_dim, embed_dim, bias=bias)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.dropout(self.fc2(F.gelu(self.fc1(x))))


class PreNormBlock(nn.Module):
    """x + attn(LN(x)); x + MLP(LN(x)): a GPT-2 block (the baseline's and the AR encoder's)."""

    def __init__(self, embed_dim, heads, ffn_dim, bias, dropout):
        super().__init__()
        self.self_attn_layer_norm = layer_norm(embed_dim, bias)
        self.self_attn = CausalAttention(embed_dim, heads, bias, dropout)
        self.final_layer_norm = layer_norm(embed_dim, bias)
        self.ffn = FeedForward(embed_dim, ffn_dim, bias, dropout)
        self.dropout = nn.Dropout(dropout)

    def _self(self, x, incremental_state):
        return x + self.dropout(self.self_attn(self.self_attn_layer_norm(x),
                                               incremental_state=incremental_state))

    def forward(self, x, incremental_state=None):
        x = self._self(x, incremental_state)
        return x + self.ffn(self.final_layer_norm(x))


class CrossDecoderBlock(PreNormBlock):
    """The AR encoder-decoder's decoder block: causal self-attention, causally masked
    cross-attention over LN(final encoder output) (a LayerNorm of its own per block), MLP.
    Order 'original': self -> cross -> MLP; 'alt': cross -> self -> MLP."""

    def __init__(self, embed_dim, heads, cross_heads, ffn_dim, bias, dropout, order="original"):
        super().__init__(embed_dim, heads, ffn_dim, bias, dropout)
        if order not in ("original", "alt"):
            raise ValueError(f"decoder block order must be original or alt, got {order!r}")
        self.order = order
        self.encoder_attn_layer_norm = layer_norm(embed_dim, bias)  # the decoder stream (query)
        self.memory_layer_norm = layer_norm(embed_dim, bias)  # the encoder output (keys/values)
        self.encoder_attn = CausalAttention(embed_dim, cross_heads, bias, dropout)

    def _cross(self, x, encoder_out, incremental_state):
        return x + self.dropout(self.encoder_attn(self.encoder_attn_layer_norm(x),
                                                  self.memory_layer_norm(encoder_out),
                                                  incremental_state=incremental_state))

    def forward(self, x, encoder_out=None, incremental_state=None):
        if self.order == "original":
            x = self._cross(self._self(x, incremental_state), encoder_out, incremental_state)
        else:
            x = self._self(self._cross(x, encoder_out, incremental_state), incremental_state)
        return x + self.ffn(self.final_layer_norm(x))
