"""Reusable layers (one idea per file); models compose them."""
