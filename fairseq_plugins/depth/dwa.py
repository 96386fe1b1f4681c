"""Depth-weighted averaging (DWA; DenseFormer, Pagliardini et al., NeurIPS 2024, arXiv 2402.02622).

In a stack of N blocks with outputs x_1 .. x_N and the embedding output x_0, a DWA after block s
(1-based) replaces the block's output by a learned scalar combination of the states so far,

    y_s = sum_{j in J(s)} alpha_{s,j} x_j,   J(s) = {j <= s : j = s (mod k)}   (dilation k)

and y_s is the input of block s + 1 (the stack's output is y_N when block N has a DWA). The
states combined are always the blocks' own outputs x_j, never earlier averages. With period p, only
the blocks s = p, 2p, ... have a DWA; the others pass x_s on unchanged. alpha_{s,s} = 1 and every
other weight 0 at initialisation, so the stack starts as the plain transformer, exactly.

Everything is per position: incremental decoding needs no cache.
"""
import logging
from typing import Dict, List, Tuple

import torch
from torch import Tensor, nn

from ..weight_logging import WeightSource
from .interface import Connection, Layout, StackState

logger = logging.getLogger(__name__)


def dwa_inputs(block: int, dilation: int) -> Tuple[int, ...]:
    """J(s): the states a DWA after 1-based ``block`` combines, ascending (state 0 = x_0)."""
    return tuple(range(block % dilation, block + 1, dilation))


def has_dwa(block: int, period: int) -> bool:
    """Whether 1-based ``block`` is followed by a DWA."""
    return block % period == 0


def identity_weights(num_inputs: int) -> Tensor:
    """alpha = (0, ..., 0, 1): the block's own output, so the stack starts as the transformer."""
    weights = torch.zeros(num_inputs)
    weights[-1] = 1.0
    return weights


class DepthWeightedAverage(WeightSource, nn.Module):
    """One DWA: ``weight`` holds alpha over ``inputs`` (indices into the stack's states).

    forward(states) with states = [x_0, ..., x_s] (each T x B x C) -> T x B x C.
    """

    def __init__(self, inputs: Tuple[int, ...]):
        super().__init__()
        self.inputs = tuple(inputs)
        self.weight = nn.Parameter(identity_weights(len(self.inputs)))

    @torch.no_grad()
    def reset_parameters(self):
        self.weight.copy_(identity_weights(len(self.inputs)))

    def forward(self, states: List[Tensor]) -> Tensor:
        newest = states[self.inputs[-1]]
        weight = self.weight.to(newest.dtype)
        # a running sum, not a stacked tensor: autograd keeps references to the states (which the
        # stack keeps anyway), no copy of them
        out = newest * weight[-1]
        for k, j in enumerate(self.inputs[:-1]):
            out = out + states[j] * weight[k]
        return out

    def logged_weights(self) -> Dict[str, Tensor]:
        """{'s<j>': alpha of state x_j} (``--log-layer-weights``)."""
        weight = self.weight.detach().float()
        return {f"s{j}": weight[k] for k, j in enumerate(self.inputs)}

    def upgrade_state_dict_named(self, state_dict, name):
        """Fine-tuning from a checkpoint without averages (e.g. fairseq's transformer): they start
        as the identity, so the model computes exactly what the checkpoint did."""
        key = f"{name}.weight" if name else "weight"
        if key not in state_dict:
            logger.info(f"{key} is not in the checkpoint: initialised as the identity")
            state_dict[key] = identity_weights(len(self.inputs)).to(self.weight)

    @staticmethod
    def macs(embed_dim: int, num_inputs: int) -> int:
        """Forward multiply-accumulates per token: one scaled vector per input."""
        return num_inputs * embed_dim

    def extra_repr(self) -> str:
        return f"inputs={self.inputs}"


class DepthWeightedAverages(Connection):
    """DWA as a depth connection: the history keeps x_0 and every block's own output; after
    every block in ``blocks`` (0-based; :func:`has_dwa` of a period), the average over
    :func:`dwa_inputs` becomes the stream, i.e. the next block's input (or the stack's output
    after the last block)."""

    name = "dwa"

    def __init__(self, layout: Layout, blocks, dilation: int = 1):
        super().__init__(layout, keep_history=True)
        self.dilation = dilation
        self.averages = nn.ModuleDict({
            str(i): DepthWeightedAverage(dwa_inputs(i + 1, dilation))
            for i in sorted(blocks)})

    def end_block(self, state: StackState, block: int):
        state.history.append(state.stream)
        average = self.averages[str(block)] if str(block) in self.averages else None
        if average is not None:
            state.stream = average(state.history)

    def macs(self, embed_dim: int) -> int:
        return sum(DepthWeightedAverage.macs(embed_dim, len(a.inputs))
                   for a in self.averages.values())
