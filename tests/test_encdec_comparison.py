"""scripts/experiments/encdec_comparison.py: the encoder-decoder comparison's declaration run by
the experiment runner, end to end at the tests' scale (Multi30k- and COGS-shaped toy sets: the
real files' preparation is tests/test_prepare.py's), and its refusals before anything trains."""
import json
import os
import shutil
import sys

import pytest
from conftest import forked_env, run_command
from helpers import SCRIPTS, cogs_like, multi30k_like

from layerlab import runs
from layerlab.paths import load_script

SCRIPT = os.path.join(SCRIPTS, "experiments", "encdec_comparison.py")


def _run(*args, cwd, env=None):
    # forked from the tests' warm server (conftest.run_command): the script's own imports are
    # not paid again at each of its three starts
    return run_command([sys.executable, SCRIPT, *map(str, args)], cwd=cwd, env=env)


def test_both_tasks_end_to_end_then_resume(tmp_path):
    multi30k_like(tmp_path)
    cogs_like(tmp_path)
    args = ["--tasks", "multi30k,cogs", "--rows", "baseline,hc_static", "--seeds", "1",
            "--recipe", "multi30k=smoke,cogs=smoke", "--out-dir", "runs", "--jobs", "2",
            "--keep-runs", "kept"]
    # its fairseq commands forked from a warm server (layerlab.warm), as the LM comparison's
    # tests run theirs
    proc = _run(*args, cwd=tmp_path, env=forked_env())
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((tmp_path / "runs" / "results.json").read_text())
    m30k = report["tasks"]["multi30k"]["test_2016"]
    assert set(m30k) == {"baseline", "hc_static"} and m30k["baseline"]["seeds"] == [1]
    hc = m30k["hc_static"]
    assert hc["params"] > m30k["baseline"]["params"]
    assert {"difference", "low", "high"} <= set(hc["vs_baseline"]) and "vs_baseline_paired" in hc
    cogs = report["tasks"]["cogs"]
    assert set(cogs) == {"test", "gen_dev"}
    # at the tests' scale HC static adds more than 2% on COGS's toy vocabulary: its matched
    # baseline ran there (and only there) and it is compared with it
    match = cogs["test"]["hc_static"]["matched"]
    assert match.startswith("baseline_ffn") and match in cogs["test"]
    assert "vs_matched" in cogs["test"]["hc_static"] and match not in m30k
    gen = cogs["gen_dev"]["baseline"]
    assert set(gen["per_category"]) == {"pp_recursion", "subj_to_obj_common"}
    assert gen["structural"] == gen["per_category"]["pp_recursion"]
    assert gen["lexical"] == gen["per_category"]["subj_to_obj_common"]
    result = json.loads((tmp_path / "runs" / "multi30k" / "hc_static" / "seed1" /
                         "result.json").read_text())
    assert result["valid_curve"] and result["train_cpu_seconds"] > 0
    assert result["machines"] == [runs.machine()]  # the machine it trained on
    # the last epoch's fit, read from the run's own log, and its table in the report
    assert 0 < result["last_nll"]["train"] and 0 < result["last_nll"]["valid"]
    fit = report["fit"]["multi30k"]["hc_static"]
    assert fit["train"] == round(result["last_nll"]["train"], 3)
    assert set(report["fit"]["cogs"]) == set(cogs["test"])
    assert report["fit"]["cogs"]["baseline"]["gen_dev"] > 0  # validated beside dev
    assert "### multi30k, fit at the last epoch" in (tmp_path / "runs" / "results.md").read_text()
    # the two tasks' rankings: one row besides the baseline is too few to rank
    assert report["between_tasks"] == {"multi30k/cogs": None}
    train = result["recipe"]["train"]
    assert "--hyper-connections" in train and "--encoder-normalize-before" in train
    cogs_train = json.loads((tmp_path / "runs" / "cogs" / "baseline" / "seed1" /
                             "result.json").read_text())["recipe"]["train"]
    assert cogs_train[-8:-3] == ["--task", "seq2seq_eval", "--eval-exact-match",
                                 "--valid-subset", "valid,test1"]
    cogs_result = json.loads((tmp_path / "runs" / "cogs" / "baseline" / "seed1" /
                              "result.json").read_text())
    # gen_dev validated as dev is: a curve of its own, at the same updates
    gen_curve = cogs_result["curves"]["gen_dev"]
    assert [u for u, _ in gen_curve] == [u for u, _ in cogs_result["valid_curve"]]
    assert gen_curve and all(0 <= v <= 100 for _, v in gen_curve)
    assert "### cogs, gen_dev (exact match %)" in (tmp_path / "runs" / "results.md").read_text()
    # learning curves as differences from the baseline's run of the same seed, per task and
    # validated subset (COGS: dev and gen_dev), and the baseline's own curve; their figure
    for task, labels in (("multi30k", ["valid"]), ("cogs", ["valid", "gen_dev"])):
        curves = report["curves"][task]
        assert sorted(curves) == sorted(labels + [f"{label}_baseline" for label in labels])
        for label in labels:
            updates, mean, low, high = curves[label]["hc_static"]
            own = json.loads((tmp_path / "runs" / task / "hc_static" / "seed1" /
                              "result.json").read_text())
            base = json.loads((tmp_path / "runs" / task / "baseline" / "seed1" /
                               "result.json").read_text())
            where = "valid_curve" if label == "valid" else None
            mine = own[where] if where else own["curves"][label]
            theirs = base[where] if where else base["curves"][label]
            assert updates == [u for u, _ in mine]
            assert mean == low == high == [round(a[1] - b[1], 3) for a, b in zip(mine, theirs)]
    assert (tmp_path / "runs" / "results_curves.png").stat().st_size > 0
    log = tmp_path / "runs" / "cogs" / "baseline" / "seed1" / "train.log"
    stamp = log.stat().st_mtime
    again = _run(*args, cwd=tmp_path)  # every run finished: nothing trains again
    assert again.returncode == 0 and log.stat().st_mtime == stamp
    # --keep-runs: each finished run's result and test statistics (not its checkpoints)
    kept = tmp_path / "kept" / "cogs" / "hc_static" / "seed1"
    assert sorted(os.listdir(kept)) == ["result.json", "test_stats_gen_dev.npy",
                                        "test_stats_test.npy"]
    # a fresh machine with only the kept runs: --report-only writes the same tables, and
    # trains nothing
    fresh = _run(*args[:-6], "--out-dir", "fresh", "--keep-runs", "kept", "--report-only",
                 cwd=tmp_path)
    assert fresh.returncode == 0, fresh.stderr[-2000:]
    again_report = json.loads((tmp_path / "fresh" / "results.json").read_text())
    assert again_report["tasks"] == json.loads(json.dumps(report["tasks"]))
    assert not list((tmp_path / "fresh").rglob("train.log"))


