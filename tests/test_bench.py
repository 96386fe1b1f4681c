"""The benchmark script runs and writes valid JSON (no timing is asserted: see scripts/bench)."""
import json
import os
import subprocess
import sys

from helpers import SCRIPTS


def test_seq2seq_bench_quick_writes_json(tmp_path):
    out = tmp_path / "bench.json"
    proc = subprocess.run([sys.executable, os.path.join(SCRIPTS, "bench", "seq2seq.py"), "--quick",
                           "--variants", "transformer,fusion,bridge,swapped", "--out", str(out),
                           "--markdown", str(tmp_path / "bench.md")],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report == json.loads(proc.stdout)
    assert set(report["results"]) == {"transformer", "fusion", "bridge", "swapped"}
    scaling = report["cross_attention_memory_mb_by_target_length"]
    assert set(scaling) == {"16", "32"} and all(set(v) == {"standard", "swapped"}
                                                for v in scaling.values())
    for variant in ("fusion", "bridge"):
        ratios = report["ratios_vs_transformer"][variant]
        assert ratios["params_extra"] > 0 and ratios["mac_model_ratio"] > 1
        assert all(v > 0 for v in ratios.values())
    d, layers = report["config"]["d"], report["config"]["layers"]
    assert report["ratios_vs_transformer"]["bridge"]["params_extra"] == layers * layers * d * d
    table = (tmp_path / "bench.md").read_text()
    assert "| fusion |" in table and "| bridge |" in table


def test_lm_bench_quick_writes_json(tmp_path):
    out = tmp_path / "bench_lm.json"
    proc = subprocess.run([sys.executable, os.path.join(SCRIPTS, "bench", "lm.py"), "--quick",
                           "--out", str(out)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report == json.loads(proc.stdout)
    assert set(report["ratios_vs_gpt_baseline_lm"]) == {"ar_encdec_lm", "ar_encdec_lm_emb_mse"}
    assert set(report["cache_speedup"]) == {"gpt_baseline_lm", "ar_encdec_lm",
                                            "ar_encdec_lm_emb_mse"}
    assert all(v > 0 for v in report["cache_speedup"].values())
    params = {n: r["params_reference_count"] for n, r in report["results"].items()}
    assert params["ar_encdec_lm_emb_mse"] - params["ar_encdec_lm"] == 4 * 32  # the two loss LNs
