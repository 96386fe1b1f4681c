"""Manifold-Constrained Hyper-Connections (mHC; Xie et al., DeepSeek, 2025, arXiv 2512.24880) and
mHC-lite (arXiv 2601.05732): Hyper-Connections whose stream-mixing matrix is doubly stochastic.

Per position the n streams x (n x C). Around sub-layer k (every attention and FFN sub-layer of
the stack, bottom up), the paper's Eq. 3:

    x' = H_res x + H_post^T f(H_pre x)

with the coefficients (Eq. 7-8) read from the RMS norm of the flattened streams,
x~ = RMSNorm(vec(x)) (1 x nC: one norm over all n streams together, no gain: a gain would only
rescale the maps that follow):

    H_pre  = sigmoid(a_pre  x~ phi_pre  + b_pre)          1 x n   (read weights)
    H_post = 2 sigmoid(a_post x~ phi_post + b_post)       1 x n   (write weights)
    H_res  = SK(a_res mat(x~ phi_res) + b_res)            n x n   (stream mixing)

a_* scalar gates (0.01), phi_* maps (nC x n, nC x n, nC x n^2) initialised to 0, b_* biases.
SK (Eq. 9) is Sinkhorn-Knopp on exp(.): ``--mhc-sinkhorn-iterations`` iterations (the paper's
20), each normalising the columns, then the rows, so the rows sum to 1 to float precision and
the columns approximately (docs/ideas/mhc.md gives the measured error). mHC-lite
(``--mhc lite``) replaces SK by an exact parametrisation: H_res = sum_p w_p P_p over the n!
permutation matrices, w = softmax(a_res x~ phi_res + b_res) (phi_res nC x n!); n <= 4.

This follows the paper's orientation: the mixed stream i is sum_j H_res[i, j] x_j, with the
rows (the side normalised last) summing to one, so equal streams stay equal exactly. DeepSeek's
reference kernels normalise rows first and apply the matrix transposed: the same family of
functions with the roles of rows and columns exchanged.

The coefficients and Sinkhorn always run in float32 (also under --fp16, --bf16, --amp; in
float64 in a float64 model): in half precision Sinkhorn's row sums drift by ~1e-3.

Initialisation (``--mhc-init``; the paper gives none). ``residual`` (the default) makes the model
the pre-norm residual stack, to float rounding: the streams start equal; H_pre puts 3/4 on a
home stream (k mod n, as Hyper-Connections' Eq. 14) and 1/(4(n-1)) on each other (summing to one,
so the read is the stream; the unequal weights break the streams' symmetry in training); H_post =
2 sigmoid(0) = 1; H_res = 3/4 on the diagonal, 1/(4(n-1)) elsewhere (doubly stochastic, so equal
streams stay equal; Sinkhorn leaves it as it is); for mHC-lite, weight 3/4 on the identity
permutation, the rest shared equally. ``zeros``: every bias 0, as some reproductions do (H_pre =
1/2 each: the sub-layer reads n/2 times the stream, which its LayerNorm removes up to its eps;
H_res = 1/n everywhere).

The top of the stack (``--mhc-readout``): ``learned`` (the default) is DeepSeek's readout, a
per-token sigmoid-weighted sum of the streams, w = sigmoid(a x~ phi + b) (1 x n), starting at
w = 1/n (the mean: the pre-norm stack exactly; ``zeros``: w = 1/2); ``mean``; ``sum`` (Hyper-Connections' rule).
"""
import itertools
import logging
import math
from dataclasses import dataclass
from typing import Dict, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fairseq.dataclass import FairseqDataclass

from ..config import option
from . import fused
from .multi_stream import MultiStream, mean_square, statistics_dtype
from .interface import Layout, StackState
from .registry import Method, Stack

logger = logging.getLogger(__name__)

KINDS = ("none", "sinkhorn", "lite")
INITS = ("residual", "zeros")
READOUTS = ("learned", "mean", "sum")
RMS_EPS = 1e-6
HOME = 0.75  # the residual init's weight on the home stream / the diagonal / the identity
LITE_MAX_STREAMS = 4  # n! permutations: 24 at n = 4


# the defaults the method fills in for the options left None (the one place of each)
DEFAULTS = {"mhc_expansion_rate": 4, "mhc_sinkhorn_iterations": 20, "mhc_init": "residual",
            "mhc_readout": "learned"}


