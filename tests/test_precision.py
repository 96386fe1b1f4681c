"""Reduced precision: every family trains (forward + backward through its real criterion) under
``torch.autocast("cpu", bfloat16)`` and with its parameters cast to float16 and bfloat16; the
custom autograd functions are autocast-aware; the CPU-tuned (padded) paths run only where they
were measured and equal the plain ones. The CPU stands in for the GPU here: the same dtypes and
autocast rules, other kernels."""
import math

import pytest
import torch
import torch.nn.functional as F
from helpers import build_language_model, build_translation_model, make_dict, random_batch

from fairseq_plugins.models.causal_lm_base import TiedOutputProjection, tied_output_projection
from fairseq_plugins.modules import precision
from fairseq_plugins.modules.lm_blocks import CausalAttention
from fairseq_plugins.modules.log_cumsum import causal_logcumsumexp

SIZES = ["--encoder-embed-dim", "16", "--decoder-embed-dim", "16", "--encoder-ffn-embed-dim",
         "32", "--decoder-ffn-embed-dim", "32", "--encoder-attention-heads", "2",
         "--decoder-attention-heads", "2", "--encoder-layers", "2", "--decoder-layers", "2"]
CRITERION = ["--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1"]
SEQ2SEQ = {
    "fusion": ("fusion_transformer_tiny", SIZES),
    "bridge": ("bridge_transformer_tiny", SIZES),
    "fusion_bridge_prenorm_gca": ("bridge_transformer_tiny", SIZES + [
        "--encoder-fusion", "--decoder-fusion", "--encoder-normalize-before",
        "--decoder-normalize-before", "--bridge-init", "gca"]),
    "opus_mt": ("opus_mt_de_en", SIZES + ["--max-source-positions", "32",
                                          "--max-target-positions", "32"]),
    "swapped": ("swapped_transformer_tiny", SIZES + ["--cross-attention-chunk-size", "2"]),
    "inverted": ("inverted_transformer_tiny", SIZES),
    "decoder_values": ("decoder_values_transformer_tiny", SIZES),
    "dwa": ("dwa_transformer_tiny", SIZES + ["--dwa-dilation", "2"]),
    "transparent": ("transparent_transformer_tiny", SIZES),
    "fusion_all_positions": ("fusion_transformer_tiny", SIZES + ["--fusion-reading",
                                                                 "all-positions"]),
    "hyper_connections": ("hyper_connections_transformer_tiny", SIZES),
    "mudd": ("mudd_transformer_tiny", SIZES),
    "mhc": ("mhc_transformer_tiny", SIZES),
    "frac_connections": ("frac_connections_transformer_tiny", SIZES),
    "attn_res_block": ("attn_res_block_transformer_tiny", SIZES),
    "laurel_pa": ("laurel_pa_transformer_tiny", SIZES + ["--laurel-rank", "4"]),
}
LM_SIZES = ["--embed-dim", "30", "--layers", "2", "--attention-heads", "2",
            "--tokens-per-sample", "16"]  # head dim 15: the padded path where it runs