def test_the_ranking_against_the_language_models_is_spearman_over_the_shared_rows(tmp_path):
    """Gains here (higher is better) against the WikiText-2 comparison's (fewer bits is
    better) over the rows both have, under their names there; None below three rows."""
    comparison = load_script("experiments", "encdec_comparison.py")
    lm = {"depths": {"4": {"lrf": {"vs_baseline": {"difference": -0.03}, "seeds": [1, 2, 3]},
                           "mhc": {"vs_baseline": {"difference": -0.01}},
                           "mudd": {"vs_baseline": {"difference": +0.02}},
                           "dwa": {"vs_baseline": {"difference": -0.02}}}}}
    path = tmp_path / "lm.json"
    path.write_text(json.dumps(lm))

    def table(**gains):
        return {"baseline": {}, **{row: {"vs_baseline": {"difference": g}, "seeds": [1, 2]}
                                   for row, g in gains.items()}}
    # the same order (lrf_decoder is the LM's lrf): +1
    same = comparison.ranking_against_lm(table(lrf_decoder=2.0, dwa=1.0, mhc=0.5, mudd=-1.0,
                                               bridge_gca=9.0), str(path))
    assert same["spearman"] == 1.0 and same["rows"] == ["lrf_decoder", "dwa", "mhc", "mudd"]
    assert same["rank"]["lrf_decoder"] == 1 and same["lm_rank"]["mudd"] == 4
    assert same["lm_gain_bits"]["lrf_decoder"] == 0.03
    # how many seeds each side's gain is a mean over, in the table too
    assert same["seeds"]["mhc"] == 2 and same["lm_seeds"] == {"lrf_decoder": 3, "dwa": 0,
                                                              "mhc": 0, "mudd": 0}
    lines = comparison.markdown({"command": "c", "package_version": "v", "date": "d",
                                 "recipes": {}, "tasks": {},
                                 "against_lm": {"multi30k": same}}).splitlines()
    assert "| lrf_decoder | +2.00 | 2 | 1 | +0.0300 | 3 | 1 |" in lines
    reversed_ = comparison.ranking_against_lm(table(lrf_decoder=-2.0, dwa=-1.0, mhc=0.5,
                                                    mudd=1.0), str(path))
    assert reversed_["spearman"] == -1.0
    assert comparison.ranking_against_lm(table(lrf_decoder=1.0, mhc=2.0), str(path)) is None
    assert comparison.ranking_against_lm(table(lrf_decoder=1.0), str(tmp_path / "no")) is None


