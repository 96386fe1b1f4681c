"""Corpus BLEU with sacreBLEU, in the two recipes the papers use.

- De-En (bridge paper): detokenised hypotheses and references, sacreBLEU's default 13a tokeniser.
- CoGnition Chinese (LRF paper, as the CoGnition authors compute it): subword-nmt markers and all
  spaces removed from the (jieba-segmented, BPE'd) hypotheses, raw unsegmented references,
  ``--tokenize zh``.
"""
from typing import Dict, Sequence

from sacrebleu.metrics import BLEU

from .cter import normalise_hypothesis


def corpus_bleu(hypotheses: Sequence[str], references: Sequence[str], cognition_zh: bool = False,
                tokenize: str = None) -> Dict:
    """{'bleu': score, 'signature': sacreBLEU signature, 'text': sacreBLEU's one-line result}."""
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} references")
    if not references:
        raise ValueError("no sentences to score (empty hypothesis and reference files?)")
    if cognition_zh:
        hypotheses = [normalise_hypothesis(h) for h in hypotheses]
        tokenize = tokenize or "zh"
    metric = BLEU(tokenize=tokenize) if tokenize else BLEU()
    score = metric.corpus_score(list(hypotheses), [list(references)])
    return {"bleu": score.score, "signature": str(metric.get_signature()), "text": str(score)}
