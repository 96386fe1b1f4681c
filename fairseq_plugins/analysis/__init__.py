"""What every encoder and decoder layer holds, for any fairseq checkpoint of this package or of
fairseq itself: representational similarity (CKA), the logit lens, where each layer's update
comes from, and cross-attention entropies. Not imported by the plugin package: used by
``scripts/analyze_layers.py`` and importable on its own."""
