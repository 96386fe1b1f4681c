#!/usr/bin/env bash
# The WikiText-2 depth comparison over ten times the training, with learning curves
# (docs/ideas/comparison.md, "8,000 updates"): scripts/experiments/lm_depth_comparison.py with
# 8,000 updates, the 800-update comparison's warm-up (100 updates) and logging (every 40), the
# full validation set scored every 800 updates, three seeds. Resumable, in stages:
#   1. the baseline at 4, 8 and 12 blocks, seed 1: the deeper depth is the shallowest of 8 and
#      12 whose baseline ends below the 4-block baseline's test bits (12 when neither does);
#   2. every row at 4 blocks, seed 1 (while the depth is not known yet);
#   3. every row at 4 blocks and the deeper depth, seeds 1, 2, 3, seed by seed.
# Each stage skips what is finished (result.json), continues an interrupted run from its last
# checkpoint (every 100 updates) and keeps every finished run in results/lm_depth_runs_8k (commit
# it). After each stage that kept something new, one report over every finished run (every
# row, 4, 8 and 12 blocks, each row over the seeds it has; against the 800-update report and
# runs) is written to results/lm_depth_comparison_8k_cpu.{json,md}: a stage's own tables (in
# OUT) hold only its plan, so a restart of stage 1 would otherwise replace the committed report
# by the baselines'.
# Stages 2 and 3 also score the test set at update 800 (--test-at 800: the 800-update
# comparison's budget, within the same runs; a run finished without it trains its first 800
# updates again, checked against its curve), so that the report compares the two budgets at
# 8 blocks too, where the 800-update comparison has no table.
#   [OUT=DIR] [DEEP=8|12] [ROWS=a,b] [JOBS=2] [THREADS=N] [WIKITEXT_FROM=DIR] bash scripts/experiments/lm_depth_long.sh
# THREADS: each run's threads (default the machine's cores / JOBS); JOBS=1 THREADS=1 leaves the
# other core of two to another comparison.
#   bash scripts/experiments/lm_depth_long.sh report    # that report alone, training nothing
# OUT (scratch: checkpoints, logs) defaults to ~/layerlab-runs/lm-depth-8k, outside the work
# tree, so that a new checkout on the same machine continues the unfinished runs.
set -euo pipefail
# the whole script is one function, read before any of it runs: bash reads a script as it runs
# it, so an edit of this file (a new checkout, a commit) while runs go on would otherwise make
# the running instance go on from the same byte offset in the new text
main() {
    cd "$(dirname "$0")/../.."
    OUT=${OUT:-$HOME/layerlab-runs/lm-depth-8k}
    KEEP=results/lm_depth_runs_8k
    ROWS=${ROWS:-baseline,hc_static,hc_dynamic,mhc,frac_connections,attn_res_full,attn_res_block,mudd,dwa,lrf,lrf_all_positions,value_residual,laurel_rw_lr,laurel_pa,ar_encdec}
    python scripts/prepare/lm.py --dataset wikitext-2 --from "${WIKITEXT_FROM:-../shared/data/wikitext-2}"
    compare() {
        python scripts/experiments/lm_depth_comparison.py --data data-bin/wikitext-2 \
            --out-dir "$OUT" --keep-runs "$KEEP" --updates 8000 --warmup-updates 100 --log-interval 40 \
            --curve-interval 800 --jobs "${JOBS:-2}" ${THREADS:+--threads "$THREADS"} "$@"
    }
    report() {
        compare --rows "$ROWS" --depths 4,8,12 --seeds 1,2,3 --report-only \
            --results-name lm_depth_comparison_8k_cpu --test-at 800 \
            --shorter-report results/lm_depth_comparison_cpu.json \
            --shorter-runs results/lm_depth_runs
    }
    if [ "${1:-}" = report ]; then
        report
        exit
    fi
    # between stages a failed report stops no training: the runs matter more than their tables.
    # A stage that kept nothing new (a restart passing over what is done) writes no report: it
    # would change only the report's header (the commit that wrote it), leaving the committed
    # report modified with nothing new in it. What is kept: every file in KEEP, with its time
    # (a finished run, test blocks at an added --test-at point, a recovery's mismatch)
    kept() { find "$KEEP" -type f -printf '%p %T@\n' 2>/dev/null | sort | cksum; }
    report_between() {
        if [ "$(kept)" = "$1" ]; then
            return
        fi
        report || echo "lm_depth_long.sh: the report failed; training goes on" >&2
    }
    before=$(kept)
    compare --rows baseline --depths 4,8,12 --seeds 1 --no-matched-baselines
    report_between "$before"
    DEEP=${DEEP:-$(python -m layerlab.depth_choice "$KEEP" --shallow 4 --candidates 8,12)}
    echo "the deeper depth: $DEEP blocks" >&2
    before=$(kept)
    compare --rows "$ROWS" --depths 4 --seeds 1 --test-at 800
    report_between "$before"
    compare --rows "$ROWS" --depths "4,$DEEP" --seeds 1,2,3 --test-at 800
    report
}
main "$@"
