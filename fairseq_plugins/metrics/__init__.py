"""The metrics of this package: exact match, CTER, BLEU and the fairseq-generate log reader.

They belong to the plugin because a training run needs them (the ``seq2seq_eval`` task's
validation metrics); the scorer scripts and the experiment library (``layerlab``) import them
from here. Pure Python (sacreBLEU for BLEU): no torch or fairseq in these modules.
"""
