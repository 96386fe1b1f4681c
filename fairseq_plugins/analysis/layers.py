"""Teacher-forced analysis of every layer of a model, streamed over batches.

:class:`LayerAnalysis` takes one model (a fairseq encoder-decoder model: fairseq's ``transformer``
or this package's ``layerwise_transformer``; or one of this package's language models) and, batch
by batch, accumulates

- ``cka``: linear CKA between every pair of layers within the encoder (embedding output included)
  and within the decoder, token level; between encoder and decoder layers, sentence level (mean
  over the real tokens of each sentence, since the two stacks see different tokens);
- ``logit_lens``: every decoder layer's output (and every block's of a language model) through
  what follows the last layer (final LayerNorm where the model has one, output projection):
  next-token accuracy and cross-entropy (nats) against the reference target;
- ``updates``: per layer, the norm of each sub-layer's residual update over the norm of the
  layer's input, mean over real tokens (:mod:`.updates`);
- ``cross_attention_entropy``: per decoder layer and head, the entropy (nats) of the attention
  over the source positions, mean over real target tokens, next to log S (uniform attention);
- ``layer_weights``: what the model learned about its layers: the bridge's per-decoder-layer
  weights over the encoder layers, the depth-weighted averages, and the fuse-attention weights
  over the lower layers (mean over heads and real tokens).

:meth:`LayerAnalysis.result` returns a JSON-ready dict. Memory is bounded by the CKA sums
(:mod:`.cka`) and one batch's activations.
"""
from typing import Dict, List, Optional

import torch
from torch import Tensor

from ..weight_logging import WeightSource, reported, sources, start_recording
from .cka import CKAAccumulator, all_pairs
from .updates import UpdateRecorder, check_complete, merge_means, relative_norms


def entropy(weights: Tensor, dim: int = -1) -> Tensor:
    """Entropy (nats) of distributions along ``dim``; 0 log 0 = 0."""
    logs = torch.where(weights > 0, weights.clamp_min(1e-30).log(), torch.zeros_like(weights))
    return -(weights * logs).sum(dim)


def is_seq2seq(model) -> bool:
    return hasattr(model, "encoder") and hasattr(model.encoder, "layers")


def decoder_head(decoder, x: Tensor) -> Tensor:
    """Logits of a decoder state x (T x B x C) of fairseq's transformer decoder, through what its
    ``extract_features`` and ``output_layer`` apply after the last layer -> B x T x V."""
    if getattr(decoder, "layer_norm", None) is not None:
        x = decoder.layer_norm(x)
    x = x.transpose(0, 1)
    if getattr(decoder, "project_out_dim", None) is not None:
        x = decoder.project_out_dim(x)
    return decoder.output_layer(x)


class _AttentionWeights:
    """Per-head attention weights of fairseq MultiheadAttention modules, asked for through a
    keyword pre-hook (need_weights / need_head_weights) and read from their output."""

    def __init__(self, modules: Dict[int, torch.nn.Module]):
        self.weights: Dict[int, Tensor] = {}
        self.handles = []
        for i, module in modules.items():
            self.handles.append(module.register_forward_pre_hook(self._ask, with_kwargs=True))
            self.handles.append(module.register_forward_hook(self._keep(i)))

    @staticmethod
    def _ask(module, args, kwargs):
        return args, dict(kwargs, need_weights=True, need_head_weights=True)

    def _keep(self, i):
        def hook(module, args, output):
            if output[1] is not None:
                self.weights[i] = output[1]  # H x B x T x S
        return hook

    def remove(self):
        for handle in self.handles:
            handle.remove()


