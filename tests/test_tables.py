"""The table scripts (scripts/tables/): every table's smoke scale end to end on the real
development data, resuming, the paper scale's commands (dry run), and the curve plotter."""
import json
import math
import os
import subprocess

import pytest
from conftest import cli_env, forked_env, run_script
from helpers import SCRIPTS, SHARED_DATA

TABLES = os.path.join(SCRIPTS, "tables")
needs_data = pytest.mark.skipif(not os.path.isdir(SHARED_DATA),
                                reason="development data (../shared/data) not present")


def run_table(script, *args, check=True, env=None):
    proc = run_script(os.path.join(TABLES, script), *args, env=env)
    if check:
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


@pytest.fixture(scope="module")
def data_root(tmp_path_factory):
    return tmp_path_factory.mktemp("tables-data")


def smoke(script, data_root, out, *extra):
    """The table's smoke scale, its commands forked from a warm server (``layerlab.warm``: ~5 s
    of imports less per command; the documented commands and the quickstart start theirs as
    fresh processes)."""
    return run_table(script, "--scale", "smoke", "--from", SHARED_DATA, "--data-root", data_root,
                     "--out-dir", out / "runs", "--results-dir", out / "results", *extra,
                     env=forked_env())


def link_prepared(data_root, name, prepared):
    """Place a dataset prepared once per run (conftest: ``(text, data-bin, stdout)``) where the
    table looks for ``name``: its prepare step then finds it complete (same config) and skips."""
    for sub, folder in (("data", prepared[0]), ("data-bin", prepared[1])):
        link = data_root / sub / name
        if not link.exists():
            link.parent.mkdir(exist_ok=True)
            link.symlink_to(folder, target_is_directory=True)


def check_outputs(out, name, labels, pictures):
    report = json.loads((out / "results" / f"{name}_smoke.json").read_text())
    table = (out / "results" / f"{name}_smoke.md").read_text()
    assert report["scale"] == "smoke" and report["substitutions"]
    assert "fairseq_plugins 0.1.0" in table and "--scale smoke" in table
    for label in labels:
        assert f"| {label} |" in table, table
    for picture in pictures:
        png = out / "results" / f"{name}_smoke_{picture}"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"]({name}_smoke_{picture})" in table  # linked from the markdown copy
    return report


@needs_data
def test_lm_table_smoke_runs_every_row_and_resumes(data_root, tmp_path):
    smoke("lm_table.py", data_root, tmp_path)
    report = check_outputs(tmp_path, "lm_table", ["baseline", "embedding loss, cosine",
                                                  "MSE (x8) + subtraction"], ["curves.png"])
    rows = report["rows"]
    assert len(rows) == 8
    for row in rows.values():
        train, valid = row["train_nats"][0], row["valid_nats"][0]
        # ten updates from a uniform start over a 1k vocabulary: close to ln(1000) ~ 6.9 nats
        assert 3.0 < train < 8.0 and 3.0 < valid < 8.0, row
    params = {name: row["params"] for name, row in rows.items()}
    # the embedding-loss LayerNorms (2 x weight + bias of d=64) are the only difference
    assert params["emb_mse"] - params["encdec"] == 4 * 64
    assert params["baseline"] == params["baseline_dropout"] != params["baseline_small"]
    # a second run resumes: nothing is trained again
    log = tmp_path / "runs" / "runs" / "baseline-seed1" / "train.log"
    mtime = log.stat().st_mtime
    proc = smoke("lm_table.py", data_root, tmp_path)
    assert "fairseq-train" not in proc.stdout and log.stat().st_mtime == mtime
    assert json.loads((tmp_path / "results" / "lm_table_smoke.json").read_text())["rows"] == rows


