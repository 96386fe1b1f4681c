"""``seq2seq_eval``: fairseq's ``translation`` task plus exact-match and CTER validation metrics.

Adds ``exact_match`` (``--eval-exact-match``) and ``cter_instance`` / ``cter_aggregate``
(``--eval-cter``) to the validation stats, next to translation's own ``--eval-bleu``, so that e.g.
``--best-checkpoint-metric exact_match --maximize-best-checkpoint-metric`` selects checkpoints on
them. Hypotheses are generated once per validation batch with the ``--eval-bleu-args`` generation
settings and detokenised with ``--eval-bleu-detok`` / ``--eval-bleu-remove-bpe`` (translation's
flags), whichever metrics are on.

Metrics are logged as sums, so they are exact under distributed validation: exact match as
(correct, count); CTER as wrong instances and one per-compound wrong-count vector, from which the
aggregate rate (compounds with any wrong context) is derived after all batches are summed.
"""
import json
import logging
from argparse import Namespace
from dataclasses import dataclass, field
from typing import Optional

import numpy as np
import torch

from fairseq import metrics, utils
from fairseq.data import encoders
from fairseq.tasks.translation import TranslationConfig, TranslationTask

from ..metrics.cter import CONTEXTS_PER_COMPOUND, instance_correct, read_lexicon
from ..metrics.exact_match import normalise
from ..metrics.generate_log import read_lines
from ..registry import register_task

logger = logging.getLogger(__name__)


@dataclass
class Seq2SeqEvalConfig(TranslationConfig):
    eval_exact_match: bool = field(
        default=False, metadata={"help": "validation metric exact_match: % of hypotheses equal to "
                                         "the reference after detokenisation (SCAN, COGS, CFQ)"})
    eval_cter: bool = field(
        default=False, metadata={"help": "validation metrics cter_instance / cter_aggregate "
                                         "(CoGnition); the validation subset must be cg-test in "
                                         "its original order"})
    eval_cter_compound: Optional[str] = field(
        default=None, metadata={"help": "compound file aligned with the validation subset "
                                        "(cg-test.compound)"})
    eval_cter_lexicon: Optional[str] = field(
        default=None, metadata={"help": "CoGnition lexicon file"})
    eval_cter_strict: bool = field(
        default=False, metadata={"help": "fix the official CTER tool's lexicon quirks"})


