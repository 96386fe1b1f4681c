"""Attention Residuals (AttnRes; Kimi Team, Moonshot AI, 2026, arXiv 2603.15031): the residual
sum replaced by softmax attention over depth.

Full AttnRes. The sources of the stack are v_0 = x_0 (the embedding output) and v_i = f_i(.) the
output of sub-layer i (every attention and FFN sub-layer, counted bottom up, 1-based). Sub-layer
l reads, instead of the residual sum x_0 + sum_(i<l) v_i,

    h_l = sum_(i=0)^(l-1) alpha_(i->l) v_i,   alpha_(i->l) = softmax_i(w_l . RMSNorm_l(v_i))

with w_l (C) a learned pseudo-query per sub-layer (the keys are the values, RMS-normalised; the
RMSNorm has a gain per sub-layer, eps 1e-6), and then computes f_l(LN(h_l)) as usual. The stack
hands on h_(K+1), the same attention with its own pseudo-query over all K+1 sources.

Block AttnRes (``--attn-res block``, ``--attn-res-blocks N``). The stack's blocks (layers) are
cut into N groups of L/N consecutive layers. Group g's representation b_g is the plain sum of its
sub-layers' outputs (b_0 = x_0); inside a group the sources are the completed groups and the
group's partial sum so far:

    h_l = attention over [b_0, ..., b_(g-1), p_l],   p_l = sum of the outputs of group g's
                                                      sub-layers before l (absent for its first)

Full AttnRes is the limit in which every sub-layer is its own group.

Initialisation: the pseudo-queries are zero (the paper), so every alpha is uniform: h_l is the
mean of its sources, i.e. the plain pre-norm residual stream divided by the number of sources s.
A pre-norm sub-layer reads LN(h / s) = LN(h) up to the LayerNorm's eps (LN(h / s) with eps is
LN(h) with s^2 eps), and so does a final LayerNorm: with every eps set to 0 the model at
initialisation *is* the plain pre-norm model (tested in float64); with fairseq's eps 1e-5 it
differs by ~s^2 eps / (2 var) relative. A stack read without a norm (``ar_encdec_lm``'s encoder,
a Linear to the decoder input) hands on the plain output divided by s.

Every source is kept for the whole pass (Full: K + 1 states of C per position, the memory the
paper's O(Ld) refers to; Block: N + 1). The attention works per position, so incremental
decoding needs no cache. The logits and the softmax run in float32 (float64 in a float64 model).
"""
import functools
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fairseq.dataclass import FairseqDataclass

from ..config import option
from ..weight_logging import Record, WeightSource
from . import fused
from .multi_stream import mean_square, statistics_dtype
from .interface import Connection, Inputs, Layout, StackState
from .registry import Method, Stack

KINDS = ("none", "full", "block")
RMS_EPS = 1e-6


# the defaults the method fills in for the options left None (the one place of each)
DEFAULTS = {"attn_res_blocks": 4}


@dataclass
class AttnResConfig(FairseqDataclass):
    """Flags ``--attn-res`` ...; hydra ``model.attn_res`` ..."""
    attn_res: Optional[str] = option(
        "none", "Attention Residuals (Kimi Team 2026) in every stack: every sub-layer reads a "
                "softmax attention over the outputs below it (full) or over block summaries "
                "(block) instead of the residual sum", choices=KINDS)
    attn_res_blocks: Optional[int] = option(
        None, "with --attn-res block: groups of consecutive layers per stack (N; must divide "
              "every stack's layer count)", minimum=1, metavar="N", default_text=str(DEFAULTS["attn_res_blocks"]))


PRESETS = {"attn_res": {"attn_res": "full"},  # <family>_<name>_tiny
           "attn_res_block": {"attn_res": "block", "attn_res_blocks": 2}}
CONFIG = AttnResConfig
FLAG = "--attn-res"  # the option that turns the method on (its errors name it)
CHECKPOINT_NAMES = {"queries": FLAG, "key_gains": FLAG}  # what a mismatched checkpoint is named by


def active(args) -> bool:
    return (getattr(args, "attn_res", None) or "none") != "none"


def validate(args):
    if getattr(args, "attn_res_blocks", None) is not None and (
            getattr(args, "attn_res", None) or "none") != "block":
        raise ValueError("--attn-res-blocks was given but --attn-res is not block; add "
                         "--attn-res block")


