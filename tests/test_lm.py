"""Autoregressive encoder-decoder LM, its decoder-only baseline and the embedding-loss criterion."""
import os

import pytest
import torch
import torch.nn.functional as F
from conftest import run_cli, run_script
from helpers import (PLUGIN_DIR, SCRIPTS, assert_lm_beam_search_scores_equal_full_forward,
                     assert_lm_incremental_equals_full_forward,
                     build_language_model, make_dict)

from fairseq_plugins.criterions.lm_embedding_loss import LMEmbeddingLossCriterion, embedding_loss
from fairseq_plugins.models.causal_lm_base import TiedOutputProjection
from fairseq_plugins.modules.lm_blocks import CausalAttention, CrossDecoderBlock, project_memories

EMB = ["--criterion", "lm_embedding_loss", "--embedding-loss"]
AR_OPTIONS = [[], ["--decoder-block-order", "alt"], ["--pos-embed-subtraction", "yes_ln"],
              ["--pos-embed-subtraction", "yes_no_ln", "--ln-before-decoder-input",
               "--add-pos-embed-to-decoder", "--bias"]]


def _lm(arch, extra=(), context=16, seed=0):
    model, task, args = build_language_model(arch, ["--tokens-per-sample", context, *extra],
                                             seed=seed)
    return model, task, args


def _tokens(bsz=3, length=12, seed=0):
    return torch.randint(4, 24, (bsz, length), generator=torch.Generator().manual_seed(seed))


