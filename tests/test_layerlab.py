"""The experiment library (layerlab): one source for the benchmark targets, the fairseq commands,
failed steps, log parsing and seed summaries; and no script reaching around it."""
import importlib.util
import json
import os
import re
import sys
import threading

import pytest
from helpers import REPO, SCRIPTS

from layerlab import bench, fairseq_log, paths, runs, stats


def test_benchmark_targets_are_checked_and_described_from_one_table(monkeypatch):
    parts = {"seq2seq": {"ratios_vs_transformer": {
        "fusion": {"train_ratio_over_mac_ratio": 1.1, "generate_speed_ratio": 0.9},
        "swapped": {"train_time_ratio": 1.5, "generate_time_ratio": 1.4}}}}
    rows = {t["target"]: t for t in bench.check_targets(parts)}
    assert rows["swapped: generation time / transformer's"]["met"] is False
    assert rows["fusion: training time / (transformer time x MAC-model ratio)"]["met"] is True
    assert not any(t["from"] == "lm" for t in rows.values())  # the part was not run
    # change the one table: the check and the report's description both follow
    swapped_generation = ("seq2seq", "generate_time_ratio", ("swapped",))
    table = [(*t[:4], 1.5, t[5]) if t[:3] == swapped_generation else t for t in bench.TARGETS]
    monkeypatch.setattr(bench, "TARGETS", tuple(table))
    rows = {t["target"]: t for t in bench.check_targets(parts)}
    assert rows["swapped: generation time / transformer's"]["met"] is True
    assert rows["swapped: generation time / transformer's"]["required"] == "<= 1.5"
    assert "<= 1.5 (swapped)" in bench.describe_targets("seq2seq")["generate_time_ratio"]


def test_fairseq_commands_run_this_pythons_fairseq(tmp_path, monkeypatch):
    exe = os.path.join(os.path.dirname(sys.executable), "fairseq-train")
    assert paths.fairseq_command("fairseq-train") == [exe]
    # without the console scripts beside the interpreter: python -m of a module that exists
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    for name in ("fairseq-train", "fairseq-generate", "fairseq-preprocess", "fairseq-eval-lm"):
        cmd = paths.fairseq_command(name)
        assert cmd[:2] == [str(tmp_path / "python"), "-m"]
        assert importlib.util.find_spec(cmd[2]) is not None, cmd


def test_a_failed_step_names_the_command_and_ends_with_its_log(tmp_path):
    log = tmp_path / "step.log"
    with pytest.raises(runs.StepError, match=r"(?s)exit 3.*see .*step\.log\n.*the reason"):
        runs.run_logged([sys.executable, "-c", "import sys; print('the reason'); sys.exit(3)"],
                        str(log))
    runs.run_logged([sys.executable, "-c", "print('fine')"], str(log))
    assert log.read_text() == "fine\n"


@pytest.mark.skipif(not os.path.exists(f"/proc/{os.getpid()}/stat"), reason="needs Linux /proc")
def test_a_running_step_reports_its_cpu_time_while_it_runs(tmp_path):
    """on_cpu sees the count grow while the command runs (what a caller killed mid-run has
    kept), then the total, which is the returned value, also for a failing command."""
    seen = []
    busy = "import time\nend = time.process_time() + 1.2\nwhile time.process_time() < end: pass"
    total = runs.run_logged([sys.executable, "-c", busy], str(tmp_path / "busy.log"),
                            on_cpu=seen.append, every=0.2)
    assert len(seen) >= 3 and seen[-1] == total >= 1.2
    assert seen[:-1] == sorted(seen[:-1]) and 0 < seen[-2] <= total
    # the count of another process is not this one's: the helper reads the given pid
    assert runs.process_cpu_seconds(os.getpid()) > 0
    failed = []
    with pytest.raises(runs.StepError):
        runs.run_logged([sys.executable, "-c", "import sys; sys.exit(2)"],
                        str(tmp_path / "fail.log"), on_cpu=failed.append)
    assert len(failed) == 1 and failed[0] > 0