@register_task("seq2seq_eval", dataclass=Seq2SeqEvalConfig)
class Seq2SeqEvalTask(TranslationTask):
    cfg: Seq2SeqEvalConfig

    def __init__(self, cfg: Seq2SeqEvalConfig, src_dict, tgt_dict):
        super().__init__(cfg, src_dict, tgt_dict)
        self.compounds = self.lexicon = None
        if cfg.eval_cter:
            if not cfg.eval_cter_compound or not cfg.eval_cter_lexicon:
                raise ValueError("--eval-cter needs --eval-cter-compound and --eval-cter-lexicon")
            self.compounds = read_lines(cfg.eval_cter_compound)
            self.lexicon = read_lexicon(cfg.eval_cter_lexicon, strict=cfg.eval_cter_strict)
            if not self.compounds or len(self.compounds) % CONTEXTS_PER_COMPOUND:
                raise ValueError(f"{cfg.eval_cter_compound}: {len(self.compounds)} lines is not a "
                                 f"positive multiple of {CONTEXTS_PER_COMPOUND}")
        self._cached_generation = None

    @property
    def _generates(self):
        return self.cfg.eval_exact_match or self.cfg.eval_cter

    def load_dataset(self, split, epoch=1, combine=False, **kwargs):
        super().load_dataset(split, epoch=epoch, combine=combine, **kwargs)
        if self.compounds is not None and split != "train":
            n = len(self.datasets[split])
            if n != len(self.compounds):
                raise ValueError(
                    f"--eval-cter: subset '{split}' has {n} sentences but "
                    f"{self.cfg.eval_cter_compound} has {len(self.compounds)} lines; the "
                    "validation subset must be cg-test in its original order")

    def build_model(self, cfg, from_checkpoint=False):
        model = super().build_model(cfg, from_checkpoint)
        if self._generates and not self.cfg.eval_bleu:
            # translation builds these only for --eval-bleu; the same flags configure them here
            self.sequence_generator = self.build_generator(
                [model], Namespace(**json.loads(self.cfg.eval_bleu_args or "{}")))
            self.tokenizer = encoders.build_tokenizer(Namespace(
                tokenizer=self.cfg.eval_bleu_detok,
                **json.loads(self.cfg.eval_bleu_detok_args or "{}")))
        return model

    def inference_step(self, generator, models, sample, prefix_tokens=None, constraints=None):
        # translation's BLEU generates through this method too: reuse this batch's generation
        cached = self._cached_generation
        if cached is not None and cached[0] is sample and prefix_tokens is None:
            return cached[1]
        return super().inference_step(generator, models, sample, prefix_tokens, constraints)

    def _decode(self, tokens, unk_string):
        text = self.tgt_dict.string(tokens.int().cpu(), self.cfg.eval_bleu_remove_bpe,
                                    unk_string=unk_string)
        return self.tokenizer.decode(text) if self.tokenizer else text

    def valid_step(self, sample, model, criterion):
        if not self._generates:
            return super().valid_step(sample, model, criterion)
        model.eval()
        with torch.no_grad():
            gen_out = self.inference_step(self.sequence_generator, [model], sample)
        self._cached_generation = (sample, gen_out)
        try:
            loss, sample_size, logging_output = super().valid_step(sample, model, criterion)
        finally:
            self._cached_generation = None
        # distinct unk strings: an <unk> in the hypothesis never matches one in the reference
        hyps = [self._decode(out[0]["tokens"], "UNKNOWNTOKENINHYP") for out in gen_out]
        refs = [self._decode(utils.strip_pad(t, self.tgt_dict.pad()), "UNKNOWNTOKENINREF")
                for t in sample["target"]]
        if self.cfg.eval_exact_match:
            logging_output["_em_correct"] = sum(normalise(h) == normalise(r)
                                                for h, r in zip(hyps, refs))
            logging_output["_em_count"] = len(hyps)
        if self.cfg.eval_cter:
            ids = sample["id"].tolist()
            wrong = np.zeros(len(self.compounds) // CONTEXTS_PER_COMPOUND)
            seen = np.zeros_like(wrong)
            for i, hyp in zip(ids, hyps):
                ok = instance_correct(self.compounds[i], hyp, self.lexicon)
                wrong[i // CONTEXTS_PER_COMPOUND] += not ok
                seen[i // CONTEXTS_PER_COMPOUND] += 1
            logging_output["_cter_wrong"] = float(wrong.sum())
            logging_output["_cter_count"] = len(ids)
            logging_output["_cter_group_wrong"] = torch.from_numpy(wrong)
            logging_output["_cter_group_seen"] = torch.from_numpy(seen)
        return loss, sample_size, logging_output

    def reduce_metrics(self, logging_outputs, criterion):
        super().reduce_metrics(logging_outputs, criterion)

        def total(key):
            value = sum(log.get(key, 0) for log in logging_outputs)
            return value.cpu().numpy() if torch.is_tensor(value) else value

        if self.cfg.eval_exact_match and total("_em_count") > 0:
            metrics.log_scalar("_em_correct", total("_em_correct"))
            metrics.log_scalar("_em_count", total("_em_count"))
            metrics.log_derived("exact_match", lambda m: round(
                100.0 * m["_em_correct"].sum / m["_em_count"].sum, 2))
        if self.cfg.eval_cter and total("_cter_count") > 0:
            for key in ("_cter_wrong", "_cter_count", "_cter_group_wrong", "_cter_group_seen"):
                metrics.log_scalar(key, total(key))
            metrics.log_derived("cter_instance", lambda m: round(
                100.0 * m["_cter_wrong"].sum / m["_cter_count"].sum, 2))
            metrics.log_derived("cter_aggregate", lambda m: round(
                100.0 * float((m["_cter_group_wrong"].sum > 0).sum())
                / max(float((m["_cter_group_seen"].sum > 0).sum()), 1.0), 2))
