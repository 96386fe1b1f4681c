#!/usr/bin/env python3
"""Do the well-kept libraries that fuse the same functions compute ours? (issue 103's anchors)

    [TRITON_INTERPRET=1] python scripts/bench/anchors.py [--te-mhc FILE] [--out results/X.json]

- fla-core's Attention Residuals (``fla.ops.attnres``): its reference ``naive_attnres`` against
  our AttnRes read (``depth/attn_res.py``, eager) for every query of a Full AttnRes stack, values
  and gradients, in float32 on the CPU; its Triton ``fused_attnres`` the same way where CUDA is
  available (it refuses CPU tensors, also under Triton's interpreter).
- NVIDIA TransformerEngine's Triton mHC Sinkhorn (``_mhc_sinkhorn_fwd_fused`` in
  ``transformer_engine/common/triton/mhc.py``, pure Triton: run under the interpreter on the CPU)
  against ``depth.mhc.sinkhorn`` after 20 iterations, fed our logits as they are and transposed
  (TransformerEngine mixes the streams as ``x @ H_res`` with x of C x n: its H_res is the
  transpose of the paper's, which ours follows). ``--te-mhc`` names the file (TransformerEngine's
  PyTorch package needs its CUDA library to import, the Triton file does not); by default it is
  looked up on ``sys.path`` without importing the package.

A library that is not installed is reported as such. Writes a JSON report (and markdown beside
it with ``--out``). docs/ideas/fused-kernels.md says what the numbers show.
"""
import argparse
import glob
import importlib.util
import json
import os
import sys

import torch

from layerlab import bench

TE_FILE = os.path.join("transformer_engine", "common", "triton", "mhc.py")


def _max_diff(a, b) -> float:
    """max |a - b| relative to max |b| (b: ours, or the exact value)."""
    a, b = a.detach().float(), b.detach().float()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


def fla_attnres(device: str) -> dict:
    """Our Full AttnRes read of every sub-layer against fla's naive (and, on CUDA, fused) read:
    {'naive': {value, gradients}, 'fused': ...} as max differences relative to ours (float32)."""
    try:
        from fla.ops import attnres
    except ImportError as error:
        return {"installed": False, "why": str(error)}
    from fairseq_plugins.inprocess import build_language_model

    model = build_language_model("gpt_baseline_lm_tiny", ["--tokens-per-sample", "16",
                                                          "--embed-dim", "64", "--attn-res",
                                                          "full", "--no-fused-kernels"])[0]
    connection = model.decoder.depth.connection.to(device)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        connection.queries.copy_(torch.randn(connection.queries.shape, generator=g))
        connection.key_gains.copy_(0.5 + torch.rand(connection.key_gains.shape, generator=g))
    out = {"installed": True}
    readers = {"naive": attnres.naive_attnres}
    if device == "cuda":
        readers["fused"] = attnres.fused_attnres
    for name, read in readers.items():
        worst = {"value": 0.0, "grad_sources": 0.0, "grad_query": 0.0, "grad_gain": 0.0}
        for k in range(1, connection.queries.size(0)):
            sources = [torch.randn(9, 3, 64, generator=g).to(device).requires_grad_()
                       for _ in range(k + 1)]
            state = connection.start(sources[0])
            state.open_slot(connection, connection.new_slot(sources[0]))
            logits = [connection._logits(v, k) for v in sources]
            ours = connection._attend(state, sources, logits, k)  # T x B x C
            query = connection.queries[k].detach().clone().requires_grad_()
            gain = connection.key_gains[k].detach().clone().requires_grad_()
            theirs = read(query, sources, gain, rms_eps=1e-6)
            upstream = torch.randn(ours.shape, generator=g).to(device)
            ours_grads = torch.autograd.grad(ours, sources + [connection.queries,
                                                              connection.key_gains], upstream)
            their_grads = torch.autograd.grad(theirs, sources + [query, gain], upstream)
            worst["value"] = max(worst["value"], _max_diff(ours, theirs))
            worst["grad_sources"] = max(worst["grad_sources"], *(
                _max_diff(a, b) for a, b in zip(ours_grads[:-2], their_grads[:-2])))
            worst["grad_query"] = max(worst["grad_query"],
                                      _max_diff(ours_grads[-2][k], their_grads[-2]))
            worst["grad_gain"] = max(worst["grad_gain"],
                                     _max_diff(ours_grads[-1][k], their_grads[-1]))
        out[name] = worst
    if device != "cuda":
        out["fused"] = "not run: fused_attnres refuses CPU tensors (also under the interpreter)"
    else:
        out["time"] = fla_attnres_time()
    return out


