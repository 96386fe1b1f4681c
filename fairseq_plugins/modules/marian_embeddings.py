"""Input embeddings that behave as Hugging Face's Marian (opus-mt) computes them.

- :class:`MarianSinusoidalPositionalEmbedding`: positions from 0, angle pos / 10000^(2i/d) for
  dimension pair i, sines in the first half of the vector and cosines in the second (fairseq's own
  sinusoids start at padding_idx + 1 and use another frequency scale).
- :class:`ZeroStartEmbedding`: the decoder's first input is the zero vector. Marian starts
  decoding from ``<pad>``, whose embedding is zero; fairseq starts from ``</s>``, which as a
  decoder input only ever appears at position 0, so that token's embedding is zeroed there.
"""
from typing import Dict, Optional

import torch
from torch import Tensor, nn


class MarianSinusoidalPositionalEmbedding(nn.Module):
    """B x T tokens -> B x T x C positions; same call signature as fairseq's position modules.

    Real tokens are numbered 0, 1, ... from the first non-pad token, so left-padded fairseq
    batches get the positions Marian gives the same sentence right-padded. Pad positions get 0
    (they are masked everywhere). The table is a non-persistent buffer: nothing in checkpoints.
    """

    def __init__(self, num_positions: int, embedding_dim: int, padding_idx: int):
        super().__init__()
        self.padding_idx = padding_idx
        self.max_positions = num_positions
        self.register_buffer("table", self.build_table(num_positions, embedding_dim),
                             persistent=False)

    @staticmethod
    def build_table(num_positions: int, dim: int) -> Tensor:
        pos = torch.arange(num_positions, dtype=torch.float64).unsqueeze(1)
        pair = torch.arange(dim, dtype=torch.float64) // 2
        angle = pos / torch.pow(10000.0, 2 * pair / dim)
        half = (dim + 1) // 2
        table = torch.zeros(num_positions, dim, dtype=torch.float64)
        table[:, :half] = torch.sin(angle[:, 0::2])
        table[:, half:] = torch.cos(angle[:, 1::2])
        return table.float()

    def forward(self, tokens: Tensor,
                incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None,
                positions: Optional[Tensor] = None) -> Tensor:
        bsz, seq_len = tokens.shape
        if positions is None:
            if incremental_state is not None:
                # generation feeds the whole prefix: the new token is at position seq_len - 1
                positions = tokens.new_full((bsz, 1), seq_len - 1)
            else:
                mask = tokens.ne(self.padding_idx).long()
                positions = (torch.cumsum(mask, dim=1) - 1).clamp(min=0) * mask
        if int(positions.max()) >= self.max_positions:
            raise ValueError(f"position {int(positions.max())} is beyond the "
                             f"{self.max_positions} sinusoidal positions (--max-*-positions)")
        return self.table[positions]


class ZeroStartEmbedding(nn.Embedding):
    """An embedding that shares ``shared``'s weight Parameter and returns zeros for ``start_idx``.

    The weight is the same Parameter object (tied with the encoder and the output projection),
    so the state dict, the optimizer and weight tying see one tensor.
    """

    def __init__(self, shared: nn.Embedding, start_idx: int):
        super().__init__(shared.num_embeddings, shared.embedding_dim, shared.padding_idx,
                         _weight=shared.weight.detach())
        self.weight = shared.weight
        self.start_idx = start_idx

    def forward(self, tokens: Tensor) -> Tensor:
        return super().forward(tokens).masked_fill(tokens.eq(self.start_idx).unsqueeze(-1), 0.0)
