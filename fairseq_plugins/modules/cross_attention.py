"""The decoder cross-attention kinds (``--cross-attention``) and how to build each one."""
from .decoder_values_cross_attention import DecoderValuesCrossAttention
from .inverted_cross_attention import InvertedCrossAttention
from .swapped_cross_attention import DEFAULT_CHUNK_SIZE, SwappedCrossAttention

# "standard" is fairseq's own MultiheadAttention (built by fairseq's decoder layer)
STANDARD = "standard"
CROSS_ATTENTION_KINDS = (STANDARD, "swapped", "inverted", "decoder-values")
__all__ = ["CROSS_ATTENTION_KINDS", "DEFAULT_CHUNK_SIZE", "STANDARD", "build_cross_attention",
           "extra_macs"]
_SLOT_KINDS = {"swapped": SwappedCrossAttention, "decoder-values": DecoderValuesCrossAttention}
_CLASSES = dict(_SLOT_KINDS, inverted=InvertedCrossAttention)


def build_cross_attention(kind: str, embed_dim: int, cfg):
    """The variant module for ``kind`` (not 'standard') with the decoder config's sizes."""
    common = dict(kdim=cfg.encoder.embed_dim, vdim=cfg.encoder.embed_dim,
                  dropout=cfg.attention_dropout)
    heads = cfg.decoder.attention_heads
    if kind == "inverted":
        return InvertedCrossAttention(embed_dim, heads, **common)
    if kind in _SLOT_KINDS:
        return _SLOT_KINDS[kind](embed_dim, heads, zero_init=bool(cfg.cross_attention_zero_init),
                                 chunk_size=cfg.cross_attention_chunk_size, **common)
    raise ValueError(f"unknown cross-attention kind {kind!r}; allowed: {CROSS_ATTENTION_KINDS}")


def extra_macs(kind: str, embed_dim: int, num_heads: int, src_len: int, tgt_len: int,
               chunk_size: int = DEFAULT_CHUNK_SIZE) -> int:
    """Forward multiply-accumulates that ``kind`` adds to standard cross-attention in one
    decoder layer for one sentence (each variant's own ``extra_macs``)."""
    if kind == STANDARD:
        return 0
    return _CLASSES[kind].extra_macs(embed_dim, num_heads, src_len, tgt_len, chunk_size)
