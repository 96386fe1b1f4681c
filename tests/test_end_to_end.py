"""Real CLIs end to end: prepare_scan (fairseq-preprocess) -> fairseq-train --user-dir ->
fairseq-generate / fairseq-interactive / fairseq-validate with only --user-dir, under
torch >= 2.6 with no environment variable forcing the old torch.load behaviour."""
import json
import os
import subprocess
import sys

import pytest
from conftest import cli_env, forked_env, run_cli, run_command, train
from helpers import PLUGIN_DIR, SCRIPTS

from fairseq_plugins.metrics.generate_log import read_generate_log
from layerlab.paths import load_script


@pytest.fixture(scope="module")
def fusion_ckpt(scan_bin):
    return train(scan_bin, "fusion_transformer_tiny")


def test_preprocess_outputs(scan_bin):
    files = set(os.listdir(scan_bin / "bin"))
    for subset in ("train", "valid", "test"):
        for lang in ("in", "out"):
            assert f"{subset}.in-out.{lang}.bin" in files
    assert {"dict.in.txt", "dict.out.txt"} <= files


def test_generate_with_only_user_dir(scan_bin, fusion_ckpt, tmp_path):
    out = run_cli("fairseq-generate", scan_bin / "bin", "--user-dir", PLUGIN_DIR,
                  "--path", fusion_ckpt, "--gen-subset", "valid", "--beam", "4",
                  "--batch-size", "64", "--required-batch-size-multiple", "1",
                  "--num-workers", "0", "--max-len-a", "0", "--max-len-b", "20")
    log = tmp_path / "gen.txt"
    log.write_text(out)
    parsed = read_generate_log(str(log), expected=200)
    assert len(parsed["hypotheses"]) == 200 and len(parsed["references"]) == 200
    assert all(h.strip() for h in parsed["hypotheses"][:20])  # the model emits actions


def test_interactive_with_only_user_dir(scan_bin, fusion_ckpt):
    out = run_cli("fairseq-interactive", scan_bin / "bin", "--user-dir", PLUGIN_DIR,
                  "--path", fusion_ckpt, "--source-lang", "in", "--target-lang", "out",
                  "--beam", "3", "--buffer-size", "2", "--batch-size", "2",
                  stdin="jump twice\nwalk left and look\nrun\n")
    hyps = [line for line in out.splitlines() if line.startswith("H-")]
    assert len(hyps) == 3


def test_validate_with_only_user_dir(scan_bin, fusion_ckpt):
    out = run_cli("fairseq-validate", scan_bin / "bin", "--user-dir", PLUGIN_DIR,
                  "--task", "translation", "--path", fusion_ckpt, "--valid-subset", "valid",
                  "--max-tokens", "2048", "--num-workers", "0")
    assert "valid on 'valid' subset" in out and "loss" in out


def test_checkpoint_loaded_without_user_dir_names_the_plugin(scan_bin, fusion_ckpt):
    import torch

    state = torch.load(fusion_ckpt, map_location="cpu")  # the package's allow-list is active
    assert next(iter(state)) == "_fairseq_plugins"  # the marker is the first thing unpickled
    args = [os.path.join(os.path.dirname(sys.executable), "fairseq-generate"), scan_bin / "bin",
            "--path", fusion_ckpt, "--gen-subset", "valid", "--beam", "2", "--batch-size", "64",
            "--required-batch-size-multiple", "1", "--num-workers", "0", "--max-len-a", "0",
            "--max-len-b", "10"]  # the load is checked, not the outputs: short ones
    # torch's default safe loading, no --user-dir: one line saying what to pass (the installed
    # fairseq_plugins_hints.pth), the marker's name in the trace when asked for
    proc = subprocess.run(list(map(str, args)), capture_output=True, text=True, env=cli_env())
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines()[-1] == (
        "fairseq-generate: error: this checkpoint was saved with the fairseq_plugins package: "
        "load it with --user-dir /absolute/path/to/fairseq_plugins")
    # the same command forked (run_command: the hook the interpreter's start installed is the
    # server's, checked in a fresh process above)
    proc = run_command(args, env=dict(cli_env(), FAIRSEQ_PLUGINS_TRACEBACK="1"))
    assert proc.returncode == 1 and "Traceback" in proc.stderr
    assert "fairseq_plugins.checkpoint_marker.PassUserDirFairseqPlugins" in proc.stderr
    # full unpickling imports the (installed) package, which registers the models: it loads
    env = dict(cli_env(), TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD="1")
    proc = run_command(args, env=env, cwd=scan_bin)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("\nH-") == 200


