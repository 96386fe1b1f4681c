"""``layerwise_transformer``: fairseq's Transformer with switchable layer-relationship features.

One seq2seq model; each feature is an independent switch, and named architectures are presets:

- layer-wise fusion (LRF; Zheng et al. 2023, arXiv 2307.10799): ``--encoder-fusion`` /
  ``--decoder-fusion`` add a fuse-attention sub-layer (:mod:`fairseq_plugins.modules.fuse_attention`) to every layer (or the
  ``--fusion-layers``) of that stack;
- encoder-decoder FC bridge (Song 2024, arXiv 2405.08570): ``--bridge fc`` gives every decoder
  layer its own cross-attention memory, a bias-free projection of all encoder layers
  (:mod:`fairseq_plugins.modules.layer_bridge`), computed once per source sentence;
- swapped-role cross-attention (README: "Swapped-role cross-attention"): ``--cross-attention
  swapped|inverted|decoder-values`` replaces the cross-attention of every decoder layer (or the
  ``--cross-attention-layers``) by a causally correct variant
  (:mod:`fairseq_plugins.modules.cross_attention`);
- Marian (opus-mt) compatibility, so that converted Hugging Face checkpoints run unchanged:
  ``--marian-positions``, ``--final-logits-bias``, ``--decoder-start-zero-embedding``
  (:mod:`fairseq_plugins.modules.marian_embeddings`).

With every switch off the model *is* fairseq's ``transformer`` (same modules, same parameter
names), so checkpoints and results compare directly. Options are checked in :meth:`build_model`,
so a bad combination fails before training starts.
"""
import argparse
import contextlib
import logging
import os
from typing import Dict, List, Optional

import torch
from torch import Tensor

from fairseq.models.transformer import (
    TransformerDecoderBase,
    TransformerEncoderBase,
    TransformerModel,
    base_architecture,
    tiny_architecture,
    transformer_iwslt_de_en,
)

from ..modules.causal_cross_attention import CausalCrossAttention
from ..modules.cross_attention import CROSS_ATTENTION_KINDS
from ..modules.fuse_attention import LayerHistory
from ..modules.layer_bridge import BRIDGE_INITS, LayerBridge
from ..modules.layerwise_layers import LayerwiseDecoderLayer, LayerwiseEncoderLayer
from ..modules.marian_embeddings import MarianSinusoidalPositionalEmbedding, ZeroStartEmbedding
from ..registry import register_model, register_model_architecture

logger = logging.getLogger(__name__)

MODEL_NAME = "layerwise_transformer"

# fairseq layer options that the explicit sub-layer order of LayerwiseEncoder/DecoderLayer (used
# with fusion or the bridge) does not implement, and would otherwise silently ignore.
_UNSUPPORTED_WITH_LAYERWISE = (
    "cross_self_attention", "scale_attn", "scale_heads", "scale_fc", "scale_resid",
    "checkpoint_activations",
)
# the fuse-attention reads its K/V weights directly (see FuseAttention) and the cross-attention
# variants build Linear layers of their own: quant-noise's hooks would miss them
_UNSUPPORTED_WITH_NEW_ATTENTION = ("quant_noise_pq",)


def add_fusion_args(parser):
    # fairseq hands add_args its model argument group already (nesting groups is deprecated)
    parser.add_argument("--encoder-fusion", action=argparse.BooleanOptionalAction,
                       help="add a fuse-attention sub-layer (over all lower layers' outputs, per "
                            "token) to the encoder layers (default: off; on in fusion_* presets)")
    parser.add_argument("--decoder-fusion", action=argparse.BooleanOptionalAction,
                       help="the same for the decoder layers")
    parser.add_argument("--fusion-heads", type=int, metavar="N",
                       help="attention heads of the fuse-attention (default: the stack's "
                            "--encoder/decoder-attention-heads); must divide the embedding dim")
    parser.add_argument("--fusion-layers", type=str, metavar="IDX,IDX,...",
                       help="0-based indices of the layers that fuse, in every fused stack, like "
                            "--encoder-layers-to-keep (default: all layers)")
    parser.add_argument("--fusion-include-embedding", action=argparse.BooleanOptionalAction,
                       help="include the embedding output h_0 among the fused states "
                            "(default: on, as in the paper)")


