#!/usr/bin/env bash
# The comparison of the cross-layer methods (docs/ideas/comparison.md): fairseq's transformer, LRF
# (encoder, decoder, both), DWA (both), the FC bridge (original init) and transparent attention,
# tiny sizes, the same budget per row, 3 seeds, on SCAN simple (exact match) and Multi30k De-En
# (BLEU). Resumable: finished runs (result.json) are skipped when it is run again.
#   [SEEDS=1,2,3] [MULTI30K_FROM=DIR] bash scripts/experiments/cross_layer_methods.sh [OUT_ROOT]
#   (OUT_ROOT default: outputs/cross-layer)
# About 2 hours on an idle 2-core CPU (Multi30k: 77 minutes, two runs at a time). Copies the
# tables and figures to results/.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:-outputs/cross-layer}
ARCHS=transformer_tiny,fusion_enc_transformer_tiny,fusion_dec_transformer_tiny,fusion_transformer_tiny,dwa_transformer_tiny,bridge_transformer_tiny,transparent_transformer_tiny
SEEDS=${SEEDS:-1,2,3}

python scripts/prepare/scan.py --split simple
python scripts/compare_seeds.py --data data-bin/scan-simple --archs "$ARCHS" --seeds "$SEEDS" \
    --max-len-a 0 --max-len-b 64 --out-dir "$OUT/scan"
cp "$OUT/scan/results.md" results/cross_layer_scan_cpu.md
cp "$OUT/scan/results.json" results/cross_layer_scan_cpu.json
cp "$OUT/scan/results.png" results/cross_layer_scan_cpu.png

# MULTI30K_FROM: a folder with the release files (scripts/prepare/multi30k.py --from); else download
python scripts/prepare/multi30k.py ${MULTI30K_FROM:+--from "$MULTI30K_FROM"}
python scripts/compare_seeds.py --data data-bin/multi30k --archs "$ARCHS" --seeds "$SEEDS" \
    --metric bleu --spm data/multi30k/spm.model --ref data/multi30k/test.raw.en \
    --max-update 600 --max-tokens 4096 --lr 2e-3 --jobs 2 --out-dir "$OUT/multi30k"
cp "$OUT/multi30k/results.md" results/cross_layer_multi30k_cpu.md
cp "$OUT/multi30k/results.json" results/cross_layer_multi30k_cpu.json
cp "$OUT/multi30k/results.png" results/cross_layer_multi30k_cpu.png
