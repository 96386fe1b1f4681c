"""MUDD connections (MUDDFormer; Xiao et al., ICML 2025, arXiv 2502.12170): multiway dynamic dense
connections over depth.

After block i (0-based) of a stack of L, with X_0 the embedding output and X_j block j-1's
output, a depth-aggregate module DA_i produces the next block's inputs, one per way
c in {Q, K, V, R} (the query, key and value inputs of its self-attention and its residual):

    X^c_{i+1} = sum_{j=0}^{i+1} A^c_{i,j} X_j,
    A_i = GELU(RMSNorm(X_{i+1}) W1_i) W2_i + S_i         (per token; 4 x (i+2) weights)

with RMSNorm without gain (eps 1e-6), W1_i: C x (i+2)*4, W2_i: (i+2)*4 x (i+2)*4 initialised to
zero and the static weights S_i one-hot on the newest state (j = i+1): the stack starts as the
Transformer, exactly. The block then computes X_A = X^R + Attn(LN_q(X^Q), LN_k(X^K), LN_v(X^V))
(separate LayerNorms for the three inputs from the second block on, initialised equal) and
X_A + FFN(LN(X_A)) as usual. The last DA produces the residual way only (the input of the final
norm), with 4x the hidden width, as the paper's Appendix B.

``--mudd-ways r`` keeps one way (the residual; a dynamic DenseFormer) as an ablation.

Not included (a separate change): the released configuration's FFN widths that grow with depth,
and its hidden widths rounded up to multiples of 64 (a hardware padding).
"""
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fairseq.dataclass import FairseqDataclass

from ..config import option
from ..weight_logging import WeightSource
from . import fused
from .interface import SELF, Connection, Inputs, Layout, StackState
from .registry import SEPARATE_INPUTS, Method, Stack

WAYS = ("qkvr", "r")


@dataclass
class MuddConfig(FairseqDataclass):
    """Flags ``--mudd`` ...; hydra ``model.mudd`` ..."""
    mudd: Optional[bool] = option(
        False, "MUDD connections (Xiao et al. 2025): dynamic dense connections over depth, "
               "separate for the query, key, value and residual inputs of every block")
    mudd_ways: Optional[str] = option(
        None, "with --mudd: qkvr (the paper's four ways) or r (the residual way only)",
        choices=WAYS, default_text=WAYS[0])


PRESETS = {"mudd": {"mudd": True}}  # <family>_<name>_tiny
CONFIG = MuddConfig
FLAG = "--mudd"  # the option that turns the method on (its errors name it)
# what a mismatched checkpoint is named by (the blocks' key / value LayerNorms too)
CHECKPOINT_NAMES = {"aggregates": FLAG, "key_layer_norm": FLAG, "value_layer_norm": FLAG}


def active(args) -> bool:
    return bool(getattr(args, "mudd", False))


def validate(args):
    if not active(args) and getattr(args, "mudd_ways", None) is not None:
        raise ValueError("--mudd-ways was given but --mudd is off; add --mudd")


def needs(args):
    """The query, key and value ways feed a self-attention separate inputs."""
    return frozenset({SEPARATE_INPUTS}) if (args.mudd_ways or WAYS[0]) != "r" else frozenset()


def build(args, stack: Stack) -> "Mudd":
    for i, block in enumerate(stack.layout):
        if block[0] != SELF:
            raise ValueError(f"--mudd: the first sub-layer of block {i} is {block[0]!r}, not the "
                             "self-attention whose query/key/value the connections feed "
                             "(ar_encdec_lm: use --decoder-block-order original)")
    return Mudd(stack.layout, stack.embed_dim, args.mudd_ways or WAYS[0])


METHOD = Method("mudd", FLAG, CONFIG, active, build, PRESETS, validate, needs=needs,
                remedies={SEPARATE_INPUTS: "use --mudd-ways r (the residual way only)"},
                reduced=lambda options: {**options, "mudd_ways": "r"},
                checkpoint_names=CHECKPOINT_NAMES)