def build(args, stack: Stack) -> "AttentionResiduals":
    groups = None
    if args.attn_res == "block":
        groups = args.attn_res_blocks or DEFAULTS["attn_res_blocks"]
        layers = len(stack.layout)
        if layers % groups:
            divisors = [n for n in range(1, layers + 1) if layers % n == 0]
            raise ValueError(f"--attn-res-blocks {groups} does not divide the stack's {layers} "
                             f"layers: use one of {divisors}")
    return AttentionResiduals(stack.layout, stack.embed_dim, groups)


METHOD = Method("attn_res", FLAG, CONFIG, active, build, PRESETS, validate,
                checkpoint_names=CHECKPOINT_NAMES)


class _WeightedSum(torch.autograd.Function):
    """(alpha T x B x s, v_1 .. v_s T x B x C each) -> sum_i alpha_i v_i, T x B x C.

    Autograd through a chain of s multiply-adds would run per source a product and a reduction
    for alpha's gradient and a product for v_i's, through s intermediate sums; here the backward
    is per source one dot product over C (alpha_i's gradient) and one scaled copy (v_i's): fewer
    passes over the sources, which is what Full AttnRes's O(K^2) source visits cost. Tested
    against autograd (gradcheck, float64)."""

    @staticmethod
    def forward(ctx, alpha: Tensor, *sources: Tensor) -> Tensor:
        # under autocast the sources' dtypes differ (the embedding output float32, a
        # sub-layer's output bfloat16): the sum in the widest, as the plain residual's
        dtype = functools.reduce(torch.promote_types, (v.dtype for v in sources))
        weights = alpha.to(dtype).unsqueeze(-1).unbind(-2)
        out = weights[0] * sources[0].to(dtype)
        for weight, source in zip(weights[1:], sources[1:]):
            out.addcmul_(weight, source.to(dtype))
        ctx.save_for_backward(alpha, *sources)
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: Tensor):
        alpha, *sources = ctx.saved_tensors
        grad_alpha = torch.stack([torch.linalg.vecdot(grad, v.to(grad.dtype))
                                  for v in sources], dim=-1).to(alpha.dtype)
        weights = alpha.to(grad.dtype).unsqueeze(-1).unbind(-2)
        return (grad_alpha, *((weight * grad).to(v.dtype)
                              for weight, v in zip(weights, sources)))


