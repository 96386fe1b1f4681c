"""Every shell block in README.md and docs/ (all pages) either runs here or says why not.

A ```bash block starts with one of two comment lines:
- ``# tested: tests/test_docs.py::<id> (...)``: this file runs the block with bash, in a
  temporary folder, after the substitutions listed under ``<id>`` in ``RUNS`` (each must occur
  in the block: a changed command fails here instead of drifting);
- ``# not run by the tests: <reason>`` (paper scale, GPUs, downloads, long runs; where another
  test runs the same thing, the reason names it).
Every run also swaps the repository-relative paths (``python scripts/...``,
``$PWD/fairseq_plugins``) for absolute ones, so that nothing is written into the checkout.
"""
import glob
import os
import re
import subprocess
import sys

import pytest
from conftest import cli_env
from helpers import REPO, SHARED_DATA

DOCS = [os.path.join(REPO, "README.md"),
        *sorted(glob.glob(os.path.join(REPO, "docs", "**", "*.md"), recursive=True))]
TESTED = "# tested: tests/test_docs.py::"
NOT_RUN = "# not run by the tests: "
WIKITEXT2 = os.path.join(SHARED_DATA, "wikitext-2")

# id: (substitutions (documented text, what runs instead), files the run must leave)
RUNS = {
    "scan_fusion": ([("--split simple", "--split simple --valid-size 100"),
                     ("--max-update 1500", "--max-update 20"),
                     ("--gen-subset test", "--gen-subset valid")],
                    ["checkpoints/fusion/checkpoint_last.pt", "gen.txt"]),
    "prepare_scan": ([], ["data-bin/scan-simple/dict.in.txt", "data/scan/simple/test.out"]),
    "lm": ([("--dataset wikitext-2 --vocab-size 8000",
             "--text wikitext-2-head.txt --name wikitext-2 --vocab-size 1000"),
            ("--arch ar_encdec_lm_yif", "--arch ar_encdec_lm_tiny"),
            ("--batch-size 50 --update-freq 16", "--batch-size 4 --max-update 2")],
           ["checkpoints/checkpoint_best.pt"]),
    "hydra_scan": ([("--split simple", "--split simple --valid-size 100"),
                    ("common.user_dir=$PWD/fairseq_plugins",
                     "common.user_dir=$PWD/fairseq_plugins optimization.max_update=20 "
                     "dataset.validate_interval_updates=20 checkpoint.save_interval_updates=20 "
                     "dataset.num_workers=0 +model.fusion_kind=dwa"),
                    ("--gen-subset test", "--gen-subset valid --max-len-b 10")],
                   ["checkpoints/checkpoint_best.pt", "gen.txt"]),
    "hydra_lm": ([("--dataset wikitext-2 --vocab-size 8000",
                   "--text wikitext-2-head.txt --name wikitext-2 --vocab-size 1000"),
                  ("common.user_dir=$PWD/fairseq_plugins",
                   "common.user_dir=$PWD/fairseq_plugins optimization.max_update=3 "
                   "dataset.num_workers=0 model._name=ar_encdec_lm model.layers=2 "
                   "+model.cross_attention_heads=8 criterion._name=lm_embedding_loss "
                   "+criterion.embedding_loss=mse")],
                 ["checkpoints/checkpoint_last.pt"]),
}


def bash_blocks():
    """[(file, first line number, text)] of every ```bash block of the docs."""
    blocks = []
    for path in DOCS:
        lines = open(path, encoding="utf-8").read().split("\n")
        start = None
        for i, line in enumerate(lines):
            if start is None and line.strip() == "```bash":
                start = i + 1
            elif start is not None and line.strip() == "```":
                blocks.append((os.path.relpath(path, REPO), start + 1,
                               "\n".join(lines[start:i])))
                start = None
    return blocks


def test_every_shell_block_is_run_here_or_says_why_not():
    blocks = bash_blocks()
    assert len(blocks) >= len(RUNS)
    tested = []
    for path, line, text in blocks:
        first = text.split("\n", 1)[0]
        assert first.startswith((TESTED, NOT_RUN)), \
            f"{path}:{line}: a shell block must start with '{TESTED}<id>' or '{NOT_RUN}<why>'"
        if first.startswith(TESTED):
            tested.append(re.match(r"[\w-]+", first[len(TESTED):]).group())
        else:
            assert len(first) > len(NOT_RUN) + 10, f"{path}:{line}: say why it is not run"
    assert sorted(tested) == sorted(RUNS), "every run here documents one block, and vice versa"


def _block(block_id):
    found = [text for _, _, text in bash_blocks()
             if text.startswith(f"{TESTED}{block_id} ") or text == f"{TESTED}{block_id}"
             or text.startswith(f"{TESTED}{block_id}\n")]
    assert len(found) == 1, block_id
    return found[0]


def _runnable(block_id, text):
    for documented, substitute in RUNS[block_id][0]:
        assert documented in text, f"{block_id}: the documented command changed: {documented!r}"
        text = text.replace(documented, substitute)
    text = text.replace("python scripts/", f"python {REPO}/scripts/")
    return text.replace("$PWD/fairseq_plugins", f"{REPO}/fairseq_plugins")


@pytest.mark.parametrize("block_id", sorted(RUNS))
def test_documented_commands_run(block_id, tmp_path):
    if block_id in ("lm", "hydra_lm"):
        if not os.path.isdir(WIKITEXT2):
            pytest.skip("../shared/data/wikitext-2 not present")
        with open(os.path.join(WIKITEXT2, "train.txt"), encoding="utf-8") as f:
            head = [line for _, line in zip(range(4000), f)]
        (tmp_path / "wikitext-2-head.txt").write_text("".join(head), encoding="utf-8")
    script = "set -euo pipefail\n" + _runnable(block_id, _block(block_id)) + "\n"
    env = dict(cli_env(), PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    proc = subprocess.run(["bash", "-c", script], capture_output=True, text=True, cwd=tmp_path,
                          env=env)
    assert proc.returncode == 0, f"{script}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    for path in RUNS[block_id][1]:
        assert (tmp_path / path).exists(), path
