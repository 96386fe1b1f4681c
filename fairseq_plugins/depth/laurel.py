"""LAuReL, learned augmented residual layers (Menghani, Kumar and Kumar, ICML 2025, arXiv
2411.07501v4): the residual connection ``x_{i+1} = f(x_i) + x_i`` generalised to
``x_{i+1} = alpha f(x_i) + g(x_i, x_{i-1}, ..., x_0)`` with g linear and learned (Eq. 2).

Here x_i is the input of the i-th sub-layer of the stack (every self-attention, cross-attention
and FFN, counted bottom up from 0; x_0 the embedding output) and f its pre-norm sub-layer
f(LN(x_i)) with its dropout. The variants (``--laurel``):

- ``rw`` (Sec. 2.1): ``x_{i+1} = alpha_i f(x_i) + beta_i x_i``, two learned scalars per
  sub-layer;
- ``lr`` (Sec. 2.2, Eq. 3): ``x_{i+1} = f(x_i) + x_i + x_i A_i B_i`` with A_i C x r, B_i r x C
  (row vectors; the paper's B A x), r = ``--laurel-rank``;
- ``rw_lr`` (Eq. 5): ``x_{i+1} = alpha_i f(x_i) + beta_i (x_i + x_i A_i B_i)``;
- ``pa`` (Sec. 2.3, Eq. 4): ``x_{i+1} = f(x_i) + x_i + sum_{j<k} gamma_{i,j} x_{i-j} A_{i,j}
  B_{i,j}``, k = ``--laurel-lags`` previous inputs (j = 0 is x_i itself);
- ``rw_lr_pa`` (Eq. 6): ``x_{i+1} = alpha_i f(x_i) + beta_i (x_i + sum_{j<k} gamma_{i,j}
  x_{i-j} A_{i,j} B_{i,j})``.

Where the paper is silent, the choices (docs/ideas/laurel.md says each):

- placement: per sub-layer, in pre-norm stacks only (the paper folds any pre-norm into f and
  names no placement; refused in a post-norm stack at build time);
- RW's normalisation: ``(alpha_i, beta_i) = 2 softmax(w_i)``, w_i = 0 at initialisation (the
  paper says only that a bounding normalisation such as softmax or sigmoid helps); scalars, not
  the vector form the paper mentions;
- PA: one low-rank pair per lag (Eq. 6, Table 4's 2rkC + k parameters; the text's single h_i
  would be 2rC + k), gammas initialised to 1 without normalisation, the window truncated at the
  bottom of the stack: a lag j with i - j < 0 is absent (no zero-padded x_{-1});
- the initialisation the paper gives for its language models: B = 0 and A "column orthogonal",
  ``A[c, j] = 1 / sqrt(r C)`` where ``c mod r == j``, else 0 (Sec. 3.3).

At initialisation every variant is the plain pre-norm stack exactly: alpha = beta = 1 and
B = 0 make ``x_{i+1} = f(x_i) + x_i`` (tested bit for bit in float64). Everything is per
position, so incremental decoding needs no cache; the previous inputs PA reads are kept in the
pass's slot.
"""
from dataclasses import dataclass
from typing import Dict, List, Optional

import math

import torch
from torch import Tensor, nn

from fairseq.dataclass import FairseqDataclass

from ..config import option
from ..weight_logging import WeightSource
from .interface import Connection, Layout, StackState
from .registry import Method, Stack

RW, LR, RW_LR, PA, RW_LR_PA = "rw", "lr", "rw_lr", "pa", "rw_lr_pa"
VARIANTS = (RW, LR, RW_LR, PA, RW_LR_PA)
KINDS = ("none",) + VARIANTS
SCALED = (RW, RW_LR, RW_LR_PA)  # the variants with RW's alpha and beta
LOW_RANK = (LR, RW_LR, PA, RW_LR_PA)  # ... with low-rank maps (--laurel-rank)
PREVIOUS = (PA, RW_LR_PA)  # ... reading previous inputs (--laurel-lags)

# the defaults the method fills in for the options left None (the one place of each): r = 16 as
# the peer code's default (the paper used 4 and 64 for its LLMs, 32 in its C4 ablation); k = 3,
# which the paper says "seems sufficient"
DEFAULTS = {"laurel_rank": 16, "laurel_lags": 3}


@dataclass
class LaurelConfig(FairseqDataclass):
    """Flags ``--laurel`` ...; hydra ``model.laurel`` ..."""
    laurel: Optional[str] = option(
        "none", "LAuReL (Menghani et al. 2025) at every sub-layer of every stack: learned "
                "residual weights (rw), a low-rank term (lr), both (rw_lr), low-rank terms of "
                "the previous sub-layers' inputs (pa), or all (rw_lr_pa)", choices=KINDS)
    laurel_rank: Optional[int] = option(
        None, "with --laurel lr, rw_lr, pa or rw_lr_pa: the rank r of the low-rank maps (less "
              "than the model's width)", minimum=1, metavar="R",
        default_text=str(DEFAULTS["laurel_rank"]))
    laurel_lags: Optional[int] = option(
        None, "with --laurel pa or rw_lr_pa: how many inputs a sub-layer's residual reads (k: "
              "its own and the k-1 before it)", minimum=1, metavar="K",
        default_text=str(DEFAULTS["laurel_lags"]))