def test_results_resume_only_when_finished(tmp_path):
    run_dir = str(tmp_path / "run")
    runs.fresh_run_dir(run_dir)
    assert runs.load_result(run_dir) is None
    runs.save_result(run_dir, {"bleu": 1.5})
    assert runs.load_result(run_dir) == {"bleu": 1.5}
    runs.fresh_run_dir(run_dir)  # an unfinished run starts from nothing
    assert os.listdir(run_dir) == []
    # a finished run is reused only for the recipe it was made with
    runs.save_result(run_dir, {"bleu": 1.5, "recipe": {"lr": 0.002}})
    assert runs.load_result(run_dir, {"lr": 0.002})["bleu"] == 1.5
    with pytest.raises(runs.StepError, match="made with another recipe"):
        runs.load_result(run_dir, {"lr": 0.001})


def test_the_machines_runs_trained_on_are_counted_as_recorded():
    a, b = "AMD EPYC, AVX2, torch 2.13.0", "Intel Xeon, AVX512, torch 2.13.0"
    results = [{}, {"machines": [a]}, {"machines": [a]}, {"machines": [b]},
               {"machines": [None, a]}, {"machines": [b, a]}]
    counts, text = runs.machines_used(results)
    assert counts == {"not recorded": 1, a: 2, b: 1, f"not recorded then {a}": 1,
                      f"{b} then {a}": 1}
    assert text.endswith(f": {a}: 2 runs; {b}: 1 run; {b} then {a}: 1 run; not recorded: 1 "
                         f"run; not recorded then {a}: 1 run.")
    # the record of this machine names its CPU and the kernels' instruction set
    import torch
    here = runs.machine()
    assert here.count(", ") >= 2 and here.endswith(f"torch {torch.__version__}")


def test_a_run_records_each_machine_it_trains_on_once(tmp_path, monkeypatch):
    monkeypatch.setattr(runs, "machine", lambda: "A")
    record = tmp_path / runs.MACHINES
    assert runs.record_machine(str(tmp_path), resumed=False) == ["A"]
    assert runs.record_machine(str(tmp_path), resumed=True) == ["A"]  # the same machine again
    monkeypatch.setattr(runs, "machine", lambda: "B")
    assert runs.record_machine(str(tmp_path), resumed=True) == ["A", "B"]
    assert json.loads(record.read_text()) == ["A", "B"]
    # a new run (not resumed) starts a new record
    assert runs.record_machine(str(tmp_path), resumed=False) == ["B"]
    # a run resumed without the file began before the record was kept: its first machine is
    # unknown
    record.unlink()
    assert runs.record_machine(str(tmp_path), resumed=True) == [None, "B"]


def test_in_parallel_yields_every_task_and_stops_at_a_failed_step():
    def square(x):
        return x * x
    assert sorted(runs.in_parallel(square, [(k,) for k in range(5)], 2)) == [
        ((k,), k * k) for k in range(5)]
    started = []

    def step(k):
        started.append(k)
        if k == 0:
            raise runs.StepError("step 0 failed")
        return k
    with pytest.raises(runs.StepError, match="step 0 failed"):
        list(runs.in_parallel(step, [(k,) for k in range(50)], 1))
    assert started == [0]  # the tasks not started yet were cancelled
    started.clear()

    def broken(k):  # any other failure (a bug) stops the queue as well
        started.append(k)
        raise ValueError(f"bug in task {k}")
    with pytest.raises(ValueError, match="bug in task 0"):
        list(runs.in_parallel(broken, [(k,) for k in range(50)], 1))
    assert started == [0]
    # never more than `jobs` tasks at a time, and every one of them is run
    lock, at_once, most = threading.Lock(), [0], [0]
    first_three = threading.Barrier(3, timeout=30)  # broken unless three run at once

    def counted(k):
        with lock:
            at_once[0] += 1
            most[0] = max(most[0], at_once[0])
        if k < 3:
            first_three.wait()
        with lock:
            at_once[0] -= 1
        return k
    assert sorted(k for _, k in runs.in_parallel(counted, [(k,) for k in range(12)], 3)) == list(
        range(12))
    assert most[0] == 3