def test_a_user_dir_that_does_not_exist_is_one_line(tmp_path):
    """fairseq resolves a relative --user-dir against the current folder: from another folder
    `--user-dir fairseq_plugins` is one line saying to give the absolute path."""
    cli = os.path.join(os.path.dirname(sys.executable), "fairseq-eval-lm")
    proc = subprocess.run([cli, str(tmp_path), "--user-dir", "fairseq_plugins", "--path", "x.pt"],
                          capture_output=True, text=True, env=cli_env(), cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert proc.stderr.strip() == (
        f"fairseq-eval-lm: error: --user-dir: no such folder: {tmp_path / 'fairseq_plugins'}; "
        f"fairseq looks for a relative --user-dir under the current folder ({tmp_path}): give "
        "the absolute path of fairseq_plugins")


def test_a_data_folder_without_dictionary_and_a_path_that_is_no_checkpoint_are_one_line(
        tmp_path):
    """fairseq's own FileNotFoundError for a folder without dict.txt and torch.load's error for
    a --path that is no checkpoint: one line naming the path and what was expected, status 2;
    with FAIRSEQ_PLUGINS_TRACEBACK=1 the traceback, as fairseq shows it."""
    bin_dir = os.path.dirname(sys.executable)
    (tmp_path / "text").mkdir()
    (tmp_path / "text" / "train.txt").write_text("a b c\n")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "dict.txt").write_text("a 1\nb 1\n")
    (tmp_path / "notes.pt").write_text("not a checkpoint\n")
    runs = {
        "fairseq-train": ([str(tmp_path / "text"), "--task", "language_modeling", "--user-dir",
                           PLUGIN_DIR, "--arch", "gpt_baseline_lm_tiny", "--batch-size", "2"],
                          f"fairseq-train: error: no dictionary {tmp_path / 'text' / 'dict.txt'}: "
                          "the data folder was not made by fairseq-preprocess for this task"),
        "fairseq-eval-lm": ([str(tmp_path / "data"), "--path", str(tmp_path / "notes.pt")],
                            f"fairseq-eval-lm: error: --path {tmp_path / 'notes.pt'}: not a "
                            "checkpoint (torch.load cannot read it: "),
    }
    for i, (program, (args, expected)) in enumerate(runs.items()):
        cmd = [os.path.join(bin_dir, program), *args]
        # the first in a fresh process (the hook is installed as the interpreter starts), the
        # rest forked from a warm one that started so (run_command)
        proc = (subprocess.run(cmd, capture_output=True, text=True, env=cli_env(), cwd=tmp_path)
                if i == 0 else run_command(cmd, cwd=tmp_path))
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
        assert proc.stderr.strip().splitlines()[-1].startswith(expected), proc.stderr[-500:]
        proc = run_command(cmd, cwd=tmp_path, env=dict(cli_env(), FAIRSEQ_PLUGINS_TRACEBACK="1"))
        assert proc.returncode == 1 and "Traceback" in proc.stderr


