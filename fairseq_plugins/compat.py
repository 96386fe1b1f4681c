"""Fixes that let fairseq 0.12.x run under torch >= 2.6 and numpy 2.

Applied once when the package is imported (``apply()`` is idempotent). Each fix states what it
repairs; nothing else in fairseq or torch is touched.
"""
import argparse
import collections
import types
import typing

import numpy as np
import torch

_APPLIED = False


def _checkpoint_safe_globals():
    """Types that fairseq checkpoints (and its distributed state broadcast) contain.

    torch >= 2.6 loads with ``weights_only=True``: only allow-listed classes may be
    unpickled. A fairseq checkpoint holds an ``argparse.Namespace`` (legacy models) and omegaconf
    containers (the training config). When several processes resume a run, rank 0 broadcasts the
    loaded state with torch.save/torch.load, which also carries fairseq's ``_TensorPlaceholder``
    and plain containers. Validation with ``--eval-bleu`` keeps its n-gram counts as numpy
    arrays in fairseq's meters, which the checkpoint's ``extra_state`` holds: numpy's array
    reconstruction and its numeric dtypes (not object arrays). This list is the allow-list: no
    blanket ``weights_only=False``.
    """
    from omegaconf import DictConfig, ListConfig
    from omegaconf.base import ContainerMetadata, Metadata
    from omegaconf.nodes import AnyNode

    from fairseq.distributed.utils import _TensorPlaceholder

    from .checkpoint_marker import PassUserDirFairseqPlugins

    return [
        PassUserDirFairseqPlugins,
        argparse.Namespace,
        DictConfig,
        ListConfig,
        ContainerMetadata,
        Metadata,
        AnyNode,
        typing.Any,
        dict,
        list,
        int,
        collections.defaultdict,
        _TensorPlaceholder,
        *_numpy_array_globals(),
    ]


def _numpy_array_globals():
    """What unpickling a numeric numpy array or scalar reads: the reconstruction functions,
    ``ndarray``, ``dtype`` and the numeric dtype classes (numpy >= 1.25 has ``np.dtypes``)."""
    core = getattr(np, "_core", None) or np.core
    out = [core.multiarray._reconstruct, core.multiarray.scalar, np.ndarray, np.dtype]
    dtypes = getattr(np, "dtypes", None)
    if dtypes is not None:
        out += [getattr(dtypes, name) for name in dir(dtypes) if name.endswith("DType")
                and name not in ("ObjectDType", "VoidDType", "StringDType")]
    return out


def _add_numpy_aliases():
    """Restore numpy aliases removed in numpy 2 that fairseq 0.12 still calls.

    - ``np.compat.long`` (language_pair_dataset with ``--num-batch-buckets``,
      token_block_dataset with ``--sample-break-mode eos``);
    - ``np.int`` / ``np.float`` (data_utils batch bucketing, dynamic_crf_layer).
    The aliases are what numpy 1.x defined them to be.
    """
    if not hasattr(np, "compat"):
        np.compat = types.SimpleNamespace(long=int)
    elif not hasattr(np.compat, "long"):
        np.compat.long = int
    for name, value in (("int", int), ("float", float)):
        if name not in np.__dict__:
            setattr(np, name, value)


def _fix_swish_activation():
    """``--activation-fn swish``: fairseq returns the class ``torch.nn.SiLU`` instead of a
    function, so a layer would call ``SiLU(x)`` (a constructor) on its activations. Return
    ``F.silu``, what swish means (opus-mt/Marian uses it); every other name is unchanged."""
    import torch.nn.functional as F
    from fairseq import utils

    original = utils.get_activation_fn

    def get_activation_fn(activation):
        return F.silu if activation == "swish" else original(activation)

    get_activation_fn.__wrapped__ = original
    utils.get_activation_fn = get_activation_fn


def _atomic_checkpoint_copies():
    """fairseq writes the first checkpoint of a save atomically (``.tmp`` + rename) but *copies*
    it to the others (``checkpoint_last.pt`` after ``checkpoint_best.pt``, or after
    ``checkpoint_<epoch>_<updates>.pt``) in place: a run killed during that copy leaves a truncated
    ``checkpoint_last.pt``, and the restarted run fails to load it. Copy to ``<name>.tmp`` and
    rename, as the first write does, so every checkpoint file is always complete."""
    from fairseq import checkpoint_utils
    from fairseq.file_io import PathManager

    if getattr(checkpoint_utils.PathManager, "atomic_copies", False):
        return

    class AtomicCopyPathManager(PathManager):
        atomic_copies = True

        @staticmethod
        def copy(src_path, dst_path, overwrite=False):
            if not PathManager.supports_rename(dst_path):
                return PathManager.copy(src_path, dst_path, overwrite)
            tmp = dst_path + ".tmp"
            copied = PathManager.copy(src_path, tmp, overwrite=True)
            if copied:
                PathManager.rename(tmp, dst_path)
            return copied

    checkpoint_utils.PathManager = AtomicCopyPathManager


def _mark_saved_checkpoints():
    """Put :mod:`.checkpoint_marker`'s marker first in every checkpoint fairseq saves, so that
    loading it without ``--user-dir`` names this package instead of failing in fairseq's config
    code (see that module)."""
    from fairseq import checkpoint_utils

    from .checkpoint_marker import mark

    save = checkpoint_utils.torch_persistent_save
    if getattr(save, "marks_checkpoints", False):
        return

    def torch_persistent_save(obj, filename, async_write: bool = False):
        return save(mark(obj), filename, async_write=async_write)

    torch_persistent_save.marks_checkpoints = True
    torch_persistent_save.__wrapped__ = save
    checkpoint_utils.torch_persistent_save = torch_persistent_save


def apply():
    """Apply every fix (safe to call any number of times)."""
    global _APPLIED
    if _APPLIED:
        return
    if hasattr(torch.serialization, "add_safe_globals"):
        torch.serialization.add_safe_globals(_checkpoint_safe_globals())
    _add_numpy_aliases()
    _fix_swish_activation()
    _atomic_checkpoint_copies()
    _mark_saved_checkpoints()
    _APPLIED = True