LMS = {
    "ar_encdec_lm_embedding_loss": ("ar_encdec_lm_tiny", LM_SIZES + [
        "--cross-attention-heads", "3", "--pos-embed-subtraction", "yes_ln",
        "--criterion", "lm_embedding_loss", "--embedding-loss", "mse"]),
    "gpt_baseline_lm": ("gpt_baseline_lm_tiny", LM_SIZES + ["--criterion", "cross_entropy"]),
    # the depth connections (fairseq_plugins.depth)
    "gpt_hyper_connections_value_residual": ("gpt_baseline_lm_tiny", LM_SIZES + [
        "--criterion", "cross_entropy", "--hyper-connections", "dynamic",
        "--value-residual", "learnable"]),
    "gpt_mudd": ("gpt_baseline_lm_tiny", LM_SIZES + ["--criterion", "cross_entropy", "--mudd"]),
    "gpt_mhc_lite": ("gpt_baseline_lm_tiny", LM_SIZES + ["--criterion", "cross_entropy",
                                                        "--mhc", "lite"]),
    "ar_encdec_lm_mhc": ("ar_encdec_lm_tiny", LM_SIZES + [
        "--cross-attention-heads", "3", "--criterion", "cross_entropy", "--mhc", "sinkhorn"]),
    "gpt_frac_connections": ("gpt_baseline_lm_tiny", LM_SIZES + [
        "--criterion", "cross_entropy", "--frac-connections", "dynamic", "--frac-rate", "2"]),
    "gpt_attn_res": ("gpt_baseline_lm_tiny", LM_SIZES + ["--criterion", "cross_entropy",
                                                        "--attn-res", "full"]),
    "ar_encdec_lm_attn_res_block": ("ar_encdec_lm_tiny", LM_SIZES + [
        "--cross-attention-heads", "3", "--criterion", "cross_entropy", "--attn-res", "block",
        "--attn-res-blocks", "2"]),
    "ar_encdec_lm_dwa_lrf": ("ar_encdec_lm_tiny", LM_SIZES + [
        "--cross-attention-heads", "3", "--criterion", "cross_entropy", "--encoder-fusion",
        "--fusion-kind", "dwa"]),
    "ar_encdec_lm_transparent": ("ar_encdec_lm_transparent_tiny", LM_SIZES + [
        "--cross-attention-heads", "3", "--criterion", "cross_entropy"]),
    "ar_encdec_lm_lrf": ("ar_encdec_lm_tiny", LM_SIZES + [
        "--cross-attention-heads", "3", "--criterion", "cross_entropy", "--decoder-fusion"]),
    "gpt_laurel": ("gpt_baseline_lm_tiny", LM_SIZES + ["--criterion", "cross_entropy",
                                                      "--laurel", "rw_lr", "--laurel-rank", "4"]),
    "ar_encdec_lm_laurel_pa": ("ar_encdec_lm_tiny", LM_SIZES + [
        "--cross-attention-heads", "3", "--criterion", "cross_entropy", "--laurel", "rw_lr_pa",
        "--laurel-rank", "4"]),
}
FAMILIES = sorted(SEQ2SEQ) + sorted(LMS)
# |loss - float32 loss| / float32 loss and ||grad - float32 grad|| / ||float32 grad|| (all
# parameters together) allowed per precision: bfloat16 keeps 8 bits of mantissa (~0.4%
# relative per rounding), float16 11 bits; a tiny model's loss and gradient add up a few
# hundred such roundings
TOLERANCE = {"autocast_bf16": (0.02, 0.1), "float16": (0.01, 0.05), "bfloat16": (0.02, 0.1)}


def _family(name):
    if name in SEQ2SEQ:
        arch, flags = SEQ2SEQ[name]
        # opus-mt shares one vocabulary between the languages
        shared = make_dict(20, "s") if arch.startswith("opus") else None
        model, task, args = build_translation_model(arch, flags + CRITERION, shared, shared)
        src, lengths, prev = random_batch(task.source_dictionary, task.target_dictionary)
        target = torch.cat([prev[:, 1:], torch.full_like(prev[:, :1], task.target_dictionary.eos())],
                           dim=1)
        sample = {"net_input": {"src_tokens": src, "src_lengths": lengths,
                                "prev_output_tokens": prev},
                  "target": target, "ntokens": target.numel(), "nsentences": target.size(0)}
    else:
        arch, flags = LMS[name]
        model, task, args = build_language_model(arch, flags)
        tokens = torch.randint(4, 24, (3, 13), generator=torch.Generator().manual_seed(0))
        sample = {"net_input": {"src_tokens": tokens[:, :-1].contiguous(),
                                "src_lengths": torch.full((3,), 12)},
                  "target": tokens[:, 1:].contiguous(), "ntokens": 36, "nsentences": 3}
    return model.eval(), task.build_criterion(args), sample  # eval: no dropout, same masks


