"""Hyper-Connections (Zhu et al., ICLR 2025, arXiv 2409.19606): n residual streams per position,
mixed by learned weights around every sub-layer.

The stream is a hyper hidden matrix H (n x C per position; T x B x n x C here). Around sub-layer
k (every attention and FFN sub-layer of the stack, counted bottom up), with the connection
matrix [[0, B], [A_m, A_r]]:

    input  = A_m^T H                  (C: what the sub-layer reads, before its LayerNorm)
    H'     = A_r^T H + B^T f(input)   (n x C: A_r mixes the streams, B writes the output)

Static: A_m (n), A_r (n x n), B (n) are parameters. Dynamic (Eq. 10-13) adds per-token terms
from the normalised streams H_bar = norm(H) (LayerNorm per stream, as the paper's Algorithm 2):

    A_m(H) = A_m + s_a * tanh(H_bar W_m),  A_r(H) = A_r + s_a * tanh(H_bar W_r),
    B(H)   = B + s_b * tanh(H_bar W_b)^T

with W_m (C x 1), W_r (C x n), W_b (C x 1) initialised to zero and the scales s_a, s_b to 0.01.

Initialisation (Eq. 14): A_m = e_(k mod n), A_r = I, B = 1. Every stream then starts as the
plain pre-norm residual stream, exactly (one-hot and identity weights reproduce it bit for
bit); the stack starts from n copies of the embedding output.

At the top the paper sums the n streams (Algorithm 1). Here ``--hc-readout`` chooses: ``mean``
(the default) or ``sum``. Followed by a LayerNorm the two differ only through the norm's eps
(LN(n h) vs LN(h)), but a stack whose output is read without a norm (``ar_encdec_lm``'s encoder:
a Linear to the decoder input) would start n times the plain model's output with the sum. With
the mean the model at initialisation is the plain pre-norm model to float rounding of the mean
(tested at 1e-6 relative).
"""
import logging
from dataclasses import dataclass
from contextlib import nullcontext
from typing import Any, ContextManager, Dict, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fairseq.dataclass import FairseqDataclass

from ..config import option
from . import fused
from .interface import Connection, Inputs, Layout, StackState
from .recompute import Recompute

logger = logging.getLogger(__name__)

KINDS = ("none", "static", "dynamic")
READOUTS = ("mean", "sum")


@dataclass
class HyperConnectionsConfig(FairseqDataclass):
    """Flags ``--hyper-connections`` ...; hydra ``model.hyper_connections`` ..."""
    hyper_connections: Optional[str] = option(
        "none", "Hyper-Connections (Zhu et al. 2025) around every sub-layer of every stack: "
                "static or dynamic connection weights", choices=KINDS)
    hc_expansion_rate: Optional[int] = option(
        None, "with --hyper-connections: residual streams per position (the paper's n)",
        minimum=1, metavar="N", default_text="4")
    hc_readout: Optional[str] = option(
        None, "with --hyper-connections: how the streams are reduced at the top of a stack "
              "(the paper sums; mean keeps a stack read without a norm at the plain model's "
              "scale)", choices=READOUTS, default_text="mean")


PRESETS = {"hyper_connections": {"hyper_connections": "dynamic"}}  # <family>_<name>_tiny
CONFIG = HyperConnectionsConfig
FLAG = "--hyper-connections"  # the option that turns the method on (its errors name it)
# the weights' names (a component of their state-dict keys) -> the option that makes them: a
# checkpoint that has them, loaded into a model without them or the reverse, is named by it
CHECKPOINT_NAMES = {"static_alpha": FLAG, "dynamic_alpha": FLAG}
DEFAULTS = {"hc_expansion_rate": 4, "hc_readout": "mean"}


def active(args) -> bool:
    return (getattr(args, "hyper_connections", None) or "none") != "none"


def validate(args):
    if not active(args):
        for name in DEFAULTS:
            if getattr(args, name, None) is not None:
                raise ValueError(f"--{name.replace('_', '-')} was given but "
                                 "--hyper-connections is none; add --hyper-connections "
                                 "static or dynamic")


def build(args, layout: Layout, embed_dim: int) -> "HyperConnections":
    rate = args.hc_expansion_rate or DEFAULTS["hc_expansion_rate"]
    if rate < 1:
        raise ValueError(f"--hc-expansion-rate must be >= 1, got {rate}")
    return HyperConnections(layout, embed_dim, rate, dynamic=args.hyper_connections == "dynamic",
                            readout=args.hc_readout or DEFAULTS["hc_readout"])


