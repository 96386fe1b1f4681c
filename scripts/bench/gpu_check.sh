#!/usr/bin/env bash
# The GPU check of the depth connections' fused kernels (docs/ideas/fused-kernels.md) in one run
# of under 8 minutes on one GPU, results under one folder:
#   1. tests/kernels/ with Triton's real compiler (each kernel against the eager code it
#      replaces, forward and backward, gradcheck, whole models with and without the kernels):
#      kernel_tests.txt;
#   2. the depth bench at 12 blocks in fp16, d = 128 and d = 1024, every fused row beside its
#      eager twin (--no-fused-kernels) in the same process: bench_depth_d{128,1024}.{json,md};
#   3. 200 WikiText-2 updates of the comparison's recipe in fp32 with the kernels and without
#      (the same loss curve within fp32 rounding), and in fp16: fp16_check/results.{json,md}.
#   [OUT=DIR] [PYTHON=python3] bash scripts/bench/gpu_check.sh
# Needs a CUDA GPU, a Python with torch and triton, and data-bin/wikitext-2 (python
# scripts/prepare/lm.py --dataset wikitext-2). fairseq and this package are installed first
# where missing, without network: from .gpu-wheels/ (scripts/bench/gpu_wheels.sh makes it; carry
# it and data-bin/wikitext-2 to a machine that has neither).
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-results/gpu_check}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if ! "$PY" -c "import fairseq" 2>/dev/null; then
    "$PY" -m pip install -q --no-index --no-deps --no-build-isolation .gpu-wheels/*.whl \
        .gpu-wheels/antlr4*.tar.gz
    # its C++ / Cython extensions are built here, against this machine's torch
    "$PY" -m pip install -q --no-index --no-deps --no-build-isolation .gpu-wheels/fairseq_fixed-*.tar.gz
fi
"$PY" -c "import fairseq_plugins" 2>/dev/null || "$PY" -m pip install -q --no-deps --no-build-isolation -e .
FUSED=hc_static_n4,hc_dynamic_n4,mhc_n4,mhc_lite_n4,frac_dynamic_m4
ROWS=$FUSED,${FUSED//,/_eager,}_eager
"$PY" -m pytest -q -p no:cacheprovider tests/kernels 2>&1 | tee "$OUT/kernel_tests.txt"
for width in 128 1024; do
    "$PY" scripts/bench/depth.py --device cuda --fp16 --depths 12 --embed-dim "$width" \
        --rows "$ROWS" --out "$OUT/bench_depth_d$width.json" | tee "$OUT/bench_depth_d$width.md"
done
"$PY" scripts/experiments/lm_fp16_check.py --data data-bin/wikitext-2 --depth 12 --updates 200 \
    --rows baseline,hc_static,hc_dynamic,mhc,mhc_lite,frac_connections --eager --jobs 6 \
    --out-dir "$OUT/fp16_check"
