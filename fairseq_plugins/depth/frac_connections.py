"""Frac-Connections (Zhu et al., 2025, arXiv 2503.14125): Hyper-Connections' learned mixing
without widening the residual stream: the hidden state is cut into m fractions instead of being
copied n times.

Per position the hidden state h (C) is read as m fractions F = [f_1; ...; f_m] (m x C/m: f_i is
h's i-th slice of C/m). Around sub-layer k (every attention and FFN sub-layer of the stack,
counted bottom up), with the connection matrix [[0, B], [A_m, A_r]] ((m+1) x 2m: A_m and A_r
m x m, B 1 x m):

    input = vec(A_m^T F)                       (C: what the sub-layer reads, before its norm)
    F'    = A_r^T F + diag(B) mat(f(input))    (m x C/m: f's output cut into the same m slices,
                                                fraction i scaled by B_i)

Static: A_m, A_r, B are parameters. Dynamic: Hyper-Connections' Eq. 10-13 per fraction, from the
normalised fractions F_bar = LN(F) (a LayerNorm over each fraction's C/m values):

    A_m(F) = A_m + s_a tanh(F_bar W_m),  A_r(F) = A_r + s_a tanh(F_bar W_r),
    B(F)   = B + s_b tanh(F_bar W_b)^T

with W_m, W_r (C/m x m), W_b (C/m x 1) initialised to zero and s_a, s_b to 0.01.

Initialisation: A_m = I, A_r = I, B = 1: input = h and F' = F + f(h), the plain pre-norm
residual stack exactly (identity weights reproduce it bit for bit, tested). The stack hands on
the concatenated fractions, h itself: the state is C per position, as the plain model's, so the
method keeps no memory beyond its (m x 2m per position) coefficients.

m = 1 is a learned scalar gate on the residual and on the output (static: ReZero-like weights
per sub-layer). ``--frac-rate`` must divide the embedding dimension.

The read/mix/write is :class:`~.multi_stream.MultiStream`'s with R = m read rows of width
C/m; the parameters and the dynamic maps are :class:`~.hyper_connections.HyperConnections`'
(with its LayerNorm folded into the maps, so no normalised copy of the fractions is kept).
"""
from dataclasses import dataclass
from typing import Dict, Optional

import torch
from torch import Tensor

from fairseq.dataclass import FairseqDataclass

from ..config import option
from .hyper_connections import HyperConnections
from .interface import Layout
from .registry import Method, Stack

KINDS = ("none", "static", "dynamic")


# the defaults the method fills in for the options left None (the one place of each)
DEFAULTS = {"frac_rate": 4}


@dataclass
class FracConnectionsConfig(FairseqDataclass):
    """Flags ``--frac-connections`` ...; hydra ``model.frac_connections`` ..."""
    frac_connections: Optional[str] = option(
        "none", "Frac-Connections (Zhu et al. 2025) around every sub-layer of every stack: the "
                "hidden state cut into m fractions mixed by static or dynamic weights",
        choices=KINDS)
    frac_rate: Optional[int] = option(
        None, "with --frac-connections: fractions per hidden state (m; must divide the "
              "embedding dimension)", minimum=1, metavar="M", default_text=str(DEFAULTS["frac_rate"]))


PRESETS = {"frac_connections": {"frac_connections": "dynamic"}}  # <family>_<name>_tiny
CONFIG = FracConnectionsConfig
FLAG = "--frac-connections"  # the option that turns the method on (its errors name it)
CHECKPOINT_NAMES = {"static_alpha": FLAG, "dynamic_alpha": FLAG}  # as Hyper-Connections'


def active(args) -> bool:
    return (getattr(args, "frac_connections", None) or "none") != "none"


def validate(args):
    if not active(args) and getattr(args, "frac_rate", None) is not None:
        raise ValueError("--frac-rate was given but --frac-connections is none; add "
                         "--frac-connections static or dynamic")


def build(args, stack: Stack) -> "FracConnections":
    rate = args.frac_rate or DEFAULTS["frac_rate"]
    return FracConnections(stack.layout, stack.embed_dim, rate,
                           dynamic=args.frac_connections == "dynamic")


METHOD = Method("frac_connections", FLAG, CONFIG, active, build, PRESETS, validate,
                recomputable=True, checkpoint_names=CHECKPOINT_NAMES)


class FracConnections(HyperConnections):
    """Static or dynamic Frac-Connections over the sub-layers of ``layout``: m fractions of
    width C/m (``reads`` = ``streams`` = m); the parameters as :class:`HyperConnections`'
    (``static_alpha`` K x m x 2m: row r is fraction r's [A_m[r, :], A_r[r, :]])."""

    name = "frac_connections"
    flag, rate_flag = FLAG, "--frac-rate"
    readouts = ("concat",)

    def __init__(self, layout: Layout, embed_dim: int, rate: int, dynamic: bool):
        if rate < 1:
            raise ValueError(f"--frac-rate must be >= 1, got {rate}")
        super().__init__(layout, embed_dim, rate, dynamic, readout="concat", reads=rate)

    def initial_reads(self, k: int) -> Tensor:
        """A_m = I: the sub-layer reads the hidden state as it is."""
        return torch.eye(self.streams)

    def logged_weights(self) -> Dict[str, Tensor]:
        """The static weights of every sub-layer k: how much each fraction reads itself (A_m's
        mean diagonal) and keeps itself (A_r's), and B per fraction."""
        out = {}
        m = self.streams
        for k in range(len(self.sites)):
            alpha = self.static_alpha[k].detach().float()
            beta = self.static_beta[k].detach().float()
            out[f"k{k}_read_self"] = torch.diagonal(alpha[:, :m]).mean()
            out[f"k{k}_keep"] = torch.diagonal(alpha[:, m:]).mean()
            for r in range(m):
                out[f"k{k}_write{r}"] = beta[r]
        return out