def test_the_ranking_between_the_tasks_is_spearman_over_the_rows_both_have():
    """Each task's gains over its baseline (BLEU on one, exact-match points on the other),
    ranked over the rows both have; None below three."""
    comparison = load_script("experiments", "encdec_comparison.py")

    def table(seeds, **gains):
        return {"baseline": {"seeds": seeds}, **{
            row: {"vs_baseline": {"difference": g}, "seeds": seeds} for row, g in gains.items()}}
    m30k = table([1, 2, 3], dwa=0.5, hc_dynamic=1.1, lrf_both=-0.1, mhc=-0.5, mudd=0.2)
    cogs = table([1], dwa=-2.6, hc_dynamic=+1.0, lrf_both=-9.0, mudd=-3.0)  # no mhc there
    same = comparison.ranking_between_tasks({"multi30k": m30k, "cogs": cogs})
    assert same["rows"] == ["dwa", "hc_dynamic", "lrf_both", "mudd"]
    assert same["spearman"] == 1.0 and same["tasks"] == ["multi30k", "cogs"]
    assert same["rank"]["multi30k"]["hc_dynamic"] == 1 and same["rank"]["cogs"]["lrf_both"] == 4
    assert same["seeds"] == {"multi30k": dict.fromkeys(same["rows"], 3),
                             "cogs": dict.fromkeys(same["rows"], 1)}
    lines = comparison.markdown({"command": "c", "package_version": "v", "date": "d",
                                 "recipes": {}, "tasks": {},
                                 "between_tasks": {"multi30k/cogs": same}}).splitlines()
    assert "### multi30k against cogs" in lines
    assert "| hc_dynamic | +1.10 | 3 | 1 | +1.00 | 1 | 1 |" in lines
    assert lines[lines.index("| hc_dynamic | +1.10 | 3 | 1 | +1.00 | 1 | 1 |") + 1].startswith(
        "| dwa | +0.50 | 3 | 2 |")  # in the first task's order
    opposite = comparison.ranking_between_tasks(
        {"multi30k": m30k, "cogs": table([1], dwa=-0.5, hc_dynamic=-1.1, lrf_both=0.1)})
    assert opposite["spearman"] == -1.0
    assert comparison.ranking_between_tasks(
        {"multi30k": m30k, "cogs": table([1], dwa=1.0, mhc=2.0)}) is None


