"""fairseq tasks of this package: importing registers each of them."""
import os

from ..registry import import_submodules

import_submodules(__name__, os.path.dirname(__file__))