def test_quickstart_writes_table_and_reruns_from_scratch(scan_bin, tmp_path):
    def run(*extra, env=cli_env()):
        proc = subprocess.run(
            [sys.executable, os.path.join(SCRIPTS, "quickstart.py"), "--split", "length",
             "--max-update", "3", "--validate-every", "2", "--gen-subset", "valid",
             "--out-dir", "qs", *extra],
            capture_output=True, text=True, env=env, cwd=tmp_path)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        log = (tmp_path / "qs" / "fusion_transformer_tiny-seed1" / "train.log").read_text()
        stops = [line.split(" | ")[-1] for line in log.splitlines() if "Stopping training" in line]
        return proc.stdout, stops

    stdout, stops = run("--archs", "transformer_tiny,fusion_transformer_tiny")
    assert "| fusion_transformer_tiny |" in stdout
    report = json.loads((tmp_path / "qs" / "results.json").read_text())
    results = report["results"]
    assert [r["arch"] for r in results] == ["transformer_tiny", "fusion_transformer_tiny"]
    assert all(r["total"] == 1000 for r in results)
    assert results[1]["params"] > results[0]["params"]
    assert all(r["train_loss_bits"] > 0 for r in results)
    # validated with exact match at update 2 and at the end; the test set decoded with the best
    for r in results:
        assert [u for u, _ in r["valid_curve"]] == [2, 3] and r["updates"] == 3
        assert r["best_valid_exact_match"] == max(em for _, em in r["valid_curve"])
        assert r["final_valid_exact_match"] == r["valid_curve"][-1][1]
        assert r["checkpoint"].endswith("checkpoint_best.pt")
    # the learning rate decays linearly to 0 at --max-update
    log = (tmp_path / "qs" / "transformer_tiny-seed1" / "train.log").read_text()
    assert "'lr_scheduler': {'_name': 'polynomial_decay'" in log and "'end_learning_rate': 0.0" in log
    # the two sentences and the analysis of the trained models
    assert "Table: " in stdout and "Figure: read out through the output layer" in stdout
    assert report["what_it_shows"] in (tmp_path / "qs" / "results.md").read_text()
    assert (tmp_path / "qs" / "analysis" / "analysis.png").exists()
    # a resumed run would load checkpoint_last.pt and stop at "num_updates: 4 >= max_update: 3"
    expected = ["Stopping training due to num_updates: 3 >= max_update: 3"]
    assert stops == expected
    # the rerun's commands forked (layerlab.warm): the first run started them as a user does
    assert run("--archs", "fusion_transformer_tiny", "--no-analysis",
               env=forked_env())[1] == expected


def test_quickstart_rows_options_and_committed_reference(tmp_path, monkeypatch):
    quickstart = load_script("quickstart.py")
    assert quickstart.DEFAULT_ARCHS == ["transformer_tiny", "fusion_transformer_tiny",
                                        "bridge_transformer_tiny"]
    every = quickstart.seq2seq_tiny_archs()
    assert set(quickstart.DEFAULT_ARCHS) < set(every) and "layerwise_transformer_tiny" not in every
    proc = subprocess.run([sys.executable, os.path.join(SCRIPTS, "quickstart.py"), "--all",
                           "--archs", "transformer_tiny"], capture_output=True, text=True,
                          env=cli_env(), cwd=tmp_path)
    assert proc.returncode == 2 and "--all and --archs exclude each other" in proc.stderr
    proc = subprocess.run([sys.executable, os.path.join(SCRIPTS, "quickstart.py"), "--jobs", "0"],
                          capture_output=True, text=True, env=cli_env(), cwd=tmp_path)
    assert proc.returncode == 2 and "--jobs must be at least 1" in proc.stderr
    assert os.listdir(tmp_path) == []
    # the committed copy is a reference only for the recipe it was made with
    args = quickstart.argparse.Namespace(split="simple", gen_subset="test", lr=3e-3,
                                         max_tokens=2048, max_update=3000, warmup=200,
                                         validate_every=500)
    committed = {"recipe": quickstart.recipe(args),
                 "summary": [{"arch": "transformer_tiny", "seeds": [1, 2], "values": [98.0, 97.0],
                              "mean": 97.5, "std": 0.7}]}
    path = tmp_path / "committed.json"
    path.write_text(json.dumps(committed))
    monkeypatch.setattr(quickstart, "COMMITTED", str(path))
    assert quickstart.committed_rows(args)["transformer_tiny"]["mean"] == 97.5
    args.lr = 1e-3
    assert quickstart.committed_rows(args) == {}


