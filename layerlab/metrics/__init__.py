"""Scorers for fairseq-generate output (exact match; CTER and BLEU recipes to follow)."""
