"""The machinery of the connections with n residual streams per position (T x B x n x w):
Hyper-Connections (:mod:`.hyper_connections`), mHC and mHC-lite (:mod:`.mhc`) and
Frac-Connections (:mod:`.frac_connections`) are each a :class:`MultiStream` that gives its
weights; the read, the mixing, the write, the readout, ``--stream-recompute`` (:mod:`.recompute`)
and the fused GPU product (:mod:`.fused`) are here, once. :func:`statistics_dtype` and
:func:`mean_square` are the statistics helpers the connections with coefficients share (AttnRes
too).
"""
from contextlib import nullcontext
from typing import Any, Callable, ContextManager, Dict, Optional, Tuple

import torch
from torch import Tensor, nn

from . import fused
from ..weight_logging import Record, WeightSource
from .interface import Connection, Inputs, Layout, StackState
from .recompute import Recompute


def statistics_dtype(stream: Tensor) -> torch.dtype:
    """The dtype of a connection's statistics and coefficients: float32, or the stream's where
    it is wider (float64)."""
    return torch.promote_types(stream.dtype, torch.float32)


def mean_square(x: Tensor) -> Tensor:
    """The mean of x^2 over the last dimension, keepdim (one reduction: the squared norm; the
    connections' RMS and variance statistics, without a squared copy of x)."""
    return torch.linalg.vector_norm(x, dim=-1, keepdim=True).square() / x.size(-1)


class MultiStream(WeightSource, Connection):
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

    Once logging (:meth:`start_logging`, ``--log-layer-weights``) a training pass also composes
    the mixing matrices A_r^T of all sub-layers per position (the product across depth, as the
    mHC paper's stability diagnostic; in the pass's slot) and hands its "Amax gain" to the
    logger: the largest absolute row sum (forward) and column sum (backward) of the composite,
    the maximum over the positions."""

    needs_pre_norm = True
    additive = False
    # rebuild the sub-layers' inputs and the streams inside a block in the backward pass instead
    # of keeping them (:meth:`saving`): --stream-recompute, set at build time
    recompute = False

    def __init__(self, layout: Layout, streams: int, readout: str = "mean", reads: int = 1):
        super().__init__(layout)
        self.streams, self.readout, self.reads = streams, readout, reads
        # the sub-layers whose output streams are rebuilt in the backward pass (see write):
        # all but each block's last
        self._inside_block = {(i, name) for i, block in enumerate(self.layout)
                              for name in block[:-1]}
        self.record: Optional[Record] = None  # where a training pass's Amax gain goes

    def start_logging(self, record: Record):
        """Every training pass also composes the mixing matrices and hands ``record`` their
        Amax gain."""
        self.record = record

    def accepts_fused(self, where: str) -> bool:
        """The stream product's kernel takes up to ``fused.MAX_STREAMS`` streams."""
        return fused.streams_supported(self.streams, self.reads + self.streams, where)

    def start(self, x: Tensor) -> StackState:
        # R = 1: T x B x 1 x C (n equal streams); R = n: T x B x n x C/n (the fractions)
        return StackState(x.unflatten(-1, (self.reads, -1)), None)

    def new_slot(self, x: Tensor) -> "_Pass":
        return _Pass(Recompute() if self.recompute and torch.is_grad_enabled() else None)

    def saving(self, state: StackState) -> ContextManager:
        """With ``recompute`` and a gradient, the backward pass rebuilds the sub-layers' inputs
        and the streams between a block's sub-layers (:mod:`.recompute`)."""
        rebuilds = state.slot(self).recompute
        return rebuilds.hooks() if rebuilds is not None else nullcontext()

    def weights(self, stream: Tensor, k: int, own: "_Pass") -> Tuple[Tensor, Tensor]:
        """(alpha, beta) of sub-layer k for ``stream`` (T x B x n x w, or T x B x 1 x C for n
        equal streams): alpha ... x n x (R+n), beta ... x n (or n x (R+n) and n when static);
        ``own``: the pass's slot (its :meth:`_Pass.sublayer` slices of the parameters)."""
        raise NotImplementedError

    def read(self, state: StackState, block: int, sublayer: str) -> Tuple[Inputs, Any]:
        stream = state.stream
        own = state.slot(self)
        alpha, beta = self.weights(stream, self.sites[(block, sublayer)], own)
        read, mixed = self._products(alpha, stream)
        if self.record is not None and self.training:
            own.composite = self._composed(own.composite, alpha)
        # the input copied out (the sub-layer's LayerNorm would copy the strided view anyway):
        # saved for the backward pass as a view it would keep all of the product alive, (n+1) C
        # per token and sub-layer instead of C (measured: 120 MB of a 12-block LM's activations)
        query = read.flatten(-2).contiguous()
        # write's token: the mixed streams and beta; with a gradient, for a sub-layer other than
        # its block's last, what rebuilds the streams it writes (alpha and the streams it read)
        rebuild = None
        if own.recompute is not None:
            # the LayerNorm's saved input, rebuilt from alpha and the streams (kept for the
            # product's backward anyway): C per token and sub-layer less to keep
            own.recompute.add(query, self._rebuilt_input, alpha, stream)
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

    def _composed(self, composite: Optional[Tensor], alpha: Tensor) -> Tensor:
        """A_r^T composite (A_r^T: this sub-layer's mixing, ... x n x n)."""
        mixing = alpha[..., self.reads:].detach().float().transpose(-1, -2)
        return mixing if composite is None else torch.matmul(mixing, composite)

    def write(self, state: StackState, block: int, sublayer: str, out: Tensor, token: Any,
              post_norm=None):
        mixed, beta, rebuild = token  # A_r^T H (... x n x w), B (... x n), see read
        state.stream = self._new_streams(mixed, beta, out)
        if rebuild is not None:
            # the streams inside a block, rebuilt from the block's input streams (kept) and
            # the sub-layers' outputs (kept for beta's gradient): n C per token and sub-layer
            # less to keep, but for each block's output. Kept there, so that rebuilding the
            # streams for one sub-layer's backward recomputes a block at most
            state.slot(self).recompute.add(state.stream, self._rebuilt_streams, *rebuild, beta,
                                           out)

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
        if state.slot(self).composite is not None:
            composite = state.slot(self).composite.abs()
            self.record({"amax_gain_forward": composite.sum(-1).amax(),
                         "amax_gain_backward": composite.sum(-2).amax()})
        return self.reduce(state)

    def stream_macs(self, width: int) -> int:
        """Per token and sub-layer, streams of ``width`` w: read n R w, mix n^2 w, write n w."""
        n = self.streams
        return n * self.reads * width + n * n * width + n * width


