"""layerlab.runner: a comparison's plan, its refusals before anything trains, and its runs
launched through submitit (debug and local executors; Slurm's parameters and executor with a
stand-in srun: nothing here needs a cluster)."""
import json
import os
import stat

import pytest

from layerlab import runner
from layerlab.runner import Comparison, Launcher, PlanError, Row

ROWS = (Row("baseline", "transformer_tiny"), Row("lrf", "fusion_transformer_tiny"),
        Row("hc", "hyper_connections_transformer_tiny", ("--hc-expansion-rate", "2")))


def _comparison(**changes):
    spec = dict(name="toy", rows=ROWS, settings=("multi30k", "cogs"), seeds=(1, 2),
                baseline="baseline", only={"hc": ("multi30k",)})
    spec.update(changes)
    return Comparison(**spec)


def test_the_plan_goes_seed_by_seed_and_keeps_a_folder_per_run(tmp_path):
    plan = _comparison().plan(str(tmp_path))
    assert [run.key for run in plan] == [
        ("multi30k", "baseline", 1), ("multi30k", "lrf", 1), ("multi30k", "hc", 1),
        ("cogs", "baseline", 1), ("cogs", "lrf", 1),
        ("multi30k", "baseline", 2), ("multi30k", "lrf", 2), ("multi30k", "hc", 2),
        ("cogs", "baseline", 2), ("cogs", "lrf", 2)]
    assert plan[2].run_dir == str(tmp_path / "multi30k" / "hc" / "seed1")
    assert len({run.run_dir for run in plan}) == len(plan)


@pytest.mark.parametrize("changes,message", [
    (dict(baseline="plain"), "toy: unknown row 'plain'; known: baseline, lrf, hc"),
    (dict(rows=ROWS + (Row("lrf", "x"),)), "a row is declared twice"),
    (dict(only={"hc": ("wmt",)}), "row hc is limited to wmt, which is not among the settings"),
    (dict(only={"bridge": ("cogs",)}), "unknown row 'bridge'"),
    (dict(seeds=()), "toy: no seeds"),
])
def test_a_declaration_that_cannot_run_is_one_line(changes, message):
    with pytest.raises(PlanError) as error:
        _comparison(**changes).check()
    assert message in str(error.value) and "\n" not in str(error.value)


def test_a_row_the_family_refuses_is_named_before_anything_trains():
    from fairseq_plugins.inprocess import build_translation_model

    def build(row, setting):
        build_translation_model(row.arch, list(row.flags))

    rows = ROWS + (Row("mhc_post_norm", "layerwise_transformer_tiny", ("--mhc", "sinkhorn")),)
    _comparison().check(build)  # every declared row builds
    with pytest.raises(PlanError) as error:
        _comparison(rows=rows).check(build)
    text = str(error.value)
    assert text.startswith("toy: row mhc_post_norm (layerwise_transformer_tiny --mhc sinkhorn) "
                           "in multi30k: --mhc is defined for pre-norm stacks only")
    assert "\n" not in text


def _work(run, tag):
    """A run's work as a comparison's: its result.json in its folder."""
    os.makedirs(run.run_dir, exist_ok=True)
    result = {"row": run.row.name, "seed": run.seed, "tag": tag, "pid": os.getpid(),
              "threads": os.environ.get("OMP_NUM_THREADS")}
    with open(os.path.join(run.run_dir, "result.json"), "w") as f:
        json.dump(result, f)
    return result


def test_debug_launch_collects_in_plan_order_and_skips_finished_runs(tmp_path):
    comparison = _comparison(settings=("multi30k",), only={})
    plan = comparison.plan(str(tmp_path / "runs"))
    launcher = Launcher("debug", folder=str(tmp_path / "submitit"))
    seen = []
    results = runner.launch(plan[:2], _work, ("first",), launcher,
                            on_result=lambda run, result: seen.append(run.key))
    assert list(results) == [run.key for run in plan[:2]] and seen == list(results)
    results = runner.launch(plan, _work, ("second",), launcher)
    assert list(results) == [run.key for run in plan]
    # the first two were finished: read, not run again
    assert [r["tag"] for r in results.values()] == ["first"] * 2 + ["second"] * 4