def add_bridge_args(parser):
    parser.add_argument("--bridge", choices=["none", "fc"],
                        help="fc: every decoder layer cross-attends to its own bias-free "
                             "projection of all encoder layers' outputs (default: none)")
    parser.add_argument("--bridge-init", choices=BRIDGE_INITS,
                        help="initialisation of the bridge: original = read the last encoder "
                             "layer (the model without a bridge), gca = decoder layer j reads "
                             "encoder layer N+1-j, uniform = average, random (default: original)")
    parser.add_argument("--bridge-include-embedding", action=argparse.BooleanOptionalAction,
                        help="also project the embedding output h_0 (default: off, as the paper)")


def add_cross_attention_args(parser):
    parser.add_argument("--cross-attention", choices=CROSS_ATTENTION_KINDS,
                        help="decoder cross-attention: standard (fairseq's), swapped (source "
                             "slots that also read the target prefix), inverted (causal doubly "
                             "normalised: a learned coverage penalty), decoder-values (values from "
                             "the decoder only; a negative control) (default: standard)")
    parser.add_argument("--cross-attention-layers", type=str, metavar="IDX,IDX,...",
                        help="0-based decoder layers that use the --cross-attention variant; the "
                             "others keep standard cross-attention (default: all layers)")
    parser.add_argument("--cross-attention-zero-init", action=argparse.BooleanOptionalAction,
                        help="swapped: initialise the decoder-value projection to zero, so that "
                             "the model starts exactly as standard cross-attention (e.g. to "
                             "fine-tune a standard model) (default: off)")
    parser.add_argument("--cross-attention-chunk-size", type=int, metavar="N",
                        help="swapped/decoder-values: target positions processed together in "
                             "training; memory grows as T x S x N per head (default: 16)")


def add_marian_args(parser):
    parser.add_argument("--marian-positions", action=argparse.BooleanOptionalAction,
                        help="sinusoidal positions as Hugging Face's Marian: from 0, frequency "
                             "10000^(-2i/d), sines then cosines (default: fairseq's)")
    parser.add_argument("--final-logits-bias", action=argparse.BooleanOptionalAction,
                        help="a fixed (not trained) bias added to the output logits, loaded from "
                             "the checkpoint: Marian's final_logits_bias (default: off)")
    parser.add_argument("--decoder-start-zero-embedding", action=argparse.BooleanOptionalAction,
                        help="the decoder's first input (fairseq's </s> start symbol) is the zero "
                             "vector, as Marian's <pad> start (default: off)")


def _parse_layers(spec: Optional[str], flag: str) -> Optional[List[int]]:
    if spec is None or spec == "":
        return None
    try:
        return sorted({int(tok) for tok in str(spec).split(",") if tok.strip() != ""})
    except ValueError:
        raise ValueError(f"{flag} must be comma-separated layer indices, got {spec!r}") from None


def fused_layer_indices(args, side: str) -> List[int]:
    """Validated 0-based indices of the fusing layers of ``side`` ('encoder' or 'decoder')."""
    num_layers = getattr(args, f"{side}_layers")
    if num_layers < 2:
        raise ValueError(
            f"--{side}-fusion needs at least 2 {side} layers (--{side}-layers={num_layers}): "
            "with one layer there is nothing below it to fuse"
        )
    first = 0 if args.fusion_include_embedding else 1
    requested = _parse_layers(args.fusion_layers, "--fusion-layers")
    if requested is None:
        return list(range(first, num_layers))
    for idx in requested:
        if not first <= idx < num_layers:
            allowed = f"{first}..{num_layers - 1}"
            why = "" if first == 0 else " (layer 0 has nothing below it without the embedding)"
            raise ValueError(f"--fusion-layers index {idx} is out of range for the {side}: "
                             f"allowed {allowed}{why}")
    return requested


def fusion_heads(args, side: str) -> int:
    heads = args.fusion_heads or getattr(args, f"{side}_attention_heads")
    dim = getattr(args, f"{side}_embed_dim")
    if heads <= 0 or dim % heads != 0:
        divisors = [h for h in range(1, dim + 1) if dim % h == 0 and h <= 64]
        raise ValueError(f"--fusion-heads={heads} must divide --{side}-embed-dim={dim}; "
                         f"allowed: {divisors}")
    return heads


