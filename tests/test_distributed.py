"""fairseq's own distributed training on CPU (2 processes, gloo, legacy DDP: the flags of
docs/scale.md; fairseq's c10d backend does not run on a CPU) gives the parameters of 1 process
with --update-freq 2, for the seq2seq and language-model architectures and for every depth
connection (parameters a step may leave unused
and state handed between blocks are where DDP fails or silently differs), and a 2-process run
resumes from its checkpoint (the loaded state is broadcast with torch.save / torch.load, which
the compatibility layer's allow-list must cover)."""
import socket
import subprocess

import pytest
import torch
from conftest import run_cli, start_cli
from helpers import PLUGIN_DIR


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# language models: their task, data and criterion flags (the data-bin is the lm_bin fixture)
LM_FLAGS = {
    "ar_encdec_lm_tiny": ["--task", "language_modeling", "--tokens-per-sample", "32",
                          "--criterion", "lm_embedding_loss", "--embedding-loss", "mse",
                          "--embedding-loss-coeff", "8", "--batch-size", "4"],
    "gpt_baseline_lm_tiny": ["--task", "language_modeling", "--tokens-per-sample", "32",
                             "--batch-size", "4"],
}


def _common(data, arch, save_dir, updates, flags=()):
    extra = LM_FLAGS.get(arch, ["--max-tokens", "512", "--attention-dropout", "0"])
    return [str(data), "--user-dir", PLUGIN_DIR, "--arch", arch, *map(str, flags), "--cpu",
            "--optimizer", "adam", "--lr", "1e-3", *extra,
            "--max-update", str(updates), "--dropout", "0",
            "--seed", "1", "--num-workers", "0", "--no-epoch-checkpoints",
            "--disable-validation", "--save-dir", str(save_dir)]


def _train_single(data, arch, save_dir, updates, flags=()):
    return run_cli("fairseq-train", *_common(data, arch, save_dir, updates, flags),
                   "--update-freq", "2")


def _train_two_processes(data, arch, save_dir, updates, flags=()):
    """The two ranks side by side, each in a child of its own zygote (conftest.start_cli)."""
    port = _free_port()
    commands = [start_cli("fairseq-train", *_common(data, arch, save_dir, updates, flags),
                          "--ddp-backend", "legacy_ddp", "--distributed-backend", "gloo",
                          "--distributed-init-method", f"tcp://127.0.0.1:{port}",
                          "--distributed-world-size", "2", "--distributed-rank", rank,
                          "--distributed-no-spawn", zygote=rank)
                for rank in (0, 1)]
    outputs, failed = [], False
    for command in commands:  # one that hangs (its peer failed) is killed: both outputs shown
        try:
            proc = command.wait(timeout=300)
            outputs.append(proc.stdout + proc.stderr)
            failed |= proc.returncode != 0
        except subprocess.TimeoutExpired as e:
            outputs.append(f"(killed after {e.timeout} s)\n{e.output}{e.stderr}")
            failed = True
    assert not failed, "\n".join(f"rank {i}:\n{out[-3000:]}" for i, out in enumerate(outputs))
    return outputs[0]


def _max_param_diff(a, b):
    sa = torch.load(a / "checkpoint_last.pt")["model"]
    sb = torch.load(b / "checkpoint_last.pt")["model"]
    assert sa.keys() == sb.keys()
    return max((sa[k].float() - sb[k].float()).abs().max().item() for k in sa)


@pytest.mark.parametrize("arch,resume", [("fusion_transformer_tiny", True),
                                         ("bridge_transformer_tiny", False),
                                         ("swapped_transformer_tiny", False),
                                         ("decoder_values_transformer_tiny", False),
                                         ("inverted_transformer_tiny", False),
                                         ("ar_encdec_lm_tiny", True),
                                         ("gpt_baseline_lm_tiny", False)])