class AttentionResiduals(WeightSource, Connection):
    """Full (``groups`` None) or Block AttnRes over the sub-layers of ``layout``.

    Parameters, over the K sub-layers and the readout (row K): ``queries`` (K+1) x C (the
    pseudo-queries w), ``key_gains`` (K+1) x C (the keys' RMSNorm gains).

    State: ``history`` the completed sources [v_0 or b_0, ...] (T x B x C each), ``scratch``
    their logits for every query (K+1 tensors T x B per source, computed once per source),
    ``stream`` the current group's partial sum (Block) or the last output (Full)."""

    name, flag = "attn_res", FLAG
    needs_pre_norm = True
    additive = False

    def __init__(self, layout: Layout, embed_dim: int, groups: Optional[int] = None):
        super().__init__(layout)
        self.groups = groups
        sites = len(self.sites)
        # per site: (first of its group, last of its group)
        self.bounds: Dict[Tuple[int, str], Tuple[bool, bool]] = {}
        per_group = len(self.layout) // groups if groups else None
        order = list(self.sites)
        for index, site in enumerate(order):
            if groups is None:
                self.bounds[site] = (True, True)
            else:
                group = site[0] // per_group
                first = index == 0 or order[index - 1][0] // per_group != group
                last = index == len(order) - 1 or order[index + 1][0] // per_group != group
                self.bounds[site] = (first, last)
        self.queries = nn.Parameter(torch.zeros(sites + 1, embed_dim))
        self.key_gains = nn.Parameter(torch.ones(sites + 1, embed_dim))
        # the variant, stored with the checkpoint: Full and Block have the same parameters
        # but compute different functions (0: Full, else N)
        self.register_buffer("grouping", torch.tensor(groups or 0))
        self.record: Optional[Record] = None  # where a pass's mean depth weights go

    @torch.no_grad()
    def reset_parameters(self):
        """The paper's zero pseudo-queries (uniform weights), the gains 1."""
        self.queries.zero_()
        self.key_gains.fill_(1.0)

    def upgrade_state_dict_named(self, state_dict, name):
        """A plain model's checkpoint (no connection weights): the pseudo-queries start at
        their initialisation (:meth:`~.interface.Connection.start_from_plain`; zero: each
        sub-layer reads the mean of its sources, the plain stream up to the LayerNorms' eps).
        Another method's connection weights, or the other variant or block count, cannot be
        continued: errors naming the flags."""
        if self.start_from_plain(state_dict, name):
            return
        prefix = f"{name}." if name else ""
        if f"{prefix}queries" not in state_dict:
            raise ValueError(f"the checkpoint has no Attention Residuals weights at {prefix}"
                             "queries: it was not trained with --attn-res; train without the "
                             "flag, or start the connections from scratch")
        stored = int(state_dict.get(f"{prefix}grouping", torch.tensor(-1)))
        if stored != int(self.grouping):
            def flags(groups):
                return ("--attn-res full" if groups == 0 else
                        f"--attn-res block --attn-res-blocks {groups}")
            raise ValueError(f"the checkpoint's Attention Residuals were trained with "
                             f"{flags(stored)}, this model has {flags(int(self.grouping))}: "
                             "use the checkpoint's")

    def start_logging(self, record: Record):
        """Every pass (training or evaluation: the layer analysis starts it too) hands
        ``record`` the mean weight alpha on every source (s<i>) of every sub-layer (k<k>; the
        readout k<K>) over its positions."""
        self.record = record

    def accepts_fused(self, where: str) -> bool:
        """A read runs as one kernel (:func:`fused.depth_attention`: norms, logits, softmax and
        sum) up to the kernel's width; wider, the logits and the softmax run eagerly and the
        weighted sum as a kernel (any number of sources either way)."""
        if not fused.depth_attention_supported(self.queries.size(1), where):
            self.whole_read_fused = False
        return True

    # whether a read may run as one kernel (set False at build where the width is too large)
    whole_read_fused = True

    def start(self, x: Tensor) -> StackState:
        x = x.contiguous()  # a source of every read: see Connection.start
        return StackState(x, [x])

    def new_slot(self, x: Tensor) -> "_Pass":
        weights = {} if self.record is not None else None
        # one kernel per read: not while the weights are logged (they need the softmax's
        # weights, which the kernel does not keep), else on a device the kernels run on
        if (self.fused and self.whole_read_fused and weights is None
                and fused.runs_on(x)):
            with torch.autocast(device_type=x.device.type, enabled=False):
                queries = (self.queries * self.key_gains).to(statistics_dtype(x))
            return _Pass(None, None, queries)
        return _Pass([self._logits(x)], weights)

    def _logits(self, v: Tensor, k: Optional[int] = None):
        """w_k . RMSNorm_k(v) for every query k (a tuple of K+1 tensors T x B, one per query:
        unbound once, so that reading one costs no zero-filled gradient per read), or for query
        ``k`` only (T x B); in float32 (float64 in a float64 model).

        w . (g * v / rms(v)) = ((w * g) . v) / rms(v): no normalised copy of v. The queries do
        not depend on the input (the paper's pseudo-queries), so a completed source's logits
        for all later sub-layers are one product, computed when the source is complete: each
        source is read once for its logits instead of once per sub-layer above it."""
        dtype = statistics_dtype(v)
        with torch.autocast(device_type=v.device.type, enabled=False):
            queries = self.queries * self.key_gains if k is None else \
                (self.queries[k] * self.key_gains[k]).unsqueeze(0)
            stats = v.to(dtype)
            logits = F.linear(stats, queries.to(dtype)) * torch.rsqrt(mean_square(stats)
                                                                      + RMS_EPS)
        return logits.unbind(-1) if k is None else logits.squeeze(-1)

    def _attend(self, state: StackState, sources: List[Tensor],
                logits: Optional[List[Tensor]], k: int) -> Tensor:
        """sum_i alpha_i v_i with alpha = softmax_i(w_k . RMSNorm_k(v_i)): T x B x C, from the
        sources' logits for query k (T x B each; None: the pass reads with the one-kernel
        path, which computes them). The sources are combined one by one (no stacked copy,
        which autograd would keep per sub-layer: O(K^2 C))."""
        if logits is None:
            return fused.depth_attention(state.slot(self).queries[k], *sources)
        with torch.autocast(device_type=sources[0].device.type, enabled=False):
            alpha = torch.softmax(torch.stack(logits, dim=-1), dim=-1)
        weights = state.slot(self).weights
        if weights is not None:
            weights[k] = alpha.detach().flatten(0, -2).mean(0).float()
        if self.fused and fused.runs_on(sources[0]):  # the same sum, one kernel each way
            return fused.weighted_sum(alpha, *sources)
        return _WeightedSum.apply(alpha, *sources)

    def _sources(self, state: StackState, include_partial: bool, k: int):
        """(sources, their logits for query k) that query k attends: the completed sources
        (their logits computed when they completed), and the open group's partial sum (its
        logit computed now: it changes with every sub-layer)."""
        slot = state.slot(self)
        if slot.logits is None:  # the one-kernel read computes the logits
            return state.history + ([state.stream] if include_partial else []), None
        logits = [per_query[k] for per_query in slot.logits]
        if not include_partial:
            return state.history, logits
        partial = state.stream
        return state.history + [partial], logits + [self._logits(partial, k)]

    def read(self, state: StackState, block: int, sublayer: str) -> Tuple[Inputs, None]:
        first, _ = self.bounds[(block, sublayer)]
        k = self.sites[(block, sublayer)]
        sources, logits = self._sources(state, not first, k)
        return Inputs(self._attend(state, sources, logits, k)), None

    def write(self, state: StackState, block: int, sublayer: str, out: Tensor, token: None,
              post_norm=None):
        first, last = self.bounds[(block, sublayer)]
        state.stream = out if first else state.stream + out
        if last:  # the group is complete: its sum becomes a source
            state.history.append(state.stream)
            slot = state.slot(self)
            if slot.logits is not None:
                slot.logits.append(self._logits(state.stream))

    def end_block(self, state: StackState, block: int):
        pass  # the sources are kept by write

    def finish(self, state: StackState) -> Tensor:
        k = len(self.sites)
        out = self._attend(state, *self._sources(state, False, k), k)
        weights = state.slot(self).weights
        if weights is not None:
            self.record({f"k{k}_s{i}": weight for k, per_source in sorted(weights.items())
                         for i, weight in enumerate(per_source)})
        return out

    def view(self, state: StackState) -> Tensor:
        """The readout's attention over the sources so far (the group's partial sum included
        where a group is open)."""
        k = len(self.sites)
        sources, logits = self._sources(state, state.stream is not state.history[-1], k)
        return self._attend(state, sources, logits, k)

    def sources_at(self) -> List[int]:
        """The number of sources every sub-layer attends (in stack order), then the readout's."""
        counts, completed = [], 1
        for site in self.sites:
            first, last = self.bounds[site]
            counts.append(completed + (0 if first else 1))
            completed += int(last)
        return counts + [completed]

    def macs(self, embed_dim: int) -> int:
        """Per token: the weighted sum (C per source) at every sub-layer and the readout; per
        completed source its logits for all K+1 queries and its RMS ((K+2) C); per open group's
        partial sum at a read its logit and RMS (2 C)."""
        counts = self.sources_at()
        partials = sum(not first for first, _ in self.bounds.values())
        queries = len(self.sites) + 1
        return embed_dim * (sum(counts) + counts[-1] * (queries + 1) + 2 * partials)

    def extra_repr(self) -> str:
        kind = "full" if self.groups is None else f"block, groups={self.groups}"
        return f"{kind}, sub-layers={len(self.sites)}"


class _Pass:
    """What Attention Residuals keep during one forward pass: ``logits``, every completed
    source's logits for every query (computed once, when the source completes:
    :meth:`AttentionResiduals._logits`; x_0's first), or None where every read runs as one
    kernel; ``weights``, the mean weight on every source per query {k: per source}, while it
    logs (None otherwise); ``queries``, with the one-kernel reads, the pseudo-queries times the
    keys' gains, (K+1) x C in the statistics dtype (computed once per pass)."""
    __slots__ = ("logits", "weights", "queries")

    def __init__(self, logits: Optional[List[Tuple[Tensor, ...]]],
                 weights: Optional[Dict[int, Tensor]], queries: Optional[Tensor] = None):
        self.logits, self.weights, self.queries = logits, weights, queries