@needs_data
def test_lrf_cognition_smoke_scores_cter_and_bleu(data_root, tmp_path, cognition_small_prepared):
    # two of the four rows: the one-sided LRF rows differ from the both-sides row by their
    # architecture's name only (their models: test_fusion.py; their paper-scale commands: the
    # dry run below); each row costs ~55 s of CI, most of it decoding the 10,800 cg-test lines
    link_prepared(data_root, "cognition-validtest", cognition_small_prepared)
    proc = smoke("lrf_cognition.py", data_root, tmp_path, "--rows", "transformer,fusion")
    assert "already prepared" in proc.stdout  # the data was read, not prepared again
    report = check_outputs(tmp_path, "lrf_cognition", ["Transformer", "LRF, encoder + decoder"],
                           ["curves.png", "fusion_weights.png"])
    assert list(report["rows"]) == ["transformer", "fusion"]
    table = (tmp_path / "results" / "lrf_cognition_smoke.md").read_text()
    assert "LRF, encoder only" not in table and "LRF, decoder only" not in table
    for row in report["rows"].values():
        summary = row["summary"]
        for key in ("cter_instance_all", "cter_aggregate_NP", "cter_instance_PP"):
            assert 0 <= summary[key][0] <= 100
        # at most 4 output tokens cannot translate a compound: nearly every instance is wrong
        assert summary["cter_aggregate_all"][0] > 90
        assert summary["bleu_random"] == [None, None]  # the random test set is training data
    weights = report["fusion_weights"]
    for side in ("encoder", "decoder"):
        grid = weights[side]
        for i, row in enumerate(grid):  # layer i attends over h_0..h_i: a distribution
            assert math.isclose(sum(row[:i + 1]), 1.0, rel_tol=1e-4)
            assert all(math.isnan(v) for v in row[i + 1:])


@needs_data
def test_lrf_cfq_smoke_scores_exact_match(data_root, tmp_path):
    smoke("lrf_cfq.py", data_root, tmp_path)
    report = check_outputs(tmp_path, "lrf_cfq", ["Transformer", "LRF, encoder + decoder"],
                           ["curves.png", "fusion_weights.png"])
    for row in report["rows"].values():
        assert row["per_split"]["mcd1"][0] == 0.0  # 4-token outputs never match a query
    lines = (tmp_path / "runs" / "runs" / "fusion-mcd1-seed1" / "generate-test.txt").read_text()
    assert lines.count("\nH-") + lines.startswith("H-") == 100  # the 100-line test subset


@needs_data
def test_bridge_table_smoke_runs_four_conditions_with_equal_budgets(data_root, tmp_path,
                                                                   multi30k_prepared):
    link_prepared(data_root, "multi30k", multi30k_prepared)
    proc = smoke("bridge_wmt16.py", data_root, tmp_path)
    assert "already prepared" in proc.stdout
    report = check_outputs(tmp_path, "bridge_wmt16",
                           ["(1) fine-tune, bridge, original init", "(2) fine-tune, no bridge",
                            "(3) fine-tune, bridge, GCA init",
                            "(4) retrain from scratch, bridge, GCA init",
                            "untouched pretrained model"], ["curves.png", "bridge_weights.png"])
    assert report["untouched_bleu"] is not None
    runs = tmp_path / "runs" / "runs"
    updates = {}
    for row in report["rows"]:
        log = (runs / f"{row}-seed1" / "train.log").read_text()
        updates[row] = json.loads(log.split("| train | ")[-1].splitlines()[0])["train_num_updates"]
        # conditions 1-3 start from the pretrained checkpoint, condition 4 from scratch
        assert ("'finetune_from_model': None" in log) == (row == "retrain_gca"), row
    assert set(updates.values()) == {"5"}, updates  # the same step budget everywhere


@pytest.mark.parametrize("script,expected", [
    ("lm_table.py", ["--bf16", "9000", "ar_encdec_lm_yif", "gpt_baseline_lm_yif_small",
                     "fairseq-eval-lm", "wikitext-103"]),
    ("lrf_cognition.py", ["fusion_enc_transformer_iwslt_de_en", "100000", "--gen-subset test1",
                          "score_cter.py", "--cognition-zh", "--seed 6"]),
    ("lrf_cfq.py", ["--split mcd3", "fusion_transformer_iwslt_de_en", "score_exact_match.py"]),
    ("bridge_wmt16.py", ["convert_opus_mt.py", "--opus-mt-dir", "bridge_opus_mt_de_en",
                         "--bridge-init gca", "--finetune-from-model", "--lr 2e-5",
                         "--batch-size 128"]),
])
def test_paper_scale_dry_run_prints_the_published_recipe(tmp_path, script, expected):
    extra = ["--opus-mt", tmp_path / "opus-mt"] if script == "bridge_wmt16.py" else []
    proc = run_table(script, "--scale", "paper", "--dry-run", "--data-root", tmp_path,
                     "--out-dir", tmp_path / "out", *extra)
    for text in expected:
        assert text in proc.stdout, (text, proc.stdout[-3000:])
    assert "[table]" not in proc.stdout  # nothing ran
    assert not (tmp_path / "data-bin").exists()