@dataclass
class MHCConfig(FairseqDataclass):
    """Flags ``--mhc`` ...; hydra ``model.mhc`` ..."""
    mhc: Optional[str] = option(
        "none", "manifold-constrained Hyper-Connections (Xie et al. 2025) around every "
                "sub-layer of every stack: the mixing matrix made doubly stochastic by "
                "Sinkhorn-Knopp, or exactly as a mixture of permutations (mHC-lite)",
        choices=KINDS)
    mhc_expansion_rate: Optional[int] = option(
        None, "with --mhc: residual streams per position (n; mHC-lite: at most 4)",
        minimum=2, metavar="N", default_text=str(DEFAULTS["mhc_expansion_rate"]))
    mhc_sinkhorn_iterations: Optional[int] = option(
        None, "with --mhc sinkhorn: Sinkhorn-Knopp iterations (columns, then rows)",
        minimum=1, metavar="N", default_text=str(DEFAULTS["mhc_sinkhorn_iterations"]))
    mhc_init: Optional[str] = option(
        None, "with --mhc: the biases' initialisation (residual: the model starts as the "
              "pre-norm residual stack; zeros: all biases 0)", choices=INITS,
        default_text=str(DEFAULTS["mhc_init"]))
    mhc_readout: Optional[str] = option(
        None, "with --mhc: how the streams are reduced at the top of a stack (learned: a "
              "per-token sigmoid-weighted sum, starting as the mean)", choices=READOUTS,
        default_text=str(DEFAULTS["mhc_readout"]))


PRESETS = {"mhc": {"mhc": "sinkhorn"}, "mhc_lite": {"mhc": "lite"}}
CONFIG = MHCConfig
FLAG = "--mhc"  # the option that turns the method on (its errors name it)
CHECKPOINT_NAMES = {"maps": FLAG, "bias_res": FLAG}  # what a mismatched checkpoint is named by


def active(args) -> bool:
    return (getattr(args, "mhc", None) or "none") != "none"


def validate(args):
    if not active(args):
        for name in DEFAULTS:
            if getattr(args, name, None) is not None:
                raise ValueError(f"--{name.replace('_', '-')} was given but --mhc is none; add "
                                 "--mhc sinkhorn or lite")
        return
    # the ranges (n >= 2, iterations >= 1) are the options' own checks (``option(minimum=)``)
    rate = args.mhc_expansion_rate or DEFAULTS["mhc_expansion_rate"]
    if args.mhc == "lite":
        if rate > LITE_MAX_STREAMS:
            raise ValueError(f"--mhc lite mixes the n! permutation matrices: "
                             f"--mhc-expansion-rate must be <= {LITE_MAX_STREAMS}, got {rate} "
                             "(use --mhc sinkhorn for more streams)")
        if args.mhc_sinkhorn_iterations is not None:
            raise ValueError("--mhc-sinkhorn-iterations applies to --mhc sinkhorn; mHC-lite "
                             "(--mhc lite) is doubly stochastic without iterations")


def build(args, stack: Stack) -> "ManifoldHyperConnections":
    return ManifoldHyperConnections(
        stack.layout, stack.embed_dim, args.mhc_expansion_rate or DEFAULTS["mhc_expansion_rate"],
        lite=args.mhc == "lite",
        iterations=args.mhc_sinkhorn_iterations or DEFAULTS["mhc_sinkhorn_iterations"],
        init=args.mhc_init or DEFAULTS["mhc_init"],
        readout=args.mhc_readout or DEFAULTS["mhc_readout"])


METHOD = Method("mhc", FLAG, CONFIG, active, build, PRESETS, validate, recomputable=True,
                checkpoint_names=CHECKPOINT_NAMES)


def sinkhorn(logits: Tensor, iterations: int, fused_kernel: bool = False) -> Tensor:
    """Sinkhorn-Knopp (the paper's Eq. 9) on M = exp(logits), ... x n x n: each iteration
    normalises the columns, then the rows. Scale-free, so exp is taken after subtracting the
    maximum.

    Computed in the scaling form, the same iterates: after t iterations the matrix is
    diag(u) M diag(v) with v = 1 / (M^T u) (the columns' step) and u = 1 / (M v) (the rows'),
    u starting at 1, with a hand-written backward (:class:`_SinkhornScaling`) that gathers the
    gradient of M over all iterations at the end. The matrices are laid out n x n x positions,
    so that each matrix-vector product of an iteration is one elementwise product and one sum
    over a leading dimension, vectorised over the positions (a batched product of thousands of
    4 x 4 matrices is dominated by its per-matrix overhead on CPU: ~3x slower, measured). The
    gradient is the exact gradient of these t iterations (not the implicit one of the limit).

    ``fused_kernel``: the same iterations and gradient in one Triton kernel each way
    (:mod:`fairseq_plugins.kernels.sinkhorn`; chosen by :mod:`.fused`)."""
    m = torch.exp(logits - logits.amax(dim=(-2, -1), keepdim=True).detach())
    if fused_kernel:
        return fused.sinkhorn_scaling(m, iterations)
    shape = m.shape
    m = m.reshape(-1, shape[-2], shape[-1]).permute(1, 2, 0).contiguous()
    return _SinkhornScaling.apply(m, iterations).permute(2, 0, 1).reshape(shape)


