"""Encoder-decoder FC bridge (arXiv 2405.08570): each decoder layer reads all encoder layers.

Decoder layer i cross-attends to M_i = W_i [h_1; ...; h_N], a bias-free Linear(N*d -> d) of the
encoder layer outputs concatenated on the feature axis (block k = columns [(k-1)d, kd)); no norm,
activation or residual. The N_dec matrices are one parameter ``weight`` (N_dec x d x N*d;
``weight[i]`` is the paper's d x N*d matrix of decoder layer i), applied as a single matrix product.

Initialisations (``init``):
  original  W_i = [0 ... 0 I]: every layer reads the last encoder layer, i.e. the model without a
            bridge (exactly, see LayerwiseTransformerEncoder for which tensor is "last");
  gca       Granularity Consistent Attention: decoder layer j reads encoder layer N+1-j
            (anti-diagonal blocks), which needs N_dec == N (plus the embedding block if included);
  uniform   every block I/N (the average of the encoder layers);
  random    Xavier-uniform per W_i.
"""
import logging
from typing import Dict, List

import torch
from torch import Tensor, nn

from ..weight_logging import WeightSource

logger = logging.getLogger(__name__)

BRIDGE_INITS = ("original", "gca", "uniform", "random")


class LayerBridge(WeightSource, nn.Module):
    """Args:
        embed_dim: d.
        num_states: N, the number of encoder states concatenated (layers, + embedding output).
        num_decoder_layers: N_dec.
        init: one of ``BRIDGE_INITS``.
        first_layer_index: the encoder layer number of block 0 (1, or 0 with the embedding),
            used by ``gca`` to pair decoder layer j with encoder layer N+1-j.
    """

    def __init__(self, embed_dim: int, num_states: int, num_decoder_layers: int,
                 init: str = "original", first_layer_index: int = 1):
        super().__init__()
        if init not in BRIDGE_INITS:
            raise ValueError(f"--bridge-init {init!r}: choose from {', '.join(BRIDGE_INITS)}")
        self.embed_dim, self.num_states, self.init = embed_dim, num_states, init
        self.first_layer_index = first_layer_index
        self.weight = nn.Parameter(torch.empty(num_decoder_layers, embed_dim,
                                               num_states * embed_dim))
        self.reset_parameters()

    @property
    def num_decoder_layers(self) -> int:
        return self.weight.size(0)

    def source_block(self, decoder_layer: int) -> int:
        """Block read by 0-based ``decoder_layer`` under gca (anti-diagonal)."""
        last_layer = self.first_layer_index + self.num_states - 1  # N
        return last_layer - decoder_layer - self.first_layer_index  # layer N+1-j, j = i+1

    @staticmethod
    def macs(embed_dim: int, num_states: int, num_decoder_layers: int, src_len: int) -> int:
        """Forward multiply-accumulates of the bridge for one sentence: one Linear(N*d -> d) per
        decoder layer and source token, computed once per sentence (beam search reuses it).
        The decoder's cross-attention K/V projections are unchanged (each layer projects its
        own memory instead of the shared one)."""
        return src_len * num_decoder_layers * num_states * embed_dim * embed_dim

    @torch.no_grad()
    def reset_parameters(self):
        d, n = self.embed_dim, self.num_states
        eye = torch.eye(d)
        self.weight.zero_()
        for i in range(self.num_decoder_layers):
            w = self.weight[i]
            if self.init == "original":
                w[:, (n - 1) * d:] = eye
            elif self.init == "gca":
                k = self.source_block(i)
                w[:, k * d:(k + 1) * d] = eye
            elif self.init == "uniform":
                for k in range(n):
                    w[:, k * d:(k + 1) * d] = eye / n
            else:
                nn.init.xavier_uniform_(w)

    def forward(self, states: List[Tensor]) -> Tensor:
        """
        Args:
            states: N tensors of S x B x C (block order: lowest layer first).
        Returns:
            N_dec x S x B x C: the memory M_i of every decoder layer.
        """
        x = torch.cat(states, dim=-1)  # S x B x N*C
        out = torch.matmul(x, self.weight.view(-1, x.size(-1)).t())  # S x B x N_dec*C
        return out.view(*x.shape[:2], self.num_decoder_layers, self.embed_dim).permute(2, 0, 1, 3)

    def upgrade_state_dict_named(self, state_dict, name):
        """Fine-tuning from a checkpoint without a bridge: create the weights from ``init``.

        fairseq calls this before its strict load, so everything else must still match: an
        encoder of another depth or width is reported here, naming the mismatch.
        """
        key = f"{name}.weight" if name else "weight"
        if key in state_dict:
            return
        encoder = name.rsplit(".", 1)[0] + "." if "." in name else ""
        layers = {k[len(encoder) + len("layers."):].split(".")[0] for k in state_dict
                  if k.startswith(encoder + "layers.")}
        expected = self.num_states - (self.first_layer_index == 0)
        if len(layers) != expected:
            raise ValueError(f"checkpoint has {len(layers)} encoder layers, the bridge reads "
                             f"{expected} (--encoder-layers): cannot add a bridge to it")
        embed = state_dict.get(encoder + "embed_tokens.weight")
        if embed is not None and embed.size(1) != self.embed_dim:
            raise ValueError(f"checkpoint encoder has width {embed.size(1)}, the model's is "
                             f"{self.embed_dim} (--encoder-embed-dim)")
        logger.info(f"{key} is not in the checkpoint: initialised with --bridge-init {self.init}")
        state_dict[key] = self.weight.detach().clone()

    def block_norms(self) -> Tensor:
        """N_dec x N Frobenius norms of the d x d blocks (for heatmaps)."""
        return block_norms(self.weight.detach())

    def logged_weights(self) -> Dict[str, Tensor]:
        """{'d<i>_e<j>': norm of the block decoder layer i (0-based) reads from encoder state j
        (0: the embedding output)} (``--log-layer-weights``)."""
        norms = self.block_norms()
        return {f"d{i}_e{j + self.first_layer_index}": norms[i, j]
                for i in range(norms.size(0)) for j in range(norms.size(1))}


def block_norms(weight: Tensor) -> Tensor:
    """N_dec x N Frobenius norms of the d x d blocks of a bridge weight (N_dec x d x N*d)."""
    n_dec, d, width = weight.shape
    return weight.float().view(n_dec, d, width // d, d).pow(2).sum(dim=(1, 3)).sqrt()
