"""The self-attention of ``layerwise_transformer``'s layers: fairseq's ``MultiheadAttention``
(same construction, parameters and incremental cache), which also takes what a depth connection
gives a self-attention besides one input.

fairseq's module computes keys and values from its ``key`` / ``value`` arguments on its training
path but from the query on its incremental path (``self_attention=True``), and has no place
between projecting the values and caching them. A depth connection that feeds a block's
self-attention separate key and value inputs (MUDD's query / key / value ways) or mixes the
values it projects (value residual) needs both paths to do the same; :meth:`forward` then runs
:meth:`_explicit`, which projects the keys and values from the inputs it is given, applies the
values' hook to this call's positions and caches the result in fairseq's format (``prev_key`` /
``prev_value``: B x H x S x hd, so fairseq's beam reordering applies unchanged). Without them it
is fairseq's own forward, untouched.
"""
from typing import Callable, Dict, Optional, Tuple

import torch
from torch import Tensor

from fairseq.modules import MultiheadAttention


class DepthSelfAttention(MultiheadAttention):
    """fairseq's self-attention with separate key / value inputs and a values' hook (see the
    module's docstring); built with the arguments of ``MultiheadAttention``."""

    def forward(self, query: Tensor, key: Optional[Tensor], value: Optional[Tensor],
                key_padding_mask: Optional[Tensor] = None,
                incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None,
                need_weights: bool = True, static_kv: bool = False,
                attn_mask: Optional[Tensor] = None, before_softmax: bool = False,
                need_head_weights: bool = False,
                value_mix: Optional[Callable[[Tensor], Tensor]] = None
                ) -> Tuple[Tensor, Optional[Tensor]]:
        """fairseq's arguments (query, key, value: T x B x C); ``value_mix``: applied to the
        values of this call's positions (B x H x T x hd) before they are cached and attended.
        Keys / values other than the query, or a ``value_mix``, run :meth:`_explicit`."""
        if value_mix is None and key is query and value is query:
            return super().forward(query, key, value, key_padding_mask=key_padding_mask,
                                   incremental_state=incremental_state,
                                   need_weights=need_weights, static_kv=static_kv,
                                   attn_mask=attn_mask, before_softmax=before_softmax,
                                   need_head_weights=need_head_weights)
        if need_weights or need_head_weights or before_softmax or static_kv:
            raise ValueError("a self-attention with separate inputs returns no weights and "
                             "reads no static keys")
        if self.bias_k is not None or self.add_zero_attn:
            raise ValueError("separate key / value inputs: --add-bias-kv / --add-zero-attn are "
                             "not supported")
        return self._explicit(query, key, value, key_padding_mask, incremental_state,
                              attn_mask, value_mix), None

    def _explicit(self, query: Tensor, key: Tensor, value: Tensor,
                  key_padding_mask: Optional[Tensor], incremental_state,
                  attn_mask: Optional[Tensor], value_mix) -> Tensor:
        """Scaled dot-product attention of the query's projections over the key's and value's
        (those of earlier steps from the cache): T x B x C."""
        length, bsz, dim = query.shape
        heads, head_dim = self.num_heads, self.head_dim

        def split(x: Tensor) -> Tensor:  # T x B x C -> B x H x T x hd
            return x.view(x.size(0), bsz, heads, head_dim).permute(1, 2, 0, 3)

        q = split(self.q_proj(query) * self.scaling)
        k, v = split(self.k_proj(key)), split(self.v_proj(value))
        if value_mix is not None:
            v = value_mix(v)
        if incremental_state is not None:
            saved = self._get_input_buffer(incremental_state)
            if "prev_key" in saved:
                k = torch.cat([saved["prev_key"], k], dim=2)
                v = torch.cat([saved["prev_value"], v], dim=2)
            key_padding_mask = MultiheadAttention._append_prev_key_padding_mask(
                key_padding_mask, saved.get("prev_key_padding_mask"), bsz, k.size(2),
                static_kv=False)
            saved["prev_key"], saved["prev_value"] = k, v
            saved["prev_key_padding_mask"] = key_padding_mask
            self._set_input_buffer(incremental_state, saved)
        scores = torch.matmul(q, k.transpose(-1, -2))  # B x H x T x S
        if attn_mask is not None:
            scores = scores + attn_mask
        if key_padding_mask is not None:
            scores = scores.masked_fill(key_padding_mask.view(bsz, 1, 1, -1).to(torch.bool),
                                        float("-inf"))
        # in float32 at least (fp16 safety, as fairseq's attention), float64 in a float64 model
        probs = torch.softmax(scores, dim=-1,
                              dtype=torch.promote_types(scores.dtype, torch.float32))
        probs = probs.type_as(scores)
        mixed = torch.matmul(self.dropout_module(probs), v)  # B x H x T x hd
        return self.out_proj(mixed.permute(2, 0, 1, 3).reshape(length, bsz, dim))


def norms_from_self_attention(state_dict, name: str):
    """A checkpoint of a block without LayerNorms for separate key and value inputs (a model
    trained without them) into one with them (``<name>.key_layer_norm``,
    ``<name>.value_layer_norm``): they start as copies of the checkpoint's self-attention
    LayerNorm, so that while the connection feeds the three inputs the same stream (its
    initialisation) the block computes what the checkpoint's did. Norms the checkpoint has are
    kept."""
    prefix = f"{name}." if name else ""
    source = f"{prefix}self_attn_layer_norm."
    for key, value in list(state_dict.items()):
        if key.startswith(source):
            for norm in ("key_layer_norm", "value_layer_norm"):
                state_dict.setdefault(f"{prefix}{norm}.{key[len(source):]}", value.clone())