def test_a_diverged_run_is_a_result_reported_as_such(tmp_path, monkeypatch):
    """A training stopped by a NaN / inf loss is the run's result (diverged, its error and its
    curve so far; no test scores), left out of its row's numbers and named in the tables; any
    other failure of the training stays an error."""
    import argparse

    import numpy as np

    from layerlab import runner, significance

    comparison = load_script("experiments", "encdec_comparison.py")
    run = runner.Run("cogs", comparison.row_of("mhc"), 1, str(tmp_path / "mhc"))
    recipe = comparison.recipe_of("cogs", "smoke", run.row, "data-bin/cogs")

    def diverging(cmd, log=None, append=False, on_cpu=None):
        with open(log, "a") as f:
            f.write('2026-12-05 00:00:00 | INFO | valid | {"epoch": 1, "valid_loss": "3.1", '
                    '"valid_exact_match": "12.5", "valid_num_updates": "40"}\n')
        raise comparison.runs.StepError("fairseq-train failed: FloatingPointError: gradients "
                                        "are Nan/Inf")
    monkeypatch.setattr(comparison.runs, "run_logged", diverging)
    result = comparison.run_work(run, recipe)
    assert result["diverged"] and result["tests"] == {} and result["params"] is None
    assert "Nan/Inf" in result["error"] and result["valid_curve"] == [[40, 12.5]]
    assert json.loads((tmp_path / "mhc" / "result.json").read_text())["diverged"]

    def broken(cmd, log=None, append=False, on_cpu=None):
        raise comparison.runs.StepError("fairseq-train failed: FileNotFoundError: dict.in.txt")
    monkeypatch.setattr(comparison.runs, "run_logged", broken)
    with pytest.raises(comparison.runs.StepError, match="FileNotFoundError"):
        comparison.run_work(runner.Run("cogs", run.row, 2, str(tmp_path / "other")), recipe)

    # the report: the baseline's numbers, the diverged row named with its seed
    base = runner.Run("cogs", comparison.row_of("baseline"), 1, str(tmp_path / "base"))
    os.makedirs(base.run_dir)
    stats = significance.sentence_stats("exact_match", ["a b", "c"], ["a b", "d"])
    for label in ("test", "gen_dev"):
        np.save(os.path.join(base.run_dir, f"test_stats_{label}.npy"), stats)
    results = {base.key: {"params": 10, "train_cpu_seconds": 5.0, "valid_curve": [[40, 50.0]],
                          "curves": {"gen_dev": [[40, 10.0]]},
                          "tests": {"test": {"exact_match": 50.0},
                                    "gen_dev": {"exact_match": 50.0}}},
               run.key: result}
    report = comparison.summarise(argparse.Namespace(tasks=["cogs"]), [base, run], results,
                                  {"cogs": "smoke"})
    table = report["tasks"]["cogs"]["gen_dev"]
    assert table["baseline"]["mean"] == 50.0 and "diverged" not in table["baseline"]
    # "last valid": gen_dev's own last validation in its table, dev's beside the test
    assert table["baseline"]["valid_last"] == 10.0
    assert report["tasks"]["cogs"]["test"]["baseline"]["valid_last"] == 50.0
    assert table["mhc"] == {"seeds": [], "values": [], "params": None, "diverged": [1]}
    assert "| mhc (diverged: seed 1) | — |" in comparison.markdown(report)
    assert report["fit"] == {"cogs": {}}  # a run finished before last_nll was kept: no row
    # the fit table: a row whose every run has its last epoch's losses, Δ from the baseline's
    other = runner.Run("cogs", comparison.row_of("dwa"), 1, str(tmp_path / "dwa"))
    shutil.copytree(base.run_dir, other.run_dir)
    results[base.key]["last_nll"] = {"train": 2.0, "valid": 2.5, "gen_dev": 4.0}
    results[other.key] = dict(results[base.key],
                              last_nll={"train": 1.75, "valid": 2.625, "gen_dev": 3.5})
    fit = comparison.summarise(argparse.Namespace(tasks=["cogs"]), [base, run, other],
                               results, {"cogs": "smoke"})
    assert fit["fit"]["cogs"] == {
        "baseline": {"train": 2.0, "valid": 2.5, "gen_dev": 4.0, "gap": 0.5},
        "dwa": {"train": 1.75, "valid": 2.625, "gen_dev": 3.5, "gap": 0.875}}
    text = comparison.markdown(fit)
    assert ("| row | train | valid | gap | gen_dev | Δ train | Δ valid | Δ gen_dev |\n"
            "|---|---:|---:|---:|---:|---:|---:|---:|\n") in text
    assert "| dwa | 1.750 | 2.625 | 0.875 | 3.500 | -0.250 | +0.125 | -0.500 |" in text
    # a row whose runs lack a validated subset still has its train and valid
    results[other.key]["last_nll"] = {"train": 1.75, "valid": 2.625, "gen_dev": None}
    fit = comparison.summarise(argparse.Namespace(tasks=["cogs"]), [base, run, other],
                               results, {"cogs": "smoke"})
    assert "| dwa | 1.750 | 2.625 | 0.875 | — | -0.250 | +0.125 | — |" in \
        comparison.markdown(fit)
    del results[other.key]
    # the CPU the runs spent, the diverged one's too; a run without an account is named
    for diverged_cpu, hours, unaccounted in ((1800.0, 2.0, 0), (None, 1.5, 1)):
        results[base.key]["train_cpu_seconds"] = 5400.0
        results[run.key] = dict(result, train_cpu_seconds=diverged_cpu)
        report = comparison.summarise(argparse.Namespace(tasks=["cogs"]), [base, run],
                                      results, {"cogs": "smoke"})
        assert report["cpu_hours"] == {"cogs": {"runs": 2, "core_hours": hours,
                                                "unaccounted": unaccounted,
                                                # the diverged run trained here
                                                "machines": {"not recorded": 1,
                                                             runs.machine(): 1}}}
    assert ("cogs 1.5 core-hours over 2 runs (1 without an account); 1.5 in all."
            in comparison.markdown(report))
    assert "cogs's runs by machine (the CPU, the instruction set PyTorch's kernels use, " \
        f"PyTorch): {runs.machine()}: 1 run; not recorded: 1 run." in comparison.markdown(report)