class LayerAnalysis:
    """Streamed analysis of one model (see the module doc). ``pad``: the padding index."""

    def __init__(self, model, pad: int):
        self.model, self.pad = model, pad
        self.seq2seq = is_seq2seq(model)
        decoder = model.decoder
        self.num_decoder_states = len(decoder.layers) + 1
        dec = [f"decoder.{j}" for j in range(self.num_decoder_states)]
        self.token_cka = {"decoder": CKAAccumulator(all_pairs(dec))}
        self.lens = [[0.0, 0.0] for _ in range(self.num_decoder_states)]  # correct, nll sums
        self.tokens = 0
        self.sentences = 0
        self.update_batches: Dict[str, List] = {"encoder": [], "decoder": []}
        self.update_weights: Dict[str, List[int]] = {"encoder": [], "decoder": []}
        self.entropy_sums: Dict[int, Tensor] = {}
        self.log_source_length = 0.0
        self.decomposition_error = 0.0
        self.fusion_sums: Dict[str, Dict[int, Tensor]] = {"encoder": {}, "decoder": {}}
        self.fusion_tokens = {"encoder": 0, "decoder": 0}
        # what the depth connections report of each pass (AttnRes's mean weights): the last's
        self.pass_weights = start_recording(sources(model))
        if self.seq2seq:
            self.num_encoder_states = len(model.encoder.layers) + 1
            enc = [f"encoder.{j}" for j in range(self.num_encoder_states)]
            self.token_cka["encoder"] = CKAAccumulator(all_pairs(enc))
            self.sentence_cka = CKAAccumulator(all_pairs(enc, dec))

    # -- one batch ---------------------------------------------------------------------------
    @torch.no_grad()
    def add(self, sample):
        """One fairseq batch (``net_input`` and ``target``), teacher-forced."""
        self.model.eval()
        net, target = sample["net_input"], sample["target"]
        if self.seq2seq:
            self._add_seq2seq(net, target)
        else:
            self._add_lm(net, target)

    def _add_seq2seq(self, net, target):
        model = self.model
        src, prev = net["src_tokens"], net["prev_output_tokens"]
        cross = {i: layer.encoder_attn for i, layer in enumerate(model.decoder.layers)
                 if type(getattr(layer, "encoder_attn", None)).__name__ == "MultiheadAttention"}
        attention = _AttentionWeights(cross)
        fused = hasattr(model, "record_fusion_weights")
        if fused:
            model.record_fusion_weights(True)
        try:
            with UpdateRecorder(model.encoder.layers,
                                getattr(model.encoder, "depth", None)) as enc_updates:
                encoder_out = model.encoder(src, src_lengths=net["src_lengths"],
                                            return_all_hiddens=True)
            with UpdateRecorder(model.decoder.layers,
                                getattr(model.decoder, "depth", None)) as dec_updates:
                logits, extra = model.decoder(prev, encoder_out=encoder_out)
        finally:
            attention.remove()
            if fused:
                fusion = model.fusion_weights()
                model.record_fusion_weights(False)
        enc_states = encoder_out["encoder_states"]  # [h_0 .. h_N], S x B x C
        dec_states = extra["inner_states"]  # [g_0 .. g_M], T x B x C
        src_mask = src.ne(self.pad).t()  # S x B
        tgt_mask = target.ne(self.pad).t()  # T x B
        self._stack_cka("encoder", enc_states, src_mask)
        self._stack_cka("decoder", dec_states, tgt_mask)
        self.sentence_cka.add({**self._sentence_means("encoder", enc_states, src_mask),
                               **self._sentence_means("decoder", dec_states, tgt_mask)})
        self._logit_lens(dec_states, target, lambda x: decoder_head(model.decoder, x), logits)
        self._updates("encoder", enc_updates, src_mask)
        self._updates("decoder", dec_updates, tgt_mask)
        self._entropies(attention.weights, src_mask, tgt_mask)
        if fused:
            self._fusion(fusion, {"encoder": src_mask.t(), "decoder": tgt_mask.t()})
        self.sentences += src.size(0)

    def _add_lm(self, net, target):
        decoder = self.model.decoder
        self.model.record_fusion_weights(True)
        try:
            with UpdateRecorder(decoder.layers, decoder.depth) as updates:
                logits, _ = self.model(net["src_tokens"])
        finally:
            fusion = self.model.fusion_weights()
            self.model.record_fusion_weights(False)
        tokens = net["src_tokens"]
        positions = torch.arange(tokens.size(1), device=tokens.device)
        # the first block's input, then every block's output (the stack's views of its state)
        dec_states = [updates.inputs[0]] + [updates.outputs[i] for i in range(len(decoder.layers))]
        mask = target.ne(self.pad).t()
        self._stack_cka("decoder", dec_states, mask)
        self._logit_lens(dec_states, target,
                         lambda x: decoder.output_layer(decoder.head(x, positions)), logits)
        self._updates("decoder", updates, mask)
        # both stacks of ar_encdec_lm read the same positions
        self._fusion(fusion, {side: mask.t() for side in fusion})
        self.sentences += tokens.size(0)

    # -- accumulation --------------------------------------------------------------------------
    def _stack_cka(self, side: str, states: List[Tensor], mask: Tensor):
        self.token_cka[side].add({f"{side}.{j}": s[mask] for j, s in enumerate(states)})

    @staticmethod
    def _sentence_means(side: str, states: List[Tensor], mask: Tensor) -> Dict[str, Tensor]:
        weights = mask.unsqueeze(-1).to(states[0].dtype)  # T x B x 1
        count = weights.sum(0).clamp_min(1)
        return {f"{side}.{j}": (s * weights).sum(0) / count for j, s in enumerate(states)}

    def _logit_lens(self, states: List[Tensor], target: Tensor, head, logits: Tensor):
        keep = target.ne(self.pad)  # B x T
        for j, state in enumerate(states):
            lens_logits = head(state).float()  # B x T x V
            lprobs = torch.log_softmax(lens_logits, dim=-1)
            nll = -lprobs.gather(-1, target.unsqueeze(-1)).squeeze(-1)
            correct = lprobs.argmax(-1).eq(target)
            self.lens[j][0] += correct[keep].sum().item()
            self.lens[j][1] += nll[keep].sum().item()
        self.tokens += int(keep.sum())
        # the last layer through the head is the model's own output: a broken head shows here
        if not torch.allclose(lens_logits, logits.float(), atol=1e-4, rtol=1e-4):
            raise AssertionError("the logit lens of the last layer differs from the model's "
                                 "output: the head after the layers is not the model's")

    def _updates(self, side: str, recorder: UpdateRecorder, mask: Tensor):
        self.decomposition_error = max(self.decomposition_error, check_complete(recorder))
        self.update_batches[side].append(relative_norms(recorder, mask))
        self.update_weights[side].append(int(mask.sum()))

    def _fusion(self, weights: Dict[str, Dict[int, Tensor]], masks: Dict[str, Tensor]):
        for side, layers in weights.items():
            keep = masks[side]  # B x T
            for i, w in layers.items():  # B x H x T x L
                total = w.float().mean(1)[keep].sum(0)  # L
                sums = self.fusion_sums[side]
                sums[i] = total if i not in sums else sums[i] + total
            if layers:
                self.fusion_tokens[side] += int(keep.sum())

    def _entropies(self, weights: Dict[int, Tensor], src_mask: Tensor, tgt_mask: Tensor):
        keep = tgt_mask.t()  # B x T
        for i, w in weights.items():  # H x B x T x S
            h = entropy(w.float())  # H x B x T
            total = h[:, keep].sum(-1)  # H
            self.entropy_sums[i] = total if i not in self.entropy_sums else \
                self.entropy_sums[i] + total
        lengths = src_mask.sum(0).float()  # B
        self.log_source_length += (lengths.log()[:, None].expand_as(keep)[keep]).sum().item()

    # -- the result ----------------------------------------------------------------------------
    def result(self) -> Dict:
        out = {"model": "seq2seq" if self.seq2seq else "language_model",
               "sentences": self.sentences, "target_tokens": self.tokens,
               "cka": {}, "logit_lens": {}, "updates": {}}
        for side, acc in self.token_cka.items():
            out["cka"][side] = _matrix(acc.cka(), side, side, getattr(
                self, f"num_{side}_states"), getattr(self, f"num_{side}_states"))
        if self.seq2seq:
            out["cka"]["encoder_decoder"] = _matrix(self.sentence_cka.cka(), "encoder",
                                                    "decoder", self.num_encoder_states,
                                                    self.num_decoder_states)
        out["logit_lens"] = {
            "layers": list(range(self.num_decoder_states)),  # 0: the embedding output
            "accuracy": [100.0 * c / self.tokens for c, _ in self.lens],
            "cross_entropy": [n / self.tokens for _, n in self.lens]}
        for side, batches in self.update_batches.items():
            if batches:
                merged = merge_means(batches, self.update_weights[side])
                out["updates"][side] = {str(i + 1): merged[i] for i in sorted(merged)}
        out["update_decomposition_max_error"] = self.decomposition_error
        if self.entropy_sums:
            out["cross_attention_entropy"] = {
                "per_layer_and_head": {str(i + 1): (v / self.tokens).tolist()
                                       for i, v in sorted(self.entropy_sums.items())},
                "uniform_mean": self.log_source_length / self.tokens}
        out["layer_weights"] = layer_weights(self.model, self.pass_weights)
        for side, sums in self.fusion_sums.items():
            if sums:  # L states: the embedding output first (when fused), the layer's input last
                out["layer_weights"].setdefault("fuse_attention", {})[side] = {
                    str(i + 1): (v / self.fusion_tokens[side]).tolist()
                    for i, v in sorted(sums.items())}
        return out


