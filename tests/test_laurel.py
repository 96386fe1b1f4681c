"""LAuReL (Menghani, Kumar and Kumar 2025, arXiv 2411.07501v4): every variant against the
paper's equations written out here (float64, random parameters), the initialisation, the
checkpoint's variant, the weights it logs and the build-time refusals. The model-level tables
(incremental decoding, beam search, the CLIs, weight decay) are rows of tests/test_depth.py."""
import math

import pytest
import torch

from helpers import build_language_model, build_translation_model

from fairseq_plugins.depth import laurel
from fairseq_plugins.depth.interface import Depth, run_blocks

C, R = 12, 3
LAYOUT = (("self", "ffn"),) * 3  # 6 sub-layers


class _Sublayer(torch.nn.Module):
    """A block standing in for a pre-norm block: f(x) = tanh(LN(x) W_s) for each sub-layer s,
    read from and written to the depth connection as the package's blocks do."""

    def __init__(self, index, weights):
        super().__init__()
        self.index, self.weights = index, weights

    def forward(self, state, depth):
        for name in LAYOUT[self.index]:
            inputs, token = depth.read(state, self.index, name)
            depth.write(state, self.index, name, _f(self.weights[(self.index, name)],
                                                    inputs.query), token)


def _f(weight, x):
    return torch.tanh(torch.nn.functional.layer_norm(x, (C,)) @ weight)


def _setup(variant, lags, seed=0):
    g = torch.Generator().manual_seed(seed)
    connection = laurel.Laurel(LAYOUT, C, variant, R if variant in laurel.LOW_RANK else 0,
                               lags).double()
    with torch.no_grad():  # random, not the initialisation
        for p in connection.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype))
    weights = {site: torch.randn(C, C, generator=g, dtype=torch.float64)
               for site in connection.sites}
    x0 = torch.randn(5, 2, C, generator=g, dtype=torch.float64)  # T x B x C
    return connection, weights, x0


def _run(connection, weights, x0):
    blocks = [_Sublayer(i, weights) for i in range(len(LAYOUT))]
    return run_blocks(Depth(connection), blocks, x0)


def _equations(connection, weights, x0, window="truncated"):
    """The paper's recurrences, one sub-layer i at a time (row vectors: the paper's B A x is
    x A B here), from the connection's parameters:
    RW x' = a f(x) + b x; LR x' = f(x) + x + x A B; RW+LR x' = a f(x) + b (x + x A B);
    PA x' = f(x) + x + sum_j g_j x_{i-j} A_j B_j; RW+LR+PA x' = a f(x) + b (x + sum_j ...),
    (a, b) = 2 softmax(w). ``window``: 'truncated' (lags below x_0 absent), 'shifted' (a
    wrong reading: lag j reads x_{i-j-1}), 'separate-beta' (RW's beta on x_i only)."""
    variant = connection.variant
    xs = [x0]
    for i, site in enumerate(connection.sites):
        x = xs[-1]
        f = _f(weights[site], x)
        if variant in laurel.LOW_RANK:
            lags = connection.lags if variant in laurel.PREVIOUS else 1
            extra = 0
            for j in range(lags):
                source = i - j - (1 if window == "shifted" else 0)
                if source < 0:
                    continue
                term = xs[source] @ connection.down[i, j] @ connection.up[i, j]
                if variant in laurel.PREVIOUS:
                    term = connection.gammas[i, j] * term
                extra = extra + term
        else:
            extra = 0
        if variant in laurel.SCALED:
            a, b = 2 * torch.softmax(connection.residual_logits[i], 0)
            xs.append(a * f + (b * (x + extra) if window != "separate-beta" else b * x + extra))
        else:
            xs.append(f + x + extra)
    return xs[-1]


@pytest.mark.parametrize("variant,lags", [("rw", 1), ("lr", 1), ("rw_lr", 1), ("pa", 3),
                                          ("pa", 2), ("pa", 1), ("rw_lr_pa", 3),
                                          ("rw_lr_pa", 7)])
