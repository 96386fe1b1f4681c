"""Pre-norm blocks of the language models (yif-AI's autoregressive_encoder_decoder_transformer):
GPT-2 style, optionally bias-free.

All tensors are T x B x C. Attention is causal: position t reads memory positions <= t, where the
memory is the block's own input (self-attention) or another stream of the same length (the
autoregressive encoder-decoder's causally masked cross-attention). With an incremental state,
each call takes the new positions only and the keys/values of earlier positions come from the
cache, so one generation step costs O(context), not a re-run.
"""
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fairseq.incremental_decoding_utils import with_incremental_state

from ..depth.interface import CROSS, FFN, FUSE, SELF, Depth, StackState
from ..depth.fusion import FusionOptions
from ..depth.lrf import FuseAttention, run_sublayer
from . import precision
from .depth_self_attention import norms_from_self_attention


def layer_norm(dim: int, bias: bool) -> nn.LayerNorm:
    """LayerNorm with eps 1e-5; weight only when ``bias`` is False (the reference's use_bias)."""
    return nn.LayerNorm(dim, eps=1e-5, bias=bias)


def built_once_per_search(module, incremental_state, key: str, build):
    """``build()`` (weights derived from parameters); in incremental decoding built once per
    search and kept in ``module``'s incremental state under ``key`` (the parameters do not change
    within a search), so that one-token steps do not rebuild it. Not reordered by beam search."""
    if incremental_state is None:
        return build()
    built = module.get_incremental_state(incremental_state, key)
    if built is None:
        built = build()
        module.set_incremental_state(incremental_state, key, built)
    return built