def validate_args(args):
    """Build-time checks; raise ValueError naming the flag and the allowed values."""
    fused_sides = [s for s in ("encoder", "decoder") if getattr(args, f"{s}_fusion")]
    variant = args.cross_attention != "standard"
    unsupported = (_UNSUPPORTED_WITH_LAYERWISE
                   if fused_sides or args.bridge == "fc" or variant else ())
    unsupported += _UNSUPPORTED_WITH_NEW_ATTENTION if fused_sides or variant else ()
    for name in unsupported:
        if getattr(args, name, False):
            raise ValueError(f"--{name.replace('_', '-')} is not supported together with "
                             "--encoder-fusion/--decoder-fusion/--bridge fc/--cross-attention "
                             "other than standard")
    if not fused_sides and (args.fusion_layers or args.fusion_heads):
        raise ValueError("--fusion-layers/--fusion-heads were given but neither "
                         "--encoder-fusion nor --decoder-fusion is on")
    for side in fused_sides:
        fused_layer_indices(args, side)
        fusion_heads(args, side)
    validate_bridge_args(args)
    validate_cross_attention_args(args)


def cross_attention_layer_indices(args) -> List[int]:
    """Validated 0-based decoder layers that use the --cross-attention variant."""
    requested = _parse_layers(args.cross_attention_layers, "--cross-attention-layers")
    if requested is None:
        return list(range(args.decoder_layers))
    for idx in requested:
        if not 0 <= idx < args.decoder_layers:
            raise ValueError(f"--cross-attention-layers index {idx} is out of range: allowed "
                             f"0..{args.decoder_layers - 1} (--decoder-layers)")
    return requested


def validate_cross_attention_args(args):
    kind = args.cross_attention
    if kind == "standard":
        if args.cross_attention_layers or args.cross_attention_zero_init:
            raise ValueError("--cross-attention-layers/--cross-attention-zero-init were given "
                             "but --cross-attention is standard")
        return
    if getattr(args, "no_cross_attention", False):
        raise ValueError(f"--cross-attention {kind} with --no-cross-attention: there is no "
                         "cross-attention to replace")
    if args.cross_attention_zero_init and kind != "swapped":
        raise ValueError(f"--cross-attention-zero-init applies to swapped only (got {kind}): "
                         "inverted has no decoder values, decoder-values has nothing else")
    if args.cross_attention_chunk_size < 1:
        raise ValueError(f"--cross-attention-chunk-size must be >= 1, got "
                         f"{args.cross_attention_chunk_size}")
    if getattr(args, "decoder_xformers_att_config", None) or getattr(args, "xformers_att_config",
                                                                        None):
        raise ValueError(f"xformers attention is not supported with --cross-attention {kind}")
    cross_attention_layer_indices(args)


def validate_bridge_args(args):
    if args.bridge != "fc":
        if args.bridge_init is not None or args.bridge_include_embedding:
            raise ValueError("--bridge-init/--bridge-include-embedding were given but --bridge is "
                             f"{args.bridge!r}; add --bridge fc")
        return
    if getattr(args, "no_cross_attention", False):
        raise ValueError("--bridge fc feeds the cross-attention: not with --no-cross-attention")
    for name in ("encoder_layerdrop", "encoder_layers_to_keep"):
        if getattr(args, name, None):
            raise ValueError(f"--{name.replace('_', '-')} is not supported with --bridge fc: the "
                             "bridge reads every encoder layer")
    if (args.bridge_init or "original") == "gca" and args.encoder_layers != args.decoder_layers:
        raise ValueError(f"--bridge-init gca pairs decoder layer j with encoder layer N+1-j and "
                         f"needs --encoder-layers == --decoder-layers (got "
                         f"{args.encoder_layers} and {args.decoder_layers})")


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