def statistics_dtype(stream: Tensor) -> torch.dtype:
    """The dtype of a connection's statistics and coefficients: float32, or the stream's where
    it is wider (float64)."""
    return torch.promote_types(stream.dtype, torch.float32)


def mean_square(x: Tensor) -> Tensor:
    """The mean of x^2 over the last dimension, keepdim (one reduction: the squared norm; the
    connections' RMS and variance statistics, without a squared copy of x)."""
    return torch.linalg.vector_norm(x, dim=-1, keepdim=True).square() / x.size(-1)


class _DynamicCoefficients(torch.autograd.Function):
    """Hyper-Connections' dynamic coefficients with the LayerNorm folded into the maps:

        (x ... x s x w, M r x w, b r, S n x r, a r) -> S + a * tanh((x M^T - mu M 1) / sigma + b)

    ... x n x r (s = n streams, or s = 1 standing for n equal ones): M and b the maps with the
    LayerNorm's affine folded in (LayerNorm over w, eps 1e-5), S the static coefficients, a the
    scales. No normalised copy of x is made.

    Forward: mu, sigma from x (float32, or float64 in a float64 model), one GEMM x M^T. Backward
    keeps only x (which the mixing keeps anyway) and the per-row mu and 1 / sigma, and recomputes
    x M^T and the tanh (a GEMM over x) instead of keeping them and the intermediates autograd
    would (measured for Frac-Connections at 12 blocks: peak-memory growth 1.055x -> 1.03x the
    plain LM's). With y the tanh, g the gradient of the pre-tanh z, P = x M^T, u = P - mu M 1:

        g_S = sum of the output's gradient G,  g_a = sum G y,  g = (a G) (1 - y^2),
        g_b = sum g,  g_P = g / sigma,  g_M = g_P^T x - (sum g_P mu) 1^T,
        g_mu = -(g_P . M 1),  g_var = -(g . u) / (2 sigma^3),
        g_x = g_P M + g_mu / w + g_var 2 (x - mu) / w"""

    EPS = 1e-5

    @staticmethod
    def _tanh(x, weight, bias, mean, rstd, dtype):
        u = F.linear(x, weight.to(x.dtype)).to(dtype) - mean * weight.sum(-1).to(dtype)
        return u, torch.tanh(u * rstd + bias.to(dtype))

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Tensor, static: Tensor,
                scale: Tensor) -> Tensor:
        dtype = statistics_dtype(x)
        stats = x.to(dtype)
        mean = stats.mean(-1, keepdim=True)
        variance = (mean_square(stats) - mean.square()).clamp_min(0)
        rstd = torch.rsqrt(variance + _DynamicCoefficients.EPS)
        _, y = _DynamicCoefficients._tanh(x, weight, bias, mean, rstd, dtype)
        ctx.save_for_backward(x, weight, bias, static, scale, mean, rstd, variance > 0)
        return torch.addcmul(static.to(x.dtype), scale.to(x.dtype), y.to(x.dtype))

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: Tensor):
        x, weight, bias, static, scale, mean, rstd, positive = ctx.saved_tensors
        dtype, width, r = mean.dtype, x.size(-1), weight.size(0)
        grad = grad.to(dtype)
        u, y = _DynamicCoefficients._tanh(x, weight, bias, mean, rstd, dtype)
        g_static = grad.reshape(-1, *static.shape).sum(0)
        if y.size(-2) != grad.size(-2):  # one row standing for n equal streams
            grad = grad.sum(-2, keepdim=True)
        g_scale = (grad * y).reshape(-1, r).sum(0)
        g = grad * scale.to(dtype) * (1 - y.square())  # ... x s x r
        g_p = g * rstd
        w = weight.to(dtype)
        w_sum = w.sum(-1)
        g_mean = -(g_p * w_sum).sum(-1, keepdim=True)
        g_var = -0.5 * (g * u).sum(-1, keepdim=True) * rstd.pow(3) * positive
        stats = x.to(dtype)
        rows = g_p.reshape(-1, r)
        g_weight = rows.t() @ stats.reshape(-1, width) - (g_p * mean).reshape(-1, r).sum(
            0).unsqueeze(-1)
        factor = 2 * g_var / width
        g_x = torch.addcmul(torch.matmul(g_p, w) + (g_mean / width - factor * mean), factor,
                            stats)
        return (g_x.to(x.dtype), g_weight.to(weight.dtype),
                g.reshape(-1, r).sum(0).to(bias.dtype), g_static.to(static.dtype),
                g_scale.to(scale.dtype))