def test_local_launch_runs_in_separate_processes_one_thread_each(tmp_path):
    plan = _comparison(settings=("cogs",), only={}, seeds=(1,)).plan(str(tmp_path / "runs"))
    launcher = Launcher("local", jobs=2, folder=str(tmp_path / "submitit"))

    def work(run):  # pickled by value: the submitted process need not import this module
        import json
        import os

        os.makedirs(run.run_dir, exist_ok=True)
        result = {"row": run.row.name, "pid": os.getpid(),
                  "threads": os.environ.get("OMP_NUM_THREADS")}
        with open(os.path.join(run.run_dir, "result.json"), "w") as f:
            json.dump(result, f)
        return result

    assert launcher.executor().parameters["timeout_min"] == 24 * 60  # not submitit's 5
    before = os.environ.get("OMP_NUM_THREADS")
    results = runner.launch(plan, work, (), launcher, poll=0.2)
    assert [r["row"] for r in results.values()] == ["baseline", "lrf", "hc"]
    assert all(r["pid"] != os.getpid() and r["threads"] == "1" for r in results.values())
    assert os.environ.get("OMP_NUM_THREADS") == before  # this process's setting is restored


def test_local_runs_get_the_threads_asked_and_their_notes_reach_this_process(tmp_path, capfd):
    """``cpus``: each local run's threads (several per run on a larger machine); what a run's
    work prints on stderr (a note for whoever watches) is relayed here as it finishes, and
    ``on_submit`` sees every submitted run in plan order, a finished one not."""
    plan = _comparison(settings=("cogs",), only={}, seeds=(1,)).plan(str(tmp_path / "runs"))

    def work(run):
        import os
        import sys

        print(f"note from {run.row.name}", file=sys.stderr)
        return {"threads": os.environ.get("OMP_NUM_THREADS")}

    submitted = []
    launcher = Launcher("local", jobs=2, folder=str(tmp_path / "submitit"), cpus=3)
    results = runner.launch(plan, work, (), launcher, poll=0.2,
                            done=lambda run: {"threads": None} if run.row.name == "lrf" else None,
                            on_submit=lambda run: submitted.append(run.row.name))
    assert [r["threads"] for r in results.values()] == ["3", None, "3"]
    assert submitted == ["baseline", "hc"]
    err = capfd.readouterr().err
    assert "note from baseline" in err and "note from hc" in err and "from lrf" not in err
    # one local run alone keeps torch's default; several share the machine one thread each
    assert Launcher("local").threads() == {}
    assert Launcher("local", jobs=2).threads() == {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    assert Launcher("slurm", cpus=4).threads() == {}  # Slurm's own CPUs per task


def test_the_nearest_width_of_a_linear_count():
    """Two counts give the line; the width whose count is nearest the target (rounded), not
    the first one above it."""
    def count(width):
        return 1000 + 37 * width
    for target in (1000 + 37 * 70, 1000 + 37 * 70 + 18, 1000 + 37 * 70 + 19):
        width = runner.nearest_width(count, 64, 128, target)
        assert abs(count(width) - target) == min(abs(count(w) - target) for w in range(1, 400))
    assert runner.nearest_width(count, 64, 128, 1000 + 37 * 70 + 19) == 71
    # a tie (the WikiText-2 LRF row at 12 blocks is one) goes to the even width
    assert runner.nearest_width(lambda w: 2 * w, 64, 128, 2 * 70 + 1) == 70
    assert runner.nearest_width(lambda w: 2 * w, 64, 128, 2 * 71 + 1) == 72
    assert runner.nearest_width(count, 64, 128, 0) == 1  # never below one unit


def test_matched_baselines_are_added_once_where_a_row_exceeds_the_threshold():
    """A row over the threshold gets the baseline widened to its count, in the settings that
    need it (one row however many share it); a row within it gets none."""
    counts = {("baseline", "a"): 100, ("big", "a"): 110, ("twin", "a"): 110,
              ("small", "a"): 101, ("baseline", "b"): 200, ("big", "b"): 201,
              ("twin", "b"): 230, ("small", "b"): 201}
    rows = [Row(n, "x") for n in ("baseline", "big", "twin", "small")]
    comparison = Comparison("t", rows, ("a", "b"), (1,), "baseline")

    def matched(setting, target):
        return Row(f"baseline_w{target}", "x", ("--width", str(target)))
    out = runner.add_matched_baselines(comparison, lambda row, s: counts[(row.name, s)],
                                       matched, 0.02)
    assert out == {"a": {"big": "baseline_w110", "twin": "baseline_w110"},
                   "b": {"twin": "baseline_w230"}}
    assert [r.name for r in comparison.rows] == ["baseline", "big", "twin", "small",
                                                 "baseline_w110", "baseline_w230"]
    assert comparison.only == {"baseline_w110": ("a",), "baseline_w230": ("b",)}
    assert [r.name for r in comparison.rows_in("b")] == ["baseline", "big", "twin", "small",
                                                         "baseline_w230"]


def test_a_failed_run_stops_the_comparison_naming_it(tmp_path):
    rows = (Row("baseline", "a"), Row("broken", "b"), Row("after", "c"))
    plan = _comparison(rows=rows, settings=("cogs",), only={}, seeds=(1,)).plan(str(tmp_path))
    def work(run):  # in a submitted process (submitit's debug executor would stop in pdb)
        import json
        import os

        if run.row.name == "broken":
            raise RuntimeError(f"no data for {run.row.name}")
        os.makedirs(run.run_dir, exist_ok=True)
        with open(os.path.join(run.run_dir, "result.json"), "w") as f:
            json.dump({}, f)
        return {}

    with pytest.raises(runner.RunFailed) as error:
        runner.launch(plan, work, (), Launcher("local", folder=str(tmp_path / "s")), poll=0.2)
    assert "broken in cogs, seed 1 failed" in str(error.value)
    assert str(error.value).endswith("RuntimeError: no data for broken")
    assert runner.finished(plan[0]) and not runner.finished(plan[2])  # not submitted after


def test_slurm_launcher_sets_partition_gpus_time_and_parallelism(tmp_path, monkeypatch):
    launcher = Launcher("slurm", jobs=4, folder=str(tmp_path / "s"), partition="gpu", gpus=1,
                        time_limit=90, cpus=8)
    assert launcher.slurm_parameters() == {
        "timeout_min": 90, "cpus_per_task": 8, "nodes": 1, "tasks_per_node": 1,
        "slurm_array_parallelism": 4, "slurm_partition": "gpu", "gpus_per_node": 1}
    # submitit's Slurm executor checks for srun: a stand-in that is never called
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    srun = bin_dir / "srun"
    srun.write_text("#!/bin/sh\nexit 1\n")
    srun.chmod(srun.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    executor = launcher.executor()
    parameters = executor._executor.parameters
    assert parameters["partition"] == "gpu" and parameters["gpus_per_node"] == 1
    assert parameters["time"] == 90 and parameters["array_parallelism"] == 4
    with pytest.raises(PlanError, match="apply to --launcher slurm"):
        Launcher("local", partition="gpu")
    with pytest.raises(PlanError, match="--launcher cloud: one of local, slurm, debug"):
        Launcher("cloud")


def test_the_launcher_flags_give_the_launcher_they_name(tmp_path):
    import argparse

    parser = argparse.ArgumentParser()
    runner.add_launcher_arguments(parser)
    args = parser.parse_args(["--launcher", "slurm", "--jobs", "3", "--slurm-partition", "gpu",
                              "--gpus-per-run", "2", "--time-limit", "45"])
    launcher = runner.launcher_from_args(args, str(tmp_path / "s"), cpus=6)
    assert launcher == Launcher("slurm", 3, str(tmp_path / "s"), "gpu", 2, 45, 6)
    defaults = runner.launcher_from_args(parser.parse_args([]), "f")
    assert defaults == Launcher("local", 1, "f", None, 0, 24 * 60, None)
    with pytest.raises(PlanError, match="apply to --launcher slurm"):
        runner.launcher_from_args(parser.parse_args(["--gpus-per-run", "1"]), "f")
    with pytest.raises(SystemExit):  # argparse's own refusal of an unknown launcher
        parser.parse_args(["--launcher", "cloud"])
    # --threads overrides the script's default threads per run (the comparisons': the machine's
    # cores / --jobs, at least one)
    cores = os.cpu_count() or 1
    assert runner.shared_cores(1) == cores
    assert runner.shared_cores(cores) == 1 and runner.shared_cores(4 * cores) == 1

    def cpus(*argv):
        return runner.launcher_from_args(parser.parse_args(argv), "f",
                                         runner.shared_cores(2)).cpus
    assert cpus() == max(1, cores // 2)
    assert cpus("--threads", "3") == 3 and cpus("--jobs", "2", "--threads", "1") == 1
    with pytest.raises(PlanError, match="--threads 0: at least 1"):
        cpus("--threads", "0")
