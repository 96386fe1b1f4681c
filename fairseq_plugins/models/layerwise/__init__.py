"""``layerwise_transformer``: fairseq's Transformer with switchable layer-relationship features.

Each file answers one question:

- ``bridge.py``, ``cross_attention.py``, ``marian.py``: one feature each: its flags, their
  defaults, its validation and its resolved options (the computation itself lives in
  :mod:`fairseq_plugins.modules`); the depth connections (fusion and the rest) are
  :mod:`fairseq_plugins.depth`, shared with the language models;
- ``options.py``: the features put together; a stack's options resolved once into
  :class:`~.options.StackOptions` (every layer's index and settings);
- ``encoder.py``, ``decoder.py``: the stacks; ``model.py``: the registered model;
- ``presets.py``: the named architectures (``--arch``).

docs/adding-an-idea.md walks through adding a feature.
"""
