"""Fuse-attention (LRF; Zheng et al., AAAI 2024, arXiv 2307.10799): attention over the outputs of
the layers below.

At layer l of a stack, the query (the preceding sub-layer's output) attends over the lower layers'
outputs ``[h_0, h_1, ..., h_{l-1}]`` (``h_0`` = the embedding output). Two readings of the paper
(``--fusion-reading``, docs/ideas/fusion.md):

- ``per-token`` (default): each position attends over its *own* l lower-layer states. The
  attention runs over depth, never over time: causal by construction, and incremental decoding
  needs no cache (step t only needs step t's own lower-layer outputs).
- ``all-positions``: each position attends over every position of the l lower layers (l x T keys),
  with the key padding mask, causal in a decoder; incremental decoding caches the projected keys
  and values of earlier steps (fairseq's attention cache, reordered by beam search).
"""
from typing import Callable, Dict, List, Optional, Tuple

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from fairseq import utils
from fairseq.modules import MultiheadAttention

from ..weight_logging import Record, WeightSource
from .interface import StackState

PER_TOKEN, ALL_POSITIONS = "per-token", "all-positions"


class FuseAttention(WeightSource, nn.Module):
    """Multi-head attention of each token over its own lower-layer outputs.

    The parameters are those of a fairseq :class:`MultiheadAttention` (own Q/K/V/O projections,
    4d^2 + 4d; same names and initialisation), with depth as the key axis and the T x B tokens as
    the batch. Two exact computations of the same function, chosen per call by MAC count:

    - ``standard``: fairseq's MultiheadAttention (project every state to K and V):
      2d^2 + 2Ld^2 + 2Ld MACs per token for L states.
    - ``absorbed``: fold W_k into the query and W_v behind the mixing, since
      q_h . (W_k,h s + b_k,h) = (W_k,h^T q_h) . s + const_h (the constant cancels in the softmax)
      and sum_j p_j (W_v,h s_j + b_v,h) = W_v,h (sum_j p_j s_j) + (sum_j p_j) b_v,h:
      4d^2 + 2HdL MACs per token, nearly flat in depth. Used whenever it is cheaper (L >= 2 for
      any d > 2H), and whenever the weights are kept (it has them at hand); otherwise fairseq's
      fused path.

    Set ``keep_weights = True`` to keep the last call's attention weights in ``last_weights``
    (B x H x T x L, L = number of lower states attended); off by default, so no cost otherwise.
    Once logging (:meth:`start_logging`, ``--log-layer-weights``) every training call hands the
    logger their mean per state over the heads and the positions (padding included: the module
    does not see the mask).
    """

    def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0,
                 first_state: int = 0, reading: str = PER_TOKEN, recompute: bool = False):
        super().__init__()
        self.recompute = recompute
        if reading not in (PER_TOKEN, ALL_POSITIONS):
            raise ValueError(f"--fusion-reading {reading!r}: choose {PER_TOKEN} or "
                             f"{ALL_POSITIONS}")
        self.reading = reading
        self.attn = MultiheadAttention(embed_dim, num_heads, dropout=dropout,
                                       self_attention=False, encoder_decoder_attention=False)
        self.num_heads = num_heads
        self.head_dim = embed_dim // num_heads
        self.keep_weights = False
        self.last_weights: Optional[Tensor] = None
        self.record: Optional[Record] = None  # where a training call's mean weights go
        self.first_state = first_state  # the j of h_j that history[0] is (for the labels)

    @classmethod
    def from_options(cls, embed_dim: int, fusion, dropout: float) -> "FuseAttention":
        """The fuse-attention a stack's resolved ``FusionOptions`` describe."""
        return cls(embed_dim, fusion.heads, dropout=dropout, first_state=fusion.first_state,
                   reading=fusion.reading, recompute=fusion.recompute)

    @staticmethod
    def macs(embed_dim: int, num_heads: int, depth: int, algorithm: str = "implemented",
             positions: int = 1) -> int:
        """Forward multiply-accumulates for one token attending over ``depth`` states.

        ``naive``: multi-head attention over the states as the LRF paper describes it (Q and O
        projections 2d^2, K and V of every state 2Ld^2, scores and weighted sum 2Ld).
        ``implemented``: what :meth:`forward` runs, the cheaper of that and the absorbed form
        (4d^2 + 2HdL; see the class doc). ``positions`` > 1: the all-positions reading, where
        the token's scores and weighted sum run over ``depth`` x ``positions`` keys (each
        position's states projected once): 2d^2 + 2Ld^2 + 2L·positions·d, no absorbed form."""
        d = embed_dim
        naive = 2 * d * d + 2 * depth * d * d + 2 * depth * positions * d
        if positions > 1 or algorithm == "naive":
            return naive
        return min(naive, 4 * d * d + 2 * num_heads * d * depth)

    @property
    def out_proj(self) -> nn.Linear:
        return self.attn.out_proj

    def use_absorbed(self, depth: int) -> bool:
        d, h = self.attn.embed_dim, self.num_heads
        return 4 * d * d + 2 * h * d * depth < 2 * d * d + 2 * depth * d * d + 2 * depth * d

    def forward(self, query: Tensor, history: List[Tensor],
                key_padding_mask: Optional[Tensor] = None, causal: bool = False,
                incremental_state=None) -> Tuple[Tensor, Optional[Tensor]]:
        """
        Args:
            query: T x B x C, the preceding sub-layer's output.
            history: L tensors of T x B x C, the same tokens' lower-layer outputs.
            key_padding_mask, causal, incremental_state: read by the all-positions reading
                only (B x T, True at padding; position t reads positions <= t; fairseq's
                incremental state, when decoding step by step). Per token they change nothing:
                a position reads only its own states.
        Returns:
            T x B x C fused representation, and the weights (B x H x T x L) if kept (for the
            all-positions reading, each state's weight summed over its positions).
        """
        if self.reading == ALL_POSITIONS:
            return self._all_positions(query, history, key_padding_mask, causal,
                                       incremental_state)
        tgt_len, bsz, dim = query.shape
        flat = query.reshape(tgt_len * bsz, dim)
        logs = self.record is not None and self.training
        if self.keep_weights or logs or self.use_absorbed(len(history)):
            out, probs = self._absorbed(flat, history)
        else:
            out = self._standard(flat, history)
        if logs:
            self._record_means(probs.detach().float().mean(dim=(0, 1)))  # L
        weights = None
        if self.keep_weights:
            # (T*B) x H x L -> B x H x T x L
            weights = probs.view(tgt_len, bsz, self.num_heads, -1).permute(1, 2, 0, 3).detach()
            self.last_weights = weights
        return out.view(tgt_len, bsz, dim), weights

    def _all_positions(self, query: Tensor, history: List[Tensor],
                       key_padding_mask: Optional[Tensor], causal: bool, incremental_state):
        """Attention over every position of every lower state. The keys are in time-major order
        (key t·L + j: position t of state j), the order in which an incremental cache grows, so
        that step by step and a full forward attend the same keys under the same masks."""
        tgt_len, depth = query.size(0), len(history)
        keys = torch.stack(history, dim=1)  # S x L x B x C
        src_len = keys.size(0)
        keys = keys.reshape(src_len * depth, *keys.shape[2:])
        if key_padding_mask is not None:
            key_padding_mask = key_padding_mask.repeat_interleave(depth, dim=1)
        attn_mask = None
        if causal and incremental_state is None:
            future = utils.fill_with_neg_inf(query.new_zeros(tgt_len, src_len)).triu(1)
            attn_mask = future.repeat_interleave(depth, dim=1)
        logs = self.record is not None and self.training
        want = self.keep_weights or logs
        if want and incremental_state is None:
            # fairseq's fused path averages the weights over the heads: spelled out instead
            out, probs = self._explicit(query, keys, key_padding_mask, attn_mask)
        else:
            out, probs = self.attn(query=query, key=keys, value=keys,
                                   key_padding_mask=key_padding_mask,
                                   incremental_state=incremental_state, need_weights=want,
                                   need_head_weights=want, attn_mask=attn_mask)
        weights = None
        if want:  # H x B x T x (S·L) -> per state: B x H x T x L
            per_state = probs.view(*probs.shape[:3], -1, depth).sum(3).detach()
            if logs:
                self._record_means(per_state.float().mean(dim=(0, 1, 2)))
            if self.keep_weights:
                weights = per_state.transpose(0, 1)
                self.last_weights = weights
        return out, weights

    def _explicit(self, query: Tensor, keys: Tensor, key_padding_mask: Optional[Tensor],
                  attn_mask: Optional[Tensor]) -> Tuple[Tensor, Tensor]:
        """The attention of :meth:`_all_positions` written out (when its weights are kept):
        T x B x C and the weights H x B x T x K."""
        a, heads, hd = self.attn, self.num_heads, self.head_dim
        tgt_len, bsz, dim = query.shape
        q = (a.q_proj(query) * a.scaling).view(tgt_len, bsz * heads, hd).transpose(0, 1)
        k = a.k_proj(keys).view(-1, bsz * heads, hd).transpose(0, 1)
        v = a.v_proj(keys).view(-1, bsz * heads, hd).transpose(0, 1)
        scores = torch.bmm(q, k.transpose(1, 2)).view(bsz, heads, tgt_len, -1)
        if attn_mask is not None:
            scores = scores + attn_mask
        if key_padding_mask is not None:
            scores = scores.masked_fill(key_padding_mask[:, None, None, :], float("-inf"))
        probs = torch.softmax(scores, dim=-1, dtype=torch.promote_types(scores.dtype,
                                                                        torch.float32))
        probs = probs.type_as(scores)
        mixed = torch.bmm(a.dropout_module(probs).view(bsz * heads, tgt_len, -1), v)
        out = a.out_proj(mixed.transpose(0, 1).reshape(tgt_len, bsz, dim))
        return out, probs.transpose(0, 1)

    def start_logging(self, record: Record):
        """Every training call hands ``record`` its mean weight per state."""
        self.record = record

    def recomputes(self) -> bool:
        """Whether the sub-layer around this module runs under :func:`run_sublayer`'s
        recomputation now (``--fusion-recompute``, a training forward that keeps no weights)."""
        return (self.recompute and self.training and torch.is_grad_enabled()
                and not (self.keep_weights or self.record is not None))

    def _record_means(self, means: Tensor):
        """{'s<j>': mean weight on state h_j in this call} to the logger."""
        self.record({f"s{self.first_state + j}": w for j, w in enumerate(means)})

    def _standard(self, query: Tensor, history: List[Tensor]) -> Tensor:
        n, dim = query.shape
        kv = torch.stack(history, dim=0).reshape(len(history), n, dim)
        out, _ = self.attn(query=query.unsqueeze(0), key=kv, value=kv, need_weights=False)
        return out.squeeze(0)

    def _absorbed(self, query: Tensor, history: List[Tensor]):
        a, n, dim = self.attn, query.size(0), query.size(1)
        heads, head_dim = self.num_heads, self.head_dim
        q = (a.q_proj(query) * a.scaling).view(n, heads, head_dim)
        # (H x N x hd) @ (H x hd x C): each head's query mapped back to the state space
        q_state = torch.bmm(q.transpose(0, 1), a.k_proj.weight.view(heads, head_dim, dim))
        states = torch.stack(history, dim=-2).view(n, len(history), dim)  # N x L x C
        scores = torch.bmm(q_state.transpose(0, 1), states.transpose(1, 2))  # N x H x L
        # at least fp32 for the softmax (fp16 safety), as fairseq's attention does
        probs = torch.softmax(scores, dim=-1, dtype=torch.promote_types(scores.dtype, torch.float32))
        probs = probs.type_as(scores)
        probs = a.dropout_module(probs)
        mixed = torch.bmm(probs, states)  # N x H x C
        # (H x N x C) @ (H x C x hd): per-head value projection of the mixed states
        values = torch.bmm(mixed.transpose(0, 1),
                           a.v_proj.weight.view(heads, head_dim, dim).transpose(1, 2))
        values = values.transpose(0, 1) + probs.sum(-1, keepdim=True) * a.v_proj.bias.view(
            heads, head_dim)
        return a.out_proj(values.reshape(n, dim)), probs