class MultiStream(Connection):
    """n residual streams per position (T x B x n x w) mixed around every sub-layer by
    per-sub-layer weights: the machinery Hyper-Connections, its constrained variants and
    Frac-Connections share. A subclass gives :meth:`weights`: for sub-layer k and the streams H,
    ``alpha`` ... x n x (R+n) (columns 0..R-1: the read weights A_m, columns R..R+n-1: the
    mixing A_r, rows: streams) and ``beta`` ... x n (the write weights); then

        input = A_m^T H (R x w, flattened to C = R w),    H' = A_r^T H + beta^T f(LN(input))

    where the sub-layer's output (C) is split into R rows of w the same way. ``reads`` R = 1:
    n streams of the full width (Hyper-Connections, mHC); R = n: the hidden state cut into n
    fractions of width C / n (Frac-Connections).

    With R = 1 the stack starts from n copies of the embedding output, kept as one (T x B x 1 x C,
    standing for T x B x n x C) until the first write: equal streams need neither n per-stream
    norms nor a product over the streams. At the top, the ``mean`` or the ``sum`` of the streams
    (R = 1), or their concatenation (``concat``, R = n).

    With ``log_weights`` (``--log-layer-weights``) a training pass also composes the mixing
    matrices A_r^T of all sub-layers per position (the product across depth, as the mHC paper's
    stability diagnostic) and keeps its "Amax gain" in ``amax_gain``: the largest absolute row
    sum (forward) and column sum (backward) of the composite, the maximum over the positions."""

    needs_pre_norm = True
    additive = False
    # rebuild the sub-layers' inputs and the streams inside a block in the backward pass instead
    # of keeping them (:meth:`saving`): --stream-recompute, set at build time
    recompute = False
    # the per-position product in a Triton kernel where one can run (.fused; set at build time)
    fused = False

    def __init__(self, layout: Layout, streams: int, readout: str = "mean", reads: int = 1):
        super().__init__(layout)
        self.streams, self.readout, self.reads = streams, readout, reads
        # the sub-layers whose output streams are rebuilt in the backward pass (see write):
        # all but each block's last
        self._inside_block = {(i, name) for i, block in enumerate(self.layout)
                              for name in block[:-1]}
        self.log_weights = False
        self.amax_gain: Optional[Tuple[Tensor, Tensor]] = None

    def start(self, x: Tensor) -> StackState:
        # R = 1: T x B x 1 x C (n equal streams); R = n: T x B x n x C/n (the fractions)
        state = StackState(x.unflatten(-1, (self.reads, -1)), None)
        if self.recompute and torch.is_grad_enabled():
            state.scratch = Recompute()
        return state

    def saving(self, state: StackState) -> ContextManager:
        """With ``recompute`` and a gradient, the backward pass rebuilds the sub-layers' inputs
        and the streams between a block's sub-layers (:mod:`.recompute`)."""
        return state.scratch.hooks() if state.scratch is not None else nullcontext()

    def weights(self, stream: Tensor, k: int) -> Tuple[Tensor, Tensor]:
        """(alpha, beta) of sub-layer k for ``stream`` (T x B x n x w, or T x B x 1 x C for n
        equal streams): alpha ... x n x (R+n), beta ... x n (or n x (R+n) and n when static)."""
        raise NotImplementedError

    def read(self, state: StackState, block: int, sublayer: str) -> Tuple[Inputs, Any]:
        stream = state.stream
        alpha, beta = self.weights(stream, self.sites[(block, sublayer)])
        read, mixed = self._products(alpha, stream)
        if self.log_weights and self.training:
            self._compose(state, alpha)
        # the input copied out (the sub-layer's LayerNorm would copy the strided view anyway):
        # saved for the backward pass as a view it would keep all of the product alive, (n+1) C
        # per token and sub-layer instead of C (measured: 120 MB of a 12-block LM's activations)
        query = read.flatten(-2).contiguous()
        # write's token: the mixed streams and beta; with a gradient, for a sub-layer other than
        # its block's last, what rebuilds the streams it writes (alpha and the streams it read)
        rebuild = None
        if state.scratch is not None:
            # the LayerNorm's saved input, rebuilt from alpha and the streams (kept for the
            # product's backward anyway): C per token and sub-layer less to keep
            state.scratch.add(query, self._rebuilt_input, alpha, stream)
            if (block, sublayer) in self._inside_block:
                rebuild = (alpha, stream)
        return Inputs(query), (mixed, beta, rebuild)

    def _rebuilt_input(self, alpha: Tensor, stream: Tensor) -> Tensor:
        """read's ``query`` again (the same operations, the same values)."""
        return self._products(alpha, stream)[0].flatten(-2).contiguous()

    def _rebuilt_streams(self, alpha: Tensor, stream: Tensor, beta: Tensor,
                         out: Tensor) -> Tensor:
        """write's new streams again (the same operations, the same values)."""
        return self._new_streams(self._products(alpha, stream)[1], beta, out)

    def _new_streams(self, mixed: Tensor, beta: Tensor, out: Tensor) -> Tensor:
        """A_r^T H + beta^T out: ``mixed`` ... x n x w, ``beta`` ... x n, ``out`` ... x C."""
        return torch.addcmul(mixed, beta.unsqueeze(-1), out.unflatten(-1, (self.reads, -1)))

    def _products(self, alpha: Tensor, stream: Tensor) -> Tuple[Tensor, Tensor]:
        """(A_m^T H ... x R x w, A_r^T H ... x n x w) for the weights ``alpha`` (... x n x (R+n),
        or n x (R+n) static) and the streams H (``stream``): views of one product."""
        # [A_m A_r]^T H in one matrix product per position ((R+n) x n times n x w): rows 0..R-1
        # are the sub-layer's input A_m^T H, rows R.. the mixed streams A_r^T H the write adds
        # the output to (both read the same H). The static weights are expanded to every position
        # too: a batch of small products beats one GEMM over the permuted streams (measured on
        # CPU, forward + backward: ~2x)
        if stream.size(-2) == 1:  # n equal streams (before the first write): sum_j alpha_jk x
            both = alpha.sum(-2).unsqueeze(-1) * stream
        elif self.fused and fused.runs_on(stream):  # the same product, one kernel per direction
            both = fused.stream_products(alpha, stream)
        else:
            if alpha.dim() == 2:
                alpha = alpha.expand(*stream.shape[:-2], *alpha.shape)
            both = torch.einsum("...nk,...nc->...kc", alpha, stream)  # ... x (R+n) x w
        # split, not two slices: its backward is one concatenation, a slice's a zero-filled
        # tensor of the whole product per slice
        return both.split([self.reads, self.streams], dim=-2)

    def _compose(self, state: StackState, alpha: Tensor):
        """composite <- A_r^T composite (A_r^T: this sub-layer's mixing, ... x n x n)."""
        mixing = alpha[..., self.reads:].detach().float().transpose(-1, -2)
        state.diagnostics = (mixing if state.diagnostics is None
                             else torch.matmul(mixing, state.diagnostics))

    def write(self, state: StackState, block: int, sublayer: str, out: Tensor, token: Any,
              post_norm=None):
        mixed, beta, rebuild = token  # A_r^T H (... x n x w), B (... x n), see read
        state.stream = self._new_streams(mixed, beta, out)
        if rebuild is not None:
            # the streams inside a block, rebuilt from the block's input streams (kept) and
            # the sub-layers' outputs (kept for beta's gradient): n C per token and sub-layer
            # less to keep, but for each block's output. Kept there, so that rebuilding the
            # streams for one sub-layer's backward recomputes a block at most
            state.scratch.add(state.stream, self._rebuilt_streams, *rebuild, beta, out)

    def full_streams(self, state: StackState) -> Tensor:
        """The streams, T x B x n x C (an expanded view while they are n equal copies)."""
        return state.stream.expand(*state.stream.shape[:-2], self.streams,
                                   state.stream.size(-1))

    def reduce(self, state: StackState) -> Tensor:
        """The streams as one T x B x C tensor (the readout)."""
        if self.readout == "concat":
            return state.stream.flatten(-2)
        stream = self.full_streams(state)
        return stream.mean(-2) if self.readout == "mean" else stream.sum(-2)

    def view(self, state: StackState) -> Tensor:
        return self.reduce(state)

    def finish(self, state: StackState) -> Tensor:
        if state.diagnostics is not None:
            composite = state.diagnostics.abs()
            self.amax_gain = (composite.sum(-1).amax(), composite.sum(-2).amax())
        return self.reduce(state)

    def gain_logs(self) -> Dict[str, Tensor]:
        """The last training pass's Amax gains, for :meth:`logged_weights` (none before one)."""
        if self.amax_gain is None:
            return {}
        return {"amax_gain_forward": self.amax_gain[0], "amax_gain_backward": self.amax_gain[1]}

    def stream_macs(self, width: int) -> int:
        """Per token and sub-layer, streams of ``width`` w: read n R w, mix n^2 w, write n w."""
        n = self.streams
        return n * self.reads * width + n * n * width + n * width