def test_last_train_loss_falls_back_to_the_epoch_record(tmp_path):
    log = tmp_path / "train.log"
    log.write_text('x | train | {"train_loss": "3.5"}\n')
    assert fairseq_log.last_train_loss(str(log)) == 3.5
    log.write_text('x | train_inner | {"loss": "4.0"}\nx | train_inner | {"loss": "2.5"}\n'
                   'x | train | {"train_loss": "3.5"}\nx | train_inner | {"loss": ')
    assert fairseq_log.last_train_loss(str(log)) == 2.5  # the truncated line is skipped


def test_last_epoch_nll_reads_the_last_epoch_and_validation_of_a_subset(tmp_path):
    log = tmp_path / "train.log"
    log.write_text('x | train | {"epoch": 1, "train_loss": "5.0", "train_nll_loss": "4.0"}\n'
                   'x | valid | {"epoch": 1, "valid_loss": "4.5", "valid_nll_loss": "3.5"}\n'
                   'x | test1 | {"epoch": 1, "test1_loss": "6.0"}\n'
                   'x | train_inner | {"loss": "1.0", "nll_loss": "0.5"}\n'
                   'x | train | {"epoch": 2, "train_loss": "3.0", "train_nll_loss": "2.25"}\n'
                   'x | valid | {"epoch": 2, "valid_loss": "3.5", "valid_nll_loss": "2.75"}\n')
    # the epoch's record, not the last train_inner window; nll_loss where the criterion logs it
    assert fairseq_log.last_epoch_nll(str(log)) == {"train": 2.25, "valid": 2.75}
    # a subset logged without nll_loss (cross_entropy): its loss
    assert fairseq_log.last_epoch_nll(str(log), {"valid": "valid", "gen": "test1"}) == {
        "train": 2.25, "valid": 2.75, "gen": 6.0}
    log.write_text('x | train_inner | {"loss": "1.0"}\n')
    assert fairseq_log.last_epoch_nll(str(log)) == {"train": None, "valid": None}


def test_final_attempt_keeps_the_records_the_finished_model_descends_from():
    def at(update, loss):
        return {"num_updates": str(update), "loss": str(loss)}
    # attempt 1 logged 10..40 and was killed after its checkpoint at 20; attempt 2 resumed from
    # 20, logged 30 and 40 and was killed after its checkpoint at 30; attempt 3 resumed from 30
    # and finished at 50
    logged = [at(10, 9), at(20, 8), at(30, 7), at(40, 6), {"loss": "1.0"},  # no update: skipped
              at(30, 6.9), at(40, 5.5), at(40, 5.8), at(50, 5.0)]
    assert [(u, float(r["loss"])) for u, r in fairseq_log.final_attempt(logged)] == [
        (10, 9.0), (20, 8.0), (30, 6.9), (40, 5.8), (50, 5.0)]
    # an attempt that ends before the killed one did drops the killed one's later records:
    # the last record per update would keep attempt 1's update 40 here
    assert [u for u, _ in fairseq_log.final_attempt([at(10, 9), at(30, 7), at(40, 6),
                                                     at(20, 8), at(30, 7.5)])] == [10, 20, 30]
    assert fairseq_log.final_attempt(iter([])) == []


def test_seed_summaries():
    rows = [{"arch": "a", "seed": s, "em": v, "params": 7, "train_loss_bits": 1.0}
            for s, v in ((1, 50.0), (2, 54.0), (3, 58.0))]
    rows.append({"arch": "b", "seed": 1, "em": 10.0, "params": 9, "train_loss_bits": None})
    a, b = stats.summarise(rows, "em")
    assert (a["mean"], a["std"], a["values"], a["seeds"]) == (54.0, 4.0, [50.0, 54.0, 58.0],
                                                              [1, 2, 3])
    assert (b["std"], b["train_loss_bits_mean"]) == (0.0, None)
    assert stats.fmt(*stats.mean_std([1.0, None, 3.0])) == "2.00 ± 1.41"


