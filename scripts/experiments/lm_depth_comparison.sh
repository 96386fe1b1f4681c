#!/usr/bin/env bash
# The seeded WikiText-2 comparison of the depth connections (docs/ideas/comparison.md): every
# row of scripts/experiments/lm_depth_comparison.py (the decoder-only baseline, DWA, LRF in both
# readings, Hyper-Connections, mHC, mHC-lite, Frac-Connections, AttnRes, MUDD, value residual,
# ar_encdec_lm plain / with the bridges / with its embedding loss, matched-parameter baselines)
# at 4 and 12 blocks, 3 seeds, 800 updates. Resumable: finished runs (result.json) are skipped
# when it is run again, and every finished run is also kept in results/lm_depth_runs (commit it:
# a fresh clone resumes from there). Copies the tables to results/lm_depth_comparison_cpu.{json,md}.
#   [WIKITEXT_FROM=DIR] [ROWS=a,b] [DEPTHS=4,12] [SEEDS=1,2,3] [JOBS=2]
#       bash scripts/experiments/lm_depth_comparison.sh [OUT_ROOT]
#   (OUT_ROOT default: outputs/lm-depth; WIKITEXT_FROM default: ../shared/data/wikitext-2;
#   JOBS: runs trained at once, each with the cores / JOBS threads; default 2)
# About 5 hours at 4 blocks and 14 at 12 on an idle 2-core CPU with one run at a time; ~12% less
# with two 1-thread runs at a time.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:-outputs/lm-depth}
python scripts/prepare/lm.py --dataset wikitext-2 --from "${WIKITEXT_FROM:-../shared/data/wikitext-2}"
python scripts/experiments/lm_depth_comparison.py --data data-bin/wikitext-2 --out-dir "$OUT" \
    --keep-runs results/lm_depth_runs --results-name lm_depth_comparison_cpu \
    ${ROWS:+--rows "$ROWS"} ${DEPTHS:+--depths "$DEPTHS"} ${SEEDS:+--seeds "$SEEDS"} \
    --jobs "${JOBS:-2}"