def test_a_rows_cpu_time_is_compared_with_the_baselines_of_its_seed_on_its_machine():
    """A run's CPU time is its machine's: the ratio pairs each seed with the baseline's run of
    that seed, only where both trained on one and the same machine (the runs before the record
    was kept count as one machine); the column names the seeds where they are fewer."""
    comparison = load_script("experiments", "encdec_comparison.py")
    fast, slow = "AMD EPYC, AVX512, torch 2.13.0", "AMD EPYC, AVX2, torch 2.13.0"

    def run(cpu, *machines):
        return {"train_cpu_seconds": cpu, **({"machines": list(machines)} if machines else {})}
    base = {1: run(100.0), 2: run(200.0, slow), 3: run(100.0, fast)}
    ratios = comparison.cpu_ratios
    assert ratios({1: run(110.0), 2: run(300.0, slow), 3: run(120.0, fast)}, base) == {
        1: 1.1, 2: 1.5, 3: 1.2}
    # on another machine than its baseline's, resumed on a second one, begun before the
    # record and resumed on a recorded one, or without a complete account: no ratio
    assert ratios({1: run(150.0, slow), 2: run(300.0, fast, slow), 3: run(120.0, None, fast)},
                  base) == {}
    assert ratios({1: run(None), 2: run(300.0, slow)}, {**base, 2: run(None, slow)}) == {}
    assert ratios({2: run(300.0, slow)}, {1: run(100.0)}) == {}  # no baseline of its seed
    assert comparison.machine_of(run(1.0)) == comparison.UNRECORDED_MACHINE
    # the column: the mean ratio, with its seeds where it has fewer than the row
    assert comparison.cpu_cell({"seeds": [1, 2, 3], "cpu_ratio": 1.27}) == "1.27"
    assert comparison.cpu_cell({"seeds": [1, 2, 3], "cpu_ratio": 1.2,
                                "cpu_ratio_seeds": [2]}) == "1.2 (seed 2)"
    assert comparison.cpu_cell({"seeds": [1, 2, 3], "cpu_ratio": 1.2,
                                "cpu_ratio_seeds": [1, 3]}) == "1.2 (seeds 1,3)"
    assert comparison.cpu_cell({"seeds": [1]}) == "—"