# <family>_<name>_tiny: the paper's LLM setting (RW+LR) and the previous activations
PRESETS = {"laurel": {"laurel": RW_LR}, "laurel_pa": {"laurel": PA}}
CONFIG = LaurelConfig
FLAG = "--laurel"  # the option that turns the method on (its errors name it)
CHECKPOINT_NAMES = {"residual_logits": FLAG, "down": FLAG, "up": FLAG, "gammas": FLAG}


def kind(args) -> str:
    return getattr(args, "laurel", None) or "none"


def active(args) -> bool:
    return kind(args) != "none"


def validate(args):
    variant = kind(args)
    if getattr(args, "laurel_rank", None) is not None and variant not in LOW_RANK:
        raise ValueError(f"--laurel-rank was given but --laurel is {variant}, which has no "
                         f"low-rank maps: add --laurel {', '.join(LOW_RANK[:-1])} or "
                         f"{LOW_RANK[-1]}")
    if getattr(args, "laurel_lags", None) is not None and variant not in PREVIOUS:
        raise ValueError(f"--laurel-lags was given but --laurel is {variant}, which reads no "
                         f"previous inputs: add --laurel {' or '.join(PREVIOUS)}")


def build(args, stack: Stack) -> "Laurel":
    variant = kind(args)
    rank = (args.laurel_rank or DEFAULTS["laurel_rank"]) if variant in LOW_RANK else 0
    if rank >= stack.embed_dim:
        raise ValueError(f"--laurel-rank {rank} must be less than the {stack.side}'s width "
                         f"{stack.embed_dim} (a low-rank map)")
    lags = (args.laurel_lags or DEFAULTS["laurel_lags"]) if variant in PREVIOUS else 1
    return Laurel(stack.layout, stack.embed_dim, variant, rank, lags)


METHOD = Method("laurel", FLAG, CONFIG, active, build, PRESETS, validate,
                checkpoint_names=CHECKPOINT_NAMES)