class HyperConnections(MultiStream):
    """Static or dynamic Hyper-Connections over the sub-layers of ``layout``.

    Parameters, stacked over the K sub-layers of the stack (R read rows, streams of width w: R = 1
    and w = C here, R = n and w = C / n for Frac-Connections): ``static_alpha`` K x n x (R+n)
    (row r: stream r's [A_m[r, :], A_r[r, :]]), ``static_beta`` K x n; dynamic: ``norm_weight`` /
    ``norm_bias`` K x w, ``dynamic_alpha`` K x w x (R+n), ``dynamic_beta`` K x w,
    ``alpha_scale`` / ``beta_scale`` K."""

    name = "hyper_connections"
    flag, rate_flag = FLAG, "--hc-expansion-rate"
    readouts = READOUTS
    # the dynamic part's initialisation (maps 0, scales 0.01, the norms (1, 0)): set by
    # reset_parameters, and given to a static checkpoint loaded into the dynamic variant
    DYNAMIC_INIT = {"norm_weight": 1.0, "norm_bias": 0.0, "dynamic_alpha": 0.0,
                    "dynamic_beta": 0.0, "alpha_scale": 0.01, "beta_scale": 0.01}

    def __init__(self, layout: Layout, embed_dim: int, rate: int, dynamic: bool,
                 readout: str = "mean", reads: int = 1):
        if readout not in self.readouts:
            raise ValueError(f"the readout must be one of {self.readouts}, got {readout!r}")
        if embed_dim % reads:
            raise ValueError(f"{self.rate_flag} {reads} must divide the embedding dimension "
                             f"{embed_dim}")
        super().__init__(layout, rate, readout, reads)
        self.dynamic = dynamic
        sites, n, w = len(self.sites), rate, embed_dim // reads
        self.width = w
        self.static_alpha = nn.Parameter(torch.zeros(sites, n, reads + n))
        self.static_beta = nn.Parameter(torch.ones(sites, n))
        if dynamic:
            self.norm_weight = nn.Parameter(torch.ones(sites, w))
            self.norm_bias = nn.Parameter(torch.zeros(sites, w))
            self.dynamic_alpha = nn.Parameter(torch.zeros(sites, w, reads + n))
            self.dynamic_beta = nn.Parameter(torch.zeros(sites, w))
            self.alpha_scale = nn.Parameter(torch.full((sites,), 0.01))
            self.beta_scale = nn.Parameter(torch.full((sites,), 0.01))
        self.reset_parameters()

    def initial_reads(self, k: int) -> Tensor:
        """A_m of sub-layer k at initialisation, n x R: Eq. 14's e_(k mod n)."""
        return F.one_hot(torch.tensor([k % self.streams]), self.streams).t().float()

    @torch.no_grad()
    def reset_parameters(self):
        """The paper's initialisation (Eq. 14): A_m = :meth:`initial_reads`, A_r = I, B = 1;
        dynamic maps 0, scales 0.01, the norms (1, 0)."""
        n, reads = self.streams, self.reads
        for k in range(self.static_alpha.size(0)):
            self.static_alpha[k, :, :reads] = self.initial_reads(k)
            self.static_alpha[k, :, reads:] = torch.eye(n)
        self.static_beta.fill_(1.0)
        if self.dynamic:
            for key, value in self.DYNAMIC_INIT.items():
                getattr(self, key).fill_(value)

    def upgrade_state_dict_named(self, state_dict, name):
        """A plain model's checkpoint (no connection weights): the connections start at their
        initialisation (:meth:`~.interface.Connection.start_from_plain`). A checkpoint of static
        Hyper-Connections into the dynamic variant: the dynamic part starts at its
        initialisation (maps 0: the same function as the checkpoint). Another method's
        connection weights cannot be continued with Hyper-Connections: an error naming the
        flag."""
        if self.start_from_plain(state_dict, name):
            return
        prefix = f"{name}." if name else ""
        if f"{prefix}static_alpha" not in state_dict:
            raise ValueError(f"the checkpoint has no {self.name} weights at {prefix}"
                             f"static_alpha: it was not trained with {self.flag}; "
                             "train without the flag, or start the connections from scratch")
        shape = tuple(state_dict[f"{prefix}static_alpha"].shape)
        if shape != tuple(self.static_alpha.shape):
            raise ValueError(f"the checkpoint's connection weights {prefix}static_alpha are "
                             f"{shape} (sub-layers x streams x (reads + streams)), this "
                             f"model's {tuple(self.static_alpha.shape)} ({self.flag}, "
                             f"{self.rate_flag} {self.streams}): use {self.rate_flag} "
                             f"{shape[1]} with the checkpoint's method")
        if self.dynamic and f"{prefix}dynamic_alpha" not in state_dict:
            logger.info(f"{prefix}: a static {self.name} checkpoint, the dynamic part starts "
                        "at its initialisation")
            for key, value in self.DYNAMIC_INIT.items():
                state_dict[f"{prefix}{key}"] = torch.full_like(getattr(self, key).detach(),
                                                               value)

    def weights(self, stream: Tensor, k: int) -> Tuple[Tensor, Tensor]:
        """(alpha, beta) of sub-layer k for ``stream`` (T x B x n x w, or T x B x 1 x C for n
        equal streams): alpha ... x n x (R+n)
        (columns 0..R-1: A_m, then A_r, rows: streams), beta ... x n; static: n x (R+n) and n,
        dynamic: per position."""
        alpha, beta = self.static_alpha[k], self.static_beta[k]
        if self.dynamic:
            n = self.streams
            # both maps as one (R+n+1) x w weight M, LayerNorm folded in: with z = (x - mu) / sigma,
            # LN(x) M^T = (z w + b) M^T = (x (w M)^T - mu (w M) 1) / sigma + M b: one GEMM on the
            # streams themselves (which the mixing keeps anyway), so no normalised copy of the
            # n x C streams is made or kept for the backward pass (n C per token and sub-layer
            # of autograd's memory); the statistics in float32 (float64 in a float64 model).
            # F.linear with a contiguous (out x in) weight: its weight gradient is one wide GEMM
            # (a matmul by the w x (R+n+1) map computes a skinny one, ~2x slower on CPU, measured)
            maps = torch.cat([self.dynamic_alpha[k].t(), self.dynamic_beta[k].unsqueeze(0)])
            static = torch.cat([alpha, beta.unsqueeze(-1)], dim=-1)  # n x (R+n+1)
            scale = torch.cat([self.alpha_scale[k].expand(self.reads + n),
                               self.beta_scale[k].view(1)])
            coefficients = _DynamicCoefficients.apply(
                stream, maps * self.norm_weight[k], maps @ self.norm_bias[k], static, scale)
            # split, not slices: a slice's backward zero-fills a tensor of the whole product
            alpha, beta = coefficients.split([self.reads + n, 1], dim=-1)
            beta = beta.squeeze(-1)
        return alpha.to(stream.dtype), beta.to(stream.dtype)

    def logged_weights(self) -> Dict[str, Tensor]:
        """The static weights of every sub-layer k: A_m (read), B (write) per stream
        and the trace of A_r over n (how much each stream keeps itself)."""
        out = {}
        n = self.streams
        for k in range(len(self.sites)):
            alpha, beta = self.static_alpha[k].detach().float(), self.static_beta[k].detach().float()
            for r in range(n):
                out[f"k{k}_read{r}"] = alpha[r, 0]
                out[f"k{k}_write{r}"] = beta[r]
            out[f"k{k}_keep"] = torch.diagonal(alpha[:, 1:]).mean()
        out.update(self.gain_logs())
        return out

    def macs(self, embed_dim: int) -> int:
        """Per token and sub-layer, streams of width w (C, or C / n for fractions): read n R w,
        mix n^2 w, write n w; dynamic adds the maps (n w (R + n + 1)) and the per-stream norm
        (~2 n w, counted as n w)."""
        n, w, k = self.streams, self.width, len(self.sites)
        per_site = self.stream_macs(w)
        if self.dynamic:
            per_site += n * w * (self.reads + n + 1) + n * w
        return k * per_site

    def extra_repr(self) -> str:
        return (f"n={self.streams}, reads={self.reads}, "
                f"{'dynamic' if self.dynamic else 'static'}, sub-layers={len(self.sites)}, "
                f"readout={self.readout}")
