"""Exact-match accuracy (SCAN, COGS, CFQ): whole-line string equality after detokenisation."""
from collections import OrderedDict
from typing import Dict, List, Optional, Sequence


def normalise(line: str) -> str:
    # collapse runs of whitespace only; any other difference counts as a mismatch
    return " ".join(line.split())


def exact_match(hypotheses: Sequence[str], references: Sequence[str],
                categories: Optional[Sequence[str]] = None) -> Dict:
    """Return {'exact_match': %, 'correct': n, 'total': n, 'per_category': {...}}."""
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} references")
    if not references:
        raise ValueError("no sentences to score (empty hypothesis and reference files?)")
    if categories is not None and len(categories) != len(references):
        raise ValueError(f"{len(categories)} categories but {len(references)} references")
    hits: List[bool] = [normalise(h) == normalise(r) for h, r in zip(hypotheses, references)]
    result = {"exact_match": _pct(sum(hits), len(hits)), "correct": sum(hits), "total": len(hits)}
    if categories is not None:
        per = OrderedDict()
        for cat, hit in zip(categories, hits):
            c = per.setdefault(cat, [0, 0])
            c[0] += hit
            c[1] += 1
        result["per_category"] = {k: {"exact_match": _pct(c, t), "correct": c, "total": t}
                                  for k, (c, t) in sorted(per.items())}
    return result


def _pct(correct: int, total: int) -> float:
    return 100.0 * correct / total if total else 0.0
