"""Linear centred kernel alignment (CKA; Kornblith et al., ICML 2019, arXiv 1905.00414), streamed.

For representations X (n x p) and Y (n x q) of the same n items, column-centred,

    CKA(X, Y) = ||Y^T X||_F^2 / (||X^T X||_F ||Y^T Y||_F)

which is 1 for X = Y, invariant to orthogonal transforms and isotropic scaling of either side, and
near 0 for independent features when n is large. Everything it needs is sums over the items:
n, the column sums and the cross-products A^T B of every pair; :class:`CKAAccumulator` adds them up
batch by batch (float64), so memory is bounded by the pairs' d x d matrices, not by n.
"""
from typing import Dict, List, Sequence, Tuple

import torch
from torch import Tensor


class CKAAccumulator:
    """Sums for the CKA of every pair in ``pairs`` of named representations.

    :meth:`add` takes {name: n_batch x d} (the same n_batch items for every name) and may be
    called any number of times; :meth:`cka` returns {(a, b): value}.
    """

    def __init__(self, pairs: Sequence[Tuple[str, str]]):
        self.pairs = [tuple(p) for p in pairs]
        self.names = sorted({n for p in self.pairs for n in p})
        self.count = 0
        self.sums: Dict[str, Tensor] = {}
        self.cross: Dict[Tuple[str, str], Tensor] = {}
        # the self-products are needed for the normalisation of every pair
        self._products = sorted(set(self.pairs) | {(n, n) for n in self.names})

    def add(self, representations: Dict[str, Tensor]):
        rows = {representations[n].shape[0] for n in self.names}
        if len(rows) != 1:
            raise ValueError(f"every representation must hold the same items, got {rows} rows")
        x = {n: representations[n].detach().to(torch.float64) for n in self.names}
        self.count += rows.pop()
        for n in self.names:
            s = x[n].sum(0)
            self.sums[n] = s if n not in self.sums else self.sums[n] + s
        for a, b in self._products:
            c = x[a].t() @ x[b]
            self.cross[(a, b)] = c if (a, b) not in self.cross else self.cross[(a, b)] + c

    def _centred(self, a: str, b: str) -> Tensor:
        return self.cross[(a, b)] - torch.outer(self.sums[a], self.sums[b]) / self.count

    def cka(self) -> Dict[Tuple[str, str], float]:
        if self.count < 2:
            raise ValueError("CKA needs at least 2 items")
        norms = {n: torch.linalg.matrix_norm(self._centred(n, n)) for n in self.names}
        out = {}
        for a, b in self.pairs:
            denominator = norms[a] * norms[b]
            value = self._centred(a, b).pow(2).sum() / denominator if denominator > 0 else 0.0
            out[(a, b)] = float(value)
        return out


def linear_cka(x: Tensor, y: Tensor) -> float:
    """CKA of two n x p / n x q matrices in one go (the definition, for tests and small data)."""
    acc = CKAAccumulator([("x", "y")])
    acc.add({"x": x, "y": y})
    return acc.cka()[("x", "y")]


def all_pairs(names: List[str], others: List[str] = None) -> List[Tuple[str, str]]:
    """Every pair within ``names`` (a <= b), or every (name, other) pair across two lists."""
    if others is None:
        return [(a, b) for i, a in enumerate(names) for b in names[i:]]
    return [(a, b) for a in names for b in others]