def test_the_tables_take_time_and_memory_from_the_bench_of_the_same_recipe(tmp_path,
                                                                          monkeypatch):
    """Each row's training time and memory ratios come from scripts/bench/encdec.py's file of
    the task, only where it measured the report's recipe at full size and the row's model."""
    import argparse

    import numpy as np

    from layerlab import runner, significance

    comparison = load_script("experiments", "encdec_comparison.py")
    plan, results = [], {}
    for row, value in (("baseline", 50.0), ("mhc", 100.0)):
        run = runner.Run("cogs", comparison.row_of(row), 1, str(tmp_path / row))
        os.makedirs(run.run_dir)
        stats = significance.sentence_stats("exact_match", ["a", "b"], ["a", "b" if row ==
                                                                          "mhc" else "c"])
        for label in ("test", "gen_dev"):
            np.save(os.path.join(run.run_dir, f"test_stats_{label}.npy"), stats)
        plan.append(run)
        results[run.key] = {"params": 10, "train_cpu_seconds": 5.0, "valid_curve": [],
                            "curves": {}, "tests": {label: {"exact_match": value}
                                                    for label in ("test", "gen_dev")}}
    mhc_row = comparison.row_of("mhc")
    bench = {"recipe": "smoke", "quick": False, "ratios_vs_baseline": {
        "mhc": {"train_time_ratio": 1.31, "memory_growth_ratio": 1.7, "params_extra": 5}},
        "models": {"mhc": [mhc_row.arch, comparison.model_flags("cogs", "smoke", mhc_row)]}}
    pattern = str(tmp_path / "bench_{task}.json")
    (tmp_path / "bench_cogs.json").write_text(json.dumps(bench))
    monkeypatch.setattr(comparison, "BENCH", pattern)

    def report(recipe):
        return comparison.summarise(argparse.Namespace(tasks=["cogs"]), plan, results,
                                    {"cogs": recipe})
    measured = report("smoke")
    mhc = measured["tasks"]["cogs"]["gen_dev"]["mhc"]
    assert (mhc["train_time_ratio"], mhc["memory_growth_ratio"]) == (1.31, 1.7)
    assert mhc["by_seed"] == {1: 50.0}
    line = next(line for line in comparison.markdown(measured).splitlines()
                if line.startswith("| mhc |"))
    # seeds, params, last valid (none), test, Δ, verdict, Δ by seed, ..., time, memory, CPU
    assert line.startswith("| mhc | 1 | 10 | — | 100.00 | +50.00 [")
    assert "| not judged (1 seed) | +50.00 |" in line and line.endswith("| 1.31 | 1.7 | 1.0 |")
    assert measured["bench"] == {"cogs": pattern.format(task="cogs")}
    # another recipe's bench, or a quick run's, gives no ratios
    assert "train_time_ratio" not in report("d128")["tasks"]["cogs"]["gen_dev"]["mhc"]
    (tmp_path / "bench_cogs.json").write_text(json.dumps(dict(bench, quick=True)))
    assert "bench" not in report("smoke")
    # a row benchmarked with other flags than its runs' (its declaration changed since) shows
    # no ratios, and the caption says so
    changed = runner.Row("mhc", mhc_row.arch, mhc_row.flags + ("--hc-expansion-rate", "2"))
    other = dict(bench, models={"mhc": [mhc_row.arch,
                                        comparison.model_flags("cogs", "smoke", changed)]})
    (tmp_path / "bench_cogs.json").write_text(json.dumps(other))
    stale = report("smoke")
    assert "train_time_ratio" not in stale["tasks"]["cogs"]["gen_dev"]["mhc"]
    assert stale["bench_stale"] == {"cogs": ["mhc"]}
    assert "cogs's mhc measured there with other flags than the runs'" in \
        comparison.markdown(stale)


def test_a_recipe_not_chosen_runs_the_baseline_alone():
    comparison = load_script("experiments", "encdec_comparison.py")
    assert all(chosen is None or chosen in comparison.RECIPES[task]
               for task, chosen in comparison.CHOSEN.items())
    assert set(comparison.TASKS) == set(comparison.RECIPES) == set(comparison.CHOSEN)
    assert set(comparison.TASK_ROWS) == set(comparison.TASKS)
    for task, rows in comparison.TASK_ROWS.items():
        assert rows is None or (comparison.BASELINE in rows and set(rows) <= set(comparison.ROWS))
    # not chosen: the baseline alone; chosen: the task's rows; the tests' scale: every row
    for task in comparison.TASKS:
        other = next(n for n in comparison.RECIPES[task]
                     if n not in (comparison.CHOSEN[task], comparison.TEST_RECIPE))
        assert comparison.runs_in(task, other, "baseline")
        assert not comparison.runs_in(task, other, "lrf_both")
        assert all(comparison.runs_in(task, comparison.TEST_RECIPE, row)
                   for row in comparison.ROWS)
        if comparison.CHOSEN[task]:
            rows = comparison.TASK_ROWS[task] or comparison.ROWS
            assert [r for r in comparison.ROWS
                    if comparison.runs_in(task, comparison.CHOSEN[task], r)] == list(rows)
    recipe = comparison.recipe_of("cogs", "smoke", comparison.row_of("mudd"), "data-bin/cogs")
    train = recipe["train"]
    assert train[:2] == ["--arch", "layerwise_transformer"]
    assert train.index("--mudd") < train.index("seq2seq_eval")