@with_incremental_state
class CausalAttention(nn.Module):
    """Multi-head attention of queries x (T x B x C) over a same-length memory (default: x),
    position t reading memory positions <= t. Incremental: memory positions are appended to a
    cache that beam search reorders.

    The parameters are the usual separate q/k/v/out projections; forward concatenates them so
    that one GEMM projects everything read from the same input (q, k, v for self-attention;
    k, v for a memory). A head dim that is not a multiple of 8 (the reference's 150 / 5 = 30 and
    150 / 10 = 15) is zero-padded to one in the *weights* (zero rows in the input projections,
    zero columns in the output projection) where :func:`precision.cpu_tuned` holds (CPU, full
    precision, no autocast; measured there: 10 heads of 15 train ~25% faster padded to 16, the
    fused CPU kernels then run on their vectorised path): scores and outputs are exactly those
    of the true head dim (the scale is set from it), and no activation is copied to pad it.
    Elsewhere the head dim is the true one (equal outputs, tested). The cache holds the keys/
    values as projected (B x H x T x :meth:`padded_head_dim`)."""

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

    def padded_head_dim(self, like: Tensor) -> int:
        """The head dim the projections produce for tensors like ``like`` (an input or a
        parameter of this module): the next multiple of 8 where :func:`precision.cpu_tuned`
        holds, else the true head dim."""
        return self.head_dim + (-self.head_dim % 8 if precision.cpu_tuned(like) else 0)

    def input_weights(self, projections, layer_norm: Optional[nn.LayerNorm] = None
                      ) -> Tuple[Tensor, Optional[Tensor]]:
        """Weight ((n x H x hp) x C, hp = padded head dim) and bias (or None) of the given input
        projections stacked, so that one GEMM applies them all. With ``layer_norm``, its affine
        part is folded in (W diag(gamma), W beta + b): the GEMM then takes the *normalised*
        input, which the caller may share with other LayerNorms of the same input."""
        n, h, hd = len(projections), self.num_heads, self.head_dim
        hp = self.padded_head_dim(projections[0].weight)
        weight = torch.stack([p.weight for p in projections])  # n x C_out x C_in
        bias = (torch.stack([p.bias for p in projections])
                if projections[0].bias is not None else None)
        if layer_norm is not None:
            if layer_norm.bias is not None:
                folded = weight @ layer_norm.bias
                bias = folded if bias is None else bias + folded
            weight = weight * layer_norm.weight
        weight = weight.view(n, h, hd, -1)
        if hp != hd:
            weight = F.pad(weight, (0, 0, 0, hp - hd))
            bias = F.pad(bias.view(n, h, hd), (0, hp - hd)) if bias is not None else None
        return weight.reshape(n * h * hp, -1), (bias.reshape(-1) if bias is not None else None)

    def split_heads(self, y: Tensor) -> Tuple[Tensor, ...]:
        """T x B x (n x H x hp) (the GEMM with :meth:`input_weights`) -> n B x H x T x hp
        tensors (strided views)."""
        length, bsz, _ = y.shape
        return y.view(length, bsz, -1, self.num_heads, self.padded_head_dim(y)).permute(
            2, 1, 3, 0, 4).unbind(0)

    def _weights(self, incremental_state, name: str) -> Dict[str, Optional[Tensor]]:
        """{"weight", "bias"} of ``name`` ('qkv', 'q', 'k', 'v', 'kv': input projections; 'out'), built
        once per search in incremental decoding (:func:`built_once_per_search`)."""
        def build():
            if name != "out":
                weight, bias = self.input_weights([getattr(self, f"{c}_proj") for c in name])
                return {"weight": weight, "bias": bias}
            weight, h, hd = self.out_proj.weight, self.num_heads, self.head_dim
            hp = self.padded_head_dim(weight)
            if hp != hd:
                weight = F.pad(weight.view(-1, h, hd), (0, hp - hd)).view(-1, h * hp)
            return {"weight": weight, "bias": self.out_proj.bias}

        return built_once_per_search(self, incremental_state, name, build)

    def forward(self, x: Tensor, memory: Optional[Tensor] = None,
                incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None,
                memory_kv: Optional[Tuple[Tensor, Tensor]] = None,
                key: Optional[Tensor] = None, value: Optional[Tensor] = None,
                value_mix: Optional[Callable[[Tensor], Tensor]] = None):
        """x: T x B x C queries (and keys/values unless a memory or separate inputs are
        given); memory: T x B x C; memory_kv: the memory's keys and values already projected
        (B x H x T x hp each, from :meth:`input_weights` with ``(k_proj, v_proj)`` and
        :meth:`split_heads`); key / value: separate T x B x C inputs of the key and value
        projections (a depth connection's, e.g. MUDD); value_mix: applied to the values of
        this call's positions (B x H x T x hp) before they are cached and attended (value
        residual). -> T x B x C."""
        if key is not None or value is not None:
            q, = self.split_heads(F.linear(x, **self._weights(incremental_state, "q")))
            k, = self.split_heads(F.linear(x if key is None else key,
                                           **self._weights(incremental_state, "k")))
            v, = self.split_heads(F.linear(x if value is None else value,
                                           **self._weights(incremental_state, "v")))
        elif memory is None and memory_kv is None:
            q, k, v = self.split_heads(F.linear(x, **self._weights(incremental_state, "qkv")))
        else:
            q, = self.split_heads(F.linear(x, **self._weights(incremental_state, "q")))
            k, v = memory_kv if memory_kv is not None else self.split_heads(
                F.linear(memory, **self._weights(incremental_state, "kv")))
        if value_mix is not None:
            v = value_mix(v)
        causal = True
        if incremental_state is not None:
            cache = self.get_incremental_state(incremental_state, "cache")
            if cache is not None:
                if x.size(0) > 1:
                    raise NotImplementedError("incremental calls take one new position")
                k = torch.cat([cache["k"], k], dim=2)
                v = torch.cat([cache["v"], v], dim=2)
                causal = False  # the one new position reads all of the cache
            self.set_incremental_state(incremental_state, "cache", {"k": k, "v": v})
        dropout = self.dropout if self.training else 0.0
        out = F.scaled_dot_product_attention(q, k, v, is_causal=causal, dropout_p=dropout,
                                             scale=self.head_dim ** -0.5)
        bsz, h, length, hp = out.shape  # -> T x B x (H x hp), out_proj with zero columns
        return F.linear(out.permute(2, 0, 1, 3).reshape(length, bsz, h * hp),
                        **self._weights(incremental_state, "out"))

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
    """x + attn(LN(x)); x + MLP(LN(x)): a GPT-2 block (the baseline's and the AR encoder's),
    run through the stack's depth connection (:mod:`fairseq_plugins.depth.interface`): every
    sub-layer reads its input from the connection and writes its output back.

    ``index``: the block's 0-based place in its stack; ``separate_kv``: its self-attention
    reads separate key and value inputs (MUDD), each with a LayerNorm of its own
    (``key_layer_norm``, ``value_layer_norm``; initialised like ``self_attn_layer_norm``, so
    that equal inputs give equal normalised inputs); ``fusion``: the stack's resolved
    ``FusionOptions`` when the block has LRF's fuse-attention sub-layer after its attention
    (None: not)."""

    sublayers = (SELF, FFN)

    def __init__(self, embed_dim, heads, ffn_dim, bias, dropout, index: int = 0,
                 separate_kv: bool = False, fusion: Optional[FusionOptions] = None):
        super().__init__()
        self.index = index
        self.self_attn_layer_norm = layer_norm(embed_dim, bias)
        self.self_attn = CausalAttention(embed_dim, heads, bias, dropout)
        if separate_kv:
            self.key_layer_norm = layer_norm(embed_dim, bias)
            self.value_layer_norm = layer_norm(embed_dim, bias)
        else:
            self.key_layer_norm = self.value_layer_norm = None
        if fusion is not None:
            self.fuse_attn = FuseAttention.from_options(embed_dim, fusion, dropout)
            self.fuse_attn_layer_norm = layer_norm(embed_dim, bias)
        else:
            self.fuse_attn = self.fuse_attn_layer_norm = None
        self.final_layer_norm = layer_norm(embed_dim, bias)
        self.ffn = FeedForward(embed_dim, ffn_dim, bias, dropout)
        self.dropout = nn.Dropout(dropout)

    @classmethod
    def layout(cls, fuses: bool, **unused) -> Tuple[str, ...]:
        """The block's sub-layers in order (the depth connection's layout)."""
        return (SELF, FUSE, FFN) if fuses else (SELF, FFN)

    def upgrade_state_dict_named(self, state_dict, name):
        """A checkpoint of a block without separate key/value inputs (a plain model's) into one
        with them (MUDD): their LayerNorms start as copies of the checkpoint's self-attention
        LayerNorm, so that while the connection feeds the three inputs the same stream (its
        initialisation) the block computes what the checkpoint's did."""
        if self.key_layer_norm is not None:
            norms_from_self_attention(state_dict, name)

    def _self(self, state: StackState, depth: Depth, incremental_state):
        inputs, token = depth.read(state, self.index, SELF)
        key = value = None
        if self.key_layer_norm is not None and inputs.key is not None:
            key, value = self.key_layer_norm(inputs.key), self.value_layer_norm(inputs.value)
        out = self.self_attn(self.self_attn_layer_norm(inputs.query), key=key, value=value,
                             incremental_state=incremental_state,
                             value_mix=depth.value_mix(state, self.index))
        depth.write(state, self.index, SELF, self.dropout(out), token)

    def _fuse(self, state: StackState, depth: Depth, incremental_state=None):
        if self.fuse_attn is None:
            return

        def sublayer(state: StackState, states):
            inputs, token = depth.read(state, self.index, FUSE)
            out, _ = self.fuse_attn(self.fuse_attn_layer_norm(inputs.query), states,
                                    causal=True, incremental_state=incremental_state)
            depth.write(state, self.index, FUSE, self.dropout(out), token)

        run_sublayer(self.fuse_attn, state, depth.fused_states(state, self.index), sublayer)

    def _ffn(self, state: StackState, depth: Depth):
        inputs, token = depth.read(state, self.index, FFN)
        depth.write(state, self.index, FFN, self.ffn(self.final_layer_norm(inputs.query)), token)

    def forward(self, state: StackState, depth: Depth, incremental_state=None):
        """Runs the block on ``state`` (see :meth:`Depth.read`); returns nothing."""
        self._self(state, depth, incremental_state)
        self._fuse(state, depth, incremental_state)
        self._ffn(state, depth)


