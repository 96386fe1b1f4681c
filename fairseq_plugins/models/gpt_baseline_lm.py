"""``gpt_baseline_lm``: the decoder-only baseline of yif-AI's
``autoregressive_encoder_decoder_transformer`` (2024; GPT-2 style, pre-norm, learned positions,
final LayerNorm, tied output, no biases by default)."""
from dataclasses import dataclass

from .. import cuda_graph, depth, torch_compile
from ..criterions import embedding_loss_contract
from ..modules.lm_blocks import PreNormBlock
from ..registry import register_model, register_model_architecture
from ..config import architecture
from ..depth.interface import run_blocks
from .causal_lm_base import CausalLM, CausalLMConfig, CausalLMDecoder, build_stack, lm_sizes

MODEL_NAME = "gpt_baseline_lm"


class GPTBaselineDecoder(CausalLMDecoder):
    """tokens B x T -> logits B x T x V through L pre-norm causal blocks, connected by the
    stack's depth connection (``self.depth``; the plain residual unless a depth-connection
    flag is on)."""

    def __init__(self, args, dictionary):
        super().__init__(args, dictionary)
        ffn = args.ffn_embed_dim or 4 * args.embed_dim
        self.depth, self.layers = build_stack(args, "decoder", PreNormBlock, args.attention_heads,
                                              ffn)
        # --cuda-graph: the training passes of the blocks replayed as a CUDA graph (None: off)
        self.cuda_graph = cuda_graph.graph_for(args, args.arch)
        # --torch-compile: the same passes through torch.compile (None: off; not with the graph)
        self.torch_compile = torch_compile.compiled_for(args, args.arch)

    def extract_features(self, prev_output_tokens, incremental_state=None, **unused):
        positions = self.positions(prev_output_tokens, incremental_state)
        if incremental_state is not None:
            prev_output_tokens = prev_output_tokens[:, -1:]
        x = self.dropout(self.embed(prev_output_tokens, positions)).transpose(0, 1)
        runner = self.cuda_graph or self.torch_compile
        if runner is not None and incremental_state is None and not self.depth.observed:
            # an observer (the layer analysis) is Python a replayed graph would not call
            x = runner(self.blocks, (self.depth, self.layers), x, self.training)
        else:
            x = run_blocks(self.depth, self.layers, x,
                           lambda i: {"incremental_state": incremental_state})
        return self.head(x, positions), {"attn": [None]}

    def blocks(self, x):
        """x (T x B x C, the embedding output) through the blocks of a full-sequence pass."""
        return run_blocks(self.depth, self.layers, x)

    def head(self, x, positions):
        """What follows the last block: x (T x B x C) -> features B x T x C."""
        return self.final_layer_norm(x).transpose(0, 1)


@dataclass
class GPTBaselineConfig(CausalLMConfig, cuda_graph.CudaGraphConfig,
                        torch_compile.TorchCompileConfig):
    """The language models' options, ``--cuda-graph`` (:mod:`fairseq_plugins.cuda_graph`)
    and ``--torch-compile`` (:mod:`fairseq_plugins.torch_compile`)."""


@register_model(MODEL_NAME, dataclass=GPTBaselineConfig)
class GPTBaselineLM(CausalLM):
    decoder_class = GPTBaselineDecoder
    config_class = GPTBaselineConfig
    model_name = MODEL_NAME
    # the reference's baseline (its run configurations): d=160, 26 blocks, 10 heads
    reference_sizes = (160, 26, 10)

    @classmethod
    def validate(cls, args):
        if embedding_loss_contract.requested(args):
            raise ValueError(f"--embedding-loss {args.embedding_loss} needs a model with an "
                             f"encoder (ar_encdec_lm); {args.arch} is decoder-only: use "
                             "--embedding-loss none or --criterion cross_entropy")
        cuda_graph.validate(args)
        torch_compile.validate(args)


def _preset(name, embed_dim, layers, heads, options=None):
    def arch(args):
        lm_sizes(args, embed_dim, layers, heads)
        for key, value in (options or {}).items():
            setattr(args, key, getattr(args, key, value))

    arch.__name__ = arch.__qualname__ = name
    return register_model_architecture(MODEL_NAME, name)(architecture(arch))


# --arch gpt_baseline_lm is registered by register_model (its sizes: reference_sizes above)
# the reference's baselines (context 200, GPT-2 vocabulary; its run configurations): d=160 L=26
# with 10 heads (head dim 16) and the smaller d=156 L=26 with 12 heads; *_tiny for tests and CPU runs
_preset("gpt_baseline_lm_yif", 160, 26, 10)
_preset("gpt_baseline_lm_yif_small", 156, 26, 12)
_preset("gpt_baseline_lm_tiny", 32, 4, 4)
# the depth connections at the tiny size: gpt_baseline_lm_<method>_tiny (fairseq_plugins.depth)
for _name, _options in depth.PRESETS.items():
    _preset(f"gpt_baseline_lm_{_name}_tiny", 32, 4, 4, _options)
