"""Where each layer's update comes from: the residual stream of a transformer layer decomposed
into its sub-layers' contributions.

A fairseq layer (and this package's layerwise layers) changes its input x by residual sub-layers,
x <- x + u_k with u_k = dropout(f_k(...)), and in a post-norm layer also by the LayerNorm applied to
the stream after each of them, x <- LN(x) = x + n_k with n_k = LN(x) - x; a depth-weighted average
after the layer replaces its output x_s by y_s = x_s + (y_s - x_s). So

    output = input + sum_k u_k + sum_k n_k (+ the average's change)

exactly: :class:`UpdateRecorder` records every term with forward hooks on the sub-layer modules
(nothing in the layers changes), and :func:`check_complete` verifies the sum. Pre-norm LayerNorms
act on a sub-layer's input, not on the stream, so they are not terms.
"""
from collections import defaultdict
from typing import Dict, List, Optional

import torch
from torch import Tensor, nn

# sub-layer module name -> the name of its contribution; the FFN's update is fc2's output in
# fairseq's layers, the ``ffn`` module's in this package's LM blocks
SUBLAYERS = {"self_attn": "self-attention", "encoder_attn": "cross-attention",
             "fuse_attn": "fuse-attention", "fc2": "FFN", "ffn": "FFN"}
# the LayerNorm after each sub-layer in a post-norm layer
POST_NORMS = {"self_attn_layer_norm": "self-attention", "encoder_attn_layer_norm": "cross-attention",
              "fuse_attn_layer_norm": "fuse-attention", "final_layer_norm": "FFN"}
UNSUPPORTED = ("c_attn", "attn_ln", "ffn_layernorm", "w_resid")  # fairseq's --scale-* options


class UpdateRecorder:
    """Hooks on the layers of one stack. After a forward, ``terms[i]`` maps each contribution of
    layer i to its tensor (T x B x C) and ``inputs[i]`` / ``outputs[i]`` are the layer's input and
    output. Use as a context manager (the hooks are removed at exit).

    ``depth``: the stack's :class:`~fairseq_plugins.depth.interface.Depth` where the blocks run
    through one (the language models' blocks take the stack's state, not a tensor): the inputs
    and outputs are then its block views. ``additive``: whether the outputs decompose into the
    terms (False for connections that mix streams: Hyper-Connections, MUDD)."""

    def __init__(self, layers: nn.ModuleList, depth: Optional[nn.Module] = None):
        self.layers = layers
        self.depth = depth
        self.additive = depth is None or depth.connection.additive
        self.handles = []
        self.terms: Dict[int, Dict[str, Tensor]] = defaultdict(dict)
        self.inputs: Dict[int, Tensor] = {}
        self.outputs: Dict[int, Tensor] = {}
        for i, layer in enumerate(layers):
            for name in UNSUPPORTED:
                if getattr(layer, name, None) is not None:
                    raise ValueError(f"layer {i} uses {name} (fairseq's --scale-* options): its "
                                     "update decomposition is not implemented")
            self._hook_layer(i, layer)
        if depth is not None:
            def block_state(x, block, where):
                (self.inputs if where == "input" else self.outputs)[block] = x
            self.handles.append(depth.observe(block_state))
            # DWA as the stack's connection: its averages, keyed by block
            for key, average in getattr(depth.connection, "averages", {}).items():
                self._hook_average(int(key), average)

    def _hook_layer(self, i: int, layer: nn.Module):
        def layer_pre(module, args, kwargs):
            x = args[0] if args else kwargs["x"]
            if not isinstance(x, Tensor):
                raise TypeError(f"layer {i} runs on its stack's depth-connection state: pass the "
                                "stack's depth (UpdateRecorder(stack.layers, stack.depth))")
            self.inputs[i] = x

        def layer_post(module, args, kwargs, output):
            self.outputs[i] = output[0] if isinstance(output, tuple) else output

        if self.depth is None:
            self.handles.append(layer.register_forward_pre_hook(layer_pre, with_kwargs=True))
            self.handles.append(layer.register_forward_hook(layer_post, with_kwargs=True))
        for name, label in SUBLAYERS.items():
            module = getattr(layer, name, None)
            if module is not None:
                self.handles.append(module.register_forward_hook(self._sublayer(i, label)))
        if not getattr(layer, "normalize_before", True):
            for name, label in POST_NORMS.items():
                module = getattr(layer, name, None)
                if module is not None:
                    self.handles.append(module.register_forward_hook(
                        self._post_norm(i, f"{label} LayerNorm")))

    def _hook_average(self, i: int, average: nn.Module):
        """A depth-weighted average after layer i: its change of the layer's output."""
        def average_hook(module, args, output):
            newest = args[0][module.inputs[-1]]
            self.terms[i]["depth average"] = output - newest
        self.handles.append(average.register_forward_hook(average_hook))

    def _sublayer(self, i: int, label: str):
        def hook(module, args, output):
            update = output[0] if isinstance(output, tuple) else output
            # dropout follows the sub-layer: the analysis runs in eval mode, where it is identity
            self.terms[i][label] = update
        return hook

    def _post_norm(self, i: int, label: str):
        def hook(module, args, output):
            self.terms[i][label] = output - args[0]
        return hook

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for handle in self.handles:
            handle.remove()
        self.handles = []

    def clear(self):
        self.terms.clear()
        self.inputs.clear()
        self.outputs.clear()


def check_complete(recorder: UpdateRecorder, atol: float = 1e-4) -> float:
    """The largest |input + sum of terms - output| over the recorded layers (raises when it is
    above ``atol``: a contribution is missing); 0.0 where the stack's connection is not additive
    (nothing to check)."""
    worst = 0.0
    if not recorder.additive:
        return worst
    for i, output in recorder.outputs.items():
        total = recorder.inputs[i] + sum(recorder.terms[i].values())
        error = (total - output).abs().max().item()
        worst = max(worst, error)
        if error > atol:
            raise AssertionError(f"layer {i}: the recorded terms miss {error:.2e} of its output "
                                 f"(terms: {sorted(recorder.terms[i])})")
    return worst


def relative_norms(recorder: UpdateRecorder, mask: Optional[Tensor]) -> Dict[int, Dict[str, float]]:
    """Per layer and contribution: the mean over tokens of ||term|| / ||layer input||; ``mask``
    (T x B, True for real tokens) leaves padding out."""
    out: Dict[int, Dict[str, float]] = {}
    for i, x in recorder.inputs.items():
        stream = x.float().norm(dim=-1).clamp_min(1e-12)
        keep = mask if mask is not None else torch.ones_like(stream, dtype=torch.bool)
        out[i] = {label: ((term.float().norm(dim=-1) / stream)[keep]).mean().item()
                  for label, term in recorder.terms[i].items()}
    return out


def merge_means(batches: List[Dict[int, Dict[str, float]]],
                weights: List[int]) -> Dict[int, Dict[str, float]]:
    """Token-weighted mean of per-batch :func:`relative_norms`."""
    total = float(sum(weights))
    out: Dict[int, Dict[str, float]] = {}
    for batch, w in zip(batches, weights):
        for i, terms in batch.items():
            for label, value in terms.items():
                out.setdefault(i, {}).setdefault(label, 0.0)
                out[i][label] += value * w / total
    return out
