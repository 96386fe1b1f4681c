"""Forward multiply-accumulates of fairseq's own transformer sub-layers (they have no module in
this package; each of this package's sub-layers states its own cost beside its code:
``FuseAttention.macs``, ``LayerBridge.macs``, the cross-attention variants' ``extra_macs``).

Only matrix products are counted (projections, attention scores and sums, output layer); norms,
softmax and element-wise ops are left out, so a measured time ratio may exceed a MAC ratio by the
share of those memory-bound ops. Backward costs about twice the forward for every term, so a
forward ratio is also the training ratio.
"""


def self_attention_macs(length: int, embed_dim: int) -> int:
    """Q, K, V, O projections (4 d^2 per token) and scores + weighted sum (2 T d per token)."""
    return length * (4 * embed_dim * embed_dim + 2 * length * embed_dim)


def cross_attention_macs(tgt_len: int, src_len: int, embed_dim: int) -> int:
    """Q and O per target token (2 d^2), scores + sum (2 S d), K and V per source token."""
    d = embed_dim
    return tgt_len * (2 * d * d + 2 * src_len * d) + src_len * 2 * d * d


def ffn_macs(length: int, embed_dim: int, ffn_dim: int) -> int:
    return length * 2 * embed_dim * ffn_dim


def transformer_macs(embed_dim: int, ffn_dim: int, encoder_layers: int, decoder_layers: int,
                     src_len: int, tgt_len: int, vocab: int) -> int:
    """fairseq's transformer for one (source, target) pair, output projection included."""
    d = embed_dim
    encoder_layer = self_attention_macs(src_len, d) + ffn_macs(src_len, d, ffn_dim)
    decoder_layer = (self_attention_macs(tgt_len, d) + cross_attention_macs(tgt_len, src_len, d)
                     + ffn_macs(tgt_len, d, ffn_dim))
    return (encoder_layers * encoder_layer + decoder_layers * decoder_layer
            + tgt_len * d * vocab)
