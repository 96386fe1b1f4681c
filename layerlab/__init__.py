"""The experiment library of this repository: everything the scripts under ``scripts/`` share.

Only :mod:`.bench` imports torch when it is imported; the others import torch or fairseq only
inside the functions that need them, so a data preparation step does not pay for them.

- :mod:`.paths`: the repository, the plugin directory for ``--user-dir``, the fairseq executables
- :mod:`.runs`: running a command with its log, fairseq-train / fairseq-generate commands,
  ``result.json`` resume, the train -> generate -> score step of one run
- :mod:`.warm`: commands forked from a server that has imported torch and fairseq once
  (``LAYERLAB_FORK_COMMANDS=1``; off by default)
- :mod:`.fairseq_log`: reading fairseq's ``--log-format json`` logs (records, losses, curves)
- :mod:`.stats`: mean and spread over seeds, per-row seed summaries
- :mod:`.prepare`: the conventions of every data preparation script (``scripts/prepare/``)
- :mod:`.tables`: the paper-table runner (``scripts/tables/``)
- :mod:`.bench`: timing, memory and the targets of the benchmark suite (``scripts/bench/``)
- :mod:`.curves`: training/validation curves as a PNG

Installed with the plugin package (``pip install -e .``), so scripts import it as a package.
"""