def test_no_script_edits_the_import_path():
    offenders = []
    for root in (SCRIPTS, os.path.join(REPO, "layerlab"), os.path.join(REPO, "fairseq_plugins")):
        for folder, _, files in os.walk(root):
            for name in files:
                if name.endswith(".py"):
                    path = os.path.join(folder, name)
                    with open(path) as f:
                        if re.search(r"sys\.path\.(insert|append)", f.read()):
                            offenders.append(os.path.relpath(path, REPO))
    assert offenders == []


def test_sentence_statistics_reproduce_the_corpus_scores():
    from fairseq_plugins.metrics.bleu import corpus_bleu
    from fairseq_plugins.metrics.exact_match import exact_match
    from layerlab import significance

    hyps = ["the cat sat on the mat", "a dog  ran", "it is raining today", "we go home"]
    refs = ["the cat sat on a mat", "a dog ran", "it rains today", "we went home now"]
    bleu = significance.sentence_stats("bleu", hyps, refs)
    assert significance.score("bleu", bleu) == pytest.approx(corpus_bleu(hyps, refs)["bleu"],
                                                             abs=1e-9)
    assert significance.score("bleu", bleu[[0, 2]]) == pytest.approx(
        corpus_bleu([hyps[0], hyps[2]], [refs[0], refs[2]])["bleu"], abs=1e-9)
    em = significance.sentence_stats("exact_match", hyps, refs)
    assert significance.score("exact_match", em) == exact_match(hyps, refs)["exact_match"] == 25.0


def test_bootstrap_separates_a_real_difference_from_seed_noise():
    import numpy as np

    from layerlab import significance

    rng = np.random.default_rng(0)

    def runs_with(accuracies, n=400):
        return [(rng.random((n, 1)) < a).astype(float) for a in accuracies]

    base = runs_with([0.50, 0.52, 0.48])
    same = significance.hierarchical_bootstrap("exact_match", base, base, replicates=300)
    assert same["difference"] == 0.0 and same["low"] <= 0 <= same["high"]
    assert not same["larger_than_noise"]
    better = significance.hierarchical_bootstrap("exact_match", runs_with([0.80, 0.82, 0.79]),
                                                 base, replicates=300)
    assert better["larger_than_noise"] and better["low"] > 20
    # a mean 5 points higher, but the seeds spread over 50 points: not beyond the noise
    noisy = significance.hierarchical_bootstrap("exact_match", runs_with([0.30, 0.55, 0.80]),
                                                base, replicates=300)
    assert not noisy["larger_than_noise"] and noisy["high"] - noisy["low"] > 30


def test_bits_per_token_bootstrap_pools_blocks_and_separates_a_small_lm_gain():
    """Language models: per test block its NLL in bits and its tokens; a set of blocks scores
    sum / sum (not the mean of the blocks' ratios); a 0.02-bit gain over blocks whose own bits
    spread by 0.3 is beyond the noise with 3 close seeds, not with seeds 0.1 bits apart."""
    import numpy as np

    from layerlab import significance

    blocks = np.array([[10.0, 2.0], [30.0, 10.0]])
    assert significance.score("bits", blocks) == pytest.approx(40.0 / 12.0)
    rng = np.random.default_rng(0)
    difficulty = rng.normal(5.0, 0.3, 300)  # the test blocks: some harder than others

    def runs_with(offsets, n=128):
        return [np.stack([(difficulty + o + rng.normal(0, 0.01, 300)) * n,
                          np.full(300, float(n))], axis=1) for o in offsets]

    base = runs_with([0.0, 0.005, -0.005])
    row = runs_with([-0.02, -0.015, -0.025])
    better = significance.hierarchical_bootstrap("bits", row, base, replicates=300)
    assert better["larger_than_noise"] and better["high"] < 0
    assert better["difference"] == pytest.approx(-0.02, abs=2e-3)
    # stored to six decimals (four are printed), so that reading it to three or four rounds once
    observed = (np.mean([significance.score("bits", r) for r in row])
                - np.mean([significance.score("bits", r) for r in base]))
    assert abs(better["difference"] - observed) <= 5e-7 and round(observed, 4) != observed
    spread = significance.hierarchical_bootstrap("bits", runs_with([-0.12, -0.02, 0.08]),
                                                 base, replicates=300)
    assert not spread["larger_than_noise"]