def run_sublayer(fuse: FuseAttention, state: StackState, history: List[Tensor],
                 sublayer: Callable[[StackState, List[Tensor]], None]):
    """Runs a block's fuse-attention sub-layer, ``sublayer(state, history)`` (its read, norm,
    fuse-attention, dropout and write of ``state.stream``). With ``--fusion-recompute`` in
    training, only its inputs are kept for the backward pass (the stream, and the history,
    which the stack keeps anyway): everything in between (norms, attention, dropout mask, the
    residual sum) is recomputed there, dropout included (the RNG state is replayed), so values
    and gradients are those without it."""
    if not fuse.recomputes():
        sublayer(state, history)
        return

    def pure(stream: Tensor, *states: Tensor) -> Tensor:
        again = state.sharing_slots(stream)
        sublayer(again, list(states))
        return again.stream

    state.stream = checkpoint(pure, state.stream, *history, use_reentrant=False)


class RecordsFusionWeights:
    """A model mixin: keep the fuse-attention weights of its next forward passes for plots and
    the layer analysis (off by default: no cost). The model names its stacks' blocks in
    :meth:`fusion_stacks`."""

    def fusion_stacks(self) -> Dict[str, List[nn.Module]]:
        """{'encoder'|'decoder': the stack's layers/blocks} (those that have one)."""
        raise NotImplementedError

    def _fuse_modules(self, side: str) -> List[Tuple[int, FuseAttention]]:
        return [(i, layer.fuse_attn) for i, layer in enumerate(self.fusion_stacks().get(side, []))
                if getattr(layer, "fuse_attn", None) is not None]

    def record_fusion_weights(self, enabled: bool = True):
        """Keep fuse-attention weights of the next forward passes (off by default: no cost)."""
        for side in self.fusion_stacks():
            for _, module in self._fuse_modules(side):
                module.keep_weights = enabled
                module.last_weights = None

    def fusion_weights(self) -> Dict[str, Dict[int, Tensor]]:
        """Weights of the last forward pass: {'encoder'|'decoder': {layer: B x H x T x L}}.

        L = number of states the layer attended (embedding output first, its own input last).
        Empty until :meth:`record_fusion_weights` was called before a forward pass.
        """
        return {side: {i: m.last_weights for i, m in self._fuse_modules(side)
                       if m.last_weights is not None}
                for side in self.fusion_stacks()}
