"""Base class of the cross-attention variants whose state depends on the target prefix.

Standard cross-attention (fairseq's ``MultiheadAttention`` with ``encoder_decoder_attention``)
reads source keys/values that depend on the source only, so fairseq caches them once and does not
reorder them on a beam step. The swapped-role variants (``swapped``, ``inverted``,
``decoder-values``) also keep running state *per source position that depends on the hypothesis*
(x_<=t): it lives in the incremental state beside the cached source projections and
:meth:`reorder_incremental_state` reorders all of it, every step.

The module keeps fairseq's parameter names (``q_proj``, ``k_proj``, ``v_proj``, ``out_proj``) and
initialisation, so a standard model's cross-attention weights load into a variant, and adds
``sink``: a learned logit per head, the "nothing yet" option of the normalisation over target
positions (see the subclasses).

Subclasses implement :meth:`_project_source` (source-only tensors, cached) and :meth:`_attend`
(the attention proper, full sequence or continuing from a cached state).
"""
import logging
from typing import Dict, Optional, Tuple

import torch
from torch import Tensor, nn

from fairseq.modules.multihead_attention import MultiheadAttention

logger = logging.getLogger(__name__)

# masked logits: finite (a -inf would make logcumsumexp's backward NaN) and small enough that
# exp() of it is exactly 0 next to any real logit; the variants do this math in at least float32
MASKED = -1e9