class CrossDecoderBlock(PreNormBlock):
    """The AR encoder-decoder's decoder block: causal self-attention, causally masked
    cross-attention over LN(final encoder output) (a LayerNorm of its own per block), MLP.
    Order 'original': self -> cross -> MLP; 'alt': cross -> self -> MLP (a fuse-attention,
    if any, after both).

    The keys and values of the cross-attention come from :func:`project_memories`, which
    computes them for all blocks at once."""

    def __init__(self, embed_dim, heads, cross_heads, ffn_dim, bias, dropout, order="original",
                 **depth_options):
        super().__init__(embed_dim, heads, ffn_dim, bias, dropout, **depth_options)
        if order not in ("original", "alt"):
            raise ValueError(f"decoder block order must be original or alt, got {order!r}")
        self.order = order
        self.encoder_attn_layer_norm = layer_norm(embed_dim, bias)  # the decoder stream (query)
        self.memory_layer_norm = layer_norm(embed_dim, bias)  # the encoder output (keys/values)
        self.encoder_attn = CausalAttention(embed_dim, cross_heads, bias, dropout)

    @classmethod
    def layout(cls, fuses: bool, order: str = "original", **unused) -> Tuple[str, ...]:
        attention = (SELF, CROSS) if order == "original" else (CROSS, SELF)
        return attention + ((FUSE,) if fuses else ()) + (FFN,)

    def _cross(self, state: StackState, depth: Depth, memory_kv, incremental_state):
        inputs, token = depth.read(state, self.index, CROSS)
        out = self.encoder_attn(self.encoder_attn_layer_norm(inputs.query), memory_kv=memory_kv,
                                incremental_state=incremental_state)
        depth.write(state, self.index, CROSS, self.dropout(out), token)

    def forward(self, state: StackState, depth: Depth, memory_kv, incremental_state=None):
        """memory_kv: this block's entry of :func:`project_memories`."""
        if self.order == "original":
            self._self(state, depth, incremental_state)
            self._cross(state, depth, memory_kv, incremental_state)
        else:
            self._cross(state, depth, memory_kv, incremental_state)
            self._self(state, depth, incremental_state)
        self._fuse(state, depth, incremental_state)
        self._ffn(state, depth)


