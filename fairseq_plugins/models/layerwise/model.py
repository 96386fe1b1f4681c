"""The ``layerwise_transformer`` model: fairseq's Transformer with switchable layer-relationship
features, each owned by its module beside this one (``fusion``, ``bridge``, ``cross_attention``,
``marian``). With every switch off the model *is* fairseq's ``transformer`` (same modules, same
parameter names), so checkpoints and results compare directly. Options are checked in
:meth:`LayerwiseTransformerModel.build_model`, so a bad combination fails before training
starts."""
import os
from argparse import Namespace

from fairseq.models.transformer import TransformerModel, base_architecture
from fairseq.tasks.language_modeling import LanguageModelingTask

from ... import config, depth, errors, weight_logging
from ...checkpoint_names import NamesCheckpointMismatch
from ...depth.lrf import RecordsFusionWeights
from ...modules.causal_cross_attention import CausalCrossAttention
from ...registry import register_model
from . import bridge, options
from .decoder import LayerwiseTransformerDecoder
from .encoder import LayerwiseTransformerEncoder

MODEL_NAME = "layerwise_transformer"


def layerwise_base_architecture(args):
    """Every feature off: fairseq's ``transformer`` (base sizes)."""
    options.set_defaults(args)
    base_architecture(args)


def check_finetune_source(model, args):
    """``--finetune-from-model``: run the checkpoint's parameters through this model's
    ``upgrade_state_dict_named`` hooks at build time (on a copy), so that a checkpoint the model
    cannot start from (e.g. an encoder of another depth or width under a new bridge) stops the
    run here with the hook's own message, rather than inside fairseq's load, whose generic
    "please ensure that the architectures match" would be the last line."""
    from fairseq import checkpoint_utils

    path = getattr(args, "finetune_from_model", None)
    if not path or not os.path.isfile(path):
        return  # none, or fairseq's own "does not exist" error follows
    model.upgrade_state_dict(dict(checkpoint_utils.load_checkpoint_to_cpu(path)["model"]))


def complete(args):
    """The model's own checks; the bridge records the initialisation it starts from."""
    options.validate(args)
    bridge.record_init(args)


@register_model(MODEL_NAME, dataclass=options.LayerwiseTransformerConfig)
class LayerwiseTransformerModel(NamesCheckpointMismatch, RecordsFusionWeights,
                                weight_logging.LogsLayerWeights, TransformerModel):
    """fairseq's Transformer plus switchable layer-relationship features (see module doc)."""

    @classmethod
    def add_args(cls, parser):
        super().add_args(parser)
        options.add_args(parser)

    @classmethod
    def build_model(cls, cfg, task):
        """``cfg``: a Namespace, DictConfig or LayerwiseTransformerConfig (see
        :func:`fairseq_plugins.config.model_args`); every entry point builds the same model."""
        with errors.refusals():  # a bad option: one line, as argparse's (fairseq_plugins.errors)
            args = cls.resolved_options(cfg)
            if isinstance(task, LanguageModelingTask):  # e.g. fairseq-eval-lm on its checkpoint
                raise ValueError(
                    f"{args.arch} is a sequence-to-sequence model and cannot be built for the "
                    "language_modeling task (fairseq-eval-lm scores language models); score it "
                    "with fairseq-generate --score-reference")
            model = super().build_model(args, task)
        depth.weight_decay.exclude(args, [p for m in model.modules() if isinstance(m, depth.Depth)
                                          for p in m.connection_parameters()])
        check_finetune_source(model, args)
        if args.log_layer_weights:
            with errors.refusals():  # a model without weights to log: refused in one line
                model.start_logging_layer_weights(
                    args.arch, [f"--bridge {kind}" for kind in bridge.KINDS if kind != "none"]
                    + depth.weight_flags(depth.registry.SIDES, options.LACKS))
        return model

    @classmethod
    def resolved_options(cls, cfg) -> Namespace:
        """Every option of the model ``cfg`` asks for: given, else its preset's, else the
        model's default (:func:`fairseq_plugins.config.model_args`), checked."""
        return config.model_args(cfg, options.LayerwiseTransformerConfig, MODEL_NAME,
                                 layerwise_base_architecture, complete=complete)

    @classmethod
    def build_encoder(cls, cfg, src_dict, embed_tokens):
        return LayerwiseTransformerEncoder(cfg, src_dict, embed_tokens)

    @classmethod
    def build_decoder(cls, cfg, tgt_dict, embed_tokens):
        return LayerwiseTransformerDecoder(cfg, tgt_dict, embed_tokens,
                                           no_encoder_attn=cfg.no_cross_attention)

    def set_beam_size(self, beam_size: int):
        """fairseq's SequenceGenerator calls this (when the model has it) before a beam search.
        Only the hypothesis-dependent cross-attention variants take it: they then project and
        cache each source once per sentence instead of once per hypothesis. fairseq's own
        attention keeps its default, so standard layers decode exactly as in ``transformer``."""
        for module in self.decoder.modules():
            if isinstance(module, CausalCrossAttention):
                module.set_beam_size(beam_size)

    def fusion_stacks(self):
        """The stacks whose fuse-attention weights :meth:`record_fusion_weights` keeps."""
        return {"encoder": self.encoder.layers, "decoder": self.decoder.layers}
