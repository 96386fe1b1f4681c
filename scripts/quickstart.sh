#!/usr/bin/env bash
# SCAN -> fairseq's transformer, LRF and the FC bridge (tiny presets) trained to convergence ->
# exact-match table + layer analysis. Run via `bash dev.sh quickstart` (which sets up the virtual
# environment) or directly inside it. Extra arguments go to quickstart.py (--all, --seeds, --archs,
# --jobs, --out-dir ...).
set -euo pipefail
cd "$(dirname "$0")/.."
exec python scripts/quickstart.py "$@"
