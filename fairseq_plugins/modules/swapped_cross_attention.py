"""``swapped`` cross-attention: source slots that read the target prefix
(docs/ideas/cross-attention.md).

The cross-attention question proposes source states as queries over decoder states as keys/values.
Done literally that yields S outputs (not T) mixing future target tokens. The causal form: every
source position i owns a slot that, at target step t, has read the prefix x_<=t,

    slot_i(t) = v_i + sum_{j<=t} a_ij(t) u_j,
    a_ij(t)   = e^{e_ij} / (e^b + sum_{j'<=t} e^{e_ij'}),   e_ij = <p_i, c_j> / sqrt(d_head)

(p_i: source query, c_j / u_j: decoder key / value, b: per-head sink logit), and the decoder
reads the slots with the usual weights pi_ti = softmax_i <q_t, k_i>: out_t = sum_i pi_ti slot_i(t).
``tgt_value_proj`` zero-initialised (``zero_init``) makes u = 0: exactly standard cross-attention.

R_i(t) = sum_{j<=t} a_ij(t) u_j obeys a convex recurrence that needs no max-stabiliser:
with Z_i(t) = e^b + sum_{j<=t} e^{e_ij},
    R_i(t) = (Z_i(t-1)/Z_i(t)) R_i(t-1) + (e^{e_it}/Z_i(t)) u_t,
both factors in [0, 1] computed as exp of differences of log Z (a causal logcumsumexp).
Incremental decoding keeps (log Z, R) per source position (B x H x S, B x H x S x d_head);
beam search reorders them. Training does not materialise R for every t (T x S x d per head) nor
the T x S x T tensor of a(t): it walks the target in chunks of ``chunk_size`` positions, carrying
(log Z, R) across chunks, so memory grows as T x S x chunk, never T^2 x S.
"""
from typing import Dict, Optional

import torch
from torch import Tensor, nn

from .causal_cross_attention import CausalCrossAttention, upcast
from .log_cumsum import causal_logcumsumexp


# target positions processed together in training (--cross-attention-chunk-size)
DEFAULT_CHUNK_SIZE = 16