def test_bridge_paper_scale_needs_the_opus_mt_folder(tmp_path):
    proc = run_table("bridge_wmt16.py", "--scale", "paper", "--dry-run", "--data-root", tmp_path,
                     "--out-dir", tmp_path / "out", check=False)
    assert proc.returncode != 0 and "--opus-mt" in proc.stderr


def test_unknown_row_is_an_error(tmp_path):
    proc = run_table("lrf_cfq.py", "--scale", "paper", "--dry-run", "--rows", "transformer,lrf",
                     "--data-root", tmp_path, "--out-dir", tmp_path / "out", check=False)
    assert proc.returncode != 0 and "unknown row(s) lrf" in proc.stderr


@pytest.mark.parametrize("script", ["lm_table.py", "lrf_cfq.py", "lrf_cognition.py",
                                    "bridge_wmt16.py"])
@pytest.mark.parametrize("scale", ["smoke", "small"])
def test_missing_from_folder_is_one_line_exit_2_nothing_written(tmp_path, script, scale):
    proc = run_script(os.path.join(TABLES, script), "--scale", scale,
                      "--from", tmp_path / "nonexistent", cwd=tmp_path)
    name = script[:-3]
    assert proc.returncode == 2
    assert proc.stderr == f"{name}: error: --from {tmp_path / 'nonexistent'}: no such directory\n"
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("script,missing", [("lm_table.py", "wikitext-2/train.txt"),
                                            ("lrf_cfq.py", "cfq_mcd1/train_encode.txt")])