def test_reference_parameter_counts():
    proc = run_script(os.path.join(SCRIPTS, "lm_param_report.py"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for count in ("15,763,500", "15,762,900", "16,036,800", "15,441,192"):
        assert proc.stdout.count(count) == 2, proc.stdout  # measured and published agree
    # and a different vocabulary changes exactly the embedding term
    model, _, _ = build_language_model("gpt_baseline_lm_yif", ["--tokens-per-sample", 200],
                                       make_dict(50257 - 4 - 10, "w"))
    assert model.reference_parameter_count() == 16_036_800 - 10 * 160


# the reference runs' model_config: n_embed, n_layer, n_head (cross_attn_config n_head)
REFERENCE_CONFIGS = {"ar_encdec_lm_yif": (150, 13, 5, 10),
                     "gpt_baseline_lm_yif": (160, 26, 10, None),
                     "gpt_baseline_lm_yif_small": (156, 26, 12, None)}


@pytest.mark.parametrize("arch", sorted(REFERENCE_CONFIGS))
def test_presets_have_the_reference_sizes_and_heads(arch):
    d, layers, heads, cross_heads = REFERENCE_CONFIGS[arch]
    model, _, _ = build_language_model(arch, ["--tokens-per-sample", 200], make_dict(20, "w"))
    decoder = model.decoder
    self_attn = [m.self_attn for m in [*getattr(decoder, "encoder_layers", []), *decoder.layers]]
    assert len(self_attn) == (2 * layers if cross_heads else layers)
    assert {(a.num_heads, a.num_heads * a.head_dim) for a in self_attn} == {(heads, d)}
    cross = [m.encoder_attn.num_heads for m in decoder.layers if hasattr(m, "encoder_attn")]
    assert cross == ([cross_heads] * layers if cross_heads else [])


@pytest.mark.parametrize("arch,extra", [("ar_encdec_lm_tiny", e) for e in AR_OPTIONS]
                         + [("gpt_baseline_lm_tiny", [])])
def test_changing_token_t_never_changes_earlier_outputs(arch, extra):
    model, _, _ = _lm(arch, extra)
    model = model.double().eval()
    tokens = _tokens()
    logits, extra_out = model(tokens)
    for t in range(1, tokens.size(1)):
        changed = tokens.clone()
        changed[:, t] = (changed[:, t] - 3) % 20 + 4
        new_logits, new_extra = model(changed)
        assert torch.equal(new_logits[:, :t], logits[:, :t])
        assert not torch.equal(new_logits[:, t], logits[:, t])
        if "encoder_out" in extra_out:
            assert torch.equal(new_extra["encoder_out"][:, :t], extra_out["encoder_out"][:, :t])


def test_cross_attention_reads_only_memory_up_to_t():
    torch.manual_seed(0)
    attn = CausalAttention(8, 2, bias=False).double()
    x, memory = torch.randn(7, 2, 8).double(), torch.randn(7, 2, 8).double()
    jac = torch.autograd.functional.jacobian(lambda m: attn(x, m), memory)
    jac = jac.abs().amax(dim=(1, 2, 4, 5))  # T (out) x T (memory)
    assert torch.equal(jac.triu(1), torch.zeros_like(jac))
    assert (jac[torch.ones_like(jac).tril().bool()] > 0).all()


@pytest.mark.parametrize("heads", [2, 3, 5])  # head dims 15, 10 (padded to 16) and 6 (8)
def test_padded_head_dim_attention_equals_plain_softmax_attention(heads):
    torch.manual_seed(0)
    attn = CausalAttention(30, heads, bias=True).double().eval()
    x, memory = torch.randn(9, 2, 30).double(), torch.randn(9, 2, 30).double()

    def reference(q_in, m_in, offset=0):  # softmax(q k^T / sqrt(d) + causal mask) v, per head
        q = attn.q_proj(q_in).view(q_in.size(0), 2, heads, -1)
        k = attn.k_proj(m_in).view(m_in.size(0), 2, heads, -1)
        v = attn.v_proj(m_in).view(m_in.size(0), 2, heads, -1)
        scores = torch.einsum("tbhd,sbhd->bhts", q, k) / q.size(-1) ** 0.5
        t = torch.arange(q.size(0))[:, None] + offset
        scores = scores.masked_fill(torch.arange(k.size(0))[None, :] > t, float("-inf"))
        out = torch.einsum("bhts,sbhd->tbhd", scores.softmax(-1), v)
        return attn.out_proj(out.reshape(q.size(0), 2, 30))

    upstream = torch.randn(9, 2, 30).double()
    for mem in (memory, None):  # cross-attention (k, v in one GEMM) and self (q, k, v in one)
        expected = reference(x, x if mem is None else mem)
        ref_grads = torch.autograd.grad((expected * upstream).sum(), list(attn.parameters()))
        got = attn(x, mem)
        grads = torch.autograd.grad((got * upstream).sum(), list(attn.parameters()))
        torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)
        for g, r in zip(grads, ref_grads):  # the zero padding routes no gradient astray
            torch.testing.assert_close(g, r, rtol=1e-10, atol=1e-12)
        with torch.no_grad():
            state = {}
            steps = [attn(x[t:t + 1], None if mem is None else mem[t:t + 1],
                          incremental_state=state) for t in range(9)]
        torch.testing.assert_close(torch.cat(steps), expected.detach(), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dim", [150, 16, 7])  # weight gradient padded to 160 / as is / to 16
def test_tied_output_projection_has_linears_values_and_gradients(dim):
    x = torch.randn(3, 5, dim, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(11, dim, dtype=torch.float64, requires_grad=True)
    upstream = torch.randn(3, 5, 11, dtype=torch.float64)
    got = TiedOutputProjection.apply(x, weight)
    expected = F.linear(x, weight)
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    for g, e in zip(torch.autograd.grad((got * upstream).sum(), [x, weight]),
                    torch.autograd.grad((expected * upstream).sum(), [x, weight])):
        assert g.shape == e.shape and g.is_contiguous()
        torch.testing.assert_close(g, e, rtol=1e-12, atol=1e-12)
    assert torch.autograd.gradcheck(TiedOutputProjection.apply, (x[:1, :2], weight[:3]))


@pytest.mark.parametrize("bias", [False, True])
def test_memories_projected_together_equal_each_blocks_layer_norm_and_projection(bias):
    """project_memories folds every block's memory LayerNorm into its k/v projection and runs
    one GEMM: values and gradients (also of the LayerNorms' weight/bias) as computed per block."""
    torch.manual_seed(0)
    blocks = [CrossDecoderBlock(30, 3, 2, 60, bias, 0.0).double() for _ in range(3)]
    for block in blocks:  # LayerNorm affine parts away from (1, 0), so that folding matters
        norm = block.memory_layer_norm
        torch.nn.init.normal_(norm.weight, mean=1.0, std=0.5)
        if norm.bias is not None:
            torch.nn.init.normal_(norm.bias, std=0.5)
    encoder_out = torch.randn(7, 2, 30, dtype=torch.float64)
    upstream = torch.randn(len(blocks), 2, 2, 2, 7, 16, dtype=torch.float64)  # block, k/v, ...
    params = [p for b in blocks for p in (*b.memory_layer_norm.parameters(),
                                          *b.encoder_attn.k_proj.parameters(),
                                          *b.encoder_attn.v_proj.parameters())]
    together = torch.stack([torch.stack(kv) for kv in project_memories(blocks, encoder_out)])
    each = torch.stack([torch.stack(b.encoder_attn.split_heads(F.linear(
        b.memory_layer_norm(encoder_out),
        *b.encoder_attn.input_weights((b.encoder_attn.k_proj, b.encoder_attn.v_proj)))))
        for b in blocks])
    torch.testing.assert_close(together, each, rtol=1e-12, atol=1e-12)
    assert torch.equal(together[..., 15:], torch.zeros_like(together[..., 15:]))  # padding
    grads = torch.autograd.grad((together * upstream).sum(), params)
    expected = torch.autograd.grad((each * upstream).sum(), params)
    assert len(params) == (18 if bias else 9)
    for g, e in zip(grads, expected):
        torch.testing.assert_close(g, e, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("arch,extra", [("ar_encdec_lm_tiny", e) for e in AR_OPTIONS]
                         + [("gpt_baseline_lm_tiny", [])])
def test_incremental_equals_full_forward(arch, extra):
    model, _, _ = _lm(arch, extra)
    model = model.double().eval()
    assert_lm_incremental_equals_full_forward(model, _tokens(length=16))


def test_incremental_decoding_builds_the_fused_weights_once_per_search(monkeypatch):
    import fairseq_plugins.models.ar_encdec_lm as ar_module
    from fairseq_plugins.modules import lm_blocks

    built = []
    original = lm_blocks.CausalAttention.input_weights
    monkeypatch.setattr(ar_module, "memory_projection", lambda blocks: built.append("memory")
                        or lm_blocks.memory_projection(blocks))
    monkeypatch.setattr(lm_blocks.CausalAttention, "input_weights",
                        lambda self, *a, **k: built.append("input") or original(self, *a, **k))
    model, _, _ = _lm("ar_encdec_lm_tiny")
    model.eval()
    tokens = _tokens(length=6)
    with torch.no_grad():
        state = {}
        for t in range(tokens.size(1)):
            model.decoder(tokens[:, :t + 1], incremental_state=state)
        per_search = list(built)
        model.decoder(tokens)  # without a state: built per call
    # q/k/v of 2 + 2 self-attentions, q of 2 cross-attentions, k/v of 2 blocks' memories
    assert per_search.count("memory") == 1 and per_search.count("input") == 4 + 2 + 2
    assert built[len(per_search):].count("memory") == 1


def test_pos_subtraction_uses_the_next_positions_row():
    sub, _, _ = _lm("ar_encdec_lm_tiny", ["--pos-embed-subtraction", "yes_no_ln"])
    plain, _, _ = _lm("ar_encdec_lm_tiny")
    plain.load_state_dict(sub.state_dict())  # yes_no_ln adds no parameters
    sub, plain = sub.double().eval(), plain.double().eval()
    tokens = _tokens(length=10)
    decoder = sub.decoder
    rows = decoder.embed_positions.weight[1:11]  # rows t + 1 for t = 0..9
    expected = plain(tokens)[0] - rows @ decoder.embed_tokens.weight.T
    torch.testing.assert_close(sub(tokens)[0], expected, rtol=1e-10, atol=1e-10)
    # row t (not t + 1) would give something else
    wrong = plain(tokens)[0] - decoder.embed_positions.weight[:10] @ decoder.embed_tokens.weight.T
    assert (sub(tokens)[0] - wrong).abs().max() > 1e-3


def _criterion(task, kind, coeff=None):
    return LMEmbeddingLossCriterion(task, sentence_avg=False, embedding_loss=kind,
                                    embedding_loss_coeff=coeff)


def _sample(tokens, pad):
    target = torch.cat([tokens[:, 1:], tokens[:, :1]], dim=1)
    target[-1, -3:] = pad  # a right-padded last row
    return {"net_input": {"src_tokens": tokens, "src_lengths": None}, "target": target,
            "ntokens": int(target.ne(pad).sum())}


@pytest.mark.parametrize("kind", ["mse", "cosine"])
def test_embedding_loss_equals_spec_formula(kind):
    model, task, _ = _lm("ar_encdec_lm_tiny", EMB + [kind])
    model = model.double().train()
    tokens = _tokens(length=10)
    sample = _sample(tokens, task.dictionary.pad())
    crit = _criterion(task, kind, coeff=8.0)
    loss, sample_size, log = crit(model, sample)

    # the criterion's formula written out position by position
    dec = model.decoder
    positions = torch.arange(10)
    embedded = dec.embed_tokens(tokens) + dec.embed_positions(positions)[None]
    e_ln = dec.embedding_loss_norms["embeddings"](embedded)
    out = dec.embedding_loss_norms["encoder_out"](model(tokens)[1]["encoder_out"])
    values = []
    for b in range(tokens.size(0)):
        for t in range(10):
            if sample["target"][b, t] == task.dictionary.pad():
                continue
            avg = e_ln[b, :t + 1].mean(dim=0)
            if kind == "mse":
                values.append(((out[b, t] - avg) ** 2).mean())
            else:
                cos = torch.dot(out[b, t], avg) / (out[b, t].norm() * avg.norm())
                values.append(1 - (cos + 1) / 2)
    expected = torch.stack(values).mean()
    ntokens = sample["ntokens"]
    torch.testing.assert_close(log["emb_loss"] / ntokens, expected.detach(), rtol=1e-10, atol=1e-12)
    ce = torch.nn.functional.cross_entropy(model(tokens)[0].transpose(1, 2), sample["target"],
                                           ignore_index=task.dictionary.pad(), reduction="sum")
    # (fairseq's log-softmax runs in float32: the cross-entropy agrees to float32 precision)
    torch.testing.assert_close(loss, ce + 8.0 * expected * ntokens, rtol=1e-6, atol=1e-6)
    assert sample_size == ntokens
    # evaluation: cross-entropy only
    model.eval()
    loss_eval, _, log_eval = crit(model, sample)
    assert "emb_loss" not in log_eval
    torch.testing.assert_close(loss_eval.double(), ce.detach(), rtol=1e-6, atol=1e-6)


def test_embedding_loss_gradients_reach_only_embeddings_and_its_norms():
    model, task, _ = _lm("ar_encdec_lm_tiny", EMB + ["mse"])
    model.train()
    extra = model(_tokens())[1]["embedding_loss"]
    embedding_loss(extra["embeddings"], extra["encoder_out"], "mse").backward()
    with_grad = {n for n, p in model.named_parameters()
                 if p.grad is not None and p.grad.abs().sum() > 0}
    assert with_grad == {"decoder.embed_tokens.weight", "decoder.embed_positions.weight",
                         "decoder.embedding_loss_norms.embeddings.weight",
                         "decoder.embedding_loss_norms.embeddings.bias",
                         "decoder.embedding_loss_norms.encoder_out.weight",
                         "decoder.embedding_loss_norms.encoder_out.bias"}


def test_cosine_embedding_loss_on_zero_vectors_is_defined():
    zeros = torch.zeros(2, 5, 8, requires_grad=True)
    value = embedding_loss(zeros, zeros, "cosine")
    value.backward()
    assert value.item() == 0.5 and torch.isfinite(zeros.grad).all()


@pytest.mark.parametrize("arch,extra,error,message", [
    ("gpt_baseline_lm_tiny", EMB + ["mse"], ValueError, "needs a model with an encoder"),
    ("ar_encdec_lm_tiny", EMB + ["mse", "--embedding-loss-coeff", "0"], ValueError, "> 0"),
    ("ar_encdec_lm_tiny", EMB + ["cosine", "--embedding-loss-coeff", "-1"], ValueError, "> 0"),
    ("ar_encdec_lm_tiny", EMB + ["none", "--embedding-loss-coeff", "2"], ValueError, "is none"),
    ("ar_encdec_lm_tiny", EMB + ["mse", "--no-embedding-loss-norms"], ValueError, "LayerNorms"),
    ("ar_encdec_lm_tiny", ["--cross-attention-heads", "5"], ValueError, "must divide"),
    ("ar_encdec_lm_tiny", ["--max-target-positions", "8"], ValueError, "longer than"),
])
def test_build_time_errors(arch, extra, error, message):
    with pytest.raises(error, match=message):
        model, task, args = _lm(arch, extra)
        task.build_criterion(args)


def test_context_longer_than_the_positional_table_is_an_error():
    model, _, _ = _lm("ar_encdec_lm_tiny", context=8)
    with pytest.raises(ValueError, match="longer than the context"):
        model(_tokens(length=9))


def test_beam_search_and_sampling_with_batch_and_beam():
    for arch in ("ar_encdec_lm_tiny", "gpt_baseline_lm_tiny"):
        model, task, _ = _lm(arch, context=24, seed=2)
        assert_lm_beam_search_scores_equal_full_forward(model.eval(), task, _tokens(bsz=3, length=4))


def _train_lm(lm_bin, save_dir, arch, *extra):
    out = run_cli("fairseq-train", lm_bin, "--user-dir", PLUGIN_DIR, "--task", "language_modeling",
                  "--arch", arch, "--tokens-per-sample", "32", "--sample-break-mode", "none",
                  "--optimizer", "adam", "--lr", "3e-3", "--batch-size", "8", "--max-update", "30",
                  "--save-dir", save_dir, "--no-epoch-checkpoints", "--num-workers", "0",
                  "--seed", "1", "--log-format", "simple", "--log-interval", "10", *extra)
    return out, save_dir / "checkpoint_last.pt"


@pytest.mark.parametrize("arch,extra", [
    ("ar_encdec_lm_tiny", EMB + ["mse", "--embedding-loss-coeff", "8",
                                 "--pos-embed-subtraction", "yes_no_ln"]),
    ("gpt_baseline_lm_tiny", []),
])
def test_train_eval_lm_and_generate_end_to_end(lm_bin, tmp_path, arch, extra):
    log, ckpt = _train_lm(lm_bin, tmp_path / "ckpt", arch, *extra)
    assert "emb_loss" in log if "mse" in extra else "emb_loss" not in log
    out = run_cli("fairseq-eval-lm", lm_bin, "--user-dir", PLUGIN_DIR, "--path", ckpt,
                  "--tokens-per-sample", "32", "--batch-size", "8", "--num-workers", "0")
    assert "Loss (base 2):" in out and "Perplexity:" in out
    for mode in (["--beam", "3"], ["--sampling", "--sampling-topk", "5", "--beam", "2", "--nbest", "2"]):
        out = run_cli("fairseq-generate", lm_bin, "--user-dir", PLUGIN_DIR, "--task",
                      "language_modeling", "--path", ckpt, "--tokens-per-sample", "32",
                      "--batch-size", "4", "--max-len-b", "10", "--prefix-size", "3",
                      "--sample-break-mode", "eos", "--gen-subset", "valid",
                      "--max-sentences", "4", "--num-workers", "0", "--skip-invalid-size-inputs-valid-test",
                      *mode)
        hyps = [line for line in out.splitlines() if line.startswith("H-")]
        assert len(hyps) >= 4, out[-2000:]
    out = run_cli("fairseq-interactive", lm_bin, "--user-dir", PLUGIN_DIR, "--task",
                  "language_modeling", "--path", ckpt, "--tokens-per-sample", "32",
                  "--beam", "2", "--max-len-b", "8", stdin="▁the ▁cat\n▁a\n")
    assert sum(line.startswith("H-") for line in out.splitlines()) == 2