def _loss_and_grads(model, criterion, sample, autocast=False):
    """Forward under autocast when asked, backward outside it: fairseq's trainer with --amp
    (the task's train_step) does exactly this."""
    model.zero_grad()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        loss, _, _ = criterion(model, sample)
    loss.backward()
    grads = torch.cat([p.grad.float().flatten() for p in model.parameters()
                       if p.grad is not None])
    return loss.float().item(), grads


@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_trains_in_reduced_precision(family):
    model, criterion, sample = _family(family)
    loss32, grads32 = _loss_and_grads(model, criterion, sample)
    assert math.isfinite(loss32) and grads32.norm() > 0
    runs = {"autocast_bf16": _loss_and_grads(model, criterion, sample, autocast=True)}
    for name, dtype in (("float16", torch.float16), ("bfloat16", torch.bfloat16)):
        runs[name] = _loss_and_grads(model.to(dtype), criterion, sample)
        assert all(p.dtype == dtype for p in model.parameters())
        model.float()
    for name, (loss, grads) in runs.items():
        loss_tol, grad_tol = TOLERANCE[name]
        assert math.isfinite(loss) and torch.isfinite(grads).all(), name
        assert abs(loss - loss32) <= loss_tol * abs(loss32), (name, loss, loss32)
        assert (grads - grads32).norm() <= grad_tol * grads32.norm(), name


def test_tied_output_projection_backward_under_autocast():
    x = torch.randn(4, 5, 150, requires_grad=True)
    w = torch.randn(11, 150, requires_grad=True)
    upstream = torch.randn(4, 5, 11)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = TiedOutputProjection.apply(x, w)
        expected = F.linear(x, w)
    assert y.dtype == expected.dtype == torch.bfloat16
    torch.testing.assert_close(y, expected, rtol=0, atol=0)
    grads = torch.autograd.grad((y.float() * upstream).sum(), [x, w])
    ref = torch.autograd.grad((expected.float() * upstream).sum(), [x, w])
    for g, r, p in zip(grads, ref, (x, w)):
        assert g.dtype == p.dtype == torch.float32
        torch.testing.assert_close(g, r, rtol=0, atol=0)


def test_cpu_tuned_paths_run_only_in_full_precision_on_cpu():
    x = torch.randn(2, 3)
    assert precision.cpu_tuned(x) and precision.cpu_tuned(x.double())
    assert not precision.cpu_tuned(x.half()) and not precision.cpu_tuned(x.bfloat16())
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not precision.cpu_tuned(x)
    attn = CausalAttention(30, 2, bias=True)  # head dim 15
    assert attn.padded_head_dim(attn.q_proj.weight) == 16
    assert attn.padded_head_dim(attn.q_proj.weight.bfloat16()) == 15


def _plain_everywhere(monkeypatch):
    monkeypatch.setattr(precision, "cpu_tuned", lambda tensor: False)


@pytest.mark.parametrize("dim", [150, 7])
def test_tied_output_projection_padded_and_plain_paths_are_equal(dim, monkeypatch):
    x = torch.randn(3, 5, dim, requires_grad=True)
    w = torch.randn(11, dim, requires_grad=True)
    upstream = torch.randn(3, 5, 11)

    def run():
        y = tied_output_projection(x, w)
        return (y, *torch.autograd.grad((y * upstream).sum(), [x, w]))

    padded = run()
    _plain_everywhere(monkeypatch)
    plain = run()
    for a, b in zip(padded, plain):  # float32: the padded product sums in another order
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("arch,extra", [(a, f) for a, f in LMS.values()])
def test_lm_padded_and_plain_head_dims_give_equal_outputs_and_gradients(arch, extra,
                                                                         monkeypatch):
    model, _, _ = build_language_model(arch, extra)
    model = model.double().eval()
    tokens = torch.randint(4, 24, (3, 12), generator=torch.Generator().manual_seed(1))

    def run():
        model.zero_grad()
        out = model(tokens)[0]
        out.sum().backward()
        steps, state = [], {}
        with torch.no_grad():
            for t in range(tokens.size(1)):
                steps.append(model.decoder(tokens[:, :t + 1], incremental_state=state)[0])
        return out.detach(), torch.cat(steps, 1), [p.grad.clone() for p in model.parameters()
                                                   if p.grad is not None]

    padded = run()
    _plain_everywhere(monkeypatch)
    plain = run()
    for a, b in zip(padded[:2], plain[:2]):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)
    for a, b in zip(padded[2], plain[2]):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


