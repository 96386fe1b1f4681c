import argparse
import io
import os
import pickle
import shutil
import subprocess
import sys
from collections import defaultdict

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from helpers import PLUGIN_DIR, REPO

from fairseq_plugins import compat


def test_no_weights_only_override_in_environment():
    # the checkpoint tests below are only meaningful if nothing forces the old behaviour
    assert "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD" not in os.environ


def test_fairseq_checkpoint_types_load_with_weights_only(tmp_path):
    state = {
        "args": argparse.Namespace(arch="fusion_transformer_tiny", lr=[0.1]),
        "cfg": OmegaConf.create({"model": {"_name": "x", "dropout": 0.1}, "opt": [1, 2]}),
        "model": {"w": torch.ones(2)},
    }
    path = tmp_path / "ckpt.pt"
    torch.save(state, path)
    loaded = torch.load(path, weights_only=True)
    assert loaded["args"].arch == "fusion_transformer_tiny"
    assert loaded["cfg"].model.dropout == 0.1


class Foreign:
    pass


def test_allow_list_is_not_blanket(tmp_path):
    torch.save({"obj": Foreign()}, tmp_path / "foreign.pt")
    with pytest.raises(pickle.UnpicklingError, match="weights_only"):
        torch.load(tmp_path / "foreign.pt")


def test_a_checkpoint_with_eval_bleu_counts_loads_with_weights_only(tmp_path):
    """fairseq's --eval-bleu keeps its n-gram counts as numpy arrays in the meters that the
    checkpoint's extra_state holds: torch's safe loading, which fairseq's load uses, reads them
    (fairseq-generate, resuming; the whole path: tests/test_encdec_comparison.py); an object
    array stays refused."""
    counts = {"val": np.array([373, 365, 357, 349]), "sum": np.array([2.5e4, 1.0])}
    state = {"model": {"w": torch.zeros(2)}, "args": argparse.Namespace(arch="x"),
             "optimizer_history": [{"criterion_name": "CrossEntropyCriterion",
                                    "optimizer_name": "none", "lr_scheduler_state": {},
                                    "num_updates": 0}],
             "extra_state": {"metrics": {"valid": [(0, "_bleu_counts", 1, counts)]},
                             "train_iterator": {"epoch": 1}, "best": np.float64(31.2)},
             "last_optimizer_state": None}
    path = tmp_path / "checkpoint_last.pt"
    torch.save(state, path)
    loaded = torch.load(path)  # torch's default safe loading, as fairseq's load calls it
    assert np.array_equal(loaded["extra_state"]["metrics"]["valid"][0][3]["val"], counts["val"])
    assert loaded["extra_state"]["best"] == 31.2
    torch.save({"x": np.array([object()], dtype=object)}, tmp_path / "objects.pt")
    with pytest.raises(pickle.UnpicklingError):
        torch.load(tmp_path / "objects.pt")


def test_distributed_broadcast_payload_loads():
    # rank 0 broadcasts the loaded state as torch.save bytes with tensors split out; the
    # receiving ranks torch.load it (fairseq.distributed.utils._broadcast_object_slow)
    from fairseq.distributed import utils as dist_utils

    tensors = []
    payload = dist_utils._split_tensors_from_obj(
        {"cfg": OmegaConf.create({"a": 1}), "extra": defaultdict(list), "t": torch.zeros(1)},
        tensors)
    data = io.BytesIO()
    torch.save(payload, data)
    data.seek(0)
    obj = torch.load(data, map_location="cpu")
    assert isinstance(obj["t"], dist_utils._TensorPlaceholder) and obj["cfg"].a == 1


def test_numpy_aliases():
    assert np.compat.long is int
    assert np.int is int and np.float is float
    np.vectorize(len, otypes=[np.compat.long])(np.array(["ab", "c"], dtype=object))


def test_apply_is_idempotent():
    compat.apply()
    compat.apply()
    assert np.compat.long is int


def test_second_import_under_another_name_does_not_reregister(tmp_path):
    """An installed copy plus a --user-dir copy of the package must not clash."""
    from fairseq import utils
    from fairseq.models import ARCH_MODEL_REGISTRY

    before = ARCH_MODEL_REGISTRY["fusion_transformer_tiny"]
    copy = tmp_path / "plugins_copy"
    shutil.copytree(PLUGIN_DIR, copy, ignore=shutil.ignore_patterns("__pycache__"))
    utils.import_user_module(argparse.Namespace(user_dir=str(copy)))
    assert "plugins_copy.models.layerwise_transformer" in sys.modules
    assert ARCH_MODEL_REGISTRY["fusion_transformer_tiny"] is before


def test_user_dir_and_installed_import_in_fresh_process():
    code = (
        "import fairseq_plugins, argparse\n"
        "from fairseq import utils\n"
        f"utils.import_user_module(argparse.Namespace(user_dir={PLUGIN_DIR!r}))\n"
        "from fairseq.models import ARCH_MODEL_REGISTRY\n"
        "print('ok', 'fusion_transformer_tiny' in ARCH_MODEL_REGISTRY)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "ok True" in proc.stdout