def memory_projection(blocks) -> Dict[str, Optional[Tensor]]:
    """The k/v projections of every block's cross-attention, each with its block's memory
    LayerNorm affine part folded in, stacked: {"weight": (L x 2 x H x hp) x C, "bias"}."""
    norms = [b.memory_layer_norm for b in blocks]
    if any(n.eps != norms[0].eps or n.normalized_shape != norms[0].normalized_shape
           for n in norms):
        raise ValueError("the memory LayerNorms must share eps and shape to share a normalisation")
    parts = [b.encoder_attn.input_weights((b.encoder_attn.k_proj, b.encoder_attn.v_proj),
                                          b.memory_layer_norm) for b in blocks]
    biases = [bias for _, bias in parts]
    return {"weight": torch.cat([weight for weight, _ in parts]),
            "bias": torch.cat(biases) if biases[0] is not None else None}


def project_memories(blocks, encoder_out: Union[Tensor, Sequence[Tensor]],
                     projection: Optional[Dict[str, Optional[Tensor]]] = None
                     ) -> List[Tuple[Tensor, Tensor]]:
    """Cross-attention keys and values of every block over LN_i(encoder_out) (T x B x C) ->
    one (k, v) pair of B x H x T x hp tensors per block. ``projection``: a
    :func:`memory_projection` of these blocks built earlier (incremental decoding keeps one).
    ``encoder_out`` a sequence: block i's own memory (an encoder-decoder bridge's M_i, T x B x C
    each), normalised and projected by block i's slice of the projection.

    All the blocks' memory LayerNorms read the same tensor, so they share its normalisation
    x_hat = (x - mean) / std and differ only in their affine parts, which fold into the k/v
    projections (:meth:`CausalAttention.input_weights`): x_hat is computed once and one GEMM
    projects it for all blocks, instead of L LayerNorms and 2L small GEMMs. Equal to
    projecting each LN_i(encoder_out) (tested, values and gradients)."""
    projection = memory_projection(blocks) if projection is None else projection
    norm = blocks[0].memory_layer_norm
    if not isinstance(encoder_out, Tensor):
        weights = projection["weight"].chunk(len(blocks))
        biases = (projection["bias"].chunk(len(blocks)) if projection["bias"] is not None
                  else [None] * len(blocks))
        return [b.encoder_attn.split_heads(F.linear(
                    F.layer_norm(memory, norm.normalized_shape, eps=norm.eps), weight, bias))
                for b, memory, weight, bias in zip(blocks, encoder_out, weights, biases)]
    normalized = F.layer_norm(encoder_out, norm.normalized_shape, eps=norm.eps)
    y = F.linear(normalized, projection["weight"], projection["bias"])
    size = y.size(-1) // len(blocks)
    return [b.encoder_attn.split_heads(chunk) for b, chunk in zip(blocks, y.split(size, dim=-1))]
