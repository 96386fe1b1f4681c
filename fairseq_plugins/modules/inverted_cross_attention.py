"""``inverted`` cross-attention: causal doubly normalised attention
(docs/ideas/cross-attention.md).

Logits s_ti (decoder query t, source key i) are first normalised over the target positions seen
so far, then over the source as usual:

    pi_t = softmax_i( s_ti - log(e^b + sum_{j<=t} e^{s_ji}) )

so a source position that earlier target positions already attended strongly is down-weighted: a
learned coverage penalty, b (one sink logit per head) saying how much attention is "free". The
target-axis normaliser is one causal ``logcumsumexp`` (``log_cumsum``: stable, no stabiliser
over future positions); incremental decoding keeps it per source position (B x H x S) and beam
search reorders it. Values are the source's, as in standard cross-attention.
"""
from typing import Dict, Optional

import torch
from torch import Tensor

from .causal_cross_attention import CausalCrossAttention, upcast
from .log_cumsum import causal_logcumsumexp


class InvertedCrossAttention(CausalCrossAttention):
    causal_state_keys = ("coverage",)

    @classmethod
    def extra_macs(cls, embed_dim: int, num_heads: int, src_len: int, tgt_len: int,
                   chunk_size: int = 0) -> int:
        """None: the same projections and products as standard cross-attention, plus a
        logcumsumexp over the target (no multiply-accumulates)."""
        return 0

    def _project_source(self, key: Tensor) -> Dict[str, Tensor]:
        return {"prev_key": self._heads(self.k_proj(key)), "prev_value": self._heads(self.v_proj(key))}

    def _attend(self, query, q, source, key_padding_mask: Optional[Tensor],
                query_padding_mask: Optional[Tensor], state: Dict[str, Tensor]):
        k, v = source["prev_key"], source["prev_value"]
        logits = upcast(self.per_source("bghtd,bhsd->bghts", q, k))  # B x H x T x S
        bsz, _, _, src_len = logits.shape
        start = state.get("coverage")
        if start is None:
            start = self._initial_log_norm(bsz, src_len)
        seen = self._mask_target_padding(logits, query_padding_mask, target_dim=2)
        # log(e^b + sum_{j<=t} e^{s_ji}): the running normaliser continued over the new positions
        if seen.size(2) == 1:  # one decoding step: no concatenation, no scan
            log_norm = torch.logaddexp(start.unsqueeze(2), seen)
        else:
            log_norm = causal_logcumsumexp(torch.cat([start.unsqueeze(2), seen], dim=2),
                                           dim=2)[:, :, 1:]
        logits = logits - log_norm
        if key_padding_mask is not None:
            logits = logits.masked_fill(key_padding_mask[:, None, None, :].to(torch.bool),
                                        float("-inf"))
        weights = torch.softmax(logits, dim=-1)
        out = self.per_source("bghts,bhsd->bghtd", self.dropout_module(weights).to(v.dtype), v)
        return out, weights, {"coverage": log_norm[:, :, -1]}
