"""fairseq plugins for research on how encoder and decoder layers talk to each other.

Load with ``fairseq-train --user-dir /abs/path/to/fairseq_plugins`` or ``import fairseq_plugins``
after ``pip install -e .``. Importing applies the compatibility fixes in :mod:`.compat` and
registers every model, architecture, criterion and task of the package.
"""
from . import compat, errors

compat.apply()
errors.install()  # a refusal of the package's options: one line, status 2, as argparse's

from . import criterions, models, tasks  # noqa: E402,F401  (registration side effects)

__version__ = "0.1.0"
