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