def test_quickstart_reads_the_validation_curve(tmp_path):
    quickstart = load_script("quickstart.py")
    log = tmp_path / "train.log"
    record = '2026 | INFO | {} | {}\n'
    log.write_text(
        record.format("valid", json.dumps({"valid_exact_match": "40.5", "valid_num_updates": "500"}))
        + record.format("valid", json.dumps({"valid_exact_match": "99.1",
                                             "valid_num_updates": "1000"}))
        + record.format("valid", json.dumps({"valid_exact_match": "98.7",
                                             "valid_num_updates": "1500"}))
        + record.format("train", json.dumps({"train_num_updates": "1500"})))
    assert quickstart.validation_curve(log) == {
        "updates": 1500, "valid_curve": [(500, 40.5), (1000, 99.1), (1500, 98.7)],
        "best_valid_exact_match": 99.1, "final_valid_exact_match": 98.7}


def test_compare_seeds_summarises_and_resumes(scan_bin, tmp_path):
    cmd = [sys.executable, os.path.join(SCRIPTS, "compare_seeds.py"), "--data", scan_bin / "bin",
           "--archs", "transformer_tiny", "--seeds", "1,2", "--max-update", "3",
           "--gen-subset", "valid", "--max-len-a", "0", "--max-len-b", "16", "--out-dir", "cmp",
           "--launcher", "debug"]
    # its runs in the script's process (submitit's debug launcher; the local launcher's
    # process per run is the next test's), their commands forked from its warm servers
    # (the script itself forked as well: run_command)
    env = forked_env()
    proc = run_command(cmd, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    report = json.loads((tmp_path / "cmp" / "results.json").read_text())
    (summary,) = report["summary"]
    assert summary["arch"] == "transformer_tiny" and summary["seeds"] == [1, 2]
    assert len(summary["values"]) == 2 and summary["params"] > 0
    log = tmp_path / "cmp" / "transformer_tiny-seed1" / "train.log"
    stamp = log.stat().st_mtime
    proc = run_command(cmd, env=env, cwd=tmp_path)
    assert proc.returncode == 0 and log.stat().st_mtime == stamp  # finished runs not repeated
    assert "| transformer_tiny |" in (tmp_path / "cmp" / "results.md").read_text()
    # the same folder with other flags: an error naming the run, not its old number reused
    proc = run_command(cmd + ["--lr", "1e-3"], cwd=tmp_path)
    assert proc.returncode != 0 and "made with another recipe" in proc.stderr
    assert log.stat().st_mtime == stamp


def test_compare_seeds_linear_decay_recipe_in_parallel(scan_bin, tmp_path):
    cmd = [sys.executable, os.path.join(SCRIPTS, "compare_seeds.py"), "--data", scan_bin / "bin",
           "--archs", "transformer_tiny", "--seeds", "1,2", "--max-update", "4",
           "--recipe", "linear_decay", "--validate-every", "2", "--warmup", "1", "--beam", "1",
           "--jobs", "2", "--gen-subset", "valid", "--max-len-a", "0", "--max-len-b", "16",
           "--bootstrap", "0", "--out-dir", "cmp"]
    # forked (layerlab.warm): two commands at a time, from two servers
    proc = subprocess.run(list(map(str, cmd)), capture_output=True, text=True,
                          env=forked_env(), cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    report = json.loads((tmp_path / "cmp" / "results.json").read_text())
    assert [r["seed"] for r in report["runs"]] == [1, 2]
    for r in report["runs"]:
        assert r["checkpoint"].endswith("checkpoint_best.pt") and os.path.exists(
            tmp_path / r["checkpoint"])
        train = r["recipe"]["train"]
        assert train[train.index("--lr-scheduler") + 1] == "polynomial_decay"
        assert r["recipe"]["generate"][:2] == ["--beam", "1"]
        log = (tmp_path / "cmp" / f"transformer_tiny-seed{r['seed']}" / "train.log").read_text()
        assert "valid_exact_match" in log  # validated during training
    assert "linear decay to 0, best checkpoint" in (tmp_path / "cmp" / "results.md").read_text()


@pytest.mark.parametrize("flags, message", [
    (["--recipe", "linear_decay", "--metric", "bleu"], "needs --metric exact_match"),
    (["--validate-every", "100"], "--validate-every needs --recipe linear_decay"),
    (["--jobs", "0"], "--jobs 0: at least 1"),
    (["--threads", "0"], "--threads 0: at least 1"),
    (["--beam", "0"], "--beam must be at least 1"),
    (["--gpus-per-run", "1"], "--gpus-per-run apply to --launcher slurm"),
])
def test_compare_seeds_rejects_impossible_options(tmp_path, flags, message):
    proc = subprocess.run([sys.executable, os.path.join(SCRIPTS, "compare_seeds.py"),
                           "--data", str(tmp_path), "--archs", "transformer_tiny",
                           "--out-dir", str(tmp_path / "cmp"), *flags],
                          capture_output=True, text=True, env=cli_env())
    assert proc.returncode == 2 and message in proc.stderr
    assert not (tmp_path / "cmp").exists()


def test_quickstart_sentences_follow_the_numbers():
    quickstart = load_script("quickstart.py")
    summary = [{"arch": "a", "mean": 98.6}, {"arch": "b", "mean": 97.2}, {"arch": "c", "mean": 60.0}]
    committed = {"a": {"std": 0.4}, "b": {"std": 1.1}}
    analysis = {"analyses": {"a": {"logit_lens": {"accuracy": [14.0, 40.0, 99.0]}},
                             "b": {"logit_lens": {"accuracy": [10.0, 45.0, 98.0]}}}}
    text = quickstart.two_sentences(summary, analysis, committed)
    assert text.startswith("Table: 2 of 3 models learned SCAN {split} (test exact match "
                           "97.2-98.6%; below 95%: c 60.0%), and with a seed spread (sample std) "
                           "of up to 1.1 points (the committed 3-seed runs) differences below "
                           "about 2.2 points are not a ranking; a and c are 38.6 points apart.")
    # a multi-seed run judges by its own spread
    close = [{"arch": "a", "mean": 98.5, "values": [98.6, 98.1, 98.7], "std": 0.3},
             {"arch": "b", "mean": 96.2, "values": [96.5, 94.7, 97.4], "std": 1.4}]
    assert ("up to 1.4 points (this run) differences below about 2.8 points are not a ranking: "
            "the rows are not told apart.") in quickstart.two_sentences(close, analysis, committed)
    assert "first layer predicts 40-45% of the test tokens and its last 98-99%" in text
    assert "the last decoder layer adds most of the accuracy" in text
    analysis["analyses"]["a"]["logit_lens"]["accuracy"][-1] = 99.8
    analysis["analyses"]["b"]["logit_lens"]["accuracy"][-1] = 100.0
    assert "and its last 100%," in quickstart.two_sentences(summary, analysis, committed)
    analysis["analyses"]["b"]["logit_lens"]["accuracy"] = [10.0, 80.0, 98.0]
    assert "builds up over the decoder's layers" in quickstart.two_sentences(
        summary, analysis, committed)
    # no committed reference: one seed is not a ranking
    assert "cannot separate rows closer than the seed spread" in quickstart.two_sentences(
        summary[:1], {"analyses": {}}, {})


def test_quickstart_resumes_only_runs_of_its_own_recipe(tmp_path):
    quickstart = load_script("quickstart.py")
    args = quickstart.argparse.Namespace(split="simple", gen_subset="test", lr=3e-3,
                                         max_tokens=2048, max_update=3000, warmup=200,
                                         validate_every=500, resume=True)
    run_dir = tmp_path / "transformer_tiny-seed1"
    run_dir.mkdir()
    finished = {"arch": "transformer_tiny", "exact_match": 98.5, "recipe": quickstart.recipe(args)}
    (run_dir / "result.json").write_text(json.dumps(finished))
    resumed = quickstart.train_and_evaluate("transformer_tiny", 1, "unused", tmp_path, args)
    assert resumed == dict(finished, resumed=True)  # marked, so that the table says so
    args.lr = 1e-3  # another recipe: an error, not a silently reused number
    with pytest.raises(quickstart.runs.StepError, match="made with another recipe"):
        quickstart.train_and_evaluate("transformer_tiny", 1, "unused", tmp_path, args)