def test_causal_logcumsumexp_in_half_precision_is_finite_and_accurate():
    torch.manual_seed(0)
    # a masked prefix as the cross-attention variants write it (-1e9: -inf in float16)
    x = torch.randn(4, 64) * 3
    x[:, :5] = -1e9
    for dtype in (torch.float16, torch.bfloat16):
        xh = x.to(dtype).requires_grad_()
        y = causal_logcumsumexp(xh, dim=1)
        assert y.dtype == dtype
        (grad,) = torch.autograd.grad((y.float() * torch.randn(4, 64)).sum(), [xh])
        assert torch.isfinite(grad).all()
        if dtype == torch.float16:  # -1e9 is -inf there: no mass, no gradient
            assert torch.equal(grad[:, :5], torch.zeros_like(grad[:, :5]))
        expected = torch.logcumsumexp(xh.detach().double(), dim=1)
        torch.testing.assert_close(y[:, 5:].double(), expected[:, 5:],
                                   rtol=torch.finfo(dtype).eps, atol=torch.finfo(dtype).eps)


def test_causal_logcumsumexp_error_in_bfloat16_does_not_grow_with_length():
    torch.manual_seed(0)
    x = torch.randn(8, 512)
    exact = torch.logcumsumexp(x.double(), dim=1)
    ours = (causal_logcumsumexp(x.bfloat16(), dim=1).double() - exact).abs().max().item()
    # one rounding of the result to bfloat16: half an ulp of the largest value (~log 512 + 3)
    assert ours <= 0.5 * torch.finfo(torch.bfloat16).eps * exact.abs().max().item()
    theirs = (torch.logcumsumexp(x.bfloat16(), dim=1).double() - exact).abs().max().item()
    assert ours <= theirs


# -- fairseq's CPU half path end to end (fairseq-train --fp16, then fairseq-generate --fp16) ----
HALF = ["--cpu", "--fp16", "--fp16-no-flatten-grads", "--fp16-init-scale", "1",
        "--fp16-scale-window", "1000"]
CLI_SIZES = [*SIZES, "--dropout", "0"]
CLI_SEQ2SEQ = {  # family: (arch, flags); opus-mt on a joined dictionary
    "fusion": ("fusion_transformer_tiny", CLI_SIZES),
    "bridge": ("bridge_transformer_tiny", CLI_SIZES),
    "fusion_bridge_prenorm_gca": SEQ2SEQ["fusion_bridge_prenorm_gca"][:1] + (
        SEQ2SEQ["fusion_bridge_prenorm_gca"][1] + ["--dropout", "0"],),
    "opus_mt": ("opus_mt_de_en", CLI_SIZES),
    "swapped": ("swapped_transformer_tiny", CLI_SIZES),
    "inverted": ("inverted_transformer_tiny", CLI_SIZES),
    "decoder_values": ("decoder_values_transformer_tiny", CLI_SIZES),
}
CLI_LMS = {
    "ar_encdec_lm_embedding_loss": ("ar_encdec_lm_tiny", [
        "--embed-dim", "32", "--layers", "2", "--attention-heads", "2",
        "--cross-attention-heads", "2", "--criterion", "lm_embedding_loss",
        "--embedding-loss", "mse"]),
    "gpt_baseline_lm": ("gpt_baseline_lm_tiny", ["--embed-dim", "32", "--layers", "2",
                                                 "--attention-heads", "2"]),
}
# |valid loss (fp16) - valid loss (float32)| after the same 12 updates from the same seed, in
# nats per token (fairseq logs base 2 with 3 decimals: converted). Measured here: at most
# 0.0007 (fusion), the others equal to the logged precision; losses are ~2-2.5 nats
HALF_LOSS_TOLERANCE = 0.01