class _Pass:
    """What a multi-stream connection keeps during one forward pass: ``recompute``, the
    :class:`~.recompute.Recompute` whose hooks rebuild tensors in the backward pass (None
    without --stream-recompute or a gradient); ``composite``, the product of the mixing
    matrices so far (... x n x n; None unless a training pass logs the Amax gain); the
    sub-layers' slices of the parameters stacked over them (:meth:`sublayer`)."""
    __slots__ = ("recompute", "composite", "slices")

    def __init__(self, recompute: Optional[Recompute]):
        self.recompute = recompute
        self.composite: Optional[Tensor] = None
        self.slices: Dict[str, Any] = {}

    def once(self, name: str, make: Callable[[], Any]) -> Any:
        """``make()``, computed on the first call of this pass under ``name`` (what depends on
        the parameters only, prepared for all sub-layers at once)."""
        if name not in self.slices:
            self.slices[name] = make()
        return self.slices[name]

    def sublayer(self, connection: nn.Module, name: str, k: int) -> Tensor:
        """Sub-layer k's slice of ``connection``'s parameter ``name`` (K x ...), the parameter
        unbound once per pass: where each sub-layer selects its slice, the backward pass pays
        per sub-layer and parameter a zero-filled gradient of the whole parameter and an
        addition (in a 12-block HC or mHC step ~190 of each, a launch apiece on a GPU); an
        unbind's backward is one stack."""
        return self.once(name, lambda: getattr(connection, name).unbind(0))[k]
