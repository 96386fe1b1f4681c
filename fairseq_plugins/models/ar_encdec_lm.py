"""``ar_encdec_lm``: the autoregressive encoder-decoder language model (yif-AI's
``autoregressive_encoder_decoder_transformer``, 2024).

tokens -> (token + position embedding) -> L causal pre-norm encoder blocks (no final LayerNorm)
-> one bias-free Linear(d, d) -> L decoder blocks [causal self-attention, cross-attention over
LN(final encoder output) causally masked (t reads encoder positions <= t), MLP] -> final
LayerNorm -> (optionally minus the *next* position's embedding) -> tied output layer.

Everything is causal, so it is a language model: fairseq's ``language_modeling`` task,
``fairseq-eval-lm`` and LM generation work unchanged, and incremental decoding caches keys and
values of every encoder self-attention, decoder self-attention and the growing cross-attention
memory (one step costs O(context)).

The embedding loss (criterion ``lm_embedding_loss``) needs the two LayerNorms this model builds
with ``--embedding-loss-norms`` (on by default when that criterion asks for an embedding loss);
in training the decoder's extra output then carries LN_a(token + position embedding) and
LN_b(encoder output, detached).
"""
from dataclasses import dataclass
from typing import Optional

from torch import nn

from ..modules.lm_blocks import (CrossDecoderBlock, PreNormBlock, built_once_per_search,
                                 layer_norm, memory_projection, project_memories)
from ..config import architecture, option
from ..registry import register_model, register_model_architecture
from .. import depth
from ..criterions import embedding_loss_contract
from ..depth.interface import run_blocks
from .causal_lm_base import CausalLM, CausalLMConfig, CausalLMDecoder, build_stack, lm_sizes
from .layerwise import bridge

MODEL_NAME = "ar_encdec_lm"
POS_SUBTRACTION = ("none", "yes_no_ln", "yes_ln")
REFERENCE_CROSS_HEADS = 10  # the reference configuration's cross-attention heads


@dataclass
class ArEncDecLMConfig(bridge.CONFIG, CausalLMConfig):
    """The options of ``ar_encdec_lm`` (flags ``--cross-attention-heads`` ...; hydra
    ``model.cross_attention_heads`` ...), beside those both language models share, and the
    encoder-decoder bridge's (``--bridge``: as in ``layerwise_transformer``)."""
    cross_attention_heads: Optional[int] = option(
        None, "heads of the decoder's causal cross-attention", minimum=1, metavar="H",
        default_text=f"the --arch's; ar_encdec_lm: {REFERENCE_CROSS_HEADS}")
    pos_embed_subtraction: Optional[str] = option(
        "none", "after the final LayerNorm, subtract the next position's embedding (yes_no_ln; "
                "yes_ln: then a LayerNorm)", choices=POS_SUBTRACTION)
    decoder_block_order: Optional[str] = option(
        "original", "original: self-attention, cross-attention, MLP; alt: cross-attention "
                    "first", choices=("original", "alt"))
    ln_before_decoder_input: Optional[bool] = option(
        False, "LayerNorm on the encoder output before the decoder-input projection")
    add_pos_embed_to_decoder: Optional[bool] = option(
        False, "add positions 1..T to the decoder input")
    embedding_loss_norms: Optional[bool] = option(
        None, "build the embedding loss's two LayerNorms",
        default_text="on when --criterion lm_embedding_loss has an --embedding-loss")