@register_model(MODEL_NAME)
class LayerwiseTransformerModel(TransformerModel):
    """fairseq's Transformer plus switchable layer-relationship features (see module doc)."""

    @classmethod
    def add_args(cls, parser):
        super().add_args(parser)
        add_fusion_args(parser)
        add_bridge_args(parser)
        add_cross_attention_args(parser)
        add_marian_args(parser)

    @classmethod
    def build_model(cls, args, task):
        layerwise_base_architecture(args)
        validate_args(args)
        if args.bridge == "fc" and args.bridge_init is None:
            args.bridge_init = "original"
        model = super().build_model(args, task)
        check_finetune_source(model, args)
        return model

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

    # -- analysis -------------------------------------------------------------------------
    def _fuse_modules(self, side: str):
        layers = getattr(self, side).layers
        return [(i, l.fuse_attn) for i, l in enumerate(layers) if getattr(l, "fuse_attn", None)]

    def record_fusion_weights(self, enabled: bool = True):
        """Keep fuse-attention weights of the next forward passes (off by default: no cost)."""
        for side in ("encoder", "decoder"):
            for _, module in self._fuse_modules(side):
                module.keep_weights = enabled
                module.last_weights = None

    def fusion_weights(self) -> Dict[str, Dict[int, Tensor]]:
        """Weights of the last forward pass: {'encoder'|'decoder': {layer: B x H x T x L}}.

        L = number of states the layer attended (embedding output first, its own input last).
        Empty until :meth:`record_fusion_weights` was called before a forward pass.
        """
        return {side: {i: m.last_weights for i, m in self._fuse_modules(side)
                       if m.last_weights is not None}
                for side in ("encoder", "decoder")}


def _make_history(cfg, side: str) -> Optional[LayerHistory]:
    if not getattr(cfg, f"{side}_fusion", False):
        return None
    return LayerHistory(fused_layer_indices(cfg, side), cfg.fusion_include_embedding)


def _recording(history: Optional[LayerHistory]):
    """The stack's forward records its layers' inputs only when it fuses."""
    return history.recording() if history is not None else contextlib.nullcontext()


class LayerwiseTransformerEncoder(TransformerEncoderBase):
    """fairseq's encoder; with fusion, its layers see all lower layers' outputs; with the bridge,
    its output also holds every decoder layer's cross-attention memory.

    ``encoder_out["bridge_memories"]`` = [N_dec x S x B0 x C], computed once per source batch, and
    ``encoder_out["bridge_index"]`` = [B]: the row of B0 each current row (hypothesis) reads.
    :meth:`reorder_encoder_out` (called at every beam-search step) only reorders that index, so
    the memories are never copied; the decoder gathers them when it needs them (first step).
    """

    def __init__(self, cfg, dictionary, embed_tokens, return_fc=False):
        # Set before super().__init__(), which builds the layers (fairseq's legacy encoder
        # stores self.args the same way).
        self.fusion_history = _make_history(cfg, "encoder")
        self._layers_built = 0
        super().__init__(cfg, dictionary, embed_tokens, return_fc=return_fc)
        if getattr(cfg, "marian_positions", False) and self.embed_positions is not None:
            self.embed_positions = MarianSinusoidalPositionalEmbedding(
                cfg.max_source_positions, cfg.encoder.embed_dim, self.padding_idx)
        self.bridge = None
        if getattr(cfg, "bridge", "none") == "fc":
            with_embedding = bool(cfg.bridge_include_embedding)
            self.bridge = LayerBridge(cfg.encoder.embed_dim, cfg.encoder.layers + with_embedding,
                                      cfg.decoder.layers, cfg.bridge_init or "original",
                                      first_layer_index=0 if with_embedding else 1)

    def build_encoder_layer(self, cfg):
        if self.fusion_history is None:
            return super().build_encoder_layer(cfg)
        idx, self._layers_built = self._layers_built, self._layers_built + 1
        return LayerwiseEncoderLayer(cfg, self.fusion_history, idx, fusion_heads(cfg, "encoder"))

    def forward_scriptable(self, src_tokens, src_lengths: Optional[Tensor] = None,
                           return_all_hiddens: bool = False,
                           token_embeddings: Optional[Tensor] = None):
        with _recording(self.fusion_history):
            out = super().forward_scriptable(src_tokens, src_lengths,
                                             return_all_hiddens or self.bridge is not None,
                                             token_embeddings)
        if self.bridge is not None:
            states = out["encoder_states"]  # [h_0, h_1, ..., h_N]
            # the last block is the output as the decoder sees it (after a final LayerNorm, if
            # any), so that the "original" init is exactly the model without a bridge
            blocks = states[1:-1] + [out["encoder_out"][0]]
            if self.bridge.first_layer_index == 0:
                blocks = [states[0]] + blocks
            out["bridge_memories"] = [self.bridge(blocks)]
            out["bridge_index"] = [torch.arange(src_tokens.size(0), device=src_tokens.device)]
            if not return_all_hiddens:
                out["encoder_states"] = []
        return out

    def reorder_encoder_out(self, encoder_out: Dict[str, List[Tensor]], new_order):
        reordered = super().reorder_encoder_out(encoder_out, new_order)
        if encoder_out.get("bridge_memories"):
            reordered["bridge_memories"] = encoder_out["bridge_memories"]
            reordered["bridge_index"] = [encoder_out["bridge_index"][0].index_select(0, new_order)]
        return reordered


