"""Registers ``layerwise_transformer`` and its named architectures (the code is in
:mod:`fairseq_plugins.models.layerwise`)."""
from .layerwise import presets  # noqa: F401  (registers the architectures)
from .layerwise.model import LayerwiseTransformerModel  # noqa: F401  (registers the model)
