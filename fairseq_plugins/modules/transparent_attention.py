"""Transparent attention (Bapna et al., EMNLP 2018, arXiv 1808.07561).

Decoder layer i cross-attends to a learned convex combination of the encoder's embedding output
h_0 and its layer outputs h_1 .. h_N, instead of h_N alone:

    M_i = sum_{j=0..N} softmax(w_i)_j h_j          (N + 1 scalars per decoder layer)

The logits w start at zero, i.e. every decoder layer starts with the uniform average of the N + 1
encoder states; that is the initialisation of lingvo's ``WeightedSumLayer`` (constant 0), the
combination layer of lingvo, the authors' framework (its dropout on the logits is not
implemented here). Unlike the FC bridge, the
model does not start as the plain transformer (a softmax cannot put all weight on h_N).
The memories are computed once per source sentence, as the FC bridge's.
"""
import logging
from typing import Dict, List

import torch
from torch import Tensor, nn

from ..weight_logging import WeightSource

logger = logging.getLogger(__name__)


class TransparentAttention(WeightSource, nn.Module):
    """``weight``: N_dec x (N + 1) logits. forward(states) with states = [h_0, ..., h_N], each
    S x B x C -> the decoder layers' memories, N_dec x S x B x C (the FC bridge's layout)."""

    first_layer_index = 0  # block 0 of its input is the embedding output h_0

    def __init__(self, num_states: int, num_decoder_layers: int):
        super().__init__()
        self.num_states = num_states
        self.weight = nn.Parameter(torch.zeros(num_decoder_layers, num_states))

    @property
    def num_decoder_layers(self) -> int:
        return self.weight.size(0)

    def combination_weights(self) -> Tensor:
        """softmax(w): N_dec x (N + 1), rows summing to 1 (row i: what decoder layer i reads)."""
        return torch.softmax(self.weight.float(), dim=-1)

    def logged_weights(self) -> Dict[str, Tensor]:
        """{'d<i>_e<j>': the weight decoder layer i (0-based) gives encoder state j (0: the
        embedding output)} (``--log-layer-weights``)."""
        weights = self.combination_weights().detach()
        return {f"d{i}_e{j}": weights[i, j]
                for i in range(weights.size(0)) for j in range(weights.size(1))}

    def forward(self, states: List[Tensor]) -> Tensor:
        if len(states) != self.num_states:
            raise ValueError(f"transparent attention over {self.num_states} encoder states got "
                             f"{len(states)}")
        stacked = torch.stack(states, dim=-1)  # S x B x C x (N+1)
        weights = self.combination_weights().to(stacked.dtype)  # N_dec x (N+1)
        # one matmul for every decoder layer: S x B x C x N_dec -> N_dec x S x B x C
        return torch.matmul(stacked, weights.t()).permute(3, 0, 1, 2)

    def upgrade_state_dict_named(self, state_dict, name):
        """Fine-tuning from a checkpoint without it: start from the uniform average."""
        key = f"{name}.weight" if name else "weight"
        if key not in state_dict:
            logger.info(f"{key} is not in the checkpoint: initialised uniform (zero logits)")
            state_dict[key] = torch.zeros_like(self.weight)

    @staticmethod
    def macs(embed_dim: int, num_states: int, num_decoder_layers: int, src_len: int) -> int:
        """Forward multiply-accumulates for one sentence: (N + 1) scaled vectors per decoder
        layer and source token, once per sentence."""
        return src_len * num_decoder_layers * num_states * embed_dim
