"""Interrupted runs: SIGKILL mid-epoch and while checkpoints are written; restarting the same
command resumes from the last complete checkpoint and follows the uninterrupted trajectory."""
import os
import shutil
import signal
import subprocess
import time

import pytest
import torch
from conftest import BIN, cli_env
from helpers import PLUGIN_DIR

import fairseq_plugins  # noqa: F401  (applies the compatibility layer in this process too)


def _cmd(scan_bin, save_dir, updates, *extra):
    return [os.path.join(BIN, "fairseq-train"), str(scan_bin / "bin"), "--user-dir", PLUGIN_DIR,
            "--arch", "swapped_transformer_tiny", "--optimizer", "adam", "--lr", "1e-3",
            "--max-tokens", "512", "--max-update", str(updates), "--dropout", "0",
            "--seed", "1", "--num-workers", "0", "--save-dir", str(save_dir),
            "--no-epoch-checkpoints", "--log-format", "json", "--log-interval", "1", *extra]


def _run_until(cmd, marker, delay=0.0):
    """Start cmd, SIGKILL it ``delay`` s after a log line containing ``marker`` appears."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=cli_env())
    for line in proc.stdout:
        if marker in line:
            time.sleep(delay)
            break
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    return proc.returncode


def _params(path):
    return torch.load(path)["model"]


def test_sigkill_mid_epoch_resumes_on_the_uninterrupted_trajectory(scan_bin, tmp_path):
    extra = ("--save-interval-updates", "4", "--disable-validation")
    full = subprocess.run(_cmd(scan_bin, tmp_path / "full", 14, *extra), capture_output=True,
                          text=True, env=cli_env())
    assert full.returncode == 0, full.stderr[-2000:]
    # killed after the checkpoint at update 8 was saved, before update 14
    assert _run_until(_cmd(scan_bin, tmp_path / "cut", 14, *extra),
                      "Saved checkpoint", delay=0.0) == -signal.SIGKILL
    assert _run_until(_cmd(scan_bin, tmp_path / "cut", 14, *extra),
                      "Saved checkpoint", delay=0.0) == -signal.SIGKILL
    resumed = subprocess.run(_cmd(scan_bin, tmp_path / "cut", 14, *extra), capture_output=True,
                             text=True, env=cli_env())
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    log = resumed.stdout + resumed.stderr
    assert "Loaded checkpoint" in log and "@ 8 updates" in log
    a, b = (_params(d / "checkpoint_last.pt") for d in (tmp_path / "full", tmp_path / "cut"))
    assert max((a[k].float() - b[k].float()).abs().max().item() for k in a) < 1e-5


def test_sigkill_while_saving_never_leaves_a_broken_checkpoint_last(scan_bin, tmp_path):
    """Checkpoints at every update (best written first, last copied from it): killed at several
    points during saving, checkpoint_last.pt always loads and the run resumes to the end."""
    extra = ("--save-interval-updates", "1", "--validate-interval-updates", "1",
             "--max-valid-steps", "1")
    save_dir = tmp_path / "run"
    for delay in (0.0, 0.01, 0.03, 0.06):
        _run_until(_cmd(scan_bin, save_dir, 30, *extra), "valid on 'valid' subset", delay)
        last = save_dir / "checkpoint_last.pt"
        if last.exists():
            _params(last)  # a truncated file would fail here
    done = subprocess.run(_cmd(scan_bin, save_dir, 30, *extra), capture_output=True, text=True,
                          env=cli_env())
    assert done.returncode == 0, done.stderr[-2000:]


def test_checkpoint_copy_is_atomic(tmp_path, monkeypatch):
    """The copy to checkpoint_last.pt goes through <name>.tmp: a copy that dies half-way leaves
    the previous checkpoint_last.pt intact (fairseq alone would truncate it)."""
    from fairseq import checkpoint_utils

    src, dst = tmp_path / "checkpoint_best.pt", tmp_path / "checkpoint_last.pt"
    torch.save({"new": torch.ones(1000)}, src)
    torch.save({"old": torch.zeros(3)}, dst)

    def dying_copy(a, b, *args, **kwargs):
        with open(b, "wb") as f:
            f.write(open(a, "rb").read()[:100])
        raise KeyboardInterrupt  # the process dies during the copy

    monkeypatch.setattr(shutil, "copyfile", dying_copy)
    with pytest.raises(KeyboardInterrupt):
        checkpoint_utils.PathManager.copy(str(src), str(dst), overwrite=True)
    assert list(torch.load(dst)) == ["old"]
    monkeypatch.undo()
    assert checkpoint_utils.PathManager.copy(str(src), str(dst), overwrite=True)
    assert list(torch.load(dst)) == ["new"] and not (tmp_path / "checkpoint_last.pt.tmp").exists()
