"""Determinism and unusual input through the real CLIs, with this package's models."""
import json

from conftest import run_cli, train
from helpers import PLUGIN_DIR

FEATURES = ["--encoder-fusion", "--decoder-fusion", "--bridge-init", "random"]


def _losses(ckpt):
    log = (ckpt.parent / "train.log").read_text()
    return [json.loads(line.split("| train_inner | ", 1)[1])["loss"]
            for line in log.splitlines() if "| train_inner | " in line]


def test_same_seed_gives_bit_identical_losses(scan_bin):
    """Same seed, data and flags: the first 20 updates log identical losses (dropout on)."""
    runs = [train(scan_bin, "bridge_transformer_tiny", *FEATURES, "--dropout", "0.1",
                  "--log-format", "json", "--log-interval", "1", "--disable-validation",
                  updates=20, name=f"determinism-{i}") for i in range(2)]
    first, second = (_losses(ckpt) for ckpt in runs)
    assert len(first) == 20 and first == second


def test_interactive_handles_empty_input_lines(scan_bin):
    ckpt = train(scan_bin, "bridge_transformer_tiny", *FEATURES, updates=5, name="empty-lines")
    out = run_cli("fairseq-interactive", scan_bin / "bin", "--user-dir", PLUGIN_DIR,
                  "--path", ckpt, "--source-lang", "in", "--target-lang", "out", "--beam", "2",
                  "--max-len-b", "10", stdin="jump twice\n\nwalk left\n")
    lines = out.splitlines()
    assert "S-1\t" in lines  # the empty line is translated as an empty source, not skipped
    assert sum(line.startswith("H-") for line in lines) == 3


def test_over_long_sources_are_skipped_with_a_warning(scan_bin):
    ckpt = train(scan_bin, "swapped_transformer_tiny", updates=3, name="long-sources")
    # every valid source longer than 6 tokens is skipped (fairseq's own filter), the rest decoded
    out = run_cli("fairseq-generate", scan_bin / "bin", "--user-dir", PLUGIN_DIR, "--path", ckpt,
                  "--gen-subset", "valid", "--beam", "2", "--max-len-b", "10",
                  "--max-source-positions", "6", "--skip-invalid-size-inputs-valid-test",
                  "--batch-size", "32", "--num-workers", "0")
    assert "samples have invalid sizes and will be skipped" in out
    decoded = sum(line.startswith("H-") for line in out.splitlines())
    assert 0 < decoded < 200
    out = run_cli("fairseq-interactive", scan_bin / "bin", "--user-dir", PLUGIN_DIR, "--path",
                  ckpt, "--source-lang", "in", "--target-lang", "out", "--beam", "2",
                  "--max-len-b", "10", "--max-source-positions", "6",
                  "--skip-invalid-size-inputs-valid-test",
                  stdin="jump twice\nwalk left twice and run right thrice after look\n")
    assert sum(line.startswith("H-") for line in out.splitlines()) == 1
    assert "will be skipped" in out


def test_data_bin_with_other_dictionaries_is_a_clear_error(scan_bin, tmp_path):
    import shutil

    ckpt = train(scan_bin, "inverted_transformer_tiny", updates=3, name="dict-mismatch")
    other = tmp_path / "bin"
    shutil.copytree(scan_bin / "bin", other)
    with open(other / "dict.in.txt", "a") as f:
        f.write("unseen-word 1\n")
    proc = run_cli("fairseq-generate", other, "--user-dir", PLUGIN_DIR, "--path", ckpt,
                   "--gen-subset", "valid", "--num-workers", "0", check=False)
    assert proc.returncode != 0
    assert "size mismatch for encoder.embed_tokens.weight" in proc.stdout + proc.stderr


def test_non_finite_loss_is_caught_by_fairseqs_own_check(scan_bin, lm_bin, tmp_path):
    """An exploding run (lr 1e30) stops with fairseq's FloatingPointError, for a seq2seq variant
    and for the embedding-loss criterion: nothing here swallows non-finite values."""
    runs = [(scan_bin / "bin", ["--arch", "swapped_transformer_tiny", "--max-tokens", "512"]),
            (lm_bin, ["--task", "language_modeling", "--arch", "ar_encdec_lm_tiny",
                      "--tokens-per-sample", "32", "--batch-size", "4", "--criterion",
                      "lm_embedding_loss", "--embedding-loss", "cosine"])]
    for i, (data, flags) in enumerate(runs):
        proc = run_cli("fairseq-train", data, "--user-dir", PLUGIN_DIR, *flags, "--optimizer",
                       "sgd", "--lr", "1e30", "--max-update", "20", "--save-dir",
                       tmp_path / str(i), "--num-workers", "0", "--disable-validation",
                       check=False)
        out = proc.stdout + proc.stderr
        assert proc.returncode != 0 and "FloatingPointError" in out, out[-2000:]
        assert not (tmp_path / str(i) / "checkpoint_last.pt").exists()


def test_eval_lm_on_a_sequence_to_sequence_checkpoint_is_one_line(tmp_path):
    """fairseq-eval-lm builds the checkpoint's model for the language_modeling task: a
    layerwise_transformer checkpoint is refused in one line naming what scores it."""
    import os
    import shutil

    from helpers import REPO

    fixture = os.path.join(REPO, "tests", "fixtures", "fusion_transformer")
    shutil.copy(os.path.join(fixture, "dict.tgt.txt"), tmp_path / "dict.txt")
    proc = run_cli("fairseq-eval-lm", tmp_path, "--user-dir", PLUGIN_DIR, "--path",
                   os.path.join(fixture, "checkpoint.pt"), check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines()[-1] == (
        "fairseq-eval-lm: error: fusion_transformer_tiny is a sequence-to-sequence model and "
        "cannot be built for the language_modeling task (fairseq-eval-lm scores language "
        "models); score it with fairseq-generate --score-reference")
