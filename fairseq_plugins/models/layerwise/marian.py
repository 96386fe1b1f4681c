"""Marian (opus-mt) compatibility, so that converted Hugging Face checkpoints run unchanged:
the flags, their defaults, and what they change in a stack
(:mod:`fairseq_plugins.modules.marian_embeddings`); see docs/ideas/bridge.md (opus-mt).
"""
from dataclasses import dataclass
from typing import Optional

from fairseq.dataclass import FairseqDataclass

from ...config import option
from ...modules.marian_embeddings import MarianSinusoidalPositionalEmbedding


@dataclass
class MarianConfig(FairseqDataclass):
    """The Marian options (flags ``--marian-positions`` ...; hydra ``model.marian_positions``)."""
    marian_positions: Optional[bool] = option(
        False, "sinusoidal positions as Hugging Face's Marian: from 0, frequency "
               "10000^(-2i/d), sines then cosines (off: fairseq's)")
    final_logits_bias: Optional[bool] = option(
        False, "a fixed (not trained) bias added to the output logits, loaded from the "
               "checkpoint: Marian's final_logits_bias")
    decoder_start_zero_embedding: Optional[bool] = option(
        False, "the decoder's first input (fairseq's </s> start symbol) is the zero vector, as "
               "Marian's <pad> start")


CONFIG = MarianConfig  # what options.py composes into the model's dataclass


def new_attention(args) -> bool:
    return False


def active(args, side=None):
    """Always empty: Marian compatibility changes embeddings and logits, not the layers."""
    return []


def validate(args):
    """Nothing to check: each flag is independent of the others and of the other features."""


def positions(cfg, stack, max_positions: int, embed_dim: int):
    """``stack``'s positional embedding: Marian's sinusoids with ``--marian-positions``, else the
    one fairseq built."""
    if getattr(cfg, "marian_positions", False) and stack.embed_positions is not None:
        return MarianSinusoidalPositionalEmbedding(max_positions, embed_dim, stack.padding_idx)
    return stack.embed_positions
