"""The decoder cross-attention kinds (``--cross-attention``) and how to build each one."""
from .decoder_values_cross_attention import DecoderValuesCrossAttention
from .inverted_cross_attention import InvertedCrossAttention
from .swapped_cross_attention import DEFAULT_CHUNK_SIZE, SwappedCrossAttention

# "standard" is fairseq's own MultiheadAttention (built by fairseq's decoder layer)
STANDARD = "standard"
CROSS_ATTENTION_KINDS = (STANDARD, "swapped", "inverted", "decoder-values")
__all__ = ["CROSS_ATTENTION_KINDS", "DEFAULT_CHUNK_SIZE", "STANDARD", "build_cross_attention"]
_SLOT_KINDS = {"swapped": SwappedCrossAttention, "decoder-values": DecoderValuesCrossAttention}


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
