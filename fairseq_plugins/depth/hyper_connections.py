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
from typing import Dict, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fairseq.dataclass import FairseqDataclass

from ..config import option
from .interface import Layout
from .registry import Method, Stack
from . import fused
from .multi_stream import MultiStream, mean_square, statistics_dtype

logger = logging.getLogger(__name__)

KINDS = ("none", "static", "dynamic")
READOUTS = ("mean", "sum")


# the defaults the method fills in for the options left None (the one place of each)
DEFAULTS = {"hc_expansion_rate": 4, "hc_readout": "mean"}


@dataclass
class HyperConnectionsConfig(FairseqDataclass):
    """Flags ``--hyper-connections`` ...; hydra ``model.hyper_connections`` ..."""
    hyper_connections: Optional[str] = option(
        "none", "Hyper-Connections (Zhu et al. 2025) around every sub-layer of every stack: "
                "static or dynamic connection weights", choices=KINDS)
    hc_expansion_rate: Optional[int] = option(
        None, "with --hyper-connections: residual streams per position (the paper's n)",
        minimum=1, metavar="N", default_text=str(DEFAULTS["hc_expansion_rate"]))
    hc_readout: Optional[str] = option(
        None, "with --hyper-connections: how the streams are reduced at the top of a stack "
              "(the paper sums; mean keeps a stack read without a norm at the plain model's "
              "scale)", choices=READOUTS, default_text=str(DEFAULTS["hc_readout"]))


PRESETS = {"hyper_connections": {"hyper_connections": "dynamic"}}  # <family>_<name>_tiny
CONFIG = HyperConnectionsConfig
FLAG = "--hyper-connections"  # the option that turns the method on (its errors name it)
# the weights' names (a component of their state-dict keys) -> the option that makes them: a
# checkpoint that has them, loaded into a model without them or the reverse, is named by it
CHECKPOINT_NAMES = {"static_alpha": FLAG, "dynamic_alpha": FLAG}


def active(args) -> bool:
    return (getattr(args, "hyper_connections", None) or "none") != "none"


def validate(args):
    if not active(args):
        for name in DEFAULTS:
            if getattr(args, name, None) is not None:
                raise ValueError(f"--{name.replace('_', '-')} was given but "
                                 "--hyper-connections is none; add --hyper-connections "
                                 "static or dynamic")


def build(args, stack: Stack) -> "HyperConnections":
    rate = args.hc_expansion_rate or DEFAULTS["hc_expansion_rate"]
    if rate < 1:
        raise ValueError(f"--hc-expansion-rate must be >= 1, got {rate}")
    return HyperConnections(stack.layout, stack.embed_dim, rate,
                            dynamic=args.hyper_connections == "dynamic",
                            readout=args.hc_readout or DEFAULTS["hc_readout"])


METHOD = Method("hyper_connections", FLAG, CONFIG, active, build, PRESETS, validate,
                recomputable=True, checkpoint_names=CHECKPOINT_NAMES)


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

    def weights(self, stream: Tensor, k: int, own) -> Tuple[Tensor, Tensor]:
        """(alpha, beta) of sub-layer k for ``stream`` (T x B x n x w, or T x B x 1 x C for n
        equal streams): alpha ... x n x (R+n)
        (columns 0..R-1: A_m, then A_r, rows: streams), beta ... x n; static: n x (R+n) and n,
        dynamic: per position. ``own``: the pass's slot (the parameters' slices)."""
        if not self.dynamic:
            alpha = own.sublayer(self, "static_alpha", k)
            beta = own.sublayer(self, "static_beta", k)
        else:
            n = self.streams
            # both maps as one (R+n+1) x w weight M, LayerNorm folded in: with z = (x - mu) / sigma,
            # LN(x) M^T = (z w + b) M^T = (x (w M)^T - mu (w M) 1) / sigma + M b: one GEMM on the
            # streams themselves (which the mixing keeps anyway), so no normalised copy of the
            # n x C streams is made or kept for the backward pass (n C per token and sub-layer
            # of autograd's memory); the statistics in float32 (float64 in a float64 model).
            # F.linear with a contiguous (out x in) weight: its weight gradient is one wide GEMM
            # (a matmul by the w x (R+n+1) map computes a skinny one, ~2x slower on CPU, measured)
            weight, bias, static, scale = (
                prepared[k] for prepared in own.once("dynamic maps", self._dynamic_maps))
            # the same function in one kernel each way where a fused path runs
            coefficients = (fused.dynamic_coefficients if self.fused and fused.runs_on(stream)
                            else _DynamicCoefficients.apply)(stream, weight, bias, static, scale)
            # split, not slices: a slice's backward zero-fills a tensor of the whole product
            alpha, beta = coefficients.split([self.reads + n, 1], dim=-1)
            beta = beta.squeeze(-1)
        return alpha.to(stream.dtype), beta.to(stream.dtype)

    def _dynamic_maps(self) -> Tuple[Tuple[Tensor, ...], ...]:
        """Per sub-layer (tuples of K): the maps with the LayerNorm's gain folded in
        (R+n+1) x w, its bias through them (R+n+1), the static coefficients n x (R+n+1) and
        the scales (R+n+1). They depend on the parameters only, so they are built once per pass
        for all K sub-layers (a handful of operators where building them per sub-layer took
        five, and their backward some ten, per sub-layer)."""
        n = self.streams
        maps = torch.cat([self.dynamic_alpha.transpose(1, 2), self.dynamic_beta.unsqueeze(1)],
                         dim=1)  # K x (R+n+1) x w
        weight = maps * self.norm_weight.unsqueeze(1)
        bias = torch.matmul(maps, self.norm_bias.unsqueeze(-1)).squeeze(-1)
        static = torch.cat([self.static_alpha, self.static_beta.unsqueeze(-1)], dim=-1)
        scale = torch.cat([self.alpha_scale.unsqueeze(-1).expand(-1, self.reads + n),
                           self.beta_scale.unsqueeze(-1)], dim=-1)
        return tuple(t.unbind(0) for t in (weight, bias, static, scale))

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
