"""scripts/experiments/lm_depth_comparison.py: bad input stops before anything trains; a tiny
comparison runs end to end (matched baseline, per-block scores, the bootstrap against the
baseline); finished runs are not trained again, an interrupted one is."""
import json
import os
import shutil
import subprocess
from typing import List

import numpy as np
import pytest
import torch

from layerlab import figures, paths, warm

comparison = paths.load_script("experiments", "lm_depth_comparison.py")
TINY = ["--depths", "2", "--seeds", "1", "--updates", "2", "--embed-dim", "16"]


@pytest.fixture(autouse=True)
def forked_commands(monkeypatch):
    """The comparison's fairseq commands forked from a warm server (``layerlab.warm``: ~5 s of
    imports less per command); tests/test_interrupted.py runs them as fresh processes."""
    monkeypatch.setenv(warm.ENV, "1")


@pytest.mark.parametrize("rows,message", [
    ("baseline,hc_sideways", "unknown row(s) hc_sideways; known: baseline, dwa"),
    ("dwa", "the rows must include baseline"),
])
def test_unknown_rows_are_refused_before_anything_trains(lm_bin, tmp_path, capsys, rows, message):
    out = tmp_path / "out"
    assert comparison.main(["--data", str(lm_bin), "--out-dir", str(out), "--rows", rows]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
    assert not out.exists()


@pytest.mark.parametrize("flags,message", [
    (["--jobs", "0"], "--jobs 0: at least 1"),
    (["--threads", "0"], "--threads 0: at least 1"),
    (["--gpus-per-run", "1"], "--slurm-partition and --gpus-per-run apply to --launcher slurm"),
    (["--save-interval-updates", "-1"], "--save-interval-updates -1: a number of updates"),
    (["--updates", "8", "--warmup-updates", "9"], "--warmup-updates 9: between 1 and --updates"),
    (["--log-interval", "0"], "--log-interval 0: at least 1 update"),
    (["--updates", "8", "--curve-interval", "9"], "--curve-interval 9: between 1 and --updates"),
    (["--curve-interval", "150"], "--curve-interval 150 needs checkpoints at its multiples: a "
                                  "multiple of --save-interval-updates (100)"),
    (["--curve-interval", "100", "--save-interval-updates", "0"], "needs checkpoints at its"),
])
def test_impossible_run_options_are_refused(lm_bin, tmp_path, capsys, flags, message):
    out = tmp_path / "out"
    assert comparison.main(["--data", str(lm_bin), "--out-dir", str(out), *flags]) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()


def test_a_second_process_training_into_the_same_folder_is_refused(lm_bin, tmp_path, capsys):
    from layerlab import runs

    out = tmp_path / "out"
    out.mkdir()
    held = runs.exclusive_lock(str(out / ".lock"))  # as a running comparison holds it
    argv = ["--data", str(lm_bin), "--out-dir", str(out), *TINY, "--rows", "baseline",
            "--no-matched-baselines"]
    assert comparison.main(argv) == 2
    assert "another lm_depth_comparison.py is training into" in capsys.readouterr().err
    assert not (out / "d2").exists()
    assert comparison.main([*argv, "--report-only"]) == 0  # reading needs no lock
    held.close()
    assert runs.exclusive_lock(str(out / ".lock")) is not None


def test_a_second_process_keeping_runs_in_the_same_folder_is_refused(lm_bin, tmp_path, capsys):
    """Another --out-dir does not make it safe: both would train and keep the same runs."""
    from layerlab import runs

    kept = tmp_path / "kept"
    kept.mkdir()
    held = runs.exclusive_lock(str(kept))  # as a comparison keeping its runs there holds it
    out = tmp_path / "out"
    argv = ["--data", str(lm_bin), "--out-dir", str(out), "--keep-runs", str(kept), *TINY,
            "--rows", "baseline", "--no-matched-baselines"]
    assert comparison.main(argv) == 2
    assert f"another lm_depth_comparison.py keeps its runs in {kept}" in capsys.readouterr().err
    # the lock left no file there (the dictionary stamp is written before it is taken)
    assert not (out / "d2").exists() and [p.name for p in kept.iterdir()] == ["dictionary.sha256"]
    # the --out-dir's own lock was let go: once the folder is free, the same command trains
    assert runs.exclusive_lock(str(out / ".lock")) is not None
    held.close()
    assert runs.exclusive_lock(str(kept)) is not None


def test_missing_data_and_another_dictionary_are_refused(lm_bin, tmp_path, capsys):
    out = tmp_path / "out"
    assert comparison.main(["--data", str(tmp_path / "nowhere"), "--out-dir", str(out)]) == 2
    assert "no dict.txt; prepare the data first" in capsys.readouterr().err
    assert not out.exists()
    out.mkdir()
    (out / "dictionary.sha256").write_text("0" * 64 + "\n")  # runs made with another dictionary
    assert comparison.main(["--data", str(lm_bin), "--out-dir", str(out)]) == 2
    err = capsys.readouterr().err
    assert "was prepared with another dictionary than the runs in" in err
    assert not (out / "d4").exists()


def check_kept_runs(argv, kept, first_out, monkeypatch, capsys):
    """--keep-runs: what the report reads of each finished run is copied to the kept folder
    (committed), and a new machine's empty output folder takes the runs from there: the same
    report and figures, nothing trained again."""
    argv = [*argv, "--keep-runs", str(kept)]
    first = json.loads((first_out / "results.json").read_text())
    run = kept / "d2" / "mhc_lite" / "seed1"
    assert sorted(str(p.relative_to(run)) for p in run.rglob("*") if p.is_file()) == [
        "analysis/analysis.json", "result.json", "test_blocks.npy"]
    stamp = (kept / "dictionary.sha256").stat()

    def no_training(cmd, log=None, append=False, on_cpu=None):
        raise AssertionError(f"trained again: {cmd}")
    monkeypatch.setattr(comparison.runs, "run_logged", no_training)
    fresh = first_out.parent / "fresh"
    assert comparison.main([*argv, "--out-dir", str(fresh)]) == 0
    again = json.loads((fresh / "results.json").read_text())
    assert {**again, "written": None} == {**first, "written": None}
    assert (fresh / "weights_d2.png").stat().st_size > 0  # from the kept first-seed analysis
    assert np.array_equal(np.load(fresh / "d2" / "mhc_lite" / "seed1" / "test_blocks.npy"),
                          np.load(run / "test_blocks.npy"))
    # a report alone takes them too
    report = first_out.parent / "report"
    assert comparison.main([*argv, "--out-dir", str(report), "--report-only"]) == 0
    assert json.loads((report / "results.json").read_text())["depths"] == first["depths"]
    # the dictionary stamp is written once, not again by each comparison passing over the runs
    assert (kept / "dictionary.sha256").stat().st_mtime_ns == stamp.st_mtime_ns
    # kept runs made with another dictionary are refused before anything runs
    (kept / "dictionary.sha256").write_text("0" * 64 + "\n")
    capsys.readouterr()
    assert comparison.main([*argv, "--out-dir", str(first_out.parent / "other")]) == 2
    err = capsys.readouterr().err
    assert "another dictionary than the runs in" in err and "another --keep-runs" in err
    monkeypatch.undo()


def test_a_tiny_comparison_runs_resumes_and_tests_against_the_baseline(lm_bin, tmp_path,
                                                                       monkeypatch, capsys):
    out, kept = tmp_path / "out", tmp_path / "kept"
    argv = ["--data", str(lm_bin), "--out-dir", str(out), "--rows", "baseline,mhc_lite", *TINY]
    # two runs at a time; each finished run also copied to the kept folder (checked below)
    assert comparison.main([*argv, "--jobs", "2", "--keep-runs", str(kept)]) == 0
    report = json.loads((out / "results.json").read_text())
    rows = report["depths"]["2"]
    # mHC-lite's maps read n C per sub-layer (> 2%): a baseline with a wider FFN matches them
    matched = [r for r in rows if r.startswith("baseline_ffn")]
    assert len(matched) == 1
    assert abs(rows[matched[0]]["params"] / rows["mhc_lite"]["params"] - 1) < 0.02
    # and mHC-lite is tested against it too (the same bootstrap, the same one-seed rule)
    vs_matched = rows["mhc_lite"]["vs_matched"]
    assert vs_matched["baseline"] == matched[0] and vs_matched["larger_than_noise"] is None
    assert vs_matched["difference"] == pytest.approx(
        rows["mhc_lite"]["test_bits"][0] - rows[matched[0]]["test_bits"][0], abs=1e-3)
    assert f"| mhc_lite | {rows['mhc_lite']['params']:,} | {matched[0]} |" in (
        out / "results.md").read_text()
    assert rows["baseline"]["params"] < rows["mhc_lite"]["params"]
    run = out / "d2" / "mhc_lite" / "seed1"
    blocks = np.load(run / "test_blocks.npy")
    assert blocks.shape[1] == 2 and (blocks[:, 1] > 0).all()
    result = json.loads((run / "result.json").read_text())
    assert result["code"].startswith("0.")  # the package version (and commit) that trained it
    assert result["threads"] == max(1, (os.cpu_count() or 1) // 2)
    assert (out / "results.md").read_text().startswith("Written ")  # date, command, code
    assert result["test_bits"] == pytest.approx(blocks[:, 0].sum() / blocks[:, 1].sum(), abs=1e-4)
    # validation and test, each as bits per token and as perplexity (2^bits), in the table too
    assert rows["mhc_lite"]["valid_ppl"][0] == pytest.approx(2 ** rows["mhc_lite"]["valid_bits"][0],
                                                             rel=1e-4)
    assert (f"| {rows['mhc_lite']['valid_bits'][0]:.4f} | {rows['mhc_lite']['valid_ppl'][0]:.1f} | "
            f"{rows['mhc_lite']['test_bits'][0]:.4f} | {rows['mhc_lite']['test_ppl'][0]:.1f} |"
            ) in (out / "results.md").read_text()
    assert 0 < result["test_bits"] < np.log2(40)  # a 30-piece vocabulary, barely trained
    vs = rows["mhc_lite"]["vs_baseline"]
    assert vs["low"] <= vs["difference"] <= vs["high"]
    # one seed: the interval holds the test blocks' sampling only, so no verdict is given
    assert vs["larger_than_noise"] is None
    assert "| not judged (1 seed) |" in (out / "results.md").read_text()
    assert vs["difference"] == pytest.approx(rows["mhc_lite"]["test_bits"][0]
                                             - rows["baseline"]["test_bits"][0], abs=1e-3)
    # the same difference as a perplexity ratio (2^bits): mean perplexities' ratio, one seed
    assert vs["ppl_ratio"]["difference"] == pytest.approx(
        rows["mhc_lite"]["test_ppl"][0] / rows["baseline"]["test_ppl"][0], rel=2e-3)
    assert f"| {100 * (vs['ppl_ratio']['difference'] - 1):+.1f}% |" in (
        out / "results.md").read_text()
    # beside it, the difference at each seed both rows have (one here: the same number)
    assert vs["by_seed"] == {"1": pytest.approx(vs["difference"], abs=2e-4)}
    # stored at the five decimals of the runs' own test bits, so that the difference is exact
    # and the table's three decimals are rounded once (at four they were rounded twice)
    base_result = json.loads((out / "d2" / "baseline" / "seed1" / "result.json").read_text())
    assert vs["by_seed"]["1"] == round(result["test_bits"] - base_result["test_bits"], 5)
    assert f"| not judged (1 seed) | {vs['by_seed']['1']:+.3f} |" in (
        out / "results.md").read_text()
    assert "| mhc_lite |" in (out / "results.md").read_text()
    # the first seed is analysed; mHC reports its Amax gain from the training log (a product of
    # doubly stochastic matrices: 1)
    analysis = json.loads((run / "analysis" / "analysis.json").read_text())
    assert analysis and not any(p.suffix == ".pt" for p in run.iterdir())
    gain = rows["mhc_lite"]["amax_gain"][0]
    assert gain["amax_gain_forward"] == pytest.approx(1.0, abs=1e-3)
    assert gain["amax_gain_backward"] == pytest.approx(1.0, abs=1e-3)
    assert rows["baseline"]["amax_gain"] == [None]
    # and at every logged update, the last of which is the gain at the end
    curve = result["amax_gain_curve"]
    assert curve["update"] and curve["update"][-1] == 2
    assert len(curve["amax_gain_forward"]) == len(curve["update"]) == len(result["train_losses"])
    assert curve["amax_gain_forward"][-1] == gain["amax_gain_forward"]
    peak = rows["mhc_lite"]["amax_gain_peak"][0]
    highest = int(np.argmax(curve["amax_gain_forward"]))
    assert peak["amax_gain_forward"] == [curve["amax_gain_forward"][highest],
                                         curve["update"][highest]]
    assert rows["baseline"]["amax_gain_peak"] == [None]
    gain_line = next(line for line in (out / "results.md").read_text().splitlines()
                     if line.startswith("| mhc_lite | 1.000 / 1.000 |"))
    assert gain_line.endswith(f" | {peak['amax_gain_forward'][0]:.3f} "
                              f"({peak['amax_gain_forward'][1]:,}) / "
                              f"{peak['amax_gain_backward'][0]:.3f} "
                              f"({peak['amax_gain_backward'][1]:,}) |")
    assert (out / "weights_d2.png").stat().st_size > 0  # the learned connection weights
    assert (out / "layers_d2.png").stat().st_size > 0  # logit lens, CKA, update norms per row
    check_kept_runs(argv, kept, out, monkeypatch, capsys)
    # a report of what is finished so far trains nothing and says which seeds each row has
    assert comparison.main([*argv, "--seeds", "1,2", "--report-only"]) == 0
    assert not (out / "d2" / "baseline" / "seed2").exists()
    partial = json.loads((out / "results.json").read_text())["depths"]["2"]
    assert partial["mhc_lite"]["seeds"] == [1] and partial["mhc_lite"]["vs_baseline"] == vs
    assert "| mhc_lite | 1 |" in (out / "results.md").read_text()
    # a diverged seed (here a made-up second seed of both rows) is named beside the row, and
    # the scores and the test use the seeds that converged
    for row in ("baseline", "mhc_lite"):
        diverged = json.loads((out / "d2" / row / "seed1" / "result.json").read_text())
        diverged.update(seed=2, diverged=True, valid_bits=None, test_bits=None, valid_ppl=None,
                        test_ppl=None)
        (out / "d2" / row / "seed2").mkdir()
        (out / "d2" / row / "seed2" / "result.json").write_text(json.dumps(diverged))
    assert comparison.main([*argv, "--seeds", "1,2", "--report-only"]) == 0
    rows2 = json.loads((out / "results.json").read_text())["depths"]["2"]
    assert rows2["mhc_lite"]["diverged"] == [2] and rows2["baseline"]["diverged"] == [2]
    assert rows2["mhc_lite"]["test_bits"] == rows["mhc_lite"]["test_bits"]
    assert rows2["mhc_lite"]["vs_baseline"] == vs  # by seed too: seed 2 diverged in both
    assert "| mhc_lite | 1,2 (2 diverged) |" in (out / "results.md").read_text()
    shutil.rmtree(out / "d2" / "mhc_lite" / "seed1")  # every seed diverged: no scores, no test
    (out / "d2" / "mhc_lite" / "seed1").mkdir()
    (out / "d2" / "mhc_lite" / "seed1" / "result.json").write_text(json.dumps(dict(diverged,
                                                                                  seed=1)))
    assert comparison.main([*argv, "--seeds", "1,2", "--report-only"]) == 0
    rows2 = json.loads((out / "results.json").read_text())["depths"]["2"]
    assert rows2["mhc_lite"]["test_bits"] == [None, None]
    assert "vs_baseline" not in rows2["mhc_lite"]
    assert "| mhc_lite | 1,2 (1,2 diverged) |" in (out / "results.md").read_text()
    assert "| diverged | — | — | — |" in (out / "results.md").read_text()
    # finished runs are kept; an interrupted one (no result.json) is run again from scratch
    kept = (out / "d2" / "baseline" / "seed1" / "result.json").stat().st_mtime_ns
    os.remove(run / "result.json")
    (run / "stale.log").write_text("an interrupted run's leftovers")
    assert comparison.main(argv) == 0
    assert (out / "d2" / "baseline" / "seed1" / "result.json").stat().st_mtime_ns == kept
    assert (run / "result.json").exists() and not (run / "stale.log").exists()


def test_a_longer_run_starts_as_the_shorter_one_and_scores_its_learning_curve(lm_bin,
                                                                              tmp_path, capsys):
    """With the same warm-up, an 8-update run's first 4 updates are the 4-update run's (the
    inverse-sqrt schedule does not depend on --max-update): the same losses, bitwise, and its
    curve point at update 4 scores the 4-update run's model; the curve's last point is the
    final validation score, and no checkpoint is left behind."""
    # in this process (submitit's debug launcher: its commands forked from one warm server;
    # the local launcher's process per run is the tiny comparison's test)
    common = ["--data", str(lm_bin), "--rows", "baseline,dwa", "--depths", "2", "--seeds", "1",
              "--embed-dim", "16", "--no-matched-baselines", "--warmup-updates", "2",
              "--log-interval", "1", "--save-interval-updates", "2", "--launcher", "debug"]
    assert comparison.main([*common, "--updates", "4", "--out-dir", str(tmp_path / "short")]) == 0
    longer = [*common, "--updates", "8", "--curve-interval", "4", "--test-at", "4", "--out-dir",
              str(tmp_path / "long")]
    assert comparison.main([*longer, "--keep-runs", str(tmp_path / "kept")]) == 0
    short, long = (json.loads((tmp_path / name / "d2" / "baseline" / "seed1" / "result.json")
                              .read_text()) for name in ("short", "long"))
    assert len(long["train_losses"]) == 8 and long["train_losses"][:4] == short["train_losses"]
    assert long["train_losses"][4:] != long["train_losses"][:4]
    assert "curve" not in short and long["recipe"]["curve_interval"] == 4
    assert long["curve"]["updates"] == [4, 8]
    assert long["curve"]["valid_bits"] == [short["valid_bits"], long["valid_bits"]]
    assert long["curve"]["valid_bits"][1] < long["curve"]["valid_bits"][0]  # it learns
    assert long["allocator"] == "retain"
    run = tmp_path / "long" / "d2" / "baseline" / "seed1"
    assert not any(p.suffix == ".pt" for p in run.iterdir())
    # --test-at 4: the test set scored with the checkpoint at update 4, the 4-update run's
    # model: its test blocks, bit for bit; kept with the run
    for row in ("baseline", "dwa"):
        at4 = np.load(tmp_path / "long" / "d2" / row / "seed1" / "test_blocks_4.npy")
        assert np.array_equal(at4, np.load(tmp_path / "short" / "d2" / row / "seed1"
                                           / "test_blocks.npy"))
        assert np.array_equal(at4, np.load(tmp_path / "kept" / "d2" / row / "seed1"
                                           / "test_blocks_4.npy"))
    # the report: DWA's curve as its difference from the baseline of the same seed, ranked at
    # each point, drawn; both tests against the baseline (unpaired and paired over seeds)
    dwa = json.loads((tmp_path / "long" / "d2" / "dwa" / "seed1" / "result.json").read_text())
    report = json.loads((tmp_path / "long" / "results.json").read_text())
    curve = report["curves"]["2"]["dwa"]
    assert curve["updates"] == [4, 8] and curve["seeds"] == [1]
    assert curve["delta_mean"] == pytest.approx(
        np.subtract(dwa["curve"]["valid_bits"], long["curve"]["valid_bits"]), abs=1e-5)
    assert curve["delta_low"] == curve["delta_mean"] == curve["delta_high"]  # one seed
    table = (tmp_path / "long" / "results.md").read_text()
    assert f"| dwa | 1 | {curve['delta_mean'][0]:+.4f} (1) | {curve['delta_mean'][1]:+.4f} (1) |" \
        in table
    assert f"| baseline (bits) | 1 | {long['curve']['valid_bits'][0]:.4f} |" in table
    assert (tmp_path / "long" / "curves.png").stat().st_size > 0
    unpaired, paired = (report["depths"]["2"]["dwa"][k]
                        for k in ("vs_baseline", "vs_baseline_paired"))
    assert paired["difference"] == unpaired["difference"] and paired["seeds"] == 1
    assert paired["larger_than_noise"] is None  # one seed: no verdict either
    # against the shorter budget: the runs reproduce it, and each row's move is reported
    assert comparison.main([*longer, "--report-only", "--shorter-report",
                            str(tmp_path / "short" / "results.json"),
                            "--shorter-runs", str(tmp_path / "short")]) == 0
    report = json.loads((tmp_path / "long" / "results.json").read_text())
    checks = {c["row"]: c for c in report["reproduction"]}
    assert checks["baseline"]["valid_bits"] == [short["valid_bits"]] * 2
    assert checks["baseline"]["train_losses_equal"] and checks["dwa"]["train_losses_equal"]
    assert report["budgets"]["depths"]["2"]["moved"] == {"dwa": "not judged"}
    table = (tmp_path / "long" / "results.md").read_text()
    assert "| 2 | baseline | 1 | 4 |" in table and "### 4 against 8 updates, 2 blocks" in table
    # the same move within the longer runs (their test blocks at update 4): the 4-update
    # runs' difference, as the shorter report has it
    shorter = json.loads((tmp_path / "short" / "results.json").read_text())
    assert report["within_runs"]["4"]["2"]["moved"] == {"dwa": "not judged"}
    assert ("### 4 against 8 updates within the runs, 2 blocks" in table
            and f"| dwa | {shorter['depths']['2']['dwa']['vs_baseline']['difference']:+.4f} ["
            in table.split("within the runs")[1])
    # runs of another budget are never mixed into one table: one line, nothing trained
    capsys.readouterr()
    assert comparison.main([*longer[:-1], str(tmp_path / "short"), "--report-only"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "made with another recipe" in err
    assert "updates 4, not 8" in err and "--max-update 4, not 8" in err
    # a finished run without the point's blocks (it finished before --test-at was given) gets
    # them by training the recipe again to the point: the same model as the curve's point
    # (checked on its validation bits), so the same blocks; another model is left out
    dwa_run = tmp_path / "long" / "d2" / "dwa" / "seed1"
    for folder in (run, dwa_run, tmp_path / "kept" / "d2" / "baseline" / "seed1"):
        os.remove(folder / "test_blocks_4.npy")
    tampered = json.loads((dwa_run / "result.json").read_text())
    tampered["curve"]["valid_bits"][0] += 0.01
    (dwa_run / "result.json").write_text(json.dumps(tampered))
    capsys.readouterr()
    code = comparison.main([*longer, "--keep-runs", str(tmp_path / "kept")])
    err = capsys.readouterr().err
    assert code == 0, err
    for folder in (run, tmp_path / "kept" / "d2" / "baseline" / "seed1"):
        assert np.array_equal(np.load(folder / "test_blocks_4.npy"),
                              np.load(tmp_path / "short" / "d2" / "baseline" / "seed1"
                                      / "test_blocks.npy"))
    assert not (dwa_run / "test_blocks_4.npy").exists() and not (dwa_run / "at4").exists()
    # the record says what gave the other model: the code and the machine it trained on
    record = json.loads((dwa_run / "test_blocks_4.mismatch.json").read_text())
    assert record["machine"] == comparison.runs.machine() and record["curve_valid_bits"] == \
        tampered["curve"]["valid_bits"][0] != record["valid_bits"]
    assert "not the same model" in err and "dwa at 2 blocks, seed 1 stays out" in err
    # named under its depth's section, not silently absent
    assert json.loads((tmp_path / "long" / "results.json").read_text())["within_runs"] == {
        "4": {"2": {"missing": ["dwa"]}}}
    table = (tmp_path / "long" / "results.md").read_text().split("within the runs, 2 blocks")[1]
    assert "Not here, no run of theirs having test scores at update 4" in table
    assert "`test_blocks_4.mismatch.json` in the run's folder): dwa." in table
    # and it is not trained again at the next start, nor in a fresh clone (the record is kept)
    assert comparison.main([*longer, "--keep-runs", str(tmp_path / "kept")]) == 0
    assert "training 4 updates again" not in capsys.readouterr().err
    assert not (dwa_run / "test_blocks_4.npy").exists()
    shutil.rmtree(dwa_run)
    assert comparison.main([*longer, "--keep-runs", str(tmp_path / "kept")]) == 0
    assert "training 4 updates again" not in capsys.readouterr().err
    assert (dwa_run / "test_blocks_4.mismatch.json").exists()
    (dwa_run / "result.json").write_text(json.dumps(dwa))
    # --test-at a point that is not one of the curve's, or its end: refused in one line
    for bad in ("3", "8"):
        assert comparison.main([*longer, "--test-at", bad, "--report-only"]) == 2
        assert f"--test-at {bad}: not a point of the learning curve before the end" in \
            capsys.readouterr().err
    # a shorter report that is not shorter is refused
    assert comparison.main([*longer, "--report-only", "--shorter-report",
                            str(tmp_path / "long" / "results.json")]) == 2
    assert "trained 8 updates, not fewer than --updates 8" in capsys.readouterr().err


def test_the_baseline_at_each_depth_says_from_when_a_deeper_one_leads():
    def curve(*bits):
        return {"updates": [800, 1600, 2400], "valid_bits": list(bits)}
    entry, lines = comparison.baseline_across_depths({
        4: [curve(6.0, 5.8, 5.7)], 8: [curve(6.1, 5.75, 5.69), curve(6.1, 5.85, 5.65)],
        12: [curve(6.2, 5.79, 5.71)]})
    assert entry["valid_bits"]["8"] == [6.1, 5.8, 5.67]  # the seeds' mean
    # 8 blocks: level at 1,600 (not below), below at 2,400; 12 blocks below at 1,600 only
    assert entry["below_shallowest_from"] == {"8": 2400, "12": None}
    assert "| 8 | 2 | 6.1000 | 5.8000 | 5.6700 | 2400 |" in lines
    assert "| 12 | 1 | 6.2000 | 5.7900 | 5.7100 | — |" in lines
    assert "| 4 | 1 | 6.0000 | 5.8000 | 5.7000 | — |" in lines


def test_the_cpu_time_is_measured_where_counted_and_estimated_from_the_same_rows_runs():
    def run(depth, row, seed, cpu):
        return (depth, row, seed), {"depth": depth, "row": row, "seed": seed,
                                    "train_cpu_seconds": cpu}
    results = dict([run(4, "baseline", 1, None), run(4, "baseline", 2, 3600.0),
                    run(4, "baseline", 3, 5400.0), run(8, "baseline", 1, None),
                    run(4, "mhc", 1, 7200.0)])
    entry, lines = comparison.cpu_time(results, updates=100)
    # 4 blocks' baseline seed 1: the mean of its seeds 2 and 3 per update (45 s) x 100 updates
    assert entry == {"measured_core_hours": 4.5, "measured_runs": 3,
                     "estimated_core_hours": 1.25, "estimated_runs": 1,
                     "not_estimated": ["baseline at 8 blocks, seed 1"],
                     "machines": {"not recorded": 5}}
    assert lines[2].startswith("Training took 5.8 core-hours for 4 runs: 4.5 measured over 3 "
                               "runs, 1.2 estimated for 1 whose count is incomplete")
    assert "Not estimated (no complete run of the same row and depth yet): baseline at 8 " \
           "blocks, seed 1." in lines[2]
    _, lines = comparison.cpu_time(dict([run(4, "baseline", 1, None)]), updates=100)
    assert lines[2].startswith("No run's CPU time is complete yet. Not estimated (no complete "
                               "run of the same row and depth yet): baseline at 4 blocks, seed 1.")
    # runs that trained before the count was kept (no field at all): one line, not each run,
    # while the JSON still names them; one counted run among them brings the list back
    older = {key: {k: v for k, v in r.items() if k != "train_cpu_seconds"}
             for key, r in results.items()}
    entry, lines = comparison.cpu_time(older, updates=100)
    assert lines[2] == "Not recorded: the 5 runs trained before their CPU time was counted."
    assert entry["measured_runs"] == 0 and len(entry["not_estimated"]) == 5
    _, lines = comparison.cpu_time({**older, **dict([run(4, "mhc", 1, 7200.0)])}, updates=100)
    assert lines[2].startswith("Training took 2.0 core-hours for 1 runs") and \
        "Not estimated" in lines[2]


def test_the_amax_gain_is_kept_at_every_logged_update_and_its_peak_reported(tmp_path):
    def line(update, loss, gains=None):
        record = {"epoch": 1, "loss": str(loss), "num_updates": str(update)}
        record.update({f"lw_decoder_depth_connection_amax_gain_{k}": str(v)
                       for k, v in (gains or {}).items()})
        return f"2026-11-29 20:00:00 | INFO | train_inner | {json.dumps(record)}\n"

    log = tmp_path / "train.log"
    # a run interrupted after update 120 and resumed from its checkpoint at 80: updates 120 and
    # 160 are logged again after 120's first record, and the later records count
    log.write_text(line(40, 9.0, dict(forward=2.0, backward=1.5))
                   + line(80, 8.0, dict(forward=7.0, backward=3.0))
                   + line(120, 7.5, dict(forward=9.0, backward=2.0))
                   + "2026-11-29 20:01:00 | INFO | fairseq_cli.train | begin training\n"
                   + line(120, 7.4, dict(forward=6.0, backward=2.5))
                   + line(160, 7.0, dict(forward=5.0, backward=4.0)))
    losses, gains, curve = comparison.training_log(str(log))
    assert losses == [9.0, 8.0, 7.4, 7.0]
    assert gains == {"amax_gain_forward": 5.0, "amax_gain_backward": 4.0}  # the last update's
    assert curve == {"update": [40, 80, 120, 160], "amax_gain_forward": [2.0, 7.0, 6.0, 5.0],
                     "amax_gain_backward": [1.5, 3.0, 2.5, 4.0]}
    # the forward peak is update 80's 7.0, not the 9.0 logged at 120 before the resume
    assert comparison.amax_gain_peak(curve) == {"amax_gain_forward": [7.0, 80],
                                                "amax_gain_backward": [4.0, 160]}
    assert comparison.amax_gain_peak(None) is None
    # a row without the composite mixing logs no gains: no curve
    log.write_text(line(40, 9.0) + line(80, 8.0))
    assert comparison.training_log(str(log)) == ([9.0, 8.0], {}, None)


def test_how_a_difference_moves_between_budgets():
    def test(diff, low, high, seeds=3):
        return {"difference": diff, "low": low, "high": high,
                "larger_than_noise": (low > 0 or high < 0) if seeds >= 3 else None}
    move = comparison.change_between_budgets
    assert move(test(-0.03, -0.04, -0.02), test(-0.08, -0.09, -0.07)) == "lower: the gain grows"
    assert move(test(-0.08, -0.09, -0.07), test(-0.03, -0.04, -0.02)) == "higher: the gain shrinks"
    assert move(test(-0.08, -0.09, -0.07), test(0.03, 0.02, 0.04)) == "higher: the gain reverses"
    assert move(test(-0.03, -0.04, -0.02), test(-0.035, -0.05, -0.02)) == \
        "same within noise: the gain persists"
    assert move(test(0.03, 0.02, 0.04), test(0.035, 0.02, 0.05)) == \
        "same within noise: the deficit persists"
    # overlapping intervals, only one of them beyond noise (DWA at 4 blocks, 800 against
    # 8,000 updates: -0.0047 [-0.0202, +0.0111] and -0.0067 [-0.0127, -0.0013])
    assert move(test(-0.0047, -0.0202, 0.0111), test(-0.0067, -0.0127, -0.0013)) == \
        "same within noise: beyond noise at the longer budget only"
    assert move(test(-0.0067, -0.0127, -0.0013), test(-0.0047, -0.0202, 0.0111)) == \
        "same within noise: beyond noise at the shorter budget only"
    assert move(test(0.08, 0.07, 0.09), test(0.03, 0.02, 0.04)) == "lower: the deficit shrinks"
    assert move(test(0.00, -0.01, 0.01), test(0.001, -0.01, 0.01)) == \
        "same within noise: no difference at either"
    assert move(test(-0.03, -0.04, -0.02, seeds=1), test(-0.08, -0.09, -0.07)) == "not judged"


def test_the_curve_table_ranks_the_rows_at_every_point():
    curves = {row: {"updates": [800, 1600], "seeds": [1], "delta_mean": d, "delta_low": d,
                    "delta_high": d}
              for row, d in (("a", [-0.01, -0.05]), ("b", [-0.03, -0.01]), ("c", [0.02, -0.03]))}
    lines = comparison.curve_lines(4, curves, [{"updates": [800, 1600],
                                                "valid_bits": [6.0, 5.5]}])
    assert "| a | 1 | -0.0100 (2) | -0.0500 (1) |" in lines
    assert "| c | 1 | +0.0200 (3) | -0.0300 (2) |" in lines
    assert "| baseline (bits) | 1 | 6.0000 | 5.5000 |" in lines
    # ranks (2, 1, 3) then (1, 3, 2): Spearman -0.5
    assert any("800 and 1600 updates: -0.50 over 3 rows" in line for line in lines)


def test_each_row_is_benchmarked_as_it_is_trained():
    """The time and memory beside a row come from the bench row of the same model (the same
    architecture, size and flags; the weight logging aside, which changes no function). The
    recipe's dropout is the bench's --dropout: the committed benches' is checked below."""
    depth = paths.load_script("bench", "depth.py")
    assert set(comparison.BENCH_ROWS) == set(comparison.ROWS)
    for row, bench_row in comparison.BENCH_ROWS.items():
        arch, flags = comparison.row_spec(row, 12, 128)
        bench_arch, bench_flags = depth.METHODS[bench_row]
        assert arch == bench_arch, row
        assert [f for f in flags if f != "--log-layer-weights"] == \
            depth.sizes(arch, 128, 12) + bench_flags, row


def test_the_curves_figure_keeps_a_row_s_colour_across_depths_and_names_every_row(
        tmp_path, monkeypatch):
    """The deeper panel holds fewer rows while its runs go on (and in another order): a row is
    drawn alike in both panels, and the legend names the rows of both, not the last panel's."""
    drawn = {}

    def keep(fig, out, title=None):
        drawn["fig"] = fig
        return True

    monkeypatch.setattr(figures, "_save", keep)
    curve = ([800, 1600], [-0.1, -0.05], [-0.12, -0.06], [-0.08, -0.04])
    shallow = {row: curve for row in ("a", "b", "c", "d")}
    deep = {"c": curve, "a": curve}
    assert figures.curve_differences([("4 blocks", shallow), ("8 blocks", deep)],
                                     str(tmp_path / "curves.png"))
    left, right = drawn["fig"].axes[:2]
    styles = [{line.get_label(): (line.get_color(), line.get_linestyle())
               for line in ax.get_lines() if not line.get_label().startswith("_")}
              for ax in (left, right)]
    assert list(styles[1]) == ["c", "a"]
    for row in styles[1]:
        assert styles[1][row] == styles[0][row], row
    assert len(set(styles[0].values())) == 4  # four rows, four looks
    legend = right.get_legend()
    assert [text.get_text() for text in legend.get_texts()] == ["a", "b", "c", "d"]


@pytest.mark.parametrize("runs", ["lm_depth_runs", "lm_depth_runs_8k"])
def test_every_committed_row_has_its_time_and_memory_measured(runs):
    """Each (depth, row) with committed runs finds its bench measurement in the files the report
    reads (BENCH_FILES): a bench file missing from that list, or a depth trained but never
    benchmarked, would print "—" in the report's time and memory columns. And the bench measured
    the model the runs trained: each file's row counts the parameters of the row's committed run
    (the same vocabulary and sizes) less the positional table, which the bench's reference count
    leaves out (a 33k-word bench would count 25,278 x d more), at the recipe's context, batch and
    dropout; the time files ran as the runs train (one thread, their allocator settings), the
    memory files under glibc's defaults."""
    root = os.path.join(paths.RESULTS, runs)
    if not os.path.isdir(root):
        pytest.skip(f"results/{runs} is not committed in this checkout")
    bench = comparison.bench_ratios()
    recipe = comparison.recipe_flags(800)
    # the bench's config entry of each recipe flag it must share with the runs
    trained = {key: float(recipe[recipe.index(flag) + 1]) for key, flag in (
        ("context", "--tokens-per-sample"), ("batch", "--batch-size"), ("dropout", "--dropout"))}
    files = {}
    for measure, names in comparison.BENCH_FILES.items():
        for name in names:
            with open(os.path.join(paths.RESULTS, name)) as f:
                report = json.load(f)
            # reports made before the bench recorded its dropout ran without
            assert {key: report["config"].get(key, 0.0) for key in trained} == trained, name
            assert report.get("allocator_env") == comparison.ALLOCATORS[
                "retain" if measure == "train_time_ratio" else "default"], name
            if measure == "train_time_ratio":
                assert report["threads"] == 1, name
            for depth in report["depths"]:
                files.setdefault(depth, []).append(report["depths"][depth])
    checked = 0
    for depth_dir in sorted(os.listdir(root)):
        if not os.path.isdir(os.path.join(root, depth_dir)):  # dictionary.sha256
            continue
        for row in sorted(os.listdir(os.path.join(root, depth_dir))):
            if row not in comparison.BENCH_ROWS:  # a matched baseline: not benchmarked (—)
                continue
            bench_row = comparison.BENCH_ROWS[row]
            measured = bench.get(depth_dir[1:], {}).get(bench_row, {})
            assert measured.get("train_time_ratio") is not None, (depth_dir, row)
            assert measured.get("memory_growth_ratio") is not None, (depth_dir, row)
            run_dir = os.path.join(root, depth_dir, row)
            with open(os.path.join(run_dir, sorted(os.listdir(run_dir))[0], "result.json")) as f:
                result = json.load(f)
            flags = result["flags"]
            embed_dim = flags[flags.index("--embed-dim") + 1]
            # every file of the depth that measured the row (a method added later has files
            # of its own beside the plain model): at least one for time and one for memory
            measured_in = [rows for rows in files[depth_dir[1:]] if bench_row in rows]
            assert len(measured_in) >= 2, (depth_dir, row)
            for rows in measured_in:
                # beyond the context's rows of positions, a checkpoint holds ar_encdec_lm's one
                # more (its encoder adds the next position) and AttnRes Block's grouping buffer
                extra = (result["params"] - rows[bench_row]["params_reference_count"]
                         - comparison.CONTEXT * embed_dim)
                assert 0 <= extra <= embed_dim + 1, (depth_dir, row, extra)
            checked += 1
    assert checked >= 3


def committed_report(report, runs):
    """A committed report's JSON and markdown (skips where it or its runs are not committed)."""
    path = os.path.join(paths.RESULTS, report)
    if not (os.path.isfile(path + ".json") and os.path.isdir(os.path.join(paths.RESULTS, runs))):
        pytest.skip(f"results/{report} or results/{runs} is not committed in this checkout")
    with open(path + ".json") as f, open(path + ".md") as g:
        return json.load(f), g.read()


def committed_run(runs, depth, row, seed):
    """The result.json of a committed run."""
    with open(os.path.join(paths.RESULTS, runs, f"d{depth}", row, f"seed{seed}",
                           "result.json")) as f:
        return json.load(f)


@pytest.mark.parametrize("report, runs", [("lm_depth_comparison_cpu", "lm_depth_runs"),
                                          ("lm_depth_comparison_8k_cpu", "lm_depth_runs_8k")])
def test_the_committed_reports_differences_seed_by_seed_are_their_runs(report, runs):
    """The committed report's Δ by seed, in its JSON and in its table, is the committed runs'
    test bits minus the baseline's of the same seed, rounded once: at five decimals in the
    JSON, at three in the table (a report written by an older script, or from runs changed since,
    fails here)."""
    report, table = committed_report(report, runs)
    depths = report["depths"]

    def test_bits(depth, row, seed):
        return committed_run(runs, depth, row, seed)["test_bits"]
    checked = 0
    for depth, rows in depths.items():
        section = table.split(f"### {depth} blocks\n", 1)[1].split("\n### ", 1)[0]
        for row, entry in rows.items():
            by_seed = entry.get("vs_baseline", {}).get("by_seed")
            if not by_seed:
                continue
            differences = {s: test_bits(depth, row, s) - test_bits(depth, "baseline", s)
                           for s in by_seed}
            assert by_seed == {s: round(d, 5) for s, d in differences.items()}, (depth, row)
            cell = " / ".join(f"{d:+.3f}" for d in differences.values())
            line = next(x for x in section.splitlines() if x.startswith(f"| {row} |"))
            assert f"| {cell} |" in line, (depth, row)
            checked += 1
    assert checked >= 10


@pytest.mark.parametrize("report, runs", [("lm_depth_comparison_8k_cpu", "lm_depth_runs_8k")])
def test_the_committed_reports_learning_curves_are_their_runs_rounded_once(report, runs):
    """Each row's mean difference from the baseline on the committed report's learning curves is
    the committed runs' curve points (five decimals) averaged over the row's seeds: exactly (six
    decimals) in the JSON, and in the table that value rounded once to four decimals (a mean
    stored at five and printed at four was rounded twice: +0.008155 printed as +0.0081); an
    exact tie at four decimals may go either way."""
    from decimal import Decimal

    report, table = committed_report(report, runs)
    curves = report["curves"]

    def curve(depth, row, seed):
        return [Decimal(str(b))
                for b in committed_run(runs, depth, row, seed)["curve"]["valid_bits"]]
    checked = 0
    for depth, rows in curves.items():
        section = table.split(f"Learning curves at {depth} blocks:", 1)[1].split("\n\n", 2)[1]
        for row, entry in rows.items():
            seeds = entry["seeds"]
            means = [sum(points) / len(seeds) for points in zip(*[
                [r - b for r, b in zip(curve(depth, row, s), curve(depth, "baseline", s))]
                for s in seeds])]
            assert entry["delta_mean"] == [float(round(m, 6)) for m in means], (depth, row)
            line = next(x for x in section.splitlines() if x.startswith(f"| {row} |"))
            cells = [c.split(" (")[0] for c in line.split(" | ")[2:]]
            for cell, m in zip(cells, means):
                tie = (abs(m) * 10 ** 4) % 1 == Decimal("0.5")
                once = f"{m.quantize(Decimal('0.0001'), 'ROUND_HALF_UP'):+f}"
                assert tie or cell == once, (depth, row, cell, m)
            checked += 1
    assert checked >= 10


def test_an_interrupted_run_continues_from_its_checkpoint_as_if_never_stopped(
        lm_bin, tmp_path, monkeypatch, capsys):
    # every run in this process (submitit's debug launcher), where the stand-in below kills
    # one; the launcher opens pdb on a failed run, as submitit's debug executor does: not here
    common = ["--data", str(lm_bin), "--rows", "baseline", "--depths", "2", "--seeds", "1",
              "--updates", "4", "--embed-dim", "16", "--no-matched-baselines", "--launcher",
              "debug"]
    whole = tmp_path / "whole" / "d2" / "baseline" / "seed1"
    assert comparison.main([*common, "--out-dir", str(tmp_path / "whole"),
                            "--save-interval-updates", "0"]) == 0  # no checkpoint on the way

    class Killed(Exception):
        pass
    real = comparison.runs.run_logged

    def killed_after_two_updates(cmd, log=None, append=False, on_cpu=None):
        if any("train" in str(part) for part in cmd[:3]):  # fairseq-train / fairseq_cli.train
            # the later flag wins; the count seen while it ran stays, as if killed after it
            real([*cmd, "--max-update", 2], log, append, on_cpu=on_cpu)
            raise Killed
        return real(cmd, log, append, on_cpu=on_cpu)
    monkeypatch.setattr(comparison.runs, "run_logged", killed_after_two_updates)
    out = tmp_path / "stopped"
    monkeypatch.setattr("pdb.post_mortem", lambda *a: None)
    argv = [*common, "--out-dir", str(out), "--save-interval-updates", "2"]
    capsys.readouterr()
    assert comparison.main(argv) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert "baseline in 2, seed 1 failed" in err[-1] and "Killed" in err[-1]
    run = out / "d2" / "baseline" / "seed1"
    assert (run / "checkpoint_last.pt").exists() and not (run / "result.json").exists()
    first_process = json.loads((run / "cpu_seconds.json").read_text())
    assert len(first_process) == 1 and first_process[0] > 0
    monkeypatch.undo()
    here = comparison.runs.machine()
    # the rest on another machine (a later session's): both are recorded, in order
    monkeypatch.setattr(comparison.runs, "machine", lambda: "Other CPU, AVX512, torch 9")
    assert comparison.main(argv) == 0
    resumed = json.loads((run / "result.json").read_text())
    uninterrupted = json.loads((whole / "result.json").read_text())
    assert resumed["resumed"] and not uninterrupted["resumed"]
    assert uninterrupted["machines"] == [here]
    assert resumed["machines"] == [here, "Other CPU, AVX512, torch 9"]
    assert "| fairseq.trainer | Loaded checkpoint" in (run / "train.log").read_text()
    # the same run: the same scores and every update's loss, logged once
    assert np.array_equal(np.load(run / "test_blocks.npy"), np.load(whole / "test_blocks.npy"))
    assert resumed["train_losses"] == uninterrupted["train_losses"]
    assert len(resumed["train_losses"]) == 4
    # its CPU time: the killed process's count (kept while it ran) plus the second one's
    assert uninterrupted["train_cpu_seconds"] > 0
    assert resumed["train_cpu_seconds"] > first_process[0]
    assert not any(p.suffix == ".pt" or p.name == "started.json" for p in run.iterdir())


def test_a_verdict_needs_three_seeds_on_each_side():
    """A row 0.5 bits better than the baseline on every block and seed: beyond noise with
    three seeds a side; with two (a resample then sees half the seed variance) or one, the
    interval is reported and no verdict is given."""
    rng = np.random.default_rng(0)

    def runs(bits, seeds):  # per seed: 40 test blocks of (bits summed, tokens)
        return [np.stack([rng.normal(bits, 0.05, 40) * 100, np.full(40, 100.0)], axis=1)
                for _ in range(seeds)]
    for seeds, judged in ((3, True), (2, None), (1, None)):
        test = comparison.paired_test(runs(5.0, seeds), runs(5.5, 3))
        assert test["difference"] == pytest.approx(-0.5, abs=0.05)
        assert test["larger_than_noise"] is judged and test["seeds"] == seeds
        cell = comparison.test_cells(dict(test, by_seed={}), all_diverged=False)
        assert cell.split(" | ")[2] == ("yes" if judged else
                                        f"not judged ({seeds} seed{'s' if seeds > 1 else ''})")
    # the fewer side decides: three seeds of the row against two of the baseline
    assert comparison.paired_test(runs(5.0, 3), runs(5.5, 2))["larger_than_noise"] is None


def test_the_ranking_across_depths_and_its_rank_correlation():
    def table(diffs, seeds=3):
        return {"baseline": {}, **{row: {"vs_baseline": {"difference": d, "seeds": seeds}}
                                   for row, d in diffs.items()}}
    shallow = {"a": -0.08, "b": -0.05, "c": -0.01, "d": 0.02}
    same, entry_lines = comparison.ranking_across_depths(
        {"4": table(shallow), "12": table({k: 2 * v for k, v in shallow.items()}, seeds=1)})
    assert same["spearman"] == pytest.approx(1.0) and same["ranks"]["4"]["a"] == 1
    assert entry_lines[0] == "### The ranking at 4 and 12 blocks"
    # each difference beside the seeds its test had: one seed at 12 blocks here
    assert "| a | -0.0800 | 3 | 1 | -0.1600 | 1 | 1 |" in entry_lines
    flipped, _ = comparison.ranking_across_depths(
        {"4": table(shallow), "12": table({k: -v for k, v in shallow.items()})})
    assert flipped["spearman"] == pytest.approx(-1.0) and flipped["ranks"]["12"]["d"] == 1
    # a row measured at one depth only is left out; fewer than three rows: no correlation
    partial, lines = comparison.ranking_across_depths(
        {"4": table(shallow), "12": table({"a": -0.1, "b": 0.0})})
    assert partial["spearman"] is None and partial["rows"] == ["a", "b"] and lines == []
    # a deepest depth with the baseline alone (the longer comparison's depth search) ranks
    # nothing: the ranking is between the shallowest and the deepest depth with rows
    searched, lines = comparison.ranking_across_depths(
        {"4": table(shallow), "8": table({k: -v for k, v in shallow.items()}),
         "12": {"baseline": {}}})
    assert searched["depths"] == [4, 8] and searched["spearman"] == pytest.approx(-1.0)
    assert lines[0] == "### The ranking at 4 and 8 blocks"
    alone, lines = comparison.ranking_across_depths({"4": table(shallow), "12": {"baseline": {}}})
    assert alone["spearman"] is None and lines == []


fp16_check = paths.load_script("experiments", "lm_fp16_check.py")


def test_fp16_check_refuses_bad_input_and_a_machine_without_cuda(lm_bin, tmp_path, capsys,
                                                                  monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    out = tmp_path / "out"
    assert fp16_check.main(["--data", str(lm_bin), "--out-dir", str(out), "--rows",
                            "baseline,hc_sideways"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("error: unknown row(s) hc_sideways; no CUDA device: this checks fairseq's "
                   "GPU fp16") and not out.exists()


def test_fp16_check_trains_and_scores_a_row_as_the_comparison_does(lm_bin, tmp_path):
    """The GPU check's run on this machine in fp32 (its fp16 twin needs CUDA): the comparison's
    model, recipe and scoring; a diverged run is reported as such in the table."""
    import argparse

    args = argparse.Namespace(data=str(lm_bin), out_dir=str(tmp_path), depth=2, updates=3,
                              embed_dim=16, device="cpu")
    result = fp16_check.train_and_score(args, "mhc_lite", "fp32")
    assert not result["diverged"] and result["min_loss_scale"] is None
    assert 0 < result["valid_bits"] < np.log2(40) and result["last_train_loss"] > 0
    assert result["flags"] == comparison.row_spec("mhc_lite", 2, 16)[1]
    assert not any(p.suffix == ".pt" for p in (tmp_path / "mhc_lite" / "fp32").iterdir())
    report = {"written": "Written", "gpu": "a GPU", "depth": 2, "embed_dim": 16, "updates": 3,
              "fp16_flags": fp16_check.PRECISIONS["fp16"],
              "rows": {"mhc_lite": {"fp32": result, "fp16": dict(result, valid_bits=result[
                  "valid_bits"] + 0.01, min_loss_scale=16.0)},
                       "baseline": {"fp32": result, "fp16": {"diverged": True, "error": "x"}},
                       "dwa": {"fp32": result, "fp16": {"diverged": False, "failed": True,
                                                        "error": "ValueError"}}}}
    table = fp16_check.markdown(report)
    assert f"| mhc_lite | {result['valid_bits']:.4f} | {result['valid_bits'] + 0.01:.4f} | " \
           "+0.0100 |" in table
    assert f"| baseline | {result['valid_bits']:.4f} | diverged | — |" in table
    assert f"| dwa | {result['valid_bits']:.4f} | failed (its error: results.json) | — |" in table
    assert "with --fp16 --fp16-no-flatten-grads;" in table
    assert "--no-fused-kernels" not in table  # no eager twin: no such section
    # --eager's twin (--no-fused-kernels): on a CPU the same code, so the same losses
    eager = fp16_check.train_and_score(args, "mhc_lite", "fp32_eager")
    logs = {v: open(tmp_path / "mhc_lite" / v / "train.log").read() for v in ("fp32", "fp32_eager")}
    assert "'fused_kernels': False" in logs["fp32_eager"]
    assert "'fused_kernels': False" not in logs["fp32"]
    assert eager["train_losses"] == result["train_losses"] and len(result["train_losses"]) == 3
    report["rows"]["mhc_lite"]["fp32_eager"] = dict(eager, train_losses=[
        x + 0.002 * (i == 1) for i, x in enumerate(eager["train_losses"])])
    table = fp16_check.markdown(report)
    assert f"| mhc_lite | {result['valid_bits']:.4f} | {eager['valid_bits']:.4f} | +0.0000 | " \
           "0.0020 | 3 |" in table
    # --graph's twin (--cuda-graph) through fairseq-train: on a CPU eager, said in the log
    graph = fp16_check.train_and_score(args, "mhc_lite", "fp32_graph")
    log = open(tmp_path / "mhc_lite" / "fp32_graph" / "train.log").read()
    assert "'cuda_graph': True" in log and "--cuda-graph: the model is on the CPU" in log
    assert graph["train_losses"] == result["train_losses"]
    report["rows"]["mhc_lite"]["fp32_graph"] = graph
    table = fp16_check.markdown(report)
    assert "fp32 against fp32 with `--cuda-graph`" in table
    assert f"| mhc_lite | {result['valid_bits']:.4f} | {graph['valid_bits']:.4f} | +0.0000 | " \
           "0.0000 | 3 |" in table


def test_a_kept_run_of_another_recipe_is_an_error_not_a_result(tmp_path):
    """finished_run: a kept run lends its result only to the recipe that made it."""
    kept, run = tmp_path / "kept", tmp_path / "run"
    kept.mkdir()
    (kept / "result.json").write_text(json.dumps({"recipe": {"updates": 800}, "test_bits": 5.7}))
    (kept / "test_blocks.npy").write_bytes(b"")
    assert comparison.finished_run(str(run), str(kept), {"updates": 800})["test_bits"] == 5.7
    assert (run / "result.json").exists() and (run / "test_blocks.npy").exists()
    with pytest.raises(comparison.runs.StepError, match="made with another recipe"):
        comparison.finished_run(str(tmp_path / "other"), str(kept), {"updates": 400})
    assert not (tmp_path / "other").exists()
    # nothing kept and nothing finished: not a finished run
    assert comparison.finished_run(str(tmp_path / "new"), str(tmp_path / "none"), {}) is None


def test_both_budgets_within_the_runs_are_tested_on_the_seeds_with_the_point(tmp_path):
    """A seed whose scores at the point are missing (a recovery that did not match) leaves the
    row tested on its other seeds at both budgets, and named with them."""
    rng = np.random.default_rng(0)
    blocks = {}
    for row, shift in (("baseline", 0.0), ("a", -0.5)):
        for seed in (1, 2, 3):
            folder = tmp_path / "d2" / row / f"seed{seed}"
            folder.mkdir(parents=True)
            for name, extra in (("test_blocks.npy", 0.0), ("test_blocks_4.npy", 1.0)):
                b = np.stack([rng.uniform(40, 60, 50) + 10 * (shift + extra),
                              np.full(50, 10.0)], axis=1)
                np.save(folder / name, b)
                blocks[(row, seed, name)] = b
    os.remove(tmp_path / "d2" / "a" / "seed2" / "test_blocks_4.npy")
    args = type("Args", (), {"test_at": [4], "updates": 8, "out_dir": str(tmp_path)})
    entry = {"seeds": [1, 2, 3], "diverged": []}
    report = {"depths": {"2": {"baseline": dict(entry), "a": dict(entry, vs_baseline={})}}}
    within, lines = comparison.within_run_lines(args, report)
    assert list(within["4"]["2"]["moved"]) == ["a (seeds 1,3)"]
    expected = [comparison.paired_test(
        [blocks[("a", s, name)] for s in (1, 3)],
        [blocks[("baseline", s, name)] for s in (1, 2, 3)])
        for name in ("test_blocks_4.npy", "test_blocks.npy")]
    row = next(line for line in lines if line.startswith("| a (seeds 1,3) |"))
    assert row.startswith(f"| a (seeds 1,3) | {expected[0]['difference']:+.4f} [")
    assert f"| {expected[1]['difference']:+.4f} [" in row
    assert "(the baseline's: 1,2,3)" in "\n".join(lines)
    # beside the tests, each shared seed's difference at the point and at the end (test bits:
    # the blocks' summed bits over their summed tokens), so seed 1 against seed 1 stays
    # readable while the baseline has more seeds than the row

    def bits(row, seed, name):
        return blocks[(row, seed, name)][:, 0].sum() / blocks[(row, seed, name)][:, 1].sum()

    by_seed = {str(s): [bits("a", s, n) - bits("baseline", s, n)
                        for n in ("test_blocks_4.npy", "test_blocks.npy")] for s in (1, 3)}
    assert within["4"]["2"]["by_seed"] == {"a (seeds 1,3)": {
        s: [round(x, 5) for x in pair] for s, pair in by_seed.items()}}
    assert all(x < -0.3 and y < -0.2 for x, y in by_seed.values())  # the planted shift
    assert row.endswith(" | " + " / ".join(f"{s}: {x:+.3f} → {y:+.3f}"
                                           for s, (x, y) in by_seed.items()) + " |")
    # without the baseline's scores at the point nothing is compared
    for seed in (1, 2, 3):
        os.remove(tmp_path / "d2" / "baseline" / f"seed{seed}" / "test_blocks_4.npy")
    assert comparison.within_run_lines(args, report) == ({}, [])


FAKE_PYTHON = """#!/usr/bin/env bash
# stands in for python in scripts/experiments/lm_depth_long.sh: logs each call; the deeper depth
# is 8; the stage whose arguments contain $KEEPS_IN (if set) keeps the file $KEEPS (touch)
echo "$*" >> "$FAKE_LOG"
case "$*" in
    *layerlab.depth_choice*) echo 8 ;;
    *--report-only*) ;;
    *)  if [ -n "${KEEPS_IN:-}" ] && [[ "$*" == *"$KEEPS_IN"* ]]; then
            mkdir -p "$(dirname "$KEEPS")" && touch -d "$KEEPS_TIME" "$KEEPS"
        fi ;;
esac
"""


def run_long_script(tmp_path, **env) -> List[str]:
    """scripts/experiments/lm_depth_long.sh run in a copy of the repository under ``tmp_path``
    with FAKE_PYTHON for python and ``env`` added (one kept run: d4/dwa/seed1/result.json) ->
    its calls of lm_depth_comparison.py, one line of arguments each."""
    root = tmp_path / "repo"
    (root / "scripts" / "experiments").mkdir(parents=True)
    shutil.copy(paths.script("experiments", "lm_depth_long.sh"), root / "scripts" / "experiments")
    kept = root / "results" / "lm_depth_runs_8k" / "d4" / "dwa" / "seed1"
    kept.mkdir(parents=True)
    (kept / "result.json").write_text("{}")
    os.utime(kept / "result.json", (1e9, 1e9))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python").write_text(FAKE_PYTHON)
    (bin_dir / "python").chmod(0o755)
    log = tmp_path / "calls.log"
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "FAKE_LOG": str(log),
           "OUT": str(tmp_path / "out"), "KEEPS_TIME": "2020-01-01", **env}
    proc = subprocess.run(["bash", str(root / "scripts" / "experiments" / "lm_depth_long.sh")],
                          env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return [c for c in log.read_text().splitlines() if "lm_depth_comparison.py" in c]


@pytest.mark.parametrize("keeps_in,keeps,reports", [
    # a restart passing over finished stages: the last stage's report alone
    (None, None, ["final"]),
    # stage 1 keeps a new run: its report, then the last one
    ("--depths 4,8,12 --seeds 1 ", "d4/baseline/seed1/result.json", ["after stage 1", "final"]),
    # stage 2 adds test blocks to a kept run (a new --test-at point)
    ("--depths 4 --seeds 1 ", "d4/dwa/seed1/test_blocks_800.npy", ["after stage 2", "final"]),
    # stage 2 rewrites a kept file (the same name, a new time)
    ("--depths 4 --seeds 1 ", "d4/dwa/seed1/result.json", ["after stage 2", "final"]),
])
def test_the_long_script_reports_between_stages_only_what_is_new(tmp_path, keeps_in, keeps,
                                                                    reports):
    """A restart of the long script must not rewrite the committed report for nothing (it would
    change its header alone): a stage that kept no new or changed file writes no report."""
    root = tmp_path / "repo"
    env = {}
    if keeps_in:
        env.update(KEEPS_IN=keeps_in, KEEPS=str(root / "results" / "lm_depth_runs_8k" / keeps))
    calls = run_long_script(tmp_path, **env)
    stage = {"--depths 4,8,12 --seeds 1 ": "stage 1", "--depths 4 --seeds 1 ": "stage 2",
             "--depths 4,8 --seeds 1,2,3 ": "stage 3"}
    seen, last = [], None
    for call in calls:
        if "--report-only" in call:
            seen.append("final" if last == "stage 3" else f"after {last}")
        else:
            last = next(name for flags, name in stage.items() if flags in call)
    assert seen == reports


def test_the_long_script_passes_jobs_and_threads_to_every_comparison(tmp_path):
    """JOBS=1 THREADS=1 (one core of two, the other training another comparison) reach every
    call, the report's too; without THREADS the comparison's default (cores / --jobs)."""
    calls = run_long_script(tmp_path / "one", JOBS="1", THREADS="1")
    assert len(calls) == 4 and all("--jobs 1 --threads 1 " in c for c in calls)
    calls = run_long_script(tmp_path / "default")
    assert len(calls) == 4 and all("--jobs 2 " in c and "--threads" not in c for c in calls)