def fla_attnres_time(sources=13, width=1024, tokens=64 * 128, rounds=20) -> dict:
    """On CUDA: forward + backward of one read over ``sources`` states (Full AttnRes's last
    read at 6 blocks; bf16, T*B = ``tokens``, ``width`` C) by our kernel
    (fairseq_plugins.kernels.depth_attention: the query already multiplied by the keys' gain) and
    by fla's fused_attnres; milliseconds per call, the median of ``rounds`` after a warm-up."""
    from fla.ops.attnres import fused_attnres

    from fairseq_plugins.depth import fused

    g = torch.Generator(device="cuda").manual_seed(0)
    states = [torch.randn(tokens, width, device="cuda", dtype=torch.bfloat16, generator=g)
              .requires_grad_() for _ in range(sources)]
    query = torch.randn(width, device="cuda", generator=g).requires_grad_()
    gain = torch.ones(width, device="cuda").requires_grad_()
    upstream = torch.randn(tokens, width, device="cuda", dtype=torch.bfloat16, generator=g)

    def ours():
        torch.autograd.grad(fused.depth_attention(query * gain, *states), states + [query],
                            upstream)

    def theirs():
        torch.autograd.grad(fused_attnres(query, states, gain, rms_eps=1e-6),
                            states + [query], upstream)

    out = {}
    for name, step in (("ours_ms", ours), ("fla_ms", theirs)):
        for _ in range(3):
            step()
        times = []
        for _ in range(rounds):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            step()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        out[name] = sorted(times)[len(times) // 2]
    out.update(sources=sources, width=width, tokens=tokens)
    return out


def _te_file(path):
    if path:
        return path
    for root in sys.path:
        found = glob.glob(os.path.join(root, TE_FILE))
        if found:
            return found[0]
    return None


def te_sinkhorn(path, device: str, iterations: int = 20) -> dict:
    """TransformerEngine's Sinkhorn kernel against ours on N(0, 4) logits of 4 x 4 matrices:
    max differences (the matrices' entries are at most 1) with the logits and the result
    transposed (its orientation) and as they are, and which side of its result is exactly
    normalised."""
    path = _te_file(path)
    if path is None or not os.path.exists(path):
        return {"installed": False, "why": f"{TE_FILE} not found (--te-mhc FILE)"}
    if device != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        return {"installed": True, "why": "on the CPU it runs only under TRITON_INTERPRET=1"}
    os.environ.setdefault("NVTE_DISABLE_TRITON_AUTOTUNING", "1")
    spec = importlib.util.spec_from_file_location("te_triton_mhc", path)
    te = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(te)
    from fairseq_plugins.depth.mhc import sinkhorn

    g = torch.Generator().manual_seed(0)
    m, n = 256, 4
    logits = 2 * torch.randn(m, n, n, generator=g)
    ours = sinkhorn(logits, iterations)

    def run(x):
        x = x.contiguous().view(m, n * n).to(device)
        out = torch.empty_like(x)
        history = torch.empty(iterations + 1, m, n, device=device)
        grid = (triton_cdiv(m * n * n, 256),)
        te._mhc_sinkhorn_fwd_fused[grid](x, out, history, history.clone(), x.stride(0),
                                         x.stride(1), out.stride(0), out.stride(1), m, n=n,
                                         iters=iterations)
        return out.view(m, n, n).cpu()

    transposed = run(logits.transpose(-1, -2)).transpose(-1, -2)
    as_is = run(logits)
    return {"installed": True, "file": path, "iterations": iterations,
            "transposed_in_and_out": _max_diff(transposed, ours),
            "as_is": _max_diff(as_is, ours),
            "its_rows_sum_error": _max_diff(as_is.sum(-1), torch.ones(m, n)),
            "its_columns_sum_error": _max_diff(as_is.sum(-2), torch.ones(m, n))}


def _version(package: str) -> str:
    from importlib import metadata
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def triton_cdiv(a, b):
    return (a + b - 1) // b


def markdown(report) -> str:
    lines = [f"Command: `{report['command']}`", "", report["where"], ""]
    fla = report["fla_attnres"]
    lines.append("| anchor | compared with | max difference, relative to the largest entry |")
    lines.append("|---|---|---|")
    if fla.get("installed"):
        for name in ("naive", "fused"):
            value = fla.get(name)
            if isinstance(value, dict):
                text = ", ".join(f"{k} {v:.2e}" for k, v in value.items())
            else:
                text = str(value)
            lines.append(f"| fla-core `{name}_attnres` | our AttnRes read, every query | {text} |")
        if "time" in fla:
            t = fla["time"]
            lines.append(f"| fla-core `fused_attnres`, forward + backward, {t['sources']} sources, "
                         f"C = {t['width']}, {t['tokens']} positions, bf16 | our kernel | "
                         f"{t['fla_ms']:.3f} ms against ours {t['ours_ms']:.3f} ms |")
    else:
        lines.append(f"| fla-core AttnRes | — | not installed ({fla.get('why')}) |")
    te = report["te_sinkhorn"]
    if "as_is" in te:
        lines.append(f"| TransformerEngine Sinkhorn (20 iterations) | ours, logits and result "
                     f"transposed | {te['transposed_in_and_out']:.2e} |")
        lines.append(f"| TransformerEngine Sinkhorn (20 iterations) | ours, as they are | "
                     f"{te['as_is']:.2e} (its rows sum to 1 within {te['its_rows_sum_error']:.1e}, "
                     f"its columns within {te['its_columns_sum_error']:.1e}) |")
    else:
        lines.append(f"| TransformerEngine Sinkhorn | — | {te.get('why')} |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--te-mhc", help=f"TransformerEngine's {TE_FILE}")
    p.add_argument("--out", help="also write the JSON here (and the markdown beside it)")
    args = p.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    report = {"command": "python " + " ".join([os.path.relpath(__file__)] + sys.argv[1:]),
              "where": f"{device}, torch {torch.__version__}, fla-core {_version('fla-core')}, "
                       f"TRITON_INTERPRET={os.environ.get('TRITON_INTERPRET', '')}",
              "fla_attnres": fla_attnres(device), "te_sinkhorn": te_sinkhorn(args.te_mhc, device)}
    bench.emit_report(report, args.out)
    if args.out:
        bench.write_text(os.path.splitext(args.out)[0] + ".md", markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