class _MatVec:
    """Per-position products with the matrices M (n x n x N, N positions last): for vectors x
    (n x N), ``M^T x`` (``dim`` 0: sum over the rows i of M[i, j] x[i]) and ``M x`` (``dim`` 1),
    written into ``out`` (n x N).

    On CPU as n multiply-adds of n x N slices: a product over all n x n x N and a reduction
    over a leading dimension make two passes over a tensor n times larger, and the reduction
    is the slower kernel (Sinkhorn forward 1.4 -> 0.8 ms per sub-layer at n = 4 and 2,048
    positions with the buffers of :class:`_SinkhornScaling`, measured on 2 threads). On a GPU,
    where every operator is a kernel launch, as the product and one reduction (2 operators
    instead of n)."""

    def __init__(self, m: Tensor):
        self.m = m
        self.slices = None if m.is_cuda else (m.unbind(0), m.unbind(1))

    def __call__(self, x: Tensor, dim: int, out: Tensor) -> Tensor:
        if self.slices is None:
            return torch.sum(self.m * x.unsqueeze(1 - dim), dim, out=out)
        parts, xs = self.slices[dim], x.unbind(0)
        torch.mul(parts[0], xs[0], out=out)
        for part, xi in zip(parts[1:], xs[1:]):
            out.addcmul_(part, xi)
        return out


class _SinkhornScaling(torch.autograd.Function):
    """M (n x n x N, positive; N positions last) -> diag(u_t) M diag(v_t) after t iterations
    (see :func:`sinkhorn`); u, v are n x N, every iterate written into one buffer per side
    (t+1 and t rows), which the backward pass reads.

    Backward, with G the output's gradient and K = G * M: g_M = u v^T * G; g_u = K v,
    g_v = K^T u; then back through every step (u = 1/z, z = M v: g_z = -u^2 g_u, g_v += M^T g_z;
    v = 1/w, w = M^T u': g_w = -v^2 g_v, g_u' = M g_w), the outer products that each step adds to
    g_M (g_z v^T and u' g_w^T) summed over the steps at the end."""

    @staticmethod
    def forward(ctx, m: Tensor, iterations: int) -> Tensor:
        n, positions = m.size(0), m.size(2)
        product = _MatVec(m)
        us = m.new_empty(iterations + 1, n, positions)
        vs = m.new_empty(iterations, n, positions)
        us[0].fill_(1)
        for t in range(iterations):
            product(us[t], 0, vs[t]).reciprocal_()  # v = 1 / (M^T u)
            product(vs[t], 1, us[t + 1]).reciprocal_()  # u = 1 / (M v)
        ctx.save_for_backward(m, us, vs)
        return us[-1].unsqueeze(1) * m * vs[-1].unsqueeze(0)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: Tensor):
        m, us, vs = ctx.saved_tensors
        steps = vs.size(0)
        u, v = us[steps], vs[steps - 1]
        product, weighted = _MatVec(m), _MatVec(grad * m)
        grad_m = grad * u.unsqueeze(1) * v.unsqueeze(0)
        grad_u = weighted(v, 1, torch.empty_like(v))
        direct_v = weighted(u, 0, torch.empty_like(v))  # only the last v reaches the output
        neg_u2, neg_v2 = us.square().neg_(), vs.square().neg_()  # d(1/z)/dz = -(1/z)^2
        grad_z, grad_w = torch.empty_like(vs), torch.empty_like(vs)  # per step, step 1 first
        grad_v = torch.empty_like(v)
        for t in range(steps, 0, -1):
            g_z = torch.mul(neg_u2[t], grad_u, out=grad_z[t - 1])  # u_t = 1 / (M v_t)
            product(g_z, 0, grad_v)
            if t == steps:
                grad_v += direct_v
            g_w = torch.mul(neg_v2[t - 1], grad_v, out=grad_w[t - 1])  # v_t = 1 / (M^T u_(t-1))
            product(g_w, 1, grad_u)  # g_z read grad_u already: overwritten in place
        # sum over the steps of g_z v_t^T and u_(t-1) g_w^T
        grad_m += (grad_z.unsqueeze(2) * vs.unsqueeze(1)).sum(0)
        grad_m += (us[:steps].unsqueeze(2) * grad_w.unsqueeze(1)).sum(0)
        return grad_m, None


