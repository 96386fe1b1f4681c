#!/usr/bin/env bash
# SCAN -> every seq2seq architecture (tiny presets) -> exact-match table. Run via `bash dev.sh quickstart`
# (which sets up the virtual environment) or directly inside it. Extra arguments go to quickstart.py
# (--max-update, --archs, --split, --out-dir ...).
set -euo pipefail
cd "$(dirname "$0")/.."
exec python scripts/quickstart.py "$@"