class LayerwiseTransformerDecoder(TransformerDecoderBase):
    """fairseq's decoder; with fusion, its layers see all lower layers' outputs (T x B x C); with
    the bridge, layer i cross-attends to the encoder's memory M_i."""

    def __init__(self, cfg, dictionary, embed_tokens, no_encoder_attn=False,
                 output_projection=None):
        self.fusion_history = _make_history(cfg, "decoder")
        self.uses_bridge = getattr(cfg, "bridge", "none") == "fc"
        kind = getattr(cfg, "cross_attention", "standard")
        self.cross_attention_kinds = (
            {} if kind == "standard" else dict.fromkeys(cross_attention_layer_indices(cfg), kind))
        self._layers_built = 0
        if getattr(cfg, "decoder_start_zero_embedding", False):
            embed_tokens = ZeroStartEmbedding(embed_tokens, start_idx=dictionary.eos())
        super().__init__(cfg, dictionary, embed_tokens, no_encoder_attn=no_encoder_attn,
                         output_projection=output_projection)
        if getattr(cfg, "marian_positions", False) and self.embed_positions is not None:
            self.embed_positions = MarianSinusoidalPositionalEmbedding(
                cfg.max_target_positions, cfg.decoder.embed_dim, self.padding_idx)
        if getattr(cfg, "final_logits_bias", False):
            # a buffer: saved and loaded with the model, never trained (as in Marian)
            self.register_buffer("final_logits_bias", torch.zeros(len(dictionary)))
        else:
            self.final_logits_bias = None

    def output_layer(self, features):
        logits = super().output_layer(features)
        if self.final_logits_bias is not None:
            logits = logits + self.final_logits_bias
        return logits

    def build_decoder_layer(self, cfg, no_encoder_attn=False):
        if (self.fusion_history is None and not self.uses_bridge
                and not self.cross_attention_kinds):
            return super().build_decoder_layer(cfg, no_encoder_attn)
        idx, self._layers_built = self._layers_built, self._layers_built + 1
        heads = fusion_heads(cfg, "decoder") if self.fusion_history is not None else None
        return LayerwiseDecoderLayer(cfg, self.fusion_history, idx, heads,
                                     no_encoder_attn=no_encoder_attn,
                                     cross_attention=self.cross_attention_kinds.get(idx, "standard"))

    def _bridge_memories(self, encoder_out, incremental_state):
        """Per-layer memories, or None when not needed (no bridge, or cross-attention cached)."""
        if not self.uses_bridge or encoder_out is None:
            return None
        if incremental_state is not None:
            cache = self.layers[0].encoder_attn._get_input_buffer(incremental_state)
            if "prev_key" in cache:  # static keys/values cached at the first step
                return None
        memories = encoder_out["bridge_memories"][0]
        index = encoder_out["bridge_index"][0]
        return memories.index_select(2, index).unbind(0)

    def extract_features_scriptable(self, prev_output_tokens, encoder_out, incremental_state=None,
                                    full_context_alignment=False, alignment_layer=None,
                                    alignment_heads=None):
        args = (prev_output_tokens, encoder_out, incremental_state, full_context_alignment,
                alignment_layer, alignment_heads)
        memories = self._bridge_memories(encoder_out, incremental_state)
        try:
            if memories is not None:
                for layer, memory in zip(self.layers, memories):
                    layer.cross_attention_memory = memory
            with _recording(self.fusion_history):
                return super().extract_features_scriptable(*args)
        finally:
            if memories is not None:
                for layer in self.layers:
                    layer.cross_attention_memory = None


# -- architectures -------------------------------------------------------------------------

