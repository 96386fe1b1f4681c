"""The benchmark suite runs and writes valid JSON, markdown and the scaling PNG (no timing is
asserted: see scripts/bench)."""
import json
import os
import statistics
import subprocess
import sys

import pytest
import torch

from conftest import forked_env, run_command
from helpers import SCRIPTS
from layerlab import paths

RUN = os.path.join(SCRIPTS, "bench", "run.py")


def paired(a, b, key="train_seconds_per_round"):
    """The median over the rounds of a's time / b's within a round (what the suite reports)."""
    return statistics.median(x / y for x, y in zip(a[key], b[key]))


def test_bench_suite_quick_writes_every_part(tmp_path):
    out, md, png = tmp_path / "bench.json", tmp_path / "bench.md", tmp_path / "scaling.png"
    # its workers forked from a warm server (layerlab.warm), as --quick allows: the suite's
    # own process starts fresh, as a user's does
    proc = subprocess.run([sys.executable, os.path.join(SCRIPTS, "bench", "run.py"), "--quick",
                           "--out", str(out), "--markdown", str(md), "--plot", str(png)],
                          capture_output=True, text=True, env=forked_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    # progress only: fairseq's import sets the root logger to DEBUG unless the suite configures
    # it first (then matplotlib's font search alone logs hundreds of lines)
    assert "DEBUG:" not in proc.stderr and "INFO:" not in proc.stderr, proc.stderr[:3000]
    assert "[bench] === depth ===" in proc.stderr
    report = json.loads(out.read_text())
    assert report == json.loads(proc.stdout)
    assert report["quick"] and set(report["parts"]) == {"seq2seq", "lm", "scaling", "depth"}

    seq2seq = report["parts"]["seq2seq"]
    assert set(seq2seq["results"]) == {"transformer", "fusion", "fusion_enc", "fusion_dec",
                                       "fusion_recompute",
                                       "bridge", "swapped", "inverted", "decoder_values",
                                       "dwa", "transparent"}
    memory = seq2seq["cross_attention_memory_mb_by_target_length"]
    assert set(memory) == {"16", "32"} and all(set(v) == {"standard", "swapped"}
                                               for v in memory.values())
    for variant in ("fusion", "bridge"):
        ratios = seq2seq["ratios_vs_transformer"][variant]
        assert ratios["params_extra"] > 0 and ratios["mac_model_ratio"] > 1
        # --quick measures every model's memory in one process: a peak not isolated, maybe 0
        assert ratios.pop("memory_growth_ratio") >= 0
        assert all(v > 0 for v in ratios.values())
    d, layers = seq2seq["config"]["d"], seq2seq["config"]["layers"]
    assert seq2seq["ratios_vs_transformer"]["bridge"]["params_extra"] == layers * layers * d * d
    assert seq2seq["ratios_vs_transformer"]["inverted"]["mac_model_ratio"] == 1.0
    bridge = seq2seq["results"]["bridge"]  # ratios window by window against its own baseline
    ratios = seq2seq["ratios_vs_transformer"]["bridge"]
    assert ratios["train_time_ratio"] == pytest.approx(
        paired(bridge, bridge["baseline_in_same_process"]), abs=2e-3)
    assert ratios["generate_time_ratio"] == pytest.approx(paired(
        bridge, bridge["baseline_in_same_process"], "generate_seconds_per_round"), abs=2e-3)

    depth = report["parts"]["depth"]  # every method against the plain LM, its MAC share
    assert set(depth["ratios_vs_plain"]) == {"plain", "dwa", "lrf", "lrf_all_positions",
                                             "hc_static_n4",
                                             "hc_dynamic_n4", "mhc_n4", "mhc_lite_n4",
                                             "frac_static_m4", "frac_dynamic_m4",
                                             "hc_dynamic_n4_recompute", "mhc_n4_recompute",
                                             "frac_dynamic_m4_recompute",
                                             "attn_res_full", "attn_res_block", "mudd",
                                             "value_residual", "laurel_rw_lr", "laurel_pa",
                                             "ar_encdec", "ar_encdec_bridge",
                                             "ar_encdec_transparent",
                                             "ar_encdec_embedding_loss"}
    # time ratios: the median over the rotation's rounds of the ratio within a round
    rows = depth["ratios_vs_plain"]
    lite, plain = rows["mhc_lite_n4"], rows["plain"]
    assert len(plain["train_seconds_per_round"]) == 2  # --quick: two rounds
    assert lite["train_time_ratio"] == pytest.approx(paired(lite, plain), abs=2e-3)
    assert lite["train_time_ratio_vs_mhc"] == pytest.approx(paired(lite, rows["mhc_n4"]),
                                                            abs=2e-3)
    assert depth["ratios_vs_plain"]["plain"]["mac_share"] == 0
    # None where the quick rows' timed steps took too few clock ticks for a share
    assert all(r["system_time_share"] is None or 0 <= r["system_time_share"] <= 1
               for r in rows.values())
    assert all(r["mac_share"] > 0 and r["train_time_ratio"] > 0
               for name, r in depth["ratios_vs_plain"].items() if name != "plain")
    # ar_encdec_lm: its cross-attention beyond the plain blocks; a bridge adds its own MACs (the
    # FC bridge a d x d product per encoder state, transparent attention a scaled vector), the
    # embedding loss none
    ar = {name[len("ar_encdec"):]: r["mac_share"] for name, r in rows.items()
          if name.startswith("ar_encdec")}
    assert ar["_bridge"] > ar["_transparent"] > ar[""] == ar["_embedding_loss"]
    assert rows["ar_encdec_embedding_loss"]["params_reference_count"] > \
        rows["ar_encdec"]["params_reference_count"]  # the loss's two LayerNorms

    lm = report["parts"]["lm"]
    assert set(lm["ratios_vs_gpt_baseline_lm"]) == {"ar_encdec_lm", "ar_encdec_lm_emb_mse"}
    ar, gpt = lm["results"]["ar_encdec_lm"], lm["results"]["gpt_baseline_lm"]
    assert lm["ratios_vs_gpt_baseline_lm"]["ar_encdec_lm"]["train_tokens_per_second_ratio"] == \
        pytest.approx(paired(gpt, ar), abs=2e-3)  # tokens/s: the baseline's time / the model's
    assert set(lm["cache_speedup"]) == {"gpt_baseline_lm", "ar_encdec_lm", "ar_encdec_lm_emb_mse"}
    assert all(v > 0 for v in lm["cache_speedup"].values())
    params = {n: r["params_reference_count"] for n, r in lm["results"].items()}
    assert params["ar_encdec_lm_emb_mse"] - params["ar_encdec_lm"] == 4 * 32  # the two loss LNs

    curves = report["parts"]["scaling"]["curves"]
    assert [r["length"] for r in curves["length"]] == [8, 16]
    assert [r["depth"] for r in curves["depth"]] == [2, 3]
    for row in curves["depth"]:
        assert set(row["seconds_per_update"]) == {"transformer", "fusion", "bridge"}
        assert row["mac_model_ratio"]["fusion"] > row["mac_ratio_implemented"]["fusion"] > 1
    # the naive fusion MAC ratio grows with depth (quadratic extra cost over a linear base)
    assert curves["depth"][1]["mac_model_ratio"]["fusion"] > \
        curves["depth"][0]["mac_model_ratio"]["fusion"]

    targets = {t["target"]: t for t in report["targets"]}
    # 16 targets of the first wave + DWA's training time and transparent attention's vs the
    # bridge + the four of the depth connections (HC, value residual, MUDD, DWA in the LM) +
    # fusion's memory with --fusion-recompute + mHC's time and mHC-lite's against mHC's +
    # Frac-Connections' time and memory, AttnRes Full's and Block's time
    assert len(targets) == 29 and all(isinstance(t["met"], bool) for t in targets.values())
    assert all(f"{row}: training time / the plain LM's" in targets
               for row in ("hc_dynamic_n4", "value_residual", "mudd", "dwa", "mhc_n4",
                           "frac_dynamic_m4", "attn_res_full", "attn_res_block"))
    assert targets["frac_dynamic_m4: peak-memory growth / the plain LM's"]["required"] == "<= 1.02"
    assert targets["mhc_lite_n4: training time / mHC's"]["required"] == "<= 1.0"
    assert targets["transparent: training time / FC bridge's"]["required"] == "<= 1.0"
    assert targets["swapped: training time / transformer's"]["required"] == "<= 2.0"
    table = md.read_text()
    assert "--quick: tiny sizes" in table and "| fusion |" in table and "| 8 |" in table
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_suite_rejects_unknown_parts_and_cpu_fp16(tmp_path):
    run = os.path.join(SCRIPTS, "bench", "run.py")
    proc = run_command([sys.executable, run, "--only", "seq2seq,gpu"])
    assert proc.returncode == 2 and "unknown part(s) gpu" in proc.stderr
    proc = run_command([sys.executable, run, "--fp16"])
    assert proc.returncode == 2 and "--fp16 needs --device cuda" in proc.stderr


def _suite_paths(*argv):
    """(out, markdown, plot) that scripts/bench/run.py resolves for ``argv``: asked of a fresh
    interpreter, where the suite's own ``common`` module is the one it imports."""
    code = ("import importlib.util, json, sys; "
            f"spec = importlib.util.spec_from_file_location('suite', {RUN!r}); "
            "suite = importlib.util.module_from_spec(spec); spec.loader.exec_module(suite); "
            "args = suite.parse_args(sys.argv[1:]); "
            "print(json.dumps([args.out, args.markdown, args.plot, suite.common.REPO]))")
    proc = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    *paths, repo = json.loads(proc.stdout)
    return paths, repo


def test_quick_runs_never_write_over_the_committed_results():
    full, repo = _suite_paths()
    results = os.path.join(repo, "results")
    assert full == [os.path.join(results, f) for f in ("bench.json", "bench.md",
                                                       "bench_scaling.png")]
    quick, _ = _suite_paths("--quick")
    for path in quick:
        assert not os.path.abspath(path).startswith(results + os.sep), path
    # explicit paths still win
    assert _suite_paths("--quick", "--out", "x.json")[0][0] == "x.json"


def test_depth_bench_measures_the_rows_asked_for_and_refuses_unknown_ones():
    depth = paths.load_script("bench", "depth.py")
    assert depth.chosen_rows("mudd,ar_encdec") == ["plain", "mudd", "ar_encdec"]
    eager = [r for r in depth.METHODS if r.endswith("_eager")]
    assert eager == ["hc_static_n4_eager", "hc_dynamic_n4_eager", "mhc_n4_eager",
                     "mhc_lite_n4_eager", "frac_dynamic_m4_eager", "attn_res_full_eager",
                     "attn_res_block_eager", "mudd_eager"]
    assert all(depth.METHODS[r][1] == depth.METHODS[r[:-len("_eager")]][1]
               + ["--no-fused-kernels"] for r in eager)
    graph = [r for r in depth.METHODS if r.endswith("_graph")]
    assert graph == ["plain_graph", "dwa_graph", "value_residual_graph"] + [
        r[:-len("_eager")] + "_graph" for r in eager]
    assert all(depth.METHODS[r][1] == depth.METHODS[r[:-len("_graph")]][1] + ["--cuda-graph"]
               for r in graph)
    compiled = [r for r in depth.METHODS if r.endswith("_compile")]
    assert compiled == [r[:-len("_graph")] + "_compile" for r in graph]
    assert all(depth.METHODS[r][1] == depth.METHODS[r[:-len("_compile")]][1] + [
        "--torch-compile", "--torch-compile-mode", "reduce-overhead"] for r in compiled)
    # every row; the eager, graph and compiled twins on a GPU only (on a CPU the same code, or
    # minutes of compiling)
    assert depth.chosen_rows(None, "cuda") == list(depth.METHODS)
    assert depth.chosen_rows(None) == [r for r in depth.METHODS
                                       if r not in eager + graph + compiled]
    assert depth.chosen_rows("mhc_n4_eager") == ["plain", "mhc_n4_eager"]
    with pytest.raises(SystemExit, match="unknown row.s. hc_sideways; known: plain, dwa"):
        depth.chosen_rows("plain,hc_sideways")


@pytest.mark.parametrize("flags,message", [
    (["--depths", "3", "--rows", "attn_res_block,mudd"],
     "--depths 3: a positive number of blocks, even for attn_res_block"),
    (["--depths", "12,0", "--rows", "mudd"], "--depths 0: a positive number of blocks$"),
    (["--embed-dim", "130", "--rows", "mudd"], "--embed-dim 130: a positive multiple of 4"),
    (["--embed-dim", "0", "--rows", "mudd"], "--embed-dim 0: a positive multiple of 4"),
    (["--quick", "--embed-dim", "64"], "--embed-dim: not with --quick"),
    (["--quick", "--batch", "64"], "--batch: not with --quick"),
    (["--batch", "0", "--rows", "mudd"], "--batch 0: at least 1 sequence"),
    (["--quick", "--vocab", "8000"], "--vocab: not with --quick"),
    (["--vocab", "4", "--rows", "mudd"], "--vocab 4: at least 5 symbols"),
    (["--dropout", "1", "--rows", "mudd"], r"--dropout 1.0: a probability in \[0, 1\)"),
    (["--dropout", "-0.1", "--rows", "mudd"], r"--dropout -0.1: a probability in \[0, 1\)"),
])
def test_depth_bench_refuses_depths_it_cannot_build_before_measuring(flags, message):
    depth = paths.load_script("bench", "depth.py")
    with pytest.raises(SystemExit, match=message):
        depth.run(depth.parser().parse_args(flags))


def test_depth_bench_measures_the_batch_vocabulary_and_dropout_asked_for(monkeypatch):
    """--batch, --vocab and --dropout reach every job the bench runs (the comparison's 16
    sequences, WikiText-2's 33,278 words and the models' own dropout, none, by default): the
    dropout as every model's flag, and in the config the report records."""
    depth = paths.load_script("bench", "depth.py")
    jobs = []

    def stop(script, job_list, *rest, **kw):
        jobs.extend(job_list)
        raise RuntimeError("stop")
    monkeypatch.setattr(depth.common, "run_jobs", stop)
    for flags, batch, vocab, dropout in ((["--batch", "64"], 64, 33278, 0.0),
                                         ([], 16, 33278, 0.0), (["--vocab", "8000"], 16, 8000, 0.0),
                                         (["--dropout", "0.1"], 16, 33278, 0.1)):
        with pytest.raises(RuntimeError, match="stop"):
            depth.run(depth.parser().parse_args(["--rows", "mudd", "--depths", "4", *flags]))
        assert {job["cfg"]["batch"] for job in jobs} == {batch}
        assert {job["cfg"]["vocab"] for job in jobs} == {vocab}
        assert {job["cfg"]["dropout"] for job in jobs} == {dropout}
        for job in jobs:
            model_flags = job["models"][job["model"]][1]
            assert ("--dropout" in model_flags) == bool(dropout)
            if dropout:
                assert float(model_flags[model_flags.index("--dropout") + 1]) == dropout
        assert len(jobs) == 2  # the plain model and MUDD
        jobs.clear()


def test_cuda_jobs_share_one_process_and_cpu_jobs_get_one_each(monkeypatch):
    """On CUDA the allocator's peak is reset per measurement, so the jobs share a process (a
    process each costs CUDA's start-up); on CPU the peak resident set cannot be reset."""
    from layerlab import bench

    calls = []
    monkeypatch.setattr(bench, "run_isolated", lambda script, job, threads, forkable=False:
                        calls.append((job, forkable)) or [job])
    cuda = [{"device": "cuda", "model": m} for m in ("plain", "mhc")]
    bench.run_jobs("s.py", cuda, 1, ["a", "b"])
    assert calls == [({"mode": bench.JOBS, "jobs": cuda}, False)]
    calls.clear()
    cpu = [{"device": "cpu", "model": m} for m in ("plain", "mhc")]
    bench.run_jobs("s.py", cpu, 1, ["a", "b"])
    assert calls == [(job, False) for job in cpu]
    calls.clear()  # --quick: one process, which may be forked (run_isolated decides)
    bench.run_jobs("s.py", cpu, 1, ["a", "b"], together=True)
    assert calls == [({"mode": bench.JOBS, "jobs": cpu}, True)]


def test_only_a_quick_runs_worker_is_forked_and_only_where_forking_is_enabled(tmp_path,
                                                                             monkeypatch):
    """A measured run's worker is a fresh process (its peak memory its own); a --quick run's is
    forked from a warm server (fairseq already imported) where layerlab.warm is enabled."""
    from layerlab import bench, warm

    script = tmp_path / "worker.py"
    script.write_text("import json, os, sys\nprint(json.dumps({'warm': 'fairseq' in "
                      "sys.modules, 'threads': os.environ['OMP_NUM_THREADS'], 'args': "
                      "json.loads(sys.argv[2])}))\n")
    monkeypatch.delenv(warm.ENV, raising=False)
    assert bench.run_isolated(str(script), {"a": 1}, 1, forkable=True) == {
        "warm": False, "threads": "1", "args": {"a": 1}}
    monkeypatch.setenv(warm.ENV, "1")
    assert bench.run_isolated(str(script), {"a": 2}, 1)["warm"] is False
    assert bench.run_isolated(str(script), {"a": 3}, 2, forkable=True) == {
        "warm": True, "threads": "2", "args": {"a": 3}}


def test_jobs_in_one_process_warm_up_on_cuda_only():
    """A shared CUDA process measures its first job once unrecorded (cuBLAS's workspaces then
    belong to every job's starting point); results stay in the jobs' order."""
    from layerlab import bench

    seen = []

    def worker(job):
        seen.append(job["model"])
        return job["model"] + "!"

    jobs = [{"device": "cuda:0", "model": "plain"}, {"device": "cuda:0", "model": "mhc"}]
    assert bench.run_in_one_process(worker, jobs) == ["plain!", "mhc!"]
    assert seen == ["plain", "plain", "mhc"]
    seen.clear()
    assert bench.run_in_one_process(worker, [dict(j, device="cpu") for j in jobs]) == [
        "plain!", "mhc!"]
    assert seen == ["plain", "mhc"]


def test_operator_count_skips_views_and_counts_the_backward_pass():
    from layerlab import bench

    x = torch.ones(4, 3, requires_grad=True)
    assert bench.operators_dispatched(lambda: x.view(-1).t()) == 0
    assert bench.operators_dispatched(lambda: x + 1) == 1
    # forward: mul, sum; backward: at least the gradient of each
    assert bench.operators_dispatched(lambda: (x * 2).sum().backward()) >= 4


def test_depth_bench_operator_counts_grow_with_the_sinkhorn_iterations():
    """The Sinkhorn's iterations are most of mHC's operators (each one is a launch on a GPU)."""
    depth = paths.load_script("bench", "depth.py")
    plain = depth.operators_per_step(*depth.METHODS["plain"], 2)
    mhc = depth.operators_per_step(*depth.METHODS["mhc_n4"], 2)
    lite = depth.operators_per_step(*depth.METHODS["mhc_lite_n4"], 2)
    assert plain < lite < mhc
    fewer = depth.operators_per_step("gpt_baseline_lm", ["--mhc", "sinkhorn",
                                                         "--mhc-sinkhorn-iterations", "1"], 2)
    # 19 iterations fewer in each of the 4 sub-layers: at least a multiply, a sum and a
    # reciprocal per side and iteration forward
    assert mhc - fewer >= 4 * 19 * 6


def test_depth_table_shows_operator_counts_and_reads_reports_without_them():
    depth = paths.load_script("bench", "depth.py")
    row = {"train_time_ratio": 1.5, "memory_growth_ratio": 1.1, "params_reference_count": 1000,
           "mac_share": 0.01}
    report = {"device": "cuda", "fp16": False, "threads": 1, "torch": "x", "embed_dim": 128,
              "config": {"vocab": 10, "context": 4, "batch": 2},
              "depths": {"12": {"mhc_n4": dict(row, operators_per_step=8605,
                                               system_time_share=0.25,
                                               saved_bytes_per_token=264012, saved_ratio=1.522),
                                "mudd": row}}}
    table = depth.markdown_table(report)
    assert ("| 12 | mhc_n4 | 1.500 | 1.100 | 1,000 | 0.0100 | 8,605 | 264,012 B (1.52x) | "
            "0.250 |") in table
    assert "| 12 | mudd | 1.500 | 1.100 | 1,000 | 0.0100 |  |  |  |" in table
    assert "glibc's defaults (or not recorded)" in table
    assert "batch 2, no dropout." in table  # reports made before the bench recorded it: none
    report["config"]["dropout"] = 0.1
    assert "batch 2, dropout 0.1." in depth.markdown_table(report)
    report["allocator_env"] = {"MALLOC_TRIM_THRESHOLD_": "1"}
    assert "Allocator settings: MALLOC_TRIM_THRESHOLD_=1." in depth.markdown_table(report)


def test_bytes_saved_for_backward_count_each_storage_once_and_not_the_parameters():
    from layerlab import bench

    weight = torch.randn(8, 8, requires_grad=True)
    x = torch.randn(4, 8, requires_grad=True)

    def forward():
        h = x @ weight  # saves x and weight
        return (h.sin() * h.sin()).sum()  # saves h once (both sines), each sine's output
    # x (128 B), h (128 B) and the two sines' outputs (128 B each); the weight excluded
    assert bench.bytes_saved_for_backward(forward, exclude=[weight]) == 4 * 4 * 8 * 4
    assert bench.bytes_saved_for_backward(forward) == 4 * 4 * 8 * 4 + 8 * 8 * 4
    # a view saves its whole storage: what keeping it keeps alive
    assert bench.bytes_saved_for_backward(lambda: (x[:1] * 2.0).sum() * x[:1]) == 4 * 8 * 4 \
        + 4


def test_the_bench_rows_that_capture_count_their_eager_rows_operators():
    depth = paths.load_script("bench", "depth.py")
    assert depth.uncaptured(["--mhc", "--torch-compile", "--torch-compile-mode",
                             "reduce-overhead", "--cuda-graph", "--layers", "2"]) == [
        "--mhc", "--layers", "2"]
    assert depth.saved_per_token("gpt_baseline_lm", ["--cuda-graph"], 32, 2, "cpu",
                                 False) is None


def test_the_saved_only_bench_measures_what_each_row_keeps_for_its_backward(tmp_path):
    depth = paths.load_script("bench", "depth.py")
    out = tmp_path / "saved.json"
    depth.main(["--saved-only", "--rows", "hc_static_n4,mhc_n4_graph", "--depths", "2",
                "--embed-dim", "32", "--out", str(out)])
    report = json.loads(out.read_text())
    rows = report["depths"]["2"]
    assert rows["plain"]["saved_ratio"] == 1.0 and rows["mhc_n4_graph"]["saved_ratio"] is None
    # four streams of C where the plain residual keeps one at each of the 4 sub-layers' inputs
    # (float32): at least 3 x 4 x 32 x 4 bytes per token more
    extra = rows["hc_static_n4"]["saved_bytes_per_token"] - rows["plain"]["saved_bytes_per_token"]
    assert extra >= 3 * 4 * 32 * 4, rows
    table = depth.markdown_table(report)
    assert "| 2 | hc_static_n4 |" in table and "mhc_n4_graph" not in table


def test_the_gpu_targets_are_read_from_the_checks_reports(tmp_path):
    targets = paths.load_script("bench", "gpu_targets.py")
    depth = paths.load_script("bench", "depth.py")
    script = open(os.path.join(SCRIPTS, "bench", "gpu_check.sh")).read()
    for name, rows, _, against in targets.TARGETS:  # rows the bench has, reports the check writes
        assert f"bench {name} " in script
        assert all(r in depth.METHODS for r in rows) and (against is None
                                                          or against in depth.METHODS)

    def report(name, ratios):
        (tmp_path / f"{name}.json").write_text(json.dumps({"ratios_vs_plain": {
            row: {"train_time_ratio": ratio} for row, ratio in ratios.items()}}))
    report("bench_depth_d1024", {"plain": 1.0, "mhc_n4": 1.08, "mudd": 1.2})
    report("bench_graph_d128", {"plain": 1.0, "plain_graph": 0.5, "mhc_n4_graph": 0.6,
                                "dwa_graph": 0.7})
    assert targets.main([str(tmp_path)]) == 0
    results = {(r["report"], r["row"]): r for r in json.loads(
        (tmp_path / "targets.json").read_text())}
    assert results[("bench_depth_d1024", "mhc_n4")]["met"] is True
    assert results[("bench_depth_d1024", "mudd")]["met"] is False
    assert results[("bench_depth_d1024", "dwa")]["met"] is None  # not in the report
    # the graph rows against the plain model under the graph: 0.6 / 0.5 = 1.2, 0.7 / 0.5 = 1.4
    assert results[("bench_graph_d128", "mhc_n4_graph")]["ratio"] == 1.2
    assert results[("bench_graph_d128", "mhc_n4_graph")]["met"] is True
    assert results[("bench_graph_d128", "dwa_graph")]["met"] is False
    assert all(r["met"] is None for (name, _), r in results.items()
               if name == "bench_compile_d128")  # no such report: not measured
    table = (tmp_path / "targets.md").read_text()
    assert table.startswith("2 of 4 measured targets met")
    assert "| bench_graph_d128 | dwa_graph | plain_graph | 1.400 | <= 1.25 | no |" in table
    assert targets.main([str(tmp_path / "absent")]) == 2


def test_cpu_seconds_counts_the_kernel_time_of_fresh_memory():
    """The bench's kernel share: touching freshly mapped memory (a large tensor glibc maps for
    it) is page faults, system time of the process, which the split must see."""
    from layerlab import bench

    user, system = bench.cpu_seconds()
    for _ in range(3):
        torch.ones(2**27).sum()  # 512 MB, mapped and unmapped each time
    user_after, system_after = bench.cpu_seconds()
    assert system_after - system > 0.01
    assert user_after >= user


def test_system_share_needs_enough_clock_ticks():
    """A share sampled over a few ticks is not a measurement: one system tick and no user one
    (what failed a CI run: a share of 1.0 in the quick suite) gives None, not 1.0."""
    from layerlab import bench

    assert bench.system_share(0.0, 0.01, ticks_per_second=100) is None
    assert bench.system_share(0.3, 0.1, ticks_per_second=100) is None  # 40 ticks
    assert bench.system_share(0.375, 0.125, ticks_per_second=100) == 0.25  # 50 ticks
    assert bench.system_share(3.0, 0.0, ticks_per_second=100) == 0.0
    assert bench.system_share(0.0, 2.0, ticks_per_second=100) == 1.0


def test_the_gpu_check_names_rows_that_exist():
    """scripts/bench/gpu_check.sh cannot run here; its rows must stay those of the bench and of
    the comparison (each fused row with its eager twin)."""
    import re

    depth = paths.load_script("bench", "depth.py")
    comparison = paths.load_script("experiments", "lm_depth_comparison.py")
    script = open(os.path.join(SCRIPTS, "bench", "gpu_check.sh")).read()
    fused = re.search(r"^FUSED=(\S+)$", script, re.M).group(1).split(",")
    assert fused and all(r in depth.METHODS and r + "_eager" in depth.METHODS for r in fused)
    assert set(fused) == {r[:-len("_eager")] for r in depth.METHODS if r.endswith("_eager")}
    # GRAPH_ROWS: the --cuda-graph twins of the plain model, every fused row, DWA, value residual
    assert ("GRAPH_ROWS=plain_graph,${FUSED//,/_graph,}_graph,dwa_graph,value_residual_graph"
            in script)
    assert all(r + "_graph" in depth.METHODS for r in ["plain", *fused, "dwa", "value_residual"])
    # COMPILE_ROWS: --torch-compile twins of rows that have one
    compiled = re.search(r"^COMPILE_ROWS=(\S+)$", script, re.M).group(1).split(",")
    assert compiled and all(r.endswith("_compile") and r in depth.METHODS for r in compiled)
    rows = re.search(r"--rows (\S+) --eager --graph", script).group(1).split(",")
    assert rows and all(r in comparison.ROWS for r in rows)


def test_anchors_report_what_is_not_installed_and_render(tmp_path, monkeypatch):
    """scripts/bench/anchors.py without fla-core or TransformerEngine (CI has neither): each
    anchor says so instead of failing, and the markdown shows it; with TransformerEngine's
    Triton file on the CPU outside the interpreter it says it needs TRITON_INTERPRET=1."""
    import sys as _sys

    from layerlab.paths import load_script

    anchors = load_script("bench", "anchors.py")
    monkeypatch.setitem(_sys.modules, "fla", None)  # not importable, even where installed
    assert anchors.fla_attnres("cpu")["installed"] is False
    missing = anchors.te_sinkhorn(str(tmp_path / "nowhere.py"), "cpu")
    assert missing == {"installed": False, "why": f"{anchors.TE_FILE} not found (--te-mhc FILE)"}
    stand_in = tmp_path / "mhc.py"
    stand_in.write_text("")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert "TRITON_INTERPRET=1" in anchors.te_sinkhorn(str(stand_in), "cpu")["why"]
    text = anchors.markdown({"command": "c", "where": "w",
                             "fla_attnres": {"installed": False, "why": "no fla"},
                             "te_sinkhorn": missing})
    assert "| fla-core AttnRes | — | not installed (no fla) |" in text
    assert "| TransformerEngine Sinkhorn | — |" in text


def test_the_encdec_bench_measures_the_comparisons_rows_as_they_train(tmp_path):
    """scripts/bench/encdec.py builds each row as the encoder-decoder comparison trains it (its
    recipe's flags, pre-norm, the row's own, the task's dictionaries), adds the matched
    baselines, and sizes the batch from the recipe and the training set's mean lengths."""
    from conftest import cli_env
    from helpers import cogs_like

    cogs_like(tmp_path)
    data = tmp_path / "data-bin" / "cogs"
    out, table = tmp_path / "bench.json", tmp_path / "bench.md"
    proc = subprocess.run(
        [sys.executable, os.path.join(SCRIPTS, "bench", "encdec.py"), "--task", "cogs",
         "--recipe", "smoke", "--rows", "baseline,hc_static", "--data", str(data), "--quick",
         "--threads", "1", "--out", str(out), "--markdown", str(table)],
        capture_output=True, text=True, env=cli_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    cmp = paths.load_script("experiments", "encdec_comparison.py")
    arch, flags = report["models"]["hc_static"]
    assert arch == "layerwise_transformer"
    assert flags == cmp.model_flags("cogs", "smoke", cmp.row_of("hc_static"))
    assert {"--hyper-connections", "--encoder-normalize-before"} <= set(flags)
    # the toy's sentences are 1-3 words and EOS (2, 3, 4 tokens in turn): mean 3 on each side
    assert (report["config"]["src_len"], report["config"]["tgt_len"]) == (3, 3)
    assert (report["config"]["d"], report["config"]["max_tokens"]) == (16, 1024)

    def params(row):
        return cmp.parameters("cogs", "smoke", cmp.row_of(row), str(data))
    ratios = report["ratios_vs_baseline"]
    assert ratios["hc_static"]["params_extra"] == params("hc_static") - params("baseline") > 0
    # HC adds more than 2% at this scale: its matched baseline is measured beside it
    match = report["matched"]["hc_static"]
    assert match.startswith("baseline_ffn") and ratios[match]["train_time_ratio"] > 0
    assert f"| {match} |" in table.read_text()


def test_the_encdec_bench_refuses_an_unknown_task_in_one_line():
    proc = run_command([sys.executable, os.path.join(SCRIPTS, "bench", "encdec.py"),
                        "--task", "wmt", "--quick"])
    assert proc.returncode == 2 and "unknown task 'wmt'" in proc.stderr
    assert "Traceback" not in proc.stderr