class SwappedCrossAttention(CausalCrossAttention):
    causal_state_keys = ("log_norm", "slot_update")
    source_keys = ("prev_key", "prev_value", "prev_source_query")
    # decoder-values (the subclass) drops v_i from the slots
    source_values = True

    def __init__(self, embed_dim, num_heads, kdim=None, vdim=None, dropout=0.0,
                 zero_init: bool = False, chunk_size: int = DEFAULT_CHUNK_SIZE):
        super().__init__(embed_dim, num_heads, kdim=kdim, vdim=vdim, dropout=dropout)
        if chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
        self.chunk_size = chunk_size
        self.source_query_proj = nn.Linear(self.kdim, embed_dim, bias=True)
        self.target_key_proj = nn.Linear(embed_dim, embed_dim, bias=True)
        self.target_value_proj = nn.Linear(embed_dim, embed_dim, bias=True)
        for proj in (self.source_query_proj, self.target_key_proj, self.target_value_proj):
            nn.init.xavier_uniform_(proj.weight, gain=2 ** -0.5)
            nn.init.zeros_(proj.bias)
        if zero_init:
            nn.init.zeros_(self.target_value_proj.weight)

    @classmethod
    def extra_macs(cls, embed_dim: int, num_heads: int, src_len: int, tgt_len: int,
                   chunk_size: int = DEFAULT_CHUNK_SIZE) -> int:
        """Forward multiply-accumulates this module adds to standard cross-attention (one layer,
        one sentence): decoder key and value projections (2 T d^2), source queries (S d^2),
        logits e (T S d), the carried-slot read (T S d), the per-chunk weights (T S chunk H),
        their product with the decoder values (T chunk d) and the slot update (T S d)."""
        d, chunk = embed_dim, min(chunk_size, tgt_len)
        return (2 * tgt_len * d * d + src_len * d * d + 3 * tgt_len * src_len * d
                + tgt_len * src_len * chunk * num_heads + tgt_len * chunk * d)

    def _project_source(self, key: Tensor) -> Dict[str, Tensor]:
        source = {"prev_key": self._heads(self.k_proj(key)),
                  "prev_source_query": self._heads(self.source_query_proj(key) * self.scaling)}
        # decoder-values has no source values; the cache keeps the name (an empty placeholder)
        # so that "prev_key"/"prev_value" look like fairseq's
        source["prev_value"] = (self._heads(self.v_proj(key)) if self.source_values
                                else source["prev_key"][..., :0])
        return source

    def _attend(self, query, q, source, key_padding_mask: Optional[Tensor],
                query_padding_mask: Optional[Tensor], state: Dict[str, Tensor]):
        k, p = source["prev_key"], source["prev_source_query"]
        weights = self._read_weights(q, k, key_padding_mask)  # B x H x T x S
        read = self.dropout_module(weights)
        target_keys = self._heads(self.target_key_proj(query))
        values = upcast(self._heads(self.target_value_proj(query)))  # u: B x H x T x d
        logits = upcast(self.per_source("bghtd,bhsd->bghst", target_keys, p))  # e: B x H x S x T
        logits = self._mask_target_padding(logits, query_padding_mask, target_dim=3)
        bsz, heads, src_len, tgt_len = logits.shape

        log_norm = state.get("log_norm")
        if log_norm is None:
            log_norm = self._initial_log_norm(bsz, src_len)
        slot = state.get("slot_update")
        if slot is None:
            slot = values.new_zeros(bsz, heads, src_len, self.head_dim)
        if tgt_len == 1:  # one decoding step: the recurrence itself, fewer and smaller ops
            out, log_norm, slot = self._step(upcast(read), logits[..., 0], values, log_norm, slot)
        else:
            out, log_norm, slot = self._chunked(upcast(read), logits, values, log_norm, slot)
        if self.source_values:
            v = source["prev_value"]
            out = out + upcast(self.per_source("bghts,bhsd->bghtd", read.to(v.dtype), v))
        return out, weights, {"log_norm": log_norm, "slot_update": slot}

    @staticmethod
    def _step(read, e, values, log_norm, slot):
        """One target position: read B x H x 1 x S, e B x H x S, values B x H x 1 x d, state
        log Z (B x H x S) and R (B x H x S x d) -> (slot contribution B x H x 1 x d, state)."""
        new_norm = torch.logaddexp(log_norm, e)
        decay = (log_norm - new_norm).exp().unsqueeze(-1)
        weight = (e - new_norm).exp().unsqueeze(-1)
        if torch.is_grad_enabled():
            slot = torch.addcmul(slot * decay, weight, values)
        else:  # generation: R is this step's own tensor (fresh or reordered): update in place
            slot = slot.mul_(decay).addcmul_(weight, values)
        return torch.matmul(read, slot), new_norm, slot

    def _chunked(self, read, logits, values, log_norm, slot):
        """All target positions (read B x H x T x S, logits e B x H x S x T, values B x H x T x d)
        continuing from the state (log Z, R), chunk by chunk (see the module doc)."""
        tgt_len = logits.size(-1)
        all_log_norms = causal_logcumsumexp(torch.cat([log_norm.unsqueeze(-1), logits], dim=-1),
                                            dim=-1)
        outs = []
        for t0 in range(0, tgt_len, self.chunk_size):
            t1 = min(t0 + self.chunk_size, tgt_len)
            e = logits[..., t0:t1]  # B x H x S x C (over j)
            norm = all_log_norms[..., t0 + 1:t1 + 1]  # log Z_i(t): B x H x S x C (over t)
            # a_ij(t) for t, j in the chunk: B x H x S x C(t) x C(j), j > t masked before exp
            future = torch.ones(t1 - t0, t1 - t0, dtype=torch.bool, device=e.device).triu(1)
            inner = (e.unsqueeze(-2) - norm.unsqueeze(-1)).masked_fill(future, float("-inf")).exp()
            decay = (log_norm.unsqueeze(-1) - norm).exp()  # Z_i(t0-1) / Z_i(t): B x H x S x C
            r = read[:, :, t0:t1]  # B x H x C x S
            out = torch.matmul(r * decay.transpose(-1, -2), slot)
            out = out + torch.matmul(torch.einsum("bhti,bhitj->bhtj", r, inner), values[:, :, t0:t1])
            outs.append(out)
            slot = decay[..., -1:] * slot + torch.matmul(inner[..., -1, :], values[:, :, t0:t1])
            log_norm = norm[..., -1]
        return torch.cat(outs, dim=2), log_norm, slot