def test_a_row_with_more_than_two_percent_parameters_gets_a_matched_baseline(tmp_path):
    """The wider-FFN baseline whose parameters come closest to the row's, added for the tasks
    that need it; a row within 2% gets none."""
    from layerlab import runner

    comparison = load_script("experiments", "encdec_comparison.py")
    cogs_like(tmp_path)
    data = str(tmp_path / "data-bin" / "cogs")
    rows = [comparison.row_of(name) for name in ("baseline", "lrf_both", "value_residual")]
    declared = runner.Comparison("t", rows, ["cogs"], [1], "baseline")
    matched = comparison.add_matched_baselines(declared, {"cogs": ("smoke", data)})
    base = comparison.parameters("cogs", "smoke", rows[0], data)
    # value residual adds two lambdas per block: within 2%, no matched baseline
    assert comparison.parameters("cogs", "smoke", rows[2], data) / base - 1 < 0.02
    assert list(matched["cogs"]) == ["lrf_both"]
    name = matched["cogs"]["lrf_both"]
    assert name.startswith("baseline_ffn")
    match = declared.row(name)
    assert declared.only[name] == ("cogs",) and match.arch == "transformer"
    lrf = comparison.parameters("cogs", "smoke", rows[1], data)
    ffn = int(name.rsplit("ffn", 1)[1])
    fits = [abs(comparison.parameters("cogs", "smoke", runner.Row("w", "transformer", (
        "--encoder-ffn-embed-dim", str(f), "--decoder-ffn-embed-dim", str(f))), data) - lrf)
        for f in (ffn - 1, ffn, ffn + 1)]
    assert fits[1] == min(fits)  # the closest width
    recipe = comparison.recipe_of("cogs", "smoke", match, data)["train"]
    last = len(recipe) - 1 - recipe[::-1].index("--encoder-ffn-embed-dim")
    assert recipe[last + 1] == str(ffn)  # the row's width comes after the recipe's: it wins
    assert recipe.index("--encoder-ffn-embed-dim") < last


@pytest.mark.parametrize("args,message", [
    (["--tasks", "wmt"], "unknown task 'wmt'; known: multi30k, cogs"),
    (["--rows", "baseline,lrf"], "unknown row(s) lrf; known: baseline, lrf_encoder"),
    (["--tasks", "cogs", "--recipe", "cogs=big"], "--recipe cogs=big: known recipes of cogs:"),
    (["--tasks", "cogs", "--data", "cogs=nowhere"], "cogs: no data folder nowhere (prepare it: "
     "python scripts/prepare/cogs.py"),
    (["--threads", "0"], "--threads 0: at least 1"),
])
def test_bad_declarations_are_one_line_before_anything_trains(tmp_path, args, message):
    proc = _run(*args, "--out-dir", "runs", cwd=tmp_path)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines()[-1].startswith("encdec_comparison.py: error: ")
    assert not (tmp_path / "runs").exists()


def test_a_second_instance_into_the_same_folder_is_refused(tmp_path):
    """Two instances into one --out-dir would train the same runs, each with threads sized for
    the machine alone: the second stops in one line while the first holds the folder."""
    cogs_like(tmp_path)
    (tmp_path / "runs").mkdir()
    held = runs.exclusive_lock(str(tmp_path / "runs" / ".lock"))
    args = ("--tasks", "cogs", "--recipe", "cogs=smoke", "--rows", "baseline", "--seeds", "1",
            "--out-dir", "runs")
    try:
        proc = _run(*args, cwd=tmp_path)
    finally:
        held.close()
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines()[-1] == (
        "encdec_comparison.py: error: another encdec_comparison.py is training into runs "
        "(wait for it, stop it, or use another --out-dir)")
    assert not (tmp_path / "runs" / "cogs").exists()


def test_a_data_folder_of_another_task_is_refused(tmp_path):
    (tmp_path / "m30k").mkdir()
    for lang in ("de", "en"):
        (tmp_path / "m30k" / f"dict.{lang}.txt").write_text("a 1\n")
    proc = _run("--tasks", "cogs", "--data", f"cogs={tmp_path / 'm30k'}", "--out-dir", "runs",
                cwd=tmp_path)
    assert proc.returncode == 2
    assert f"cogs: {tmp_path / 'm30k'} has no dict.in.txt, dict.out.txt: not the cogs data " \
        "folder" in proc.stderr


