"""What the ``lm_embedding_loss`` criterion and the ``ar_encdec_lm`` model agree on, defined once
and imported by both (no string shared by convention):

- when the model builds the embedding loss's two LayerNorms: :func:`requested` (the training
  criterion asks for an embedding loss);
- how the model hands their outputs to the criterion: :func:`attach` puts them into the decoder's
  extra output in training, :func:`read` takes them out (None when the model gave none).
"""
from typing import Dict, Optional, Tuple

from torch import Tensor

CRITERION = "lm_embedding_loss"
KINDS = ("none", "mse", "cosine")
_EXTRA_KEY = "embedding_loss"


def requested(args) -> Optional[str]:
    """The embedding loss the training criterion asks for ('mse', 'cosine'), or None (another
    criterion, ``--embedding-loss none``, or no training criterion at all)."""
    kind = getattr(args, "embedding_loss", None)
    return kind if getattr(args, "criterion", None) == CRITERION and kind not in (
        None, "none") else None


def attach(extra: Dict, embeddings: Tensor, encoder_out: Tensor) -> Dict:
    """``extra`` with the criterion's inputs, LN_a(token + position embedding) and
    LN_b(encoder output, detached), both B x T x C."""
    extra[_EXTRA_KEY] = {"embeddings": embeddings, "encoder_out": encoder_out}
    return extra


def read(extra: Dict) -> Optional[Tuple[Tensor, Tensor]]:
    """(embeddings, encoder_out) as :func:`attach` stored them, or None."""
    inputs = extra.get(_EXTRA_KEY)
    return None if inputs is None else (inputs["embeddings"], inputs["encoder_out"])
