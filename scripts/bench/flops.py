"""Analytic multiply-accumulate (MAC) counts per training example for seq2seq models.

Only matrix products are counted (projections, attention scores and sums, output layer); norms,
softmax and element-wise ops are left out, so a measured time ratio may exceed the MAC ratio by
the share of those memory-bound ops. Backward costs ~2x forward for every term, so the
forward ratio is also the training ratio.
"""


def transformer_macs(d, ffn, enc_layers, dec_layers, src_len, tgt_len, vocab):
    """Forward MACs of fairseq's transformer for one (source, target) pair."""
    enc_layer = src_len * (4 * d * d + 2 * src_len * d + 2 * d * ffn)
    dec_self = tgt_len * (4 * d * d + 2 * tgt_len * d)
    dec_cross = tgt_len * (2 * d * d + 2 * src_len * d) + src_len * 2 * d * d  # K/V per source
    dec_ffn = tgt_len * 2 * d * ffn
    return (enc_layers * enc_layer + dec_layers * (dec_self + dec_cross + dec_ffn)
            + tgt_len * d * vocab)


def fusion_extra_macs(d, heads, layers_fused, seq_len, include_embedding=True,
                      algorithm="implemented"):
    """Forward MACs that fuse-attention adds to one stack, for ``seq_len`` tokens.

    Layer i (0-based) attends over L = i+1 states (i without the embedding output). ``naive``:
    multi-head attention over the L states as the LRF paper describes it: Q and O projections
    (2 d^2), K and V projections of every state (2 L d^2), scores and weighted sum (2 L d).
    ``implemented``: what FuseAttention runs, the cheaper of that and the absorbed form (W_k folded
    into the query, W_v applied after mixing): 4 d^2 + 2 H d L.
    """
    total = 0
    for i in layers_fused:
        depth = i + 1 if include_embedding else i
        naive = 2 * d * d + 2 * depth * d * d + 2 * depth * d
        absorbed = 4 * d * d + 2 * heads * d * depth
        total += naive if algorithm == "naive" else min(naive, absorbed)
    return seq_len * total


def bridge_extra_macs(d, enc_layers, dec_layers, src_len, include_embedding=False):
    """Forward MACs of the FC bridge: one Linear(N*d -> d) per decoder layer, per source token,
    computed once per sentence (beam search reuses it). The decoder's cross-attention K/V
    projections are unchanged (each layer projects its own memory instead of the shared one)."""
    return src_len * dec_layers * (enc_layers + include_embedding) * d * d


def cross_attention_extra_macs(kind, d, heads, dec_layers, src_len, tgt_len, chunk=16):
    """Forward MACs that a ``--cross-attention`` variant adds to (or removes from) standard
    cross-attention, in all ``dec_layers``. ``inverted`` only adds a logcumsumexp (no MACs).
    ``swapped``: decoder key and value projections (2 T d^2), source queries (S d^2), logits e
    (T S d), the carried-slot read (T S d), the per-chunk weights (T S chunk H), their
    product with the decoder values (T chunk d) and the slot update (T S d).
    ``decoder-values``: the same without the source values (S d^2 + T S d)."""
    if kind in ("standard", "inverted"):
        return 0
    chunk = min(chunk, tgt_len)
    swapped = (2 * tgt_len * d * d + src_len * d * d + 3 * tgt_len * src_len * d
               + tgt_len * src_len * chunk * heads + tgt_len * chunk * d)
    if kind == "decoder-values":
        swapped -= src_len * d * d + tgt_len * src_len * d
    return dec_layers * swapped