class _RMSMaps(torch.autograd.Function):
    """(x ... x D, W m x D) -> (x W^T) r, r = 1 / sqrt(mean(x^2) + eps) per row: ... x m.

    One GEMM and one reduction forward; the backward touches x (D wide) in one GEMM and one
    fused multiply-add, where autograd through the norm makes four passes over it (measured:
    ~1 ms per sub-layer of a 12-block d=128 LM, n = 4). With G the output's gradient and
    P = x W^T: g_P = G r, g_W = g_P^T x, g_x = g_P W - (sum(G . P) r^3 / D) x."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor) -> Tensor:
        products = F.linear(x, weight)
        rstd = torch.rsqrt(mean_square(x) + RMS_EPS)
        ctx.save_for_backward(x, weight, products, rstd)
        return products * rstd

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: Tensor):
        x, weight, products, rstd = ctx.saved_tensors
        g_p = grad * rstd
        g_weight = g_p.reshape(-1, g_p.size(-1)).t() @ x.reshape(-1, x.size(-1))
        g_ms = (grad * products).sum(-1, keepdim=True) * rstd.pow(3) / x.size(-1)
        return torch.addcmul(g_p @ weight, g_ms, x, value=-1), g_weight


def permutation_matrices(n: int) -> Tensor:
    """The n! permutation matrices, n! x n x n, the identity first."""
    eye = torch.eye(n)
    return torch.stack([eye[list(p)] for p in itertools.permutations(range(n))])


def logit(p: float) -> float:
    return math.log(p / (1 - p))


class ManifoldHyperConnections(MultiStream):
    """mHC / mHC-lite over the sub-layers of ``layout``.

    Parameters, stacked over the K sub-layers: ``maps`` K x m x nC (phi_pre, phi_post, phi_res as
    rows: m = 2n + n^2, or 2n + n! for lite), ``gates`` K x 3 (a_pre, a_post, a_res),
    ``bias_pre`` / ``bias_post`` K x n, ``bias_res`` K x n x n (lite: K x n!). The learned readout:
    ``readout_map`` n x nC, ``readout_gate`` (1), ``readout_bias`` n."""

    name, flag = "mhc", FLAG

    def __init__(self, layout: Layout, embed_dim: int, rate: int, lite: bool = False,
                 iterations: int = 20, init: str = "residual", readout: str = "learned"):
        if init not in INITS:
            raise ValueError(f"--mhc-init must be one of {INITS}, got {init!r}")
        if readout not in READOUTS:
            raise ValueError(f"--mhc-readout must be one of {READOUTS}, got {readout!r}")
        if rate < 2 or (lite and rate > LITE_MAX_STREAMS) or iterations < 1:
            raise ValueError(f"mHC needs 2 <= n (<= {LITE_MAX_STREAMS} for lite) and >= 1 "
                             f"Sinkhorn iterations, got n={rate}, iterations={iterations}")
        super().__init__(layout, rate, readout)
        self.lite, self.iterations, self.init = lite, iterations, init
        sites, n, d = len(self.sites), rate, embed_dim
        mixes = math.factorial(n) if lite else n * n
        self.maps = nn.Parameter(torch.zeros(sites, 2 * n + mixes, n * d))
        self.gates = nn.Parameter(torch.full((sites, 3), 0.01))
        self.bias_pre = nn.Parameter(torch.zeros(sites, n))
        self.bias_post = nn.Parameter(torch.zeros(sites, n))
        self.bias_res = nn.Parameter(torch.zeros(sites, mixes) if lite
                                     else torch.zeros(sites, n, n))
        if lite:
            self.register_buffer("permutations", permutation_matrices(n), persistent=False)
        if readout == "learned":
            self.readout_map = nn.Parameter(torch.zeros(n, n * d))
            self.readout_gate = nn.Parameter(torch.full((1,), 0.01))
            self.readout_bias = nn.Parameter(torch.zeros(n))
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self):
        """Maps 0, gates 0.01; the biases as ``init`` says (module docstring)."""
        n = self.streams
        self.maps.zero_()
        self.gates.fill_(0.01)
        self.bias_pre.zero_()
        self.bias_post.zero_()
        self.bias_res.zero_()
        if self.init == "residual":
            other = (1 - HOME) / (n - 1)
            self.bias_pre.fill_(logit(other))
            for k in range(self.bias_pre.size(0)):
                self.bias_pre[k, k % n] = logit(HOME)
            if self.lite:  # softmax weight HOME on the identity (index 0), the rest equal
                self.bias_res[:, 0] = math.log(HOME / (1 - HOME) * (self.bias_res.size(1) - 1))
            else:  # exp(b): HOME / (1 - HOME) * (n - 1) on the diagonal, 1 elsewhere
                # the identity in the parameter's dtype: a float32 constant would leave a
                # float64 model 1e-8 away from this initialisation
                self.bias_res.copy_(torch.eye(n, dtype=self.bias_res.dtype,
                                              device=self.bias_res.device)
                                    * math.log(HOME / (1 - HOME) * (n - 1)))
        if self.readout == "learned":
            self.readout_map.zero_()
            self.readout_gate.fill_(0.01)
            self.readout_bias.fill_(logit(1.0 / n) if self.init == "residual" else 0.0)

    def upgrade_state_dict_named(self, state_dict, name):
        """A plain model's checkpoint (no connection weights): mHC starts at its initialisation
        (:meth:`~.interface.Connection.start_from_plain`). Another method's connection weights
        cannot be continued with mHC; mHC weights of another n or variant neither: errors
        naming the flags."""
        if self.start_from_plain(state_dict, name):
            return
        prefix = f"{name}." if name else ""
        if f"{prefix}maps" not in state_dict:
            raise ValueError(f"the checkpoint has no mHC weights at {prefix}maps: it was not "
                             "trained with --mhc; train without the flag, or start the "
                             "connections from scratch")
        shape = tuple(state_dict[f"{prefix}maps"].shape)
        if shape != tuple(self.maps.shape):
            raise ValueError(f"the checkpoint's mHC maps are {shape}, this model's "
                             f"{tuple(self.maps.shape)}: use the checkpoint's --mhc and "
                             "--mhc-expansion-rate")

    def _flattened(self, stream: Tensor, weight: Tensor) -> Tuple[Tensor, Tensor]:
        """(x ... x D, the map ``weight`` m x D) whose RMS-normalised product is x~ phi, in
        float32 (float64 in a float64 model): the flattened streams (D = nC), or for n equal
        streams (T x B x 1 x C) x itself with phi's n blocks summed (D = C: the flattened
        vector is n copies of x, its RMS is x's and x~ phi = x (sum of phi's blocks))."""
        x = stream.to(statistics_dtype(stream))
        if x.size(-2) == 1:
            x = x.squeeze(-2)
            weight = weight.view(weight.size(0), self.streams, -1).sum(1)
        else:
            x = x.flatten(-2)
        return x, weight.to(x.dtype)

    def _mixes(self, stream: Tensor, weight: Tensor) -> Tensor:
        """x~ phi for the map ``weight`` (m x nC): ... x m, in float32 (float64 in a float64
        model). RMSNorm(x) phi = (x phi) / rms(x): the norm is applied to the m products, not
        to the nC inputs (one reduction, no normalised copy of the streams; :class:`_RMSMaps`)."""
        return _RMSMaps.apply(*self._flattened(stream, weight))

    def accepts_fused(self, where: str) -> bool:
        """The stream product's kernel as every multi-stream connection; the coefficients'
        kernel for up to ``fused.MAX_COEFFICIENTS`` columns (m = 2n + n^2, or 2n + n! for
        lite), beyond that the eager coefficients (said in one log line)."""
        accepted = super().accepts_fused(where)
        self.fused_coefficients = accepted and fused.coefficients_supported(self.maps.size(1),
                                                                            where)
        return accepted

    # whether the coefficients may run as one kernel (set at build: accepts_fused)
    fused_coefficients = False

    def coefficients(self, stream: Tensor, k: int, own) -> Tuple[Tensor, Tensor, Tensor]:
        """(H_pre ... x n, H_post ... x n, H_res ... x n x n) of sub-layer k per position of
        ``stream`` (T x B x n x C, or T x B x 1 x C for n equal streams), in float32 (float64 in
        a float64 model) whatever the model's dtype or autocast. ``own``: the pass's slot (the
        parameters' slices)."""
        n, dtype = self.streams, statistics_dtype(stream)

        def param(name):
            return own.sublayer(self, name, k).to(dtype)
        with torch.autocast(device_type=stream.device.type, enabled=False):
            maps = own.sublayer(self, "maps", k)
            if self.fused and self.fused_coefficients and fused.runs_on(stream):
                # the same function in one kernel each way (the norm, the gates, the biases,
                # the sigmoids)
                x, weight = self._flattened(stream, maps)
                out = fused.mhc_coefficients(x, weight, param("gates"), param("bias_pre"),
                                             param("bias_post"), param("bias_res").flatten())
                h_pre, h_post, res = out.split([n, n, out.size(-1) - 2 * n], dim=-1)
            else:
                mixes = self._mixes(stream, maps)  # ... x m
                # unbound, not indexed: an index's backward zero-fills the three gates
                gate_pre, gate_post, gate_res = param("gates").unbind(0)
                pre, post, res = mixes.split([n, n, mixes.size(-1) - 2 * n], dim=-1)
                h_pre = torch.sigmoid(gate_pre * pre + param("bias_pre"))
                h_post = 2 * torch.sigmoid(gate_post * post + param("bias_post"))
                res = gate_res * res + param("bias_res").flatten()
            if not self.lite:
                res = res.unflatten(-1, (n, n))
            h_res = self._mixing(res)
        return h_pre, h_post, h_res

    def _mixing(self, logits: Tensor) -> Tensor:
        """H_res (... x n x n) from its logits: ... x n x n, Sinkhorn-Knopp; ... x n!, the
        softmax mixture of the permutation matrices (lite)."""
        if self.lite:
            return torch.einsum("...p,pij->...ij", torch.softmax(logits, dim=-1),
                                self.permutations.to(logits.dtype))
        return sinkhorn(logits, self.iterations, self.fused and fused.runs_on(logits))

    def weights(self, stream: Tensor, k: int, own) -> Tuple[Tensor, Tensor]:
        h_pre, h_post, h_res = self.coefficients(stream, k, own)
        # the multi-stream product reads A_m = H_pre and mixes with A_r^T H: A_r = H_res^T
        alpha = torch.cat([h_pre.unsqueeze(-1), h_res.transpose(-1, -2)], dim=-1)
        return alpha.to(stream.dtype), h_post.to(stream.dtype)

    def reduce(self, state: StackState) -> Tensor:
        if self.readout != "learned":
            return super().reduce(state)
        stream = state.stream
        dtype = statistics_dtype(stream)
        with torch.autocast(device_type=stream.device.type, enabled=False):
            w = torch.sigmoid(self.readout_gate.to(dtype) * self._mixes(stream, self.readout_map)
                              + self.readout_bias.to(dtype))  # ... x n
        # sum_j w_j x_j: one product per position
        return torch.matmul(w.to(stream.dtype).unsqueeze(-2),
                            self.full_streams(state)).squeeze(-2)

    def logged_weights(self) -> Dict[str, Tensor]:
        """The static part (the biases through their maps) of every sub-layer k:
        H_pre and H_post per stream, and the mean diagonal of H_res (how much each stream
        keeps itself)."""
        out = {}
        n = self.streams
        with torch.no_grad():
            for k in range(len(self.sites)):
                h_pre = torch.sigmoid(self.bias_pre[k].float())
                h_post = 2 * torch.sigmoid(self.bias_post[k].float())
                h_res = self._mixing(self.bias_res[k].float())
                for r in range(n):
                    out[f"k{k}_pre{r}"] = h_pre[r]
                    out[f"k{k}_post{r}"] = h_post[r]
                out[f"k{k}_keep"] = torch.diagonal(h_res).mean()
        return out

    def macs(self, embed_dim: int) -> int:
        """Per token: the maps (nC x m) and the RMS norm (nC), Sinkhorn (2 t n^2; lite: n! n^2)
        and the stream product at every sub-layer; the learned readout once per stack."""
        n, d, k = self.streams, embed_dim, len(self.sites)
        m = self.maps.size(1)
        mixing = math.factorial(n) * n * n if self.lite else 2 * self.iterations * n * n
        total = k * (n * d * m + n * d + mixing + self.stream_macs(d))
        if self.readout == "learned":
            total += n * d * n + n * d
        return total

    def extra_repr(self) -> str:
        kind = "lite" if self.lite else f"sinkhorn, iterations={self.iterations}"
        return (f"n={self.streams}, {kind}, sub-layers={len(self.sites)}, init={self.init}, "
                f"readout={self.readout}")
