"""``lm_embedding_loss``: cross-entropy plus the embedding loss of the AR encoder-decoder LM.

As in yif-AI's autoregressive_encoder_decoder_transformer (2024): E = token + position embedding
of the input, avg[t] = mean(LN_a(E)[0..t]) (a cumulative mean over time), out = LN_b(encoder
output, detached); embedding loss = MSE(out, avg) (mean over all elements) or cosine:
mean_t(1 - (cos_t + 1) / 2). It is computed in training only, so that gradients reach the
embeddings and the two LayerNorms only (the encoder output is detached).

fairseq sums the cross-entropy over target tokens and divides the gradient by the sample size;
the reference averages CE per token. The embedding loss is therefore added as
``coeff * loss * ntokens``: after fairseq's normalisation the objective is mean CE + coeff x loss,
the reference's ratio (also with ``--sentence-avg``, which rescales both terms alike).
Logged: ``loss`` (the total, base 2 as fairseq), ``nll_loss`` (the cross-entropy alone, base 2,
with ``ppl``) and ``emb_loss`` (the embedding loss as defined above, unscaled).
"""
import math
from dataclasses import dataclass, field
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from fairseq import utils
from fairseq.criterions.cross_entropy import CrossEntropyCriterion, CrossEntropyCriterionConfig
from fairseq.dataclass import ChoiceEnum
from fairseq.logging import metrics

from ..registry import register_criterion
from . import embedding_loss_contract

EMBEDDING_LOSSES = embedding_loss_contract.KINDS


def embedding_loss(embeddings: Tensor, encoder_out: Tensor, kind: str,
                   mask: Optional[Tensor] = None) -> Tensor:
    """The embedding loss of B x T x C tensors LN_a(E) and LN_b(encoder output), averaged over
    the positions where ``mask`` (B x T) is True (all when None). Cosine on zero vectors is
    defined (cos = 0, so 0.5 per position), never NaN."""
    if kind not in ("mse", "cosine"):
        raise ValueError(f"unknown embedding loss {kind!r}; allowed: mse, cosine")
    steps = torch.arange(1, embeddings.size(1) + 1, device=embeddings.device,
                         dtype=embeddings.dtype)
    running_mean = embeddings.cumsum(dim=1) / steps[None, :, None]
    if kind == "mse":
        per_position = (encoder_out - running_mean).pow(2).mean(dim=-1)
    else:
        per_position = 1 - (F.cosine_similarity(encoder_out, running_mean, dim=-1, eps=1e-8) + 1) / 2
    if mask is None:
        return per_position.mean()
    return (per_position * mask).sum() / mask.sum().clamp(min=1)


@dataclass
class LMEmbeddingLossConfig(CrossEntropyCriterionConfig):
    embedding_loss: ChoiceEnum(EMBEDDING_LOSSES) = field(
        default="none", metadata={"help": "embedding loss added to the cross-entropy in training "
                                          "(ar_encdec_lm only): mse or cosine"})
    embedding_loss_coeff: Optional[float] = field(
        default=None, metadata={"help": "its weight relative to the per-token mean "
                                        "cross-entropy (default: 1; the reference's best run: 8)"})


@register_criterion(embedding_loss_contract.CRITERION, dataclass=LMEmbeddingLossConfig)
class LMEmbeddingLossCriterion(CrossEntropyCriterion):
    def __init__(self, task, sentence_avg, embedding_loss="none", embedding_loss_coeff=None):
        super().__init__(task, sentence_avg)
        kind = str(embedding_loss)
        if kind not in EMBEDDING_LOSSES:
            raise ValueError(f"--embedding-loss must be one of {EMBEDDING_LOSSES}, got {kind!r}")
        if kind == "none" and embedding_loss_coeff is not None:
            raise ValueError("--embedding-loss-coeff was given but --embedding-loss is none")
        coeff = 1.0 if embedding_loss_coeff is None else float(embedding_loss_coeff)
        if kind != "none" and not coeff > 0:
            raise ValueError(f"--embedding-loss-coeff must be > 0 with --embedding-loss {kind}, "
                             f"got {coeff} (use --embedding-loss none to switch it off)")
        self.embedding_loss, self.coeff = kind, coeff

    def forward(self, model, sample, reduce=True):
        net_output = model(**sample["net_input"])
        ce, _ = self.compute_loss(model, net_output, sample, reduce=reduce)
        ntokens = sample["ntokens"]
        sample_size = sample["target"].size(0) if self.sentence_avg else ntokens
        loss = ce
        logging_output = {"nll_loss": ce.data, "ntokens": ntokens,
                          "nsentences": sample["target"].size(0), "sample_size": sample_size}
        if self.embedding_loss != "none" and model.training:
            inputs = embedding_loss_contract.read(net_output[1])
            if inputs is None:
                raise RuntimeError(f"--embedding-loss {self.embedding_loss}: the model gave no "
                                   "embedding-loss inputs (ar_encdec_lm with its embedding-loss "
                                   "LayerNorms is needed)")
            mask = sample["target"].ne(self.padding_idx)
            value = embedding_loss(*inputs, self.embedding_loss, mask)
            loss = ce + self.coeff * value * ntokens
            logging_output["emb_loss"] = value.data * ntokens
        logging_output["loss"] = loss.data
        return loss, sample_size, logging_output

    @staticmethod
    def reduce_metrics(logging_outputs) -> None:
        def total(key):
            return sum(log.get(key, 0) for log in logging_outputs)

        loss, nll, emb = total("loss"), total("nll_loss"), total("emb_loss")
        ntokens, sample_size = total("ntokens"), total("sample_size")
        metrics.log_scalar("loss", loss / sample_size / math.log(2), sample_size, round=3)
        metrics.log_scalar("nll_loss", nll / ntokens / math.log(2), ntokens, round=3)
        metrics.log_derived("ppl", lambda meters: utils.get_perplexity(meters["nll_loss"].avg))
        if any("emb_loss" in log for log in logging_outputs):
            metrics.log_scalar("emb_loss", emb / ntokens, ntokens, round=4)

    @staticmethod
    def logging_outputs_can_be_summed() -> bool:
        return True
