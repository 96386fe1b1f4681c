"""Real CLIs end to end: prepare_scan (fairseq-preprocess) -> fairseq-train --user-dir ->
fairseq-generate / fairseq-interactive / fairseq-validate with only --user-dir, under
torch >= 2.6 with no environment variable forcing the old torch.load behaviour."""
import json
import os
import subprocess
import sys

import pytest
from conftest import cli_env, run_cli, train
from helpers import PLUGIN_DIR, SCRIPTS

from layerlab.metrics.generate_log import read_generate_log


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
                  "--num-workers", "0")
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
            "--required-batch-size-multiple", "1", "--num-workers", "0"]
    # torch's default safe loading, no --user-dir: the error names the package, not Namespace
    proc = subprocess.run(list(map(str, args)), capture_output=True, text=True, env=cli_env())
    assert proc.returncode != 0
    assert "fairseq_plugins.checkpoint_marker.PassUserDirFairseqPlugins" in proc.stderr
    # full unpickling imports the (installed) package, which registers the models: it loads
    env = dict(cli_env(), TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD="1")
    proc = subprocess.run(list(map(str, args)), capture_output=True, text=True, env=env,
                          cwd=scan_bin)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("\nH-") == 200


def test_quickstart_writes_table_and_reruns_from_scratch(scan_bin, tmp_path):
    def run():
        proc = subprocess.run(
            [sys.executable, os.path.join(SCRIPTS, "quickstart.py"), "--split", "length",
             "--max-update", "3", "--archs", "transformer_tiny,fusion_transformer_tiny",
             "--gen-subset", "valid", "--out-dir", "qs"],
            capture_output=True, text=True, env=cli_env(), cwd=tmp_path)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        log = (tmp_path / "qs" / "fusion_transformer_tiny" / "train.log").read_text()
        stops = [line.split(" | ")[-1] for line in log.splitlines() if "Stopping training" in line]
        return proc.stdout, stops

    stdout, stops = run()
    assert "| fusion_transformer_tiny |" in stdout
    results = json.loads((tmp_path / "qs" / "results.json").read_text())["results"]
    assert [r["arch"] for r in results] == ["transformer_tiny", "fusion_transformer_tiny"]
    assert all(r["total"] == 1000 for r in results)
    assert results[1]["params"] > results[0]["params"]
    assert all(r["train_loss_bits"] > 0 for r in results)
    # a resumed run would load checkpoint_last.pt and stop at "num_updates: 4 >= max_update: 3"
    expected = ["Stopping training due to num_updates: 3 >= max_update: 3"]
    assert stops == expected
    assert run()[1] == expected


def test_compare_seeds_summarises_and_resumes(scan_bin, tmp_path):
    cmd = [sys.executable, os.path.join(SCRIPTS, "compare_seeds.py"), "--data", scan_bin / "bin",
           "--archs", "transformer_tiny", "--seeds", "1,2", "--max-update", "3",
           "--gen-subset", "valid", "--max-len-a", "0", "--max-len-b", "64", "--out-dir", "cmp"]
    proc = subprocess.run(list(map(str, cmd)), capture_output=True, text=True, env=cli_env(),
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    report = json.loads((tmp_path / "cmp" / "results.json").read_text())
    (summary,) = report["summary"]
    assert summary["arch"] == "transformer_tiny" and summary["seeds"] == [1, 2]
    assert len(summary["values"]) == 2 and summary["params"] > 0
    log = tmp_path / "cmp" / "transformer_tiny-seed1" / "train.log"
    stamp = log.stat().st_mtime
    proc = subprocess.run(list(map(str, cmd)), capture_output=True, text=True, env=cli_env(),
                          cwd=tmp_path)
    assert proc.returncode == 0 and log.stat().st_mtime == stamp  # finished runs not repeated
    assert "| transformer_tiny |" in (tmp_path / "cmp" / "results.md").read_text()
