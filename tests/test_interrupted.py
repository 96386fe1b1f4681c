"""Interrupted runs: SIGKILL mid-epoch and while checkpoints are written; restarting the same
command resumes from the last complete checkpoint and follows the uninterrupted trajectory."""
import os
import shutil
import signal
import time

import pytest
import torch
from conftest import run_cli, start_cli
from helpers import PLUGIN_DIR
from layerlab import warm

import fairseq_plugins  # noqa: F401  (applies the compatibility layer in this process too)


def _args(scan_bin, save_dir, updates, *extra):
    return [str(scan_bin / "bin"), "--user-dir", PLUGIN_DIR,
            "--arch", "swapped_transformer_tiny", "--optimizer", "adam", "--lr", "1e-3",
            "--max-tokens", "512", "--max-update", str(updates), "--dropout", "0",
            "--seed", "1", "--num-workers", "0", "--save-dir", str(save_dir),
            "--no-epoch-checkpoints", "--log-format", "json", "--log-interval", "1", *extra]


def _train(args):
    return run_cli("fairseq-train", *args, check=False)


def _run_until(args, marker, delay=0.0, count=1):
    """Start fairseq-train (a child forked from a warm server: a process of its own, which a
    SIGKILL ends as it ends any), SIGKILL it ``delay`` s after its log (stdout, read as it is
    written) contains ``marker`` ``count`` times; its exit status."""
    command = start_cli("fairseq-train", *args)
    deadline = time.monotonic() + 300
    while warm.read_output(command.paths["stdout"]).count(marker) < count:
        if command.forked.poll() is not None or time.monotonic() > deadline:
            proc = command.wait()
            pytest.fail(f"no {marker!r} in its log (exit status {proc.returncode}):\n"
                        f"{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
        time.sleep(0.002)
    time.sleep(delay)
    command.forked.kill()
    return command.wait().returncode


def _params(path):
    return torch.load(path)["model"]


def test_sigkill_mid_epoch_resumes_on_the_uninterrupted_trajectory(scan_bin, tmp_path):
    extra = ("--save-interval-updates", "4", "--disable-validation")
    full = _train(_args(scan_bin, tmp_path / "full", 14, *extra))
    assert full.returncode == 0, full.stderr[-2000:]
    # killed after the checkpoint at update 8 was saved, before update 14
    assert _run_until(_args(scan_bin, tmp_path / "cut", 14, *extra),
                      "Saved checkpoint", delay=0.0) == -signal.SIGKILL
    assert _run_until(_args(scan_bin, tmp_path / "cut", 14, *extra),
                      "Saved checkpoint", delay=0.0) == -signal.SIGKILL
    resumed = _train(_args(scan_bin, tmp_path / "cut", 14, *extra))
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
    save_dir, last = tmp_path / "run", tmp_path / "run" / "checkpoint_last.pt"
    # fairseq's trainer logs "Saving checkpoint to" as it starts writing a checkpoint (~0.1 s
    # here), then copies it to best and last: each run is killed 0-120 ms into its third save,
    # so from the first kill on there is a checkpoint_last.pt that the save overwrites
    for delay in (0.0, 0.03, 0.08, 0.12):
        status = _run_until(_args(scan_bin, save_dir, 30, *extra), "Saving checkpoint to",
                            delay, count=3)
        assert status == -signal.SIGKILL  # killed while it ran, not after it ended
        assert _params(last)  # there, and whole: a truncated file would fail to load
    done = _train(_args(scan_bin, save_dir, 30, *extra))
    assert done.returncode == 0, done.stderr[-2000:]
    log = done.stdout + done.stderr
    # the four runs saved at least two updates each before their kill
    assert "Loaded checkpoint" in log and "Stopping training due to num_updates: 30" in log
    resumed_at = int(log.split("Loaded checkpoint")[1].split(" updates)")[0].split("@ ")[-1])
    assert resumed_at >= 8, log[-3000:]


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
