"""What the two language models (yif-AI's ``autoregressive_encoder_decoder_transformer``, 2024)
share: flags, embeddings, output, init, counts.

``gpt_baseline_lm`` and ``ar_encdec_lm`` are fairseq language models (``--task
language_modeling``, ``fairseq-eval-lm``, LM generation): a :class:`CausalLMDecoder` subclass
maps tokens (B x T) to logits (B x T x V) and supports fairseq's incremental decoding.
Conventions of the reference: learned absolute positions, no embedding scaling, output tied to
the token embedding without bias, init N(0, 0.02) with residual projections at
0.02 / sqrt(2 L), optionally no bias anywhere (``--no-bias``).
"""
import logging
import math
from argparse import Namespace
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fairseq.models import FairseqIncrementalDecoder, FairseqLanguageModel

from .. import config, depth, errors, weight_logging
from ..checkpoint_names import NamesCheckpointMismatch
from ..depth.lrf import RecordsFusionWeights
from ..config import from_config, option
from ..depth import fusion
from ..modules.lm_blocks import layer_norm
from ..modules import precision

logger = logging.getLogger(__name__)


@dataclass
class CausalLMConfig(*reversed(depth.CONFIGS), weight_logging.WeightLoggingConfig):
    """The options both language models share (flags ``--embed-dim`` ...; hydra
    ``model.embed_dim`` ...), the depth connections' among them (``--decoder-fusion``,
    ``--hyper-connections`` ...: :mod:`fairseq_plugins.depth`). The sizes' defaults are the
    architecture's (``--arch``)."""
    embed_dim: Optional[int] = option(None, "model width d", minimum=1, metavar="D",
                                      default_text="the --arch's")
    layers: Optional[int] = option(None, "number of blocks (ar_encdec_lm: L encoder blocks and "
                                         "L decoder blocks)", minimum=1, metavar="L",
                                   default_text="the --arch's")
    attention_heads: Optional[int] = option(None, "(self-)attention heads; must divide "
                                                  "--embed-dim", minimum=1, metavar="H",
                                            default_text="the --arch's")
    ffn_embed_dim: Optional[int] = option(None, "MLP hidden size", minimum=1, metavar="N",
                                          default_text="4 x --embed-dim")
    dropout: Optional[float] = option(0.0, "dropout on embeddings, attention weights and "
                                           "residual branches", minimum=0.0, maximum=1.0,
                                      metavar="P")
    bias: Optional[bool] = option(False, "biases in the blocks' Linear layers and LayerNorms "
                                         "(--no-bias: none there, as the reference's "
                                         "use_bias=false; a depth connection's module, e.g. "
                                         "LRF's fuse-attention, keeps its own)")
    max_target_positions: Optional[int] = option(
        None, "context size: the positional table's length", minimum=1, metavar="N",
        default_text="--tokens-per-sample")
    tokens_per_sample: Optional[int] = from_config(
        "task.tokens_per_sample", "the task's context: the default --max-target-positions")
    criterion: Optional[str] = from_config(
        "criterion._name", "the training criterion: whether an embedding loss is asked for")
    embedding_loss: Optional[str] = from_config(
        "criterion.embedding_loss", "the embedding loss the criterion asks for, if any")


def lm_sizes(args, embed_dim, layers, heads):
    """An architecture's sizes (options already set are kept)."""
    args.embed_dim = getattr(args, "embed_dim", embed_dim)
    args.layers = getattr(args, "layers", layers)
    args.attention_heads = getattr(args, "attention_heads", heads)


def validate_lm_args(args, stacks=("decoder",)):
    """The checks between options (each option's own range is checked by the config);
    ``stacks``: the model's stacks ('encoder', 'decoder')."""
    for side in ("encoder", "decoder"):
        if side not in stacks and getattr(args, f"{side}_fusion", False):
            raise ValueError(f"--{side}-fusion: {args.arch} has no {side} stack; its stacks: "
                             f"{', '.join(f'--{s}-fusion' for s in stacks)}")
    depth.validate(args)
    if args.embed_dim % args.attention_heads:
        raise ValueError(f"--attention-heads={args.attention_heads} must divide "
                         f"--embed-dim={args.embed_dim}")
    if args.max_target_positions is None:
        args.max_target_positions = getattr(args, "tokens_per_sample", None) or 1024
    tokens = getattr(args, "tokens_per_sample", None)
    if tokens is not None and tokens > args.max_target_positions:
        raise ValueError(f"--tokens-per-sample={tokens} is longer than the positional table "
                         f"(--max-target-positions={args.max_target_positions})")