def test_recipe_curves_reads_every_validated_subset_of_a_log(tmp_path, capsys):
    """scripts/experiments/recipe_curves.py: each subset's metric by update, with its epoch;
    a subset not validated at an update is a dash; a truncated last line is skipped."""
    curves = load_script("experiments", "recipe_curves.py")
    log = tmp_path / "train.log"
    log.write_text(
        '2026-12-05 00:00:01 | INFO | valid | {"epoch": 1, "valid_exact_match": "35.7", '
        '"valid_num_updates": "282"}\n'
        '2026-12-05 00:00:02 | INFO | test1 | {"epoch": 1, "test1_exact_match": "0", '
        '"test1_num_updates": "282"}\n'
        '2026-12-05 00:00:03 | INFO | valid | {"epoch": 2, "valid_exact_match": "54.87", '
        '"valid_num_updates": "564"}\n'
        '2026-12-05 00:00:04 | INFO | test1 | {"epoch": 2, "test1_exa')
    out = tmp_path / "c.json"
    assert curves.main(["--run", f"cogs-x={log}:exact_match:valid,test1",
                        "--json", str(out)]) == 0
    table = capsys.readouterr().out
    assert "| 1 | 282 | 35.7 | 0 |" in table and "| 2 | 564 | 54.87 | — |" in table
    saved = json.loads(out.read_text())["cogs-x"]
    assert saved["curves"] == {"valid": [[282, 35.7], [564, 54.87]], "test1": [[282, 0.0]]}
    assert saved["epochs"] == {"282": 1, "564": 2}


@pytest.mark.parametrize("shared", [(), ("--share-decoder-input-output-embed",),
                                    ("--share-all-embeddings",)])
def test_a_checkpoints_parameters_count_a_tied_weight_once(tmp_path, shared):
    """runs.count_params (the tables' params column): a weight tied under several names is one
    parameter; fairseq's version buffers (one element per stack) are the only extra."""
    import torch
    from helpers import build_translation_model, make_dict

    from layerlab import runs

    vocab = make_dict(40, "w")
    model = build_translation_model("transformer", ["--encoder-layers", "1", "--decoder-layers",
                                                    "1", "--encoder-embed-dim", "16",
                                                    "--decoder-embed-dim", "16", *shared],
                                    vocab, vocab)[0]
    torch.save({"model": model.state_dict()}, tmp_path / "checkpoint.pt")
    versions = sum(1 for name in model.state_dict() if name.endswith(".version"))
    assert versions == 2
    assert runs.count_params(str(tmp_path / "checkpoint.pt")) == sum(
        p.numel() for p in model.parameters()) + versions


def test_cogs_per_category_table_lists_the_baselines_score_and_each_rows_difference():
    """COGS's per-category lines: structural categories after the lexical ones and marked, the
    baseline's exact match, every other row's difference from it; a row without per-category
    scores (a diverged one) is left out, and without the baseline there is no table."""
    comparison = load_script("experiments", "encdec_comparison.py")
    table = {"baseline": {"per_category": {"pp_recursion": 10.0, "active_to_passive": 90.0}},
             "mhc": {"per_category": {"pp_recursion": 12.5, "active_to_passive": 80.0}},
             "hc": {"seeds": [], "values": [], "params": None, "diverged": [1]}}
    lines = comparison.category_table(table)
    assert lines[2] == "| category | baseline | mhc |"
    assert lines[4:] == ["| active_to_passive | 90.0 | -10.0 |",
                         "| pp_recursion (structural) | 10.0 | +2.5 |"]
    assert comparison.category_table({"mhc": table["mhc"]}) == []
    # the groups' table: one decimal, as the categories' (75.6 and 69.81 were once side by side)
    table["baseline"].update(lexical=75.6, structural=0.0)
    table["mhc"].update(lexical=69.81, structural=12.5)
    assert comparison.group_table(table)[2:] == ["| baseline | 75.6 | 0.0 |",
                                                 "| mhc | 69.8 | 12.5 |", "| hc | — | — |"]