def test_stored_bits_read_at_three_or_four_decimals_round_once():
    """Six decimals, or more where six would end in the 5 that a reading at three or four
    decimals rounds again (the wrong way when the value lies below it)."""
    from layerlab import significance

    assert significance.rounded("bits", 0.01234567) == 0.012346
    assert significance.rounded("bits", -0.00468) == -0.00468
    for value in (0.0545499, -0.0578499, 0.0124996, 0.05455001):
        stored = significance.rounded("bits", value)
        assert abs(stored - value) < 5e-7
        assert f"{stored:.4f}" == f"{value:.4f}" and f"{stored:.3f}" == f"{value:.3f}"
    assert significance.rounded("bits", 0.0545499) == 0.0545499  # six decimals: 0.05455
    assert significance.rounded("bleu", 27.456) == 27.46  # BLEU is read at the stored two


def test_the_paired_bootstrap_removes_what_a_seed_shares_between_rows():
    """Each seed shifts both rows alike (its data order: +-0.1 bits) and the row is 0.02 bits
    better at every seed: the unpaired test counts the shared shift as noise (no verdict), the
    test paired over seeds sees the constant difference; a difference whose sign changes from
    seed to seed stays within the paired test's noise too, and unequal seeds are refused."""
    import numpy as np

    from layerlab import significance

    rng = np.random.default_rng(1)
    difficulty = rng.normal(5.0, 0.3, 300)
    shared = [0.1, -0.1, 0.0]  # what each seed does to every row

    def runs_with(offsets, n=128):
        return [np.stack([(difficulty + s + o + rng.normal(0, 0.01, 300)) * n,
                          np.full(300, float(n))], axis=1) for s, o in zip(shared, offsets)]

    base = runs_with([0.0, 0.0, 0.0])
    row = runs_with([-0.02, -0.02, -0.02])
    unpaired = significance.hierarchical_bootstrap("bits", row, base, replicates=300)
    paired = significance.paired_hierarchical_bootstrap("bits", row, base, replicates=300)
    assert not unpaired["larger_than_noise"]
    assert paired["larger_than_noise"] and paired["high"] < 0
    assert paired["difference"] == unpaired["difference"] == pytest.approx(-0.02, abs=2e-3)
    assert paired["high"] - paired["low"] < (unpaired["high"] - unpaired["low"]) / 5
    mixed = significance.paired_hierarchical_bootstrap("bits", runs_with([-0.06, 0.03, 0.02]),
                                                       base, replicates=300)
    assert not mixed["larger_than_noise"]
    with pytest.raises(ValueError, match="the same seeds on both sides"):
        significance.paired_hierarchical_bootstrap("bits", row[:2], base)


def test_cut_lines_copies_a_range_and_refuses_a_short_source(tmp_path):
    from layerlab.cut_lines import main

    src = tmp_path / "src.txt"
    src.write_text("".join(f"line {i}\n" for i in range(1, 11)))
    dst = tmp_path / "sub" / "dst.txt"
    assert main([str(src), str(dst), "--count", "3", "--skip", "4"]) == 0
    assert dst.read_text() == "line 5\nline 6\nline 7\n"
    assert main([str(src), str(dst), "--count", "2"]) == 0
    assert dst.read_text() == "line 1\nline 2\n"
    # too few lines: exit 2, and the previous file is neither truncated nor replaced
    assert main([str(src), str(dst), "--count", "5", "--skip", "8"]) == 2
    assert dst.read_text() == "line 1\nline 2\n" and not (tmp_path / "sub" / "dst.txt.tmp").exists()