def build_stack(args, side: str, block_class, *sizes, **block_options):
    """One stack of ``args.layers`` blocks of ``block_class`` (``PreNormBlock`` or
    ``CrossDecoderBlock``, built as ``block_class(embed_dim, *sizes, bias, dropout, ...)``) and
    its depth connections -> (Depth, ModuleList of blocks)."""
    num, dim = args.layers, args.embed_dim
    stack_fusion = fusion.resolve(args, side, num, heads=args.attention_heads, dim=dim)

    def fuses(i):
        return (stack_fusion is not None and stack_fusion.kind == "attention"
                and i in stack_fusion.layers)

    layout = tuple(block_class.layout(fuses(i), **block_options) for i in range(num))
    stack_depth = depth.build(args, side, layout, dim, fusion=stack_fusion)
    blocks = nn.ModuleList(
        block_class(dim, *sizes, args.bias, args.dropout, index=i,
                    separate_kv=stack_depth.separate_inputs(i),
                    fusion=stack_fusion if fuses(i) else None, **block_options)
        for i in range(num))
    return stack_depth, blocks


class CausalLMDecoder(FairseqIncrementalDecoder):
    """Token + learned position embedding, a stack (subclasses), final LayerNorm, tied output.

    ``positions`` rows are positions 0..context-1 (+ ``extra_positions`` rows the subclass reads).
    Inputs are right-padded (fairseq's language_modeling default): a causal model never lets a
    real token see the padding after it.
    """

    def __init__(self, args, dictionary, extra_positions: int = 0):
        super().__init__(dictionary)
        d, bias = args.embed_dim, args.bias
        self.context = args.max_target_positions
        self.embed_tokens = nn.Embedding(len(dictionary), d, padding_idx=dictionary.pad())
        self.embed_positions = nn.Embedding(self.context + extra_positions, d)
        self.dropout = nn.Dropout(args.dropout)
        self.final_layer_norm = layer_norm(d, bias)
        self.num_layers_for_init = args.layers

    # -- shared steps ---------------------------------------------------------------------------
    def positions(self, prev_output_tokens: Tensor, incremental_state) -> Tensor:
        """0-based positions of the tokens this call processes (the last one when incremental)."""
        length = prev_output_tokens.size(1)
        if length > self.context:
            raise ValueError(f"input of {length} tokens is longer than the context "
                             f"(--max-target-positions={self.context})")
        start = length - 1 if incremental_state is not None else 0
        return torch.arange(start, length, device=prev_output_tokens.device)

    def embed(self, tokens: Tensor, positions: Tensor) -> Tensor:
        """Token + position embedding (no scaling), B x T x C (before dropout)."""
        return self.embed_tokens(tokens) + self.embed_positions(positions)[None]

    def forward(self, prev_output_tokens, encoder_out=None, incremental_state=None,
                features_only=False, **unused):
        """tokens B x T (with an incremental state: all tokens so far, the last one new) ->
        (logits B x T x V, or features with ``features_only``; extra dict)."""
        x, extra = self.extract_features(prev_output_tokens, incremental_state)
        return (x if features_only else self.output_layer(x)), extra

    def extract_features(self, prev_output_tokens, incremental_state=None, **unused):
        raise NotImplementedError

    def output_layer(self, features: Tensor) -> Tensor:
        return tied_output_projection(features, self.embed_tokens.weight)

    def max_positions(self):
        return self.context

    def init_weights(self):
        """N(0, 0.02) for every Linear and Embedding, 0.02/sqrt(2L) for residual projections
        (attention ``out_proj`` and MLP ``fc2``), zero biases; LayerNorms stay (1, 0). The
        depth connections (:class:`~fairseq_plugins.depth.interface.Depth`) keep their own
        initialisation (the methods' papers': e.g. MUDD's zero W2)."""
        residual_std = 0.02 / math.sqrt(2 * self.num_layers_for_init)
        connections = {name for name, module in self.named_modules()
                       if isinstance(module, depth.Depth)}
        for name, module in self.named_modules():
            if any(name.startswith(f"{c}.") for c in connections):
                continue
            if isinstance(module, (nn.Linear, nn.Embedding)):
                std = residual_std if name.endswith(("out_proj", "fc2")) else 0.02
                nn.init.normal_(module.weight, mean=0.0, std=std)
                if getattr(module, "bias", None) is not None:
                    nn.init.zeros_(module.bias)
        with torch.no_grad():
            self.embed_tokens.weight[self.embed_tokens.padding_idx].zero_()

    def reference_parameter_count(self) -> int:
        """Parameters counted as the reference does: the tied embedding once, the positional
        table not at all."""
        unique = {id(p): p for p in self.parameters()}
        return sum(p.numel() for p in unique.values()) - self.embed_positions.weight.numel()


