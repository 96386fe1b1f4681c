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
import argparse

from torch import nn

from ..modules.lm_blocks import (CrossDecoderBlock, PreNormBlock, built_once_per_search,
                                 layer_norm, memory_projection, project_memories)
from ..registry import register_model, register_model_architecture
from ..criterions import embedding_loss_contract
from .causal_lm_base import CausalLM, CausalLMDecoder, add_lm_args, base_lm_args

MODEL_NAME = "ar_encdec_lm"
POS_SUBTRACTION = ("none", "yes_no_ln", "yes_ln")


class ArEncDecDecoder(CausalLMDecoder):
    """tokens B x T -> logits B x T x V (see module doc). The positional table has context + 1
    rows: row t + 1 is subtracted at position t (and added to the decoder input with
    ``--add-pos-embed-to-decoder``)."""

    def __init__(self, args, dictionary):
        super().__init__(args, dictionary, extra_positions=1)
        d, bias, drop = args.embed_dim, args.bias, args.dropout
        ffn = args.ffn_embed_dim or 4 * d
        self.encoder_layers = nn.ModuleList(
            PreNormBlock(d, args.attention_heads, ffn, bias, drop) for _ in range(args.layers))
        self.decoder_input_layer_norm = (layer_norm(d, bias) if args.ln_before_decoder_input
                                         else None)
        self.decoder_input_proj = nn.Linear(d, d, bias=False)
        self.add_pos_embed_to_decoder = args.add_pos_embed_to_decoder
        self.layers = nn.ModuleList(
            CrossDecoderBlock(d, args.attention_heads, args.cross_attention_heads, ffn, bias, drop,
                              order=args.decoder_block_order) for _ in range(args.layers))
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
        for layer in self.encoder_layers:
            x = layer(x, incremental_state=incremental_state)
        encoder_out = x  # T x B x C, raw (no final LayerNorm)

        if self.decoder_input_layer_norm is not None:
            x = self.decoder_input_layer_norm(x)
        x = self.decoder_input_proj(x)
        next_positions = self.embed_positions(positions + 1)[:, None]  # T x 1 x C
        if self.add_pos_embed_to_decoder:
            x = x + next_positions
        projection = built_once_per_search(self, incremental_state, "memory_projection",
                                           lambda: memory_projection(self.layers))
        memories = project_memories(self.layers, encoder_out, projection)
        for layer, memory_kv in zip(self.layers, memories):
            x = layer(x, memory_kv, incremental_state=incremental_state)
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


@register_model(MODEL_NAME)
class ArEncDecLM(CausalLM):
    decoder_class = ArEncDecDecoder

    @staticmethod
    def add_args(parser):
        add_lm_args(parser)
        parser.add_argument("--cross-attention-heads", type=int, metavar="H",
                            help="heads of the decoder's causal cross-attention (default: "
                                 "--attention-heads)")
        parser.add_argument("--pos-embed-subtraction", choices=POS_SUBTRACTION,
                            help="after the final LayerNorm, subtract the next position's "
                                 "embedding (yes_no_ln; yes_ln: then a LayerNorm) (default: none)")
        parser.add_argument("--decoder-block-order", choices=("original", "alt"),
                            help="original: self-attention, cross-attention, MLP; alt: "
                                 "cross-attention first (default: original)")
        parser.add_argument("--ln-before-decoder-input", action=argparse.BooleanOptionalAction,
                            help="LayerNorm on the encoder output before the decoder-input "
                                 "projection (default: off)")
        parser.add_argument("--add-pos-embed-to-decoder", action=argparse.BooleanOptionalAction,
                            help="add positions 1..T to the decoder input (default: off)")
        parser.add_argument("--embedding-loss-norms", action=argparse.BooleanOptionalAction,
                            help="build the embedding loss's two LayerNorms (default: on when "
                                 "--criterion lm_embedding_loss has an --embedding-loss)")

    @classmethod
    def validate(cls, args):
        if args.cross_attention_heads is None:
            args.cross_attention_heads = args.attention_heads
        if args.cross_attention_heads < 1 or args.embed_dim % args.cross_attention_heads:
            raise ValueError(f"--cross-attention-heads={args.cross_attention_heads} must divide "
                             f"--embed-dim={args.embed_dim}")
        requested = embedding_loss_contract.requested(args)
        if args.embedding_loss_norms is None:
            args.embedding_loss_norms = requested is not None
        elif requested and not args.embedding_loss_norms:
            raise ValueError(f"--embedding-loss {requested} needs the embedding-loss LayerNorms: "
                             "drop --no-embedding-loss-norms")


def ar_encdec_defaults(args, embed_dim=150, layers=13, heads=5, cross_heads=10):
    base_lm_args(args, embed_dim, layers, heads)
    args.cross_attention_heads = getattr(args, "cross_attention_heads", cross_heads)
    args.pos_embed_subtraction = getattr(args, "pos_embed_subtraction", "none")
    args.decoder_block_order = getattr(args, "decoder_block_order", "original")
    args.ln_before_decoder_input = getattr(args, "ln_before_decoder_input", False)
    args.add_pos_embed_to_decoder = getattr(args, "add_pos_embed_to_decoder", False)
    args.embedding_loss_norms = getattr(args, "embedding_loss_norms", None)


def _preset(name, **sizes):
    def arch(args):
        ar_encdec_defaults(args, **sizes)

    arch.__name__ = arch.__qualname__ = name
    return register_model_architecture(MODEL_NAME, name)(arch)


ArEncDecLM.arch_defaults = staticmethod(_preset(MODEL_NAME))
# the reference configuration: d=150, 13 + 13 blocks, 5 self-attention / 10 cross-attention heads
_preset("ar_encdec_lm_yif")
_preset("ar_encdec_lm_tiny", embed_dim=32, layers=2, heads=4, cross_heads=4)