class ArEncDecDecoder(CausalLMDecoder):
    """tokens B x T -> logits B x T x V (see module doc). The positional table has context + 1
    rows: row t + 1 is subtracted at position t (and added to the decoder input with
    ``--add-pos-embed-to-decoder``)."""

    def __init__(self, args, dictionary):
        super().__init__(args, dictionary, extra_positions=1)
        d, bias = args.embed_dim, args.bias
        ffn = args.ffn_embed_dim or 4 * d
        self.encoder_depth, self.encoder_layers = build_stack(
            args, "encoder", PreNormBlock, args.attention_heads, ffn)
        self.decoder_input_layer_norm = (layer_norm(d, bias) if args.ln_before_decoder_input
                                         else None)
        self.decoder_input_proj = nn.Linear(d, d, bias=False)
        self.add_pos_embed_to_decoder = args.add_pos_embed_to_decoder
        self.depth, self.layers = build_stack(
            args, "decoder", CrossDecoderBlock, args.attention_heads, args.cross_attention_heads,
            ffn, order=args.decoder_block_order)
        # --bridge: decoder block i cross-attends to its own combination M_i of the encoder's
        # states (per position: causal, as the encoder is)
        self.bridge = (bridge.build_sized(bridge.resolve(args), d, len(self.encoder_layers),
                                          len(self.layers))
                       if bridge.enabled(args) else None)
        self.pos_embed_subtraction = args.pos_embed_subtraction
        self.pos_subtraction_layer_norm = (layer_norm(d, bias)
                                           if args.pos_embed_subtraction == "yes_ln" else None)
        # the embedding loss's LayerNorms: weight and bias, whatever --bias says (as the reference)
        self.embedding_loss_norms = (
            nn.ModuleDict({"embeddings": layer_norm(d, True), "encoder_out": layer_norm(d, True)})
            if args.embedding_loss_norms else None)

    def extract_features(self, prev_output_tokens, incremental_state=None, **unused):
        positions = self.positions(prev_output_tokens, incremental_state)
        if incremental_state is not None:
            prev_output_tokens = prev_output_tokens[:, -1:]
        embedded = self.embed(prev_output_tokens, positions)  # B x T x C
        x = self.dropout(embedded).transpose(0, 1)
        step = {"incremental_state": incremental_state}
        states = [] if self.bridge is not None else None
        encoder_out = run_blocks(self.encoder_depth, self.encoder_layers, x, lambda i: step,
                                 states=states)
        x = encoder_out  # T x B x C, raw (no final LayerNorm)

        if self.decoder_input_layer_norm is not None:
            x = self.decoder_input_layer_norm(x)
        x = self.decoder_input_proj(x)
        next_positions = self.embed_positions(positions + 1)[:, None]  # T x 1 x C
        if self.add_pos_embed_to_decoder:
            x = x + next_positions
        projection = built_once_per_search(self, incremental_state, "memory_projection",
                                           lambda: memory_projection(self.layers))
        if self.bridge is None:
            memories = project_memories(self.layers, encoder_out, projection)
        else:  # h_N as the decoder reads it: the stack's output
            bridged = self.bridge(bridge.bridge_inputs(self.bridge, states[:-1] + [encoder_out]))
            memories = project_memories(self.layers, list(bridged.unbind(0)), projection)
        x = run_blocks(self.depth, self.layers, x,
                       lambda i: {"memory_kv": memories[i], **step})
        x = self.head(x, positions)

        extra = {"attn": [None], "encoder_out": encoder_out.transpose(0, 1)}
        if self.training and self.embedding_loss_norms is not None:
            embedding_loss_contract.attach(
                extra, self.embedding_loss_norms["embeddings"](embedded),
                self.embedding_loss_norms["encoder_out"](encoder_out.detach().transpose(0, 1)))
        return x, extra

    def head(self, x, positions):
        """What follows the last decoder block: the final LayerNorm and, with
        ``--pos-embed-subtraction``, the next position's embedding taken off (and normalised):
        x (T x B x C) -> features B x T x C."""
        x = self.final_layer_norm(x)
        if self.pos_embed_subtraction != "none":
            x = x - self.embed_positions(positions + 1)[:, None]
            if self.pos_subtraction_layer_norm is not None:
                x = self.pos_subtraction_layer_norm(x)
        return x.transpose(0, 1)


@register_model(MODEL_NAME, dataclass=ArEncDecLMConfig)
class ArEncDecLM(CausalLM):
    decoder_class = ArEncDecDecoder
    config_class = ArEncDecLMConfig
    model_name = MODEL_NAME
    # the reference configuration: d=150, 13 + 13 blocks, 5 self-attention heads (and 10
    # cross-attention heads: REFERENCE_CROSS_HEADS)
    reference_sizes = (150, 13, 5)
    stacks = ("encoder", "decoder")

    @classmethod
    def base_architecture(cls, args):
        args.cross_attention_heads = getattr(args, "cross_attention_heads",
                                             REFERENCE_CROSS_HEADS)
        super().base_architecture(args)

    @classmethod
    def validate(cls, args):
        bridge.validate(args)
        bridge.record_init(args)
        if args.embed_dim % args.cross_attention_heads:
            raise ValueError(f"--cross-attention-heads={args.cross_attention_heads} must divide "
                             f"--embed-dim={args.embed_dim}")
        requested = embedding_loss_contract.requested(args)
        if args.embedding_loss_norms is None:
            args.embedding_loss_norms = requested is not None
        elif requested and not args.embedding_loss_norms:
            raise ValueError(f"--embedding-loss {requested} needs the embedding-loss LayerNorms: "
                             "drop --no-embedding-loss-norms")


def _preset(name, embed_dim, layers, heads, cross_heads, options=None):
    def arch(args):
        lm_sizes(args, embed_dim, layers, heads)
        args.cross_attention_heads = getattr(args, "cross_attention_heads", cross_heads)
        for key, value in (options or {}).items():
            setattr(args, key, getattr(args, key, value))

    arch.__name__ = arch.__qualname__ = name
    return register_model_architecture(MODEL_NAME, name)(architecture(arch))


# --arch ar_encdec_lm is registered by register_model (its sizes: reference_sizes above)
_preset("ar_encdec_lm_yif", *ArEncDecLM.reference_sizes, REFERENCE_CROSS_HEADS)
_preset("ar_encdec_lm_tiny", embed_dim=32, layers=2, heads=4, cross_heads=4)
# the depth connections at the tiny size: ar_encdec_lm_<method>_tiny (fairseq_plugins.depth)
for _name, _options in depth.PRESETS.items():
    _preset(f"ar_encdec_lm_{_name}_tiny", 32, 2, 4, 4, _options)
# the encoder-decoder bridges over its encoder: ar_encdec_lm_{bridge,transparent}_tiny
_preset("ar_encdec_lm_bridge_tiny", 32, 2, 4, 4, {"bridge": "fc"})
_preset("ar_encdec_lm_transparent_tiny", 32, 2, 4, 4, {"bridge": "transparent"})