def test_from_folder_without_the_dataset_is_one_line_exit_2_nothing_written(tmp_path, script,
                                                                             missing):
    (tmp_path / "downloads").mkdir()
    scale = "smoke" if script == "lm_table.py" else "small"
    proc = run_script(os.path.join(TABLES, script), "--scale", scale,
                      "--from", "downloads", cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert missing in proc.stderr and "Traceback" not in proc.stderr
    assert os.listdir(tmp_path) == ["downloads"]


def test_plot_curves_reads_train_and_valid_records(tmp_path):
    log = tmp_path / "train.log"
    log.write_text(
        "2026-01-01 | INFO | fairseq_cli.train | start\n"
        '2026-01-01 | INFO | train_inner | {"epoch": 1, "loss": "4.0", "num_updates": "10"}\n'
        '2026-01-01 | INFO | valid | {"epoch": 1, "valid_loss": "3.5", '
        '"valid_num_updates": "10"}\n'
        '2026-01-01 | INFO | train_inner | {"epoch": 1, "loss": "2.0", "num_updates": "20"}\n'
        '2026-01-01 | INFO | train_inner | {"epoch": 1, "loss": "1.\n')  # a truncated last line
    from layerlab import curves as plot_curves

    assert plot_curves.read_curves(log) == {"train": [(10, 4.0), (20, 2.0)],
                                            "valid": [(10, 3.5)]}
    # nll_loss where the record has it (the cross-entropy alone), loss where it does not
    log2 = tmp_path / "train2.log"
    log2.write_text('x | train_inner | {"loss": "9.0", "nll_loss": "3.0", "num_updates": "5"}\n'
                    'x | train_inner | {"loss": "8.0", "num_updates": "6"}\n')
    assert plot_curves.read_curves(log2, "nll_loss")["train"] == [(5, 3.0), (6, 8.0)]
    assert plot_curves.read_curves(log2)["train"] == [(5, 9.0), (6, 8.0)]
    # a resumed run's log: the killed attempt trained to update 30 and validated at 30 after
    # its last checkpoint (update 20); the resumed attempt's records from 20 on replace them
    log3 = tmp_path / "resumed.log"
    log3.write_text(
        'x | train_inner | {"loss": "4.0", "num_updates": "10"}\n'
        'x | valid | {"valid_loss": "3.9", "valid_num_updates": "20"}\n'
        'x | train_inner | {"loss": "3.0", "num_updates": "25"}\n'
        'x | valid | {"valid_loss": "3.5", "valid_num_updates": "30"}\n'
        'x | train_inner | {"loss": "2.5", "num_updates": "30"}\n'
        'x | train_inner | {"loss": "2.9", "num_updates": "25"}\n'
        'x | valid | {"valid_loss": "3.4", "valid_num_updates": "30"}\n'
        'x | train_inner | {"loss": "2.4", "num_updates": "30"}\n')
    assert plot_curves.read_curves(log3) == {"train": [(10, 4.0), (25, 2.9), (30, 2.4)],
                                             "valid": [(20, 3.9), (30, 3.4)]}
    nats = plot_curves.curves_for([log], nats=True)[0]
    assert nats["valid"] == [(10, pytest.approx(3.5 * math.log(2)))]
    proc = run_script(os.path.join(SCRIPTS, "plot_curves.py"), log, log,
                      "--labels", "a,b", "--out", tmp_path / "c.png", "--json",
                      tmp_path / "c.json")
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "c.png").read_bytes()[:4] == b"\x89PNG"
    assert json.loads((tmp_path / "c.json").read_text())["b"]["train"] == [[10, 4.0], [20, 2.0]]
    empty = tmp_path / "empty.log"
    empty.write_text("nothing here\n")
    proc = run_script(os.path.join(SCRIPTS, "plot_curves.py"), empty,
                      "--out", tmp_path / "d.png")
    assert proc.returncode == 2 and "--log-format json" in proc.stderr


@needs_data
def test_smoke_dry_run_is_a_bash_script_that_runs_the_table(tmp_path):
    out = tmp_path / "out"
    proc = run_table("lrf_cfq.py", "--scale", "smoke", "--dry-run", "--rows", "transformer",
                     "--from", SHARED_DATA, "--data-root", tmp_path, "--out-dir", out)
    script = proc.stdout
    assert script.startswith("#!/usr/bin/env bash\n") and "\nset -euo pipefail\n" in script
    assert not (tmp_path / "data").exists() and not out.exists()  # the dry run ran nothing
    commands = [line for line in script.splitlines() if line and not line.startswith("#")]
    steps = ["layerlab.cut_lines", "prepare/cfq.py", "fairseq-train", "fairseq-generate",
             "score_exact_match.py"]
    order = [next(i for i, line in enumerate(commands) if step in line) for step in steps]
    assert order == sorted(order), commands  # data, train, generate, score, in that order
    (tmp_path / "table.sh").write_text(script)
    run = subprocess.run(["bash", tmp_path / "table.sh"], capture_output=True, text=True,
                         env=cli_env(), cwd=tmp_path)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    run_dir = out / "runs" / "transformer-mcd1-seed1"
    assert (run_dir / "checkpoint_best.pt").exists()
    generations = (run_dir / "generate-test.txt").read_text()
    assert generations.count("\nH-") + generations.startswith("H-") == 100
    score = json.loads(run.stdout[run.stdout.rindex("\n{"):])  # the scorer's JSON comes last
    assert score["total"] == 100 and score["exact_match"] == 0.0  # 4-token outputs
    # a failing step stops the script with the log's tail on stderr
    broken = script.replace("--max-update 10", "--max-update 10 --no-such-flag")
    (tmp_path / "broken.sh").write_text(broken)
    run = subprocess.run(["bash", tmp_path / "broken.sh"], capture_output=True, text=True,
                         env=cli_env(), cwd=tmp_path)
    assert run.returncode == 1 and "--no-such-flag" in run.stderr and "the whole log" in run.stderr
    assert "fairseq-generate" not in run.stdout + run.stderr