def test_two_processes_equal_update_freq_two(request, tmp_path, arch, resume):
    data = (request.getfixturevalue("lm_bin") if arch in LM_FLAGS
            else request.getfixturevalue("scan_bin") / "bin")
    single_log = _train_single(data, arch, tmp_path / "single", updates=6)
    if arch == "ar_encdec_lm_tiny":  # the embedding loss is on, and logged
        assert "emb_loss" in single_log
    if resume:  # 3 updates, stop, then the same command resumes to 6
        _train_two_processes(data, arch, tmp_path / "dist", updates=3)
        log = _train_two_processes(data, arch, tmp_path / "dist", updates=6)
        assert "Loaded checkpoint" in log and "@ 3 updates" in log
    else:
        _train_two_processes(data, arch, tmp_path / "dist", updates=6)
    assert _max_param_diff(tmp_path / "single", tmp_path / "dist") < 1e-5


# every depth connection, in the language model (and the multi-stream ones in
# layerwise_transformer's pre-norm encoder and decoder); resumed part-way: one that hands state
# between blocks (value residual), one with several streams (mHC), one that attends over depth
PRE_NORM = ["--encoder-normalize-before", "--decoder-normalize-before"]
DEPTH = {
    "hc_static": ("gpt_baseline_lm_tiny", ["--hyper-connections", "static"], False),
    "hc_dynamic": ("gpt_baseline_lm_tiny", ["--hyper-connections", "dynamic"], False),
    "mhc": ("gpt_baseline_lm_tiny", ["--mhc", "sinkhorn"], True),
    "mhc_lite": ("gpt_baseline_lm_tiny", ["--mhc", "lite"], False),
    "frac_connections": ("gpt_baseline_lm_tiny", ["--frac-connections", "dynamic"], False),
    "attn_res_full": ("gpt_baseline_lm_tiny", ["--attn-res", "full"], False),
    "attn_res_block": ("gpt_baseline_lm_tiny", ["--attn-res", "block", "--attn-res-blocks", "2"],
                       True),
    "mudd": ("gpt_baseline_lm_tiny", ["--mudd"], False),
    "value_residual": ("gpt_baseline_lm_tiny", ["--value-residual", "learnable"], True),
    "dwa": ("gpt_baseline_lm_tiny", ["--decoder-fusion", "--fusion-kind", "dwa"], False),
    "lrf": ("gpt_baseline_lm_tiny", ["--decoder-fusion"], False),
    "lrf_all_positions": ("gpt_baseline_lm_tiny", ["--decoder-fusion", "--fusion-reading",
                                                   "all-positions"], False),
    "seq2seq_hc_dynamic": ("layerwise_transformer_tiny",
                           PRE_NORM + ["--hyper-connections", "dynamic"], False),
    "seq2seq_mhc": ("layerwise_transformer_tiny", PRE_NORM + ["--mhc", "sinkhorn"], False),
    "seq2seq_frac_connections": ("layerwise_transformer_tiny",
                                 PRE_NORM + ["--frac-connections", "dynamic"], False),
}


@pytest.mark.parametrize("name", sorted(DEPTH))
def test_every_depth_connection_trains_alike_in_two_processes(request, tmp_path, name):
    """Two gloo processes with legacy DDP against one process with --update-freq 2 (6 updates).
    fairseq's c10d backend cannot run on a CPU (it hands torch's DistributedDataParallel
    device_ids=[0], which torch refuses for a CPU module: docs/scale.md), so c10d is a GPU
    check."""
    arch, flags, resume = DEPTH[name]
    data = (request.getfixturevalue("lm_bin") if arch in LM_FLAGS
            else request.getfixturevalue("scan_bin") / "bin")
    _train_single(data, arch, tmp_path / "single", updates=6, flags=flags)
    if resume:
        _train_two_processes(data, arch, tmp_path / "dist", 3, flags)
        log = _train_two_processes(data, arch, tmp_path / "dist", 6, flags)
        assert "Loaded checkpoint" in log and "@ 3 updates" in log
    else:
        _train_two_processes(data, arch, tmp_path / "dist", 6, flags)
    assert _max_param_diff(tmp_path / "single", tmp_path / "dist") < 1e-5