class TiedOutputProjection(torch.autograd.Function):
    """logits = features @ W^T (features ... x C, W = the V x C token embedding), F.linear's
    value and gradients, with the weight gradient G^T X computed on X zero-padded to a multiple
    of 16 columns where :func:`precision.cpu_tuned` holds: on CPU (AVX-512) in float32 the
    V x C product with C = 150 (the reference's width) takes ~15% longer than with C = 160,
    more than the padding and the copy back cost. Elsewhere the weight gradient is the plain
    product. Autocast-aware (:func:`precision.autocast_inputs`): under autocast both inputs
    are cast to its dtype, as F.linear's are."""

    @staticmethod
    def forward(ctx, features: Tensor, weight: Tensor) -> Tensor:
        features, weight = precision.autocast_inputs(features, weight)
        ctx.save_for_backward(features, weight)
        tuned = precision.cpu_tuned(features) and precision.cpu_tuned(weight)
        ctx.pad = -features.size(-1) % 16 if tuned else 0
        return F.linear(features, weight)

    @staticmethod
    def backward(ctx, grad: Tensor):
        features, weight = ctx.saved_tensors
        grad_features = grad_weight = None
        if ctx.needs_input_grad[0]:
            grad_features = grad @ weight
        if ctx.needs_input_grad[1]:
            dim, pad = features.size(-1), ctx.pad
            x = features.reshape(-1, dim)
            grad_weight = grad.reshape(-1, grad.size(-1)).t() @ (F.pad(x, (0, pad)) if pad else x)
            grad_weight = grad_weight[:, :dim].contiguous() if pad else grad_weight
        return grad_features, grad_weight


def tied_output_projection(features: Tensor, weight: Tensor) -> Tensor:
    """features (... x C) @ weight (V x C)^T: :class:`TiedOutputProjection` where its padded
    weight gradient runs (:func:`precision.cpu_tuned`), else ``F.linear`` (equal values and
    gradients, tested)."""
    if precision.cpu_tuned(features) and precision.cpu_tuned(weight):
        return TiedOutputProjection.apply(features, weight)
    return F.linear(features, weight)


class CausalLM(NamesCheckpointMismatch, RecordsFusionWeights, weight_logging.LogsLayerWeights,
               FairseqLanguageModel):
    """A FairseqLanguageModel whose decoder is a :class:`CausalLMDecoder`. Subclasses name their
    ``decoder_class``, options (``config_class``, registered with the model), ``model_name``
    and ``reference_sizes`` (the sizes of ``--arch model_name``)."""

    decoder_class = None
    config_class = CausalLMConfig
    model_name = None
    reference_sizes = None
    stacks = ("decoder",)  # the model's stacks, as the depth-connection flags name them

    @classmethod
    def add_args(cls, parser):
        config.add_flags(parser, cls.config_class)

    @classmethod
    def base_architecture(cls, args):
        """The model's defaults: the reference sizes, then every option's default."""
        lm_sizes(args, *cls.reference_sizes)
        config.set_defaults(args, cls.config_class)

    @classmethod
    def complete(cls, args):
        validate_lm_args(args, cls.stacks)
        cls.validate(args)

    @classmethod
    def build_model(cls, cfg, task):
        """``cfg``: a Namespace, DictConfig or ``config_class`` instance (see
        :func:`fairseq_plugins.config.model_args`); every entry point builds the same model."""
        with errors.refusals():  # a bad option: one line, as argparse's (fairseq_plugins.errors)
            args = cls.resolved_options(cfg)
            decoder = cls.decoder_class(args, task.target_dictionary)
        decoder.init_weights()
        _unregister_missing_parameters(decoder)
        depth.weight_decay.exclude(args, [p for m in decoder.modules()
                                          if isinstance(m, depth.Depth)
                                          for p in m.connection_parameters()])
        model = cls(decoder)
        if args.log_layer_weights:
            with errors.refusals():  # a model without weights to log: refused in one line
                model.start_logging_layer_weights(
                    args.arch, depth.weight_flags(model.fusion_stacks()))
        logger.info("%s: %s parameters as the reference counts them (tied embedding once, "
                    "positional table excluded)", args.arch,
                    f"{decoder.reference_parameter_count():,}")
        return model

    @classmethod
    def resolved_options(cls, cfg) -> Namespace:
        """Every option of the model ``cfg`` asks for: given, else its preset's, else the
        model's default (:func:`fairseq_plugins.config.model_args`), checked."""
        return config.model_args(cfg, cls.config_class, cls.model_name, cls.base_architecture,
                                 complete=cls.complete)

    @classmethod
    def validate(cls, args):
        """Model-specific build-time checks (subclasses)."""

    def reference_parameter_count(self) -> int:
        return self.decoder.reference_parameter_count()

    def fusion_stacks(self):
        """The stacks whose fuse-attention weights :meth:`record_fusion_weights` keeps."""
        stacks = {"decoder": self.decoder.layers}
        if getattr(self.decoder, "encoder_layers", None) is not None:
            stacks["encoder"] = self.decoder.encoder_layers
        return stacks

    def max_positions(self):
        return self.decoder.max_positions()


def _unregister_missing_parameters(module: nn.Module):
    """Bias-free Linear/LayerNorm register ``bias = None``; fairseq's trainer catalogues shared
    parameters by identity and would report every such None as one parameter "shared" by all of
    them. Keep them as plain None attributes instead (forward reads them the same way)."""
    for sub in module.modules():
        for name in [n for n, p in sub._parameters.items() if p is None]:
            del sub._parameters[name]
            object.__setattr__(sub, name, None)