@register_model_architecture(MODEL_NAME, MODEL_NAME)
def layerwise_base_architecture(args):
    """Every feature off: fairseq's ``transformer`` (base sizes)."""
    args.encoder_fusion = getattr(args, "encoder_fusion", False)
    args.decoder_fusion = getattr(args, "decoder_fusion", False)
    args.fusion_heads = getattr(args, "fusion_heads", None)
    args.fusion_layers = getattr(args, "fusion_layers", None)
    args.fusion_include_embedding = getattr(args, "fusion_include_embedding", True)
    args.bridge = getattr(args, "bridge", "none")
    args.bridge_init = getattr(args, "bridge_init", None)
    args.bridge_include_embedding = getattr(args, "bridge_include_embedding", False)
    args.cross_attention = getattr(args, "cross_attention", "standard")
    args.cross_attention_layers = getattr(args, "cross_attention_layers", None)
    args.cross_attention_zero_init = getattr(args, "cross_attention_zero_init", False)
    args.cross_attention_chunk_size = getattr(args, "cross_attention_chunk_size", 16)
    args.marian_positions = getattr(args, "marian_positions", False)
    args.final_logits_bias = getattr(args, "final_logits_bias", False)
    args.decoder_start_zero_embedding = getattr(args, "decoder_start_zero_embedding", False)
    base_architecture(args)


def _iwslt_de_en_shared(args):
    # The LRF paper's CoGnition setting: transformer_iwslt_de_en with shared decoder in/out embed.
    args.share_decoder_input_output_embed = getattr(args, "share_decoder_input_output_embed", True)
    transformer_iwslt_de_en(args)


_SIZES = {"": base_architecture, "_iwslt_de_en": _iwslt_de_en_shared, "_tiny": tiny_architecture}


def register_preset(name, size_fn, **defaults):
    """Register ``--arch name``: ``defaults`` (flag -> value, user flags win) on ``size_fn``."""

    def preset(args):
        for key, value in defaults.items():
            setattr(args, key, getattr(args, key, value))
        size_fn(args)
        layerwise_base_architecture(args)

    preset.__qualname__ = preset.__name__ = name
    register_model_architecture(MODEL_NAME, name)(preset)


# fusion_transformer{,_iwslt_de_en,_tiny}: both stacks fuse; fusion_enc_* / fusion_dec_*: the
# paper's ablation (encoder-only / decoder-only fusion).
_FUSION_SIDES = {"fusion": (True, True), "fusion_enc": (True, False), "fusion_dec": (False, True)}
for _prefix, (_enc, _dec) in _FUSION_SIDES.items():
    for _size, _size_fn in _SIZES.items():
        register_preset(f"{_prefix}_transformer{_size}", _size_fn, encoder_fusion=_enc,
                        decoder_fusion=_dec)

# bridge_transformer{,_tiny}: the FC bridge (original init unless --bridge-init says otherwise)
for _size in ("", "_tiny"):
    register_preset(f"bridge_transformer{_size}", _SIZES[_size], bridge="fc")


# {swapped,inverted,decoder_values}_transformer{,_iwslt_de_en,_tiny}: the cross-attention
# variants in every decoder layer
for _kind in CROSS_ATTENTION_KINDS[1:]:
    for _size, _size_fn in _SIZES.items():
        register_preset(f"{_kind.replace('-', '_')}_transformer{_size}", _size_fn,
                        cross_attention=_kind)


def _opus_mt_sizes(args):
    """Helsinki-NLP opus-mt (Marian) transformer: 6+6 layers, d=512, 8 heads, FFN 2048, SiLU,
    post-norm without final norms, scaled embeddings tied across encoder, decoder and output."""
    for key, value in (("encoder_embed_dim", 512), ("encoder_ffn_embed_dim", 2048),
                       ("encoder_layers", 6), ("encoder_attention_heads", 8),
                       ("decoder_layers", 6), ("decoder_attention_heads", 8),
                       ("activation_fn", "swish"), ("dropout", 0.1), ("attention_dropout", 0.0),
                       ("activation_dropout", 0.0), ("share_all_embeddings", True),
                       ("max_source_positions", 512), ("max_target_positions", 512)):
        setattr(args, key, getattr(args, key, value))
    base_architecture(args)


_MARIAN = dict(marian_positions=True, final_logits_bias=True, decoder_start_zero_embedding=True)
# opus_mt_de_en: loads checkpoints written by scripts/convert_opus_mt.py; bridge_opus_mt_de_en:
# the same with the FC bridge (fine-tune it with --finetune-from-model converted.pt)
register_preset("opus_mt_de_en", _opus_mt_sizes, **_MARIAN)
register_preset("bridge_opus_mt_de_en", _opus_mt_sizes, bridge="fc", **_MARIAN)
