"""A marker stored first in every checkpoint saved while this package is loaded, so that loading
it without the package says so instead of failing somewhere unrelated.

fairseq does not import a checkpoint's ``--user-dir`` when it loads one: without
``--user-dir .../fairseq_plugins`` the load used to fail deep in fairseq (torch's allow-list error
about ``argparse.Namespace``, or an ``IndexError`` from fairseq's config conversion). With the
marker as the first entry of the pickled state, the first thing the unpickler meets is this class:

- torch's default safe loading (``weights_only=True``) without the package's allow-list stops
  with "Unsupported global: GLOBAL fairseq_plugins.checkpoint_marker.PassUserDirFairseqPlugins";
- full unpickling (``weights_only=False``, e.g. ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1``) imports
  this module, hence the package, which registers every model: the checkpoint then loads even
  without ``--user-dir`` when the package is installed (``pip install -e .``), and fails with
  "No module named 'fairseq_plugins'" when it is not.

The installed ``fairseq_plugins_hints`` turns the first case into one line naming
``--user-dir`` (docs/reliability.md). The marker carries no data; fairseq ignores the extra
top-level key.
"""

KEY = "_fairseq_plugins"


class PassUserDirFairseqPlugins:
    """Loading this checkpoint needs ``--user-dir /abs/path/to/fairseq_plugins`` (see module)."""


def mark(state):
    """``state`` with the marker as its first entry (fairseq checkpoints only: dicts with a
    ``model`` entry; anything else is returned unchanged)."""
    if not isinstance(state, dict) or "model" not in state or KEY in state:
        return state
    return {KEY: PassUserDirFairseqPlugins(), **state}