def _valid_loss(log):
    import re

    losses = re.findall(r"valid on 'valid' subset \| loss ([0-9.]+)", log)
    assert losses, log[-3000:]
    return float(losses[-1]) * math.log(2)


@pytest.fixture(scope="module")
def scan_joined(scan_bin, tmp_path_factory):
    """The SCAN fixture's text binarised with one joined dictionary (opus-mt shares its
    embeddings between the languages)."""
    from conftest import run_cli

    dest = tmp_path_factory.mktemp("scan-joined")
    text = scan_bin / "text" / "length"
    run_cli("fairseq-preprocess", "--source-lang", "in", "--target-lang", "out",
            "--trainpref", text / "train", "--validpref", text / "valid",
            "--joined-dictionary", "--destdir", dest, "--workers", "1")
    return dest


def _train_both(data, root, train_flags):
    """(float32 log, half log) of the same 12 updates from the same seed: the two fairseq-train
    runs side by side, each in a child of its own zygote (one thread each; the results do not
    depend on it)."""
    from conftest import cli_env, start_cli
    from helpers import PLUGIN_DIR

    env = dict(cli_env(), OMP_NUM_THREADS="1")
    runs = [start_cli("fairseq-train", data, "--user-dir", PLUGIN_DIR, *train_flags,
                      "--optimizer", "adam", "--lr", "3e-3", "--max-update", "12",
                      "--save-dir", root / name, "--no-epoch-checkpoints", "--num-workers", "0",
                      "--seed", "1", "--log-format", "simple", *precision, zygote=i, env=env)
            for i, (name, precision) in enumerate((("float32", ["--cpu"]), ("half", HALF)))]
    procs = [run.wait() for run in runs]
    for proc in procs:
        assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    return [proc.stdout + proc.stderr for proc in procs]


@pytest.mark.parametrize("family", sorted(CLI_SEQ2SEQ) + sorted(CLI_LMS))
def test_cpu_half_training_and_generation_end_to_end(family, scan_bin, scan_joined, lm_bin,
                                                     tmp_path):
    if family in CLI_SEQ2SEQ:
        arch, flags = CLI_SEQ2SEQ[family]
        data = scan_joined if arch.startswith("opus") else scan_bin / "bin"
        train_flags = ["--arch", arch, *flags, "--max-tokens", "1024",
                       "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1"]
        generate_flags = ["--gen-subset", "valid", "--beam", "3", "--batch-size", "50",
                          "--max-len-b", "40", "--required-batch-size-multiple", "1"]
        expected = 200  # the fixture's valid set
    else:
        arch, flags = CLI_LMS[family]
        data = lm_bin
        train_flags = ["--task", "language_modeling", "--arch", arch, *flags,
                       "--tokens-per-sample", "32", "--sample-break-mode", "none",
                       "--batch-size", "8"]
        generate_flags = ["--task", "language_modeling", "--tokens-per-sample", "32",
                          "--sample-break-mode", "eos", "--gen-subset", "valid",
                          "--batch-size", "4", "--max-len-b", "8", "--prefix-size", "3",
                          "--skip-invalid-size-inputs-valid-test"]
        expected = None
    from conftest import run_cli
    from helpers import PLUGIN_DIR

    log32, log16 = _train_both(data, tmp_path, train_flags)
    assert "| loss nan" not in log16 and "| loss inf" not in log16
    assert abs(_valid_loss(log16) - _valid_loss(log32)) <= HALF_LOSS_TOLERANCE
    generated = run_cli("fairseq-generate", data, "--user-dir", PLUGIN_DIR, "--path",
                        tmp_path / "half" / "checkpoint_last.pt", "--num-workers", "0",
                        "--cpu", "--fp16", *generate_flags)
    hypotheses = [line.split("\t") for line in generated.splitlines() if line.startswith("H-")]
    assert hypotheses and (expected is None or len(hypotheses) == expected)
    assert all(math.isfinite(float(h[1])) for h in hypotheses)