def rms_norm(x: Tensor, eps: float = 1e-6) -> Tensor:
    """RMSNorm without a gain, over the last dim; computed in (at least) float32: in float16
    the backward of rsqrt of a small mean square overflows (u^-1.5)."""
    wide = x.to(torch.promote_types(x.dtype, torch.float32))
    return (wide * torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


class DepthAggregate(nn.Module):
    """DA after one block: ``states`` states (X_0 .. X_{i+1}) mixed into ``ways`` inputs."""

    def __init__(self, embed_dim: int, states: int, ways: int, hidden: int):
        super().__init__()
        self.states, self.ways = states, ways
        self.w1 = nn.Linear(embed_dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, ways * states, bias=False)
        self.static = nn.Parameter(torch.zeros(ways, states))
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self):
        nn.init.normal_(self.w1.weight, std=self.w1.in_features ** -0.5)
        nn.init.zeros_(self.w2.weight)
        self.static.zero_()
        self.static[:, -1] = 1.0

    def forward(self, newest: Tensor, history: List[Tensor],
                fused_kernel: bool = False) -> List[Tensor]:
        """newest: T x B x C (= history[-1]); history: X_0 .. X_{i+1} -> ``ways`` tensors
        T x B x C. ``fused_kernel``: the weighted sums in one Triton kernel each way, every
        state read once for all ways (:mod:`.fused`)."""
        weights = self.w2(F.gelu(self.w1(rms_norm(newest))))  # T x B x (ways * states)
        weights = weights.view(*weights.shape[:-1], self.ways, self.states) + self.static.to(
            weights.dtype)
        if fused_kernel:
            return list(fused.weighted_sums(weights, *history))
        outs = []
        for c in range(self.ways):
            w = weights[..., c, :]
            out = w[..., -1:] * history[-1]
            for j in range(self.states - 1):
                out = out + w[..., j:j + 1] * history[j]
            outs.append(out)
        return outs


class Mudd(WeightSource, Connection):
    """MUDD connections over a stack of ``layout`` (every block's first sub-layer is its
    self-attention). ``aggregates[i]``: the DA after block i."""

    name, flag = "mudd", FLAG
    needs_pre_norm = True
    additive = False

    def __init__(self, layout: Layout, embed_dim: int, ways: str = "qkvr"):
        super().__init__(layout, keep_history=True)
        if ways not in WAYS:
            raise ValueError(f"--mudd-ways must be one of {WAYS}, got {ways!r}")
        self.ways = ways
        last = self.num_blocks - 1
        self.aggregates = nn.ModuleList()
        for i in range(self.num_blocks):
            count = 1 if (i == last or ways == "r") else 4
            states = i + 2
            hidden = states * count * (4 if i == last else 1)
            self.aggregates.append(DepthAggregate(embed_dim, states, count, hidden))

    def upgrade_state_dict_named(self, state_dict, name):
        """A plain model's checkpoint (no connection weights): the aggregates start at their
        initialisation, the identity (:meth:`~.interface.Connection.start_from_plain`; the
        blocks' key / value LayerNorms start as copies of their self-attention's)."""
        self.start_from_plain(state_dict, name)

    def accepts_fused(self, where: str) -> bool:
        """The dense mix has a kernel for any number of states and ways."""
        return True

    def separate_inputs(self, block: int) -> bool:
        """Whether ``block``'s self-attention reads separate query/key/value inputs."""
        return self.ways == "qkvr" and block > 0

    def new_slot(self, x: Tensor) -> "_Pending":
        return _Pending()

    def read(self, state: StackState, block: int, sublayer: str) -> Tuple[Inputs, Any]:
        pending = state.slot(self)
        if pending.inputs is not None and sublayer == SELF:
            inputs, pending.inputs = pending.inputs, None
            return inputs, None
        return Inputs(state.stream), None

    def end_block(self, state: StackState, block: int):
        state.history.append(state.stream)
        mixed = self.aggregates[block](state.stream, state.history,
                                       self.fused and fused.runs_on(state.stream))
        if len(mixed) == 4:
            query, key, value, state.stream = mixed
            state.slot(self).inputs = Inputs(query, key, value)
        else:
            state.stream = mixed[0]

    def connection_parameters(self) -> List[nn.Parameter]:
        """The static weights (W1 and W2 are ordinary weights, decayed as usual)."""
        return [da.static for da in self.aggregates]

    def logged_weights(self) -> Dict[str, Tensor]:
        """The static weights of every block's DA, per way and state: ``b<i>_<way>_s<j>`` (ways
        q, k, v, r in the order the DA returns them; only r where the DA mixes the residual
        alone: the last block's, every block's under --mudd-ways r)."""
        out = {}
        for i, da in enumerate(self.aggregates):
            static = da.static.detach().float()
            ways = "qkvr" if static.size(0) == 4 else "r"
            for way, row in zip(ways, static):
                out.update({f"b{i}_{way}_s{j}": w for j, w in enumerate(row)})
        return out

    def macs(self, embed_dim: int) -> int:
        """Per token: every DA's two maps and its weighted sums (ways x states x C)."""
        total = 0
        for da in self.aggregates:
            total += embed_dim * da.w1.out_features + da.w1.out_features * da.w2.out_features
            total += da.ways * da.states * embed_dim
        return total


class _Pending:
    """MUDD's slot: the separate query / key / value inputs of the next block's
    self-attention (None once read, and where the way is the residual's)."""
    __slots__ = ("inputs",)

    def __init__(self):
        self.inputs: Optional[Inputs] = None