def _matrix(values, row_side, col_side, rows, cols) -> List[List[Optional[float]]]:
    """A rows x cols matrix of CKA values (symmetric pairs filled both ways)."""
    m = [[None] * cols for _ in range(rows)]
    for (a, b), v in values.items():
        i, j = int(a.split(".")[1]), int(b.split(".")[1])
        m[i][j] = v
        if row_side == col_side:
            m[j][i] = v
    return m


def layer_weights(model, passed: Optional[Dict[str, Dict[str, Tensor]]] = None) -> Dict:
    """What the model's parameters say about how its layers are combined, and what its depth
    connections reported of the last pass (``passed``: :func:`start_recording`'s store)
    (JSON-ready)."""
    out = {}
    # the seq2seq model's encoder holds it; ar_encdec_lm's decoder (one module for both stacks)
    bridge = (getattr(getattr(model, "encoder", None), "bridge", None)
              or getattr(getattr(model, "decoder", None), "bridge", None))
    if bridge is not None:
        if hasattr(bridge, "combination_weights"):
            out["bridge"] = {"kind": "transparent", "first_encoder_state": 0,
                             "weights": bridge.combination_weights().tolist()}
        else:
            from ..modules.layer_bridge import block_norms

            out["bridge"] = {"kind": "fc", "first_encoder_state": bridge.first_layer_index,
                             "block_norms": block_norms(bridge.weight.detach()).tolist()}
    for side in ("encoder", "decoder"):
        connection = getattr(getattr(getattr(model, side, None), "depth", None), "connection", None)
        averages = {str(int(i) + 1): {"states": list(average.inputs),
                                      "weights": average.weight.tolist()}
                    for i, average in getattr(connection, "averages", {}).items()}
        if averages:
            out.setdefault("depth_averages", {})[side] = averages
    # the depth connections of the stacks that run the interface (the language models): every
    # weight their modules report (DWA alphas, Hyper-Connections' static read/write weights,
    # MUDD's final static weights, value-residual lambdas)
    from ..depth.interface import Depth

    for name, depth in model.named_modules():
        if isinstance(depth, Depth):
            weights = {f"{sub}.{key}" if sub else key: float(value)
                       for sub, module in depth.named_modules()
                       if isinstance(module, WeightSource)
                       for key, value in reported(f"{name}.{sub}" if sub else name, module,
                                                  passed).items()}
            if weights:
                out.setdefault("depth_connections", {})[name] = weights
    return out