def test_training_progress_from_the_logs(tmp_path):
    """A status line that is redrawn in a terminal, a plain line per new validation elsewhere;
    finished runs and logs older than the monitor are not shown."""
    import io
    import json
    import os

    from layerlab.progress import TrainingProgress

    def record(tag, **values):
        return f"2026-01-01 | INFO | {tag} | {json.dumps(values)}\n"

    old = tmp_path / "old.log"
    old.write_text(record("train_inner", num_updates="3000"))
    os.utime(old, (0, 0))
    a, b = tmp_path / "a.log", tmp_path / "b.log"
    plain, term = io.StringIO(), io.StringIO()
    logs = {"a": str(a), "b": str(b), "old": str(old)}
    monitors = [TrainingProgress(logs, 3000, stream=plain, tty=False),
                TrainingProgress(logs, 3000, stream=term, tty=True)]
    a.write_text(record("train_inner", num_updates="100"))
    for m in monitors:
        m.tick()
    assert plain.getvalue() == ""  # no validation yet: nothing in a log
    assert term.getvalue() == "      training: a 100/3000"
    with open(a, "a") as f:
        f.write(record("valid", valid_num_updates="500", valid_exact_match="93.25"))
    b.write_text(record("train_inner", num_updates="200"))
    for m in monitors:
        m.tick()
        m.tick()  # nothing new: no second plain line
    assert plain.getvalue() == "      a: 500/3000, valid exact match 93.2\n"
    last = term.getvalue().rsplit("\r", 1)[-1]
    assert last == "      training: a 500/3000, valid exact match 93.2; b 200/3000"
    for m in monitors:
        m.done("a")
        m.print("      (1/2) a finished")
    assert term.getvalue().endswith("\r      (1/2) a finished\n")  # the status line cleared first
    monitors[1].tick()
    assert term.getvalue().endswith("      training: b 200/3000")


def test_a_divergence_is_told_from_other_failures():
    """runs.diverged: a loss gone NaN / inf (fairseq's FloatingPointError) is a run's result; any
    other failed command is not."""
    assert runs.diverged(runs.StepError("...FloatingPointError: Minimum loss scale reached"))
    assert runs.diverged(runs.StepError("... loss is NaN at update 12"))
    assert not runs.diverged(runs.StepError("... ValueError: --weight-decay with --fp16"))


def test_the_deeper_depth_is_the_shallowest_whose_baseline_beats_the_shallow_one(tmp_path,
                                                                                 capsys):
    from layerlab import depth_choice

    def finish(depth, bits, diverged=False):
        run = tmp_path / f"d{depth}" / "baseline" / "seed1"
        run.mkdir(parents=True)
        (run / "result.json").write_text(json.dumps({"test_bits": bits, "diverged": diverged}))

    finish(4, 5.70)
    finish(12, 5.65)
    # a depth not finished yet: no choice, one line naming it
    with pytest.raises(SystemExit) as stop:
        depth_choice.main([str(tmp_path), "--shallow", "4", "--candidates", "8,12"])
    assert stop.value.code == 2
    assert "no finished baseline run at seed 1 for 8 blocks" in capsys.readouterr().err
    finish(8, 5.72)  # 8 blocks still behind 4, 12 ahead: 12
    assert depth_choice.deeper_depth(str(tmp_path), 4, [8, 12]) == (
        12, {4: 5.70, 8: 5.72, 12: 5.65}, True)
    assert depth_choice.main([str(tmp_path), "--shallow", "4", "--candidates", "12,8"]) == 0
    assert capsys.readouterr().out == "12\n"
    (tmp_path / "d12" / "baseline" / "seed1" / "result.json").write_text(
        json.dumps({"test_bits": 5.71, "diverged": False}))  # none ahead: the deepest, said so
    assert depth_choice.deeper_depth(str(tmp_path), 4, [8, 12])[::2] == (12, False)
    assert depth_choice.main([str(tmp_path), "--shallow", "4", "--candidates", "8,12"]) == 0
    assert "no candidate beats 4 blocks" in capsys.readouterr().err
    (tmp_path / "d8" / "baseline" / "seed1" / "result.json").write_text(
        json.dumps({"test_bits": 5.60, "diverged": False}))  # the shallowest that beats it
    assert depth_choice.deeper_depth(str(tmp_path), 4, [8, 12])[0] == 8