def upcast(x: Tensor) -> Tensor:
    """fp16/bf16 -> float32 for the normalisations; float32/float64 unchanged."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


class CausalCrossAttention(MultiheadAttention):
    """Decoder cross-attention with per-hypothesis running state. Query T x B x C (decoder), key/
    value S x B x C (encoder output or a bridge memory). Returns (T x B x C, weights), weights
    being the read weights over source positions (B x T x S averaged over heads, or H x B x T x S
    with ``need_head_weights``) as fairseq's MultiheadAttention returns them."""

    # names of the incremental-state entries that depend on the hypothesis (subclasses)
    causal_state_keys: Tuple[str, ...] = ()
    # names of the cached source-only tensors; "prev_key" marks the cache as filled (as in
    # fairseq's attention)
    source_keys: Tuple[str, ...] = ("prev_key", "prev_value")

    def __init__(self, embed_dim, num_heads, kdim=None, vdim=None, dropout=0.0):
        super().__init__(embed_dim, num_heads, kdim=kdim, vdim=vdim, dropout=dropout,
                         encoder_decoder_attention=True)
        self.sink = nn.Parameter(torch.zeros(num_heads))

    # -- helpers for subclasses -------------------------------------------------------------
    def _heads(self, x: Tensor) -> Tensor:
        """T x B x C -> B x H x T x head_dim."""
        length, bsz, _ = x.shape
        return x.view(length, bsz, self.num_heads, self.head_dim).permute(1, 2, 0, 3)

    def _merge(self, x: Tensor) -> Tensor:
        """B x H x T x head_dim -> T x B x C."""
        bsz, _, length, _ = x.shape
        return x.permute(2, 0, 1, 3).reshape(length, bsz, self.embed_dim)

    @staticmethod
    def per_source(equation: str, hyp: Tensor, src: Tensor) -> Tensor:
        """``torch.einsum(equation, hyp, src)`` where hyp has one row per hypothesis (B) and src
        one row per source sentence (B_src, B = B_src x g, the g beams of a sentence adjacent):
        the equation names hyp's rows "bg" and src's "b". Returns B x ... ."""
        group = hyp.size(0) // src.size(0)
        out = torch.einsum(equation, hyp.view(src.size(0), group, *hyp.shape[1:]), src)
        return out.reshape(hyp.size(0), *out.shape[2:])

    def _read_weights(self, q: Tensor, k: Tensor, key_padding_mask: Optional[Tensor]) -> Tensor:
        """Softmax over source positions of the decoder-query/source-key logits (at least
        float32): B x H x T x S, as standard cross-attention."""
        logits = upcast(self.per_source("bghtd,bhsd->bghts", q, k))
        if key_padding_mask is not None:
            logits = logits.masked_fill(key_padding_mask[:, None, None, :].to(torch.bool),
                                        float("-inf"))
        return torch.softmax(logits, dim=-1)

    def _initial_log_norm(self, bsz: int, src_len: int) -> Tensor:
        """log of the normaliser over no target position yet: the sink alone, B x H x S."""
        return upcast(self.sink)[None, :, None].expand(bsz, -1, src_len)

    @staticmethod
    def _mask_target_padding(logits: Tensor, query_padding_mask: Optional[Tensor],
                             target_dim: int) -> Tensor:
        """Padded target positions take part in no normalisation over targets."""
        if query_padding_mask is None:
            return logits
        shape = [logits.size(0), 1, 1, 1]
        shape[target_dim] = logits.size(target_dim)
        return logits.masked_fill(query_padding_mask.to(torch.bool).view(shape), MASKED)

    # -- subclass hooks -----------------------------------------------------------------------
    def _project_source(self, key: Tensor) -> Dict[str, Tensor]:
        """Source-only tensors (B x H x S x head_dim), cached for the whole decoding."""
        raise NotImplementedError

    def _attend(self, query: Tensor, q: Tensor, source: Dict[str, Tensor],
                key_padding_mask: Optional[Tensor], query_padding_mask: Optional[Tensor],
                state: Dict[str, Tensor]) -> Tuple[Tensor, Tensor, Dict[str, Tensor]]:
        """(output B x H x T x head_dim, read weights B x H x T x S, new causal state)."""
        raise NotImplementedError

    # -- fairseq interface --------------------------------------------------------------------
    def forward(self, query, key: Optional[Tensor], value: Optional[Tensor],
                key_padding_mask: Optional[Tensor] = None,
                incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None,
                need_weights: bool = True, static_kv: bool = False,
                attn_mask: Optional[Tensor] = None, before_softmax: bool = False,
                need_head_weights: bool = False, query_padding_mask: Optional[Tensor] = None):
        """``query_padding_mask`` (B x T, True at padded target positions): those positions
        are left out of every normalisation over target positions (left- or right-padded
        targets then give the same outputs). Other MultiheadAttention options are not
        supported and fail loudly."""
        if attn_mask is not None or before_softmax:
            raise NotImplementedError(f"{type(self).__name__} takes no attn_mask/before_softmax")
        if value is not None and value is not key:
            raise ValueError(f"{type(self).__name__}: keys and values must be the same memory")
        buffer = self._get_input_buffer(incremental_state) if incremental_state is not None else {}
        if "prev_key" in buffer:  # source projections cached at the first step
            source = {name: buffer[name] for name in self.source_keys}
        else:
            source = self._project_source(
                self._one_row_per_sentence(key) if incremental_state is not None else key)
        state = {name: buffer[name] for name in self.causal_state_keys if name in buffer}

        q = self._heads(self.q_proj(query) * self.scaling)
        out, weights, new_state = self._attend(query, q, source, key_padding_mask,
                                               query_padding_mask, state)
        if incremental_state is not None:
            buffer = dict(source)
            buffer.update(new_state)
            self._set_input_buffer(incremental_state, buffer)

        out = self.out_proj(self._merge(out.to(query.dtype)))
        if not (need_weights or need_head_weights):
            return out, None
        weights = weights.transpose(0, 1)  # H x B x T x S
        return out, (weights if need_head_weights else weights.mean(dim=0))

    def _one_row_per_sentence(self, key: Tensor) -> Tensor:
        """In beam search (the model passes fairseq's ``set_beam_size`` on to this module) the g
        beams of a sentence share the source: keep one row per sentence (S x B/g x C), so that
        the cached source projections are computed once and need no copy on beam steps.
        Checked, not assumed: rows that differ within a group keep every row."""
        beam = self.beam_size
        length, bsz, dim = key.shape
        if beam <= 1 or bsz % beam:
            return key
        grouped = key.view(length, bsz // beam, beam, dim)
        first = grouped[:, :, :1]
        return first[:, :, 0] if torch.equal(grouped, first.expand_as(grouped)) else key

    def reorder_incremental_state(self, incremental_state, new_order: Tensor):
        """Reorder the per-hypothesis state, and the cached source projections. Those have one
        row per hypothesis, or one per group of g identical sources (see
        :meth:`_one_row_per_sentence`): hypothesis i reads source row i // g. A beam step only
        moves hypotheses within a sentence, which leaves the source rows as they are (no copy);
        they change when finished sentences leave the batch (as for fairseq's encoder-decoder
        attention)."""
        buffer = self._get_input_buffer(incremental_state)
        if not buffer:
            return incremental_state
        hypotheses = buffer[self.causal_state_keys[0]].size(0)
        # the source tensors share one row layout: select their rows once for all of them
        rows = self._source_rows(new_order, hypotheses, buffer["prev_key"].size(0))
        reordered = {}
        for name, value in buffer.items():
            if name in self.causal_state_keys:
                reordered[name] = value.index_select(0, new_order)
            else:
                reordered[name] = value if rows is None else value.index_select(0, rows)
        return self._set_input_buffer(incremental_state, reordered)

    @staticmethod
    def _source_rows(new_order: Tensor, hypotheses: int, source_rows: int) -> Optional[Tensor]:
        """The cached source rows the reordered hypotheses read (None: the rows as they are)."""
        group = hypotheses // source_rows
        rows = new_order // group
        if group > 1 and rows.numel() % group == 0:
            per_group = rows.view(-1, group)
            if torch.equal(per_group, per_group[:, :1].expand_as(per_group)):
                rows = per_group[:, 0]  # the new hypotheses still come in groups of g
        if rows.numel() == source_rows and torch.equal(
                rows, torch.arange(source_rows, device=rows.device)):
            return None
        return rows

    def upgrade_state_dict_named(self, state_dict, name):
        """Fine-tuning from a standard model: parameters this variant adds to fairseq's
        cross-attention (absent from the checkpoint) start from their initialisation (with
        ``zero_init``, exactly the standard model)."""
        super().upgrade_state_dict_named(state_dict, name)
        prefix = name + "." if name else ""
        if prefix + "q_proj.weight" not in state_dict:
            return  # not a checkpoint of this module at all
        added = []
        for pname, param in self.named_parameters():
            if prefix + pname not in state_dict:
                state_dict[prefix + pname] = param.detach().clone()
                added.append(pname)
        if added:
            logger.info("%s: %s not in the checkpoint, initialised as for a new model",
                        name, ", ".join(added))