class Laurel(WeightSource, Connection):
    """LAuReL at every sub-layer of ``layout`` (K sub-layers), ``variant`` one of
    :data:`VARIANTS`, low-rank maps of rank ``rank`` (0: none), ``lags`` inputs per residual
    (k; 1 unless PA).

    Parameters: ``residual_logits`` K x 2 (RW: w_i, (alpha_i, beta_i) = 2 softmax(w_i));
    ``down`` K x k x C x r and ``up`` K x k x r x C (A_{i,j}, B_{i,j}: the lag-j map of
    sub-layer i, read as x_{i-j} A B); ``gammas`` K x k (PA). ``variant`` (a buffer: rank,
    lags and the kind's index) goes into the checkpoint, so a checkpoint of another variant is
    refused by name."""

    name, flag = "laurel", FLAG
    needs_pre_norm = True
    additive = False

    def __init__(self, layout: Layout, embed_dim: int, variant: str, rank: int = 0,
                 lags: int = 1):
        super().__init__(layout)
        if variant not in VARIANTS:
            raise ValueError(f"unknown LAuReL variant {variant!r}; known: {VARIANTS}")
        self.variant, self.rank, self.lags = variant, rank, lags
        sites = len(self.sites)
        self.residual_logits = (nn.Parameter(torch.zeros(sites, 2)) if variant in SCALED
                                else None)
        if variant in LOW_RANK:
            self.down = nn.Parameter(torch.empty(sites, lags, embed_dim, rank))
            self.up = nn.Parameter(torch.empty(sites, lags, rank, embed_dim))
        else:
            self.down = self.up = None
        self.gammas = nn.Parameter(torch.empty(sites, lags)) if variant in PREVIOUS else None
        self.register_buffer("variant_code", torch.tensor(
            [VARIANTS.index(variant), rank, lags]))
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self):
        """The paper's initialisation (Sec. 3.3; RW and the gammas ours): w = 0 (alpha = beta
        = 1), B = 0, A column orthogonal with entries 1 / sqrt(r C), gammas 1."""
        if self.residual_logits is not None:
            self.residual_logits.zero_()
        if self.down is not None:
            channels, rank = self.down.shape[-2:]
            self.down.zero_()
            columns = torch.arange(channels)
            self.down[..., columns, columns % rank] = 1.0 / math.sqrt(rank * channels)
            self.up.zero_()
        if self.gammas is not None:
            self.gammas.fill_(1.0)

    def new_slot(self, x: Tensor) -> Optional[List[Tensor]]:
        """PA: the inputs of the sub-layers so far (their last k - 1 are read), T x B x C
        each; None for the other variants."""
        return [] if self.lags > 1 else None

    def scales(self, site: int) -> Optional[Tensor]:
        """(alpha_i, beta_i) of sub-layer ``site`` (2 softmax(w_i)); None without RW."""
        if self.residual_logits is None:
            return None
        return 2 * torch.softmax(self.residual_logits[site], dim=-1)

    def write(self, state: StackState, block: int, sublayer: str, out: Tensor, token: None,
              post_norm=None):
        """x_{i+1} = alpha f(x_i) + beta (x_i + sum_j gamma_{i,j} x_{i-j} A_{i,j} B_{i,j})
        with the terms the variant has (``out``: f(x_i), T x B x C)."""
        site = self.sites[(block, sublayer)]
        x = state.stream
        residual = x
        if self.down is not None:
            previous = state.slot(self)
            inputs = [x] + ([] if previous is None else previous[::-1][:self.lags - 1])
            for lag, source in enumerate(inputs):
                term = (source @ self.down[site, lag].to(source.dtype)) @ \
                    self.up[site, lag].to(source.dtype)
                if self.gammas is not None:
                    term = self.gammas[site, lag].to(term.dtype) * term
                residual = residual + term
            if previous is not None:
                previous.append(x)
                del previous[:-(self.lags - 1)]  # the oldest input no lag reads any more
        scales = self.scales(site)
        if scales is None:
            state.stream = out + residual
        else:
            state.stream = scales[0] * out + scales[1] * residual

    def connection_parameters(self) -> List[nn.Parameter]:
        """The scalars (RW's logits, PA's gammas) get no weight decay; the low-rank maps are
        weight matrices like the sub-layers' and get the model's."""
        return [p for p in (self.residual_logits, self.gammas) if p is not None]

    @torch.no_grad()
    def logged_weights(self) -> Dict[str, Tensor]:
        """{'k<i>_alpha', 'k<i>_beta': RW's scales of sub-layer i; 'k<i>_gamma<j>': PA's
        weight of lag j; 'k<i>_lr<j>': the Frobenius norm of the low-rank map A_{i,j} B_{i,j}
        (0 at initialisation: how far the term has grown)} (sub-layers in stack order, only
        the lags a sub-layer has)."""
        out = {}
        if self.down is not None:
            # ||A B||_F^2 = tr((A^T A)(B B^T)): r x r products, never the C x C map
            grams = (self.down.transpose(-1, -2) @ self.down) \
                * (self.up @ self.up.transpose(-1, -2))
            norms = grams.sum((-1, -2)).clamp_min(0).sqrt().float()
        for site in range(len(self.sites)):
            scales = self.scales(site)
            if scales is not None:
                scales = scales.float()
                out[f"k{site}_alpha"], out[f"k{site}_beta"] = scales[0], scales[1]
            for lag in range(min(self.lags, site + 1) if self.down is not None else 0):
                if self.gammas is not None:
                    out[f"k{site}_gamma{lag}"] = self.gammas[site, lag].float()
                out[f"k{site}_lr{lag}"] = norms[site, lag]
        return out

    def upgrade_state_dict_named(self, state_dict, name):
        """A plain model's checkpoint: the connection starts at its initialisation
        (:meth:`~.interface.Connection.start_from_plain`; the plain model's function). A
        checkpoint of another variant, rank or number of lags: an error naming its flags."""
        if self.start_from_plain(state_dict, name):
            return
        prefix = f"{name}." if name else ""
        stored = state_dict.get(f"{prefix}variant_code")
        if stored is None:
            raise ValueError(f"the checkpoint has no LAuReL weights at {prefix}variant_code: "
                             "it was not trained with --laurel; train without the flag, or "
                             "start the connections from scratch")
        stored = tuple(int(v) for v in stored)
        ours = tuple(int(v) for v in self.variant_code)
        if stored != ours:
            raise ValueError(f"the checkpoint's LAuReL was trained with {_flags(*stored)}, "
                             f"this model has {_flags(*ours)}: use the checkpoint's")

    def macs(self, embed_dim: int) -> int:
        """Per token and sub-layer: RW's two scalings (2 C); each low-rank term present (2 r C,
        its lags truncated at the bottom) with PA's gamma (C)."""
        total = 0
        for site in range(len(self.sites)):
            terms = min(self.lags, site + 1) if self.down is not None else 0
            total += (2 * embed_dim if self.residual_logits is not None else 0) \
                + terms * (2 * self.rank * embed_dim
                           + (embed_dim if self.gammas is not None else 0))
        return total

    def extra_repr(self) -> str:
        return (f"{self.variant}, rank={self.rank}, lags={self.lags}, "
                f"sub-layers={len(self.sites)}")


def _flags(index: int, rank: int, lags: int) -> str:
    variant = VARIANTS[index]
    out = f"--laurel {variant}"
    if variant in LOW_RANK:
        out += f" --laurel-rank {rank}"
    if variant in PREVIOUS:
        out += f" --laurel-lags {lags}"
    return out
