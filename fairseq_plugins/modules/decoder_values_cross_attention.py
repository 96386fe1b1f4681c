"""``decoder-values`` cross-attention: the seed's literal proposal made causal, a negative control.

The slots of :mod:`swapped_cross_attention` without the source values:
out_t = sum_i pi_ti sum_{j<=t} a_ij(t) u_j, so every output is a mix of *decoder* values only
and the source acts only through scalar weights. At target position 0 the only value is u_0, so
per head the output is (a scalar in [0, 1) that depends on the source) x u_0: at most H numbers of
source information reach the first prediction -- ``tests/test_cross_attention.py``
demonstrates the rank bound.
"""
import logging

from .swapped_cross_attention import DEFAULT_CHUNK_SIZE, SwappedCrossAttention

logger = logging.getLogger(__name__)


class DecoderValuesCrossAttention(SwappedCrossAttention):
    source_values = False

    def __init__(self, embed_dim, num_heads, kdim=None, vdim=None, dropout=0.0,
                 zero_init: bool = False, chunk_size: int = DEFAULT_CHUNK_SIZE):
        if zero_init:
            raise ValueError("decoder-values has no source values: zero-initialised decoder "
                             "values would give a constant zero output")
        super().__init__(embed_dim, num_heads, kdim=kdim, vdim=vdim, dropout=dropout,
                         chunk_size=chunk_size)
        del self.v_proj  # unused: an unused parameter would also break DDP
        self.v_proj = None

    @classmethod
    def extra_macs(cls, embed_dim: int, num_heads: int, src_len: int, tgt_len: int,
                   chunk_size: int = DEFAULT_CHUNK_SIZE) -> int:
        """The swapped variant's extra cost without the source values (S d^2 + T S d)."""
        return (super().extra_macs(embed_dim, num_heads, src_len, tgt_len, chunk_size)
                - src_len * embed_dim * embed_dim - tgt_len * src_len * embed_dim)

    def upgrade_state_dict_named(self, state_dict, name):
        """A standard checkpoint's source-value projection has no place here: dropped (logged)."""
        prefix = name + "." if name else ""
        dropped = [k for k in list(state_dict) if k.startswith(prefix + "v_proj.")]
        for k in dropped:
            del state_dict[k]
        if dropped:
            logger.info("%s: decoder-values has no source values; dropped %s", name,
                        ", ".join(dropped))
        super().upgrade_state_dict_named(state_dict, name)