def test_every_variant_is_the_papers_equation_in_float64(variant, lags):
    connection, weights, x0 = _setup(variant, lags)
    with torch.no_grad():
        got = _run(connection, weights, x0)
        torch.testing.assert_close(got, _equations(connection, weights, x0), rtol=1e-12,
                                   atol=1e-12)
        # the counterparts that must differ: a test that could not tell them apart is no test
        if variant in laurel.PREVIOUS and lags > 1:
            assert (got - _equations(connection, weights, x0, "shifted")).abs().max() > 1e-3
        if variant in laurel.SCALED and variant != "rw":
            separate = _equations(connection, weights, x0, "separate-beta")
            assert (got - separate).abs().max() > 1e-3
    # and its gradients are autograd's of the same equations
    params = [p for p in connection.parameters()]
    x0 = x0.requires_grad_()
    grads = torch.autograd.grad(_run(connection, weights, x0).square().sum(), params + [x0])
    expected = torch.autograd.grad(_equations(connection, weights, x0).square().sum(),
                                   params + [x0], allow_unused=True)
    for got_grad, want in zip(grads, expected):
        want = torch.zeros_like(got_grad) if want is None else want
        torch.testing.assert_close(got_grad, want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("variant", laurel.VARIANTS)
def test_initialisation_is_the_plain_residual_bit_for_bit(variant):
    """alpha = beta = 2 softmax(0) = 1 and B = 0: x + f(x) exactly, as the plain Connection."""
    from fairseq_plugins.depth.interface import Connection

    connection, weights, x0 = _setup(variant, 3)
    connection.reset_parameters()
    with torch.no_grad():
        assert torch.equal(_run(connection, weights, x0), _run(Connection(LAYOUT), weights, x0))
    if connection.down is not None:  # A: the paper's column-orthogonal initialisation
        a = connection.down[0, 0]
        assert torch.equal(a.t() @ a, torch.eye(R, dtype=a.dtype) / (R * C) * math.ceil(C / R))
        assert torch.count_nonzero(connection.up) == 0


def test_previous_activations_are_truncated_at_the_bottom_and_read_per_position():
    """PA's window: the first sub-layers have fewer lags (their missing x_{i-j} are absent:
    their parameters get no gradient), and a position reads only its own earlier inputs."""
    connection, weights, x0 = _setup("pa", 3)
    x0 = x0.requires_grad_()
    out = _run(connection, weights, x0)
    out[2].sum().backward()  # position 2 only
    assert x0.grad[:2].abs().max() == 0 and x0.grad[3:].abs().max() == 0
    assert torch.count_nonzero(connection.down.grad[0, 1:]) == 0  # sub-layer 0: lag 0 only
    assert torch.count_nonzero(connection.down.grad[1, 2]) == 0  # sub-layer 1: lags 0, 1
    assert torch.count_nonzero(connection.down.grad[2, 2]) > 0


def test_logged_weights_are_alpha_beta_and_the_gammas():
    connection, _, _ = _setup("rw_lr_pa", 3)
    logged = connection.logged_weights()
    scales = 2 * torch.softmax(connection.residual_logits[4], 0)
    assert logged["k4_alpha"] == pytest.approx(scales[0].item())
    assert logged["k4_beta"] == pytest.approx(scales[1].item())
    assert logged["k4_gamma2"] == pytest.approx(connection.gammas[4, 2].item())
    # sub-layer 0 has no lag 1 or 2 (truncated)
    assert "k0_gamma0" in logged and "k0_gamma1" not in logged and "k1_gamma1" in logged
    product = connection.down[3, 1] @ connection.up[3, 1]  # the C x C map, written out
    assert logged["k3_lr1"] == pytest.approx(torch.linalg.matrix_norm(product).item(), rel=1e-6)
    plain_lr = laurel.Laurel(LAYOUT, C, "lr", R).logged_weights()
    assert set(plain_lr) == {f"k{i}_lr0" for i in range(6)}
    assert all(value == 0 for value in plain_lr.values())  # B = 0 at initialisation


def test_macs_count_the_scalings_and_the_low_rank_terms():
    assert laurel.Laurel(LAYOUT, C, "rw").macs(C) == 6 * 2 * C
    assert laurel.Laurel(LAYOUT, C, "lr", R).macs(C) == 6 * 2 * R * C
    # pa, k = 3: 1 + 2 + 3 + 3 + 3 + 3 terms, each 2rC and a gamma (C)
    assert laurel.Laurel(LAYOUT, C, "pa", R, 3).macs(C) == 15 * (2 * R * C + C)


@pytest.mark.parametrize("theirs,ours,message", [
    (["--laurel", "rw_lr"], ["--laurel", "pa"],
     "trained with --laurel rw_lr --laurel-rank 16, this model has --laurel pa --laurel-rank "
     "16 --laurel-lags 3"),
    (["--laurel", "lr", "--laurel-rank", "4"], ["--laurel", "lr"], "--laurel-rank 4"),
    (["--laurel", "pa", "--laurel-lags", "2"], ["--laurel", "pa"], "--laurel-lags 2"),
    (["--mudd"], ["--laurel", "rw"], "not trained with --laurel"),
])
def test_a_checkpoint_of_another_variant_is_refused_naming_its_flags(theirs, ours, message):
    checkpoint = build_language_model("gpt_baseline_lm_tiny", theirs)[0].state_dict()
    model = build_language_model("gpt_baseline_lm_tiny", ours)[0]
    with pytest.raises(ValueError, match=message.replace("-", r"\-")):
        model.load_state_dict(checkpoint)
    model.load_state_dict(build_language_model("gpt_baseline_lm_tiny", ours, seed=3)[0]
                          .state_dict())


@pytest.mark.parametrize("arch,extra,message", [
    ("gpt_baseline_lm_tiny", ["--laurel", "lr", "--laurel-rank", "32"],
     "--laurel-rank 32 must be less than the decoder's width 32"),
    ("ar_encdec_lm_tiny", ["--laurel", "pa", "--laurel-rank", "100"],
     "--laurel-rank 100 must be less than the"),
    ("gpt_baseline_lm_tiny", ["--laurel", "rw", "--laurel-rank", "4"],
     "--laurel-rank was given but --laurel is rw"),
    ("gpt_baseline_lm_tiny", ["--laurel-rank", "4"],
     "--laurel-rank was given but --laurel is none"),
    ("gpt_baseline_lm_tiny", ["--laurel", "rw_lr", "--laurel-lags", "2"],
     "--laurel-lags was given but --laurel is rw_lr, which reads no previous inputs: add "
     "--laurel pa or rw_lr_pa"),
    ("gpt_baseline_lm_tiny", ["--laurel", "pa", "--laurel-lags", "0"],
     "--laurel-lags must be >= 1"),
    ("gpt_baseline_lm_tiny", ["--laurel", "lr", "--laurel-rank", "0"],
     "--laurel-rank must be >= 1"),
    ("gpt_baseline_lm_tiny", ["--laurel", "rw", "--hyper-connections", "static"], "choose one"),
    ("gpt_baseline_lm_tiny", ["--laurel", "rw", "--attn-res", "full"], "choose one"),
    ("ar_encdec_lm_tiny", ["--laurel", "rw", "--encoder-fusion"], "choose one"),
])
def test_build_time_refusals(arch, extra, message):
    with pytest.raises(ValueError) as error:
        build_language_model(arch, ["--tokens-per-sample", 16, *extra])
    assert message in str(error.value) and "\n" not in str(error.value)


def test_post_norm_seq2seq_stacks_are_refused_and_pre_norm_ones_built():
    with pytest.raises(ValueError, match="--laurel is defined for pre-norm stacks only and the "
                                         "encoder is post-norm"):
        build_translation_model("layerwise_transformer_tiny", ["--laurel", "rw"])
    model = build_translation_model("laurel_pa_transformer_tiny", ["--laurel-lags", "2"])[0]
    enc, dec = model.encoder.depth.connection, model.decoder.depth.connection
    assert (enc.variant, enc.lags, len(enc.sites)) == ("pa", 2, 4)
    assert (dec.variant, dec.lags, len(dec.sites)) == ("pa", 2, 6)  # self, cross, ffn
    assert enc.down.shape == (4, 2, 64, 16)


def test_laurel_composes_with_value_residual():
    plain = build_language_model("gpt_baseline_lm_tiny", ["--value-residual", "learnable"])[0]
    model = build_language_model("gpt_baseline_lm_tiny", ["--laurel", "rw_lr_pa",
                                                          "--value-residual", "learnable"],
                                 seed=1)[0]
    torch.nn.Module.load_state_dict(model, {**model.state_dict(), **plain.state_dict()})
    tokens = torch.randint(4, 24, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(model.double().eval()(tokens)[0], plain.double().eval()(tokens)[0])
