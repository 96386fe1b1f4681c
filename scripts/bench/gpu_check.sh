#!/usr/bin/env bash
# The GPU check of the depth connections' fused kernels (docs/ideas/fused-kernels.md), results
# under one folder. Measured on an H200 (2026-11-28): fairseq's full build 158 s (now only its
# Cython modules are built), the kernel tests 29 s, the bench at d = 128 144 s, at d = 1024 over
# 250 s (19 rows each): more than one 8-minute call; STAGES splits it.
#   1. tests: tests/kernels/ with Triton's real compiler (each kernel against the eager code it
#      replaces, forward and backward, gradcheck, whole models with and without the kernels):
#      kernel_tests.txt;
#   2. bench: the depth bench at 12 blocks in fp16, d = 128 (batch 16) with every fused row
#      beside its eager twin (--no-fused-kernels) in the same process, and d = 1024 (batch 64)
#      with the fused rows: bench_depth_d{128,1024}.{json,md};
#   3. graph: the bench's --cuda-graph rows at d = 128 against the plain model without the
#      graph: bench_graph_d128.{json,md};
#   4. compile: the bench's --torch-compile rows (mode reduce-overhead) at d = 128 for the plain
#      model and four connections, against the plain model without it: bench_compile_d128.
#      {json,md} (which of graph and compile comes closer; compiling takes its time in the
#      bench's warm-up);
#   5. equality: 200 WikiText-2 updates of the comparison's recipe in fp32 with the kernels,
#      without them, and with --cuda-graph (the same loss curve within fp32 rounding), and in
#      fp16: fp16_check/results.{json,md}.
#   6. anchors: fla-core's fused AttnRes read against ours (function and time) and
#      TransformerEngine's Triton Sinkhorn against ours (scripts/bench/anchors.py), from
#      .gpu-wheels: anchors.{json,md}.
# After the stages, scripts/bench/gpu_targets.py checks the issue's targets against the bench
# reports in OUT (this call's and an earlier call's): targets.{json,md}.
#   [OUT=DIR] [PYTHON=python3] [STAGES="tests bench graph compile equality anchors"]
#   [FAIRSEQ_SRC=DIR]
#   bash scripts/bench/gpu_check.sh
# STAGES runs a subset (a lease too short for all five in one call). Needs a CUDA GPU, a Python
# with torch and triton, and data-bin/wikitext-2 (python scripts/prepare/lm.py --dataset
# wikitext-2). fairseq and this package are installed first where missing, without network:
# from .gpu-wheels/ (scripts/bench/gpu_wheels.sh makes it; carry it and data-bin/wikitext-2 to a
# machine that has neither); fairseq runs from its source there, with only its two Cython
# modules built.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-results/gpu_check}
PY=${PYTHON:-python3}
STAGES=${STAGES:-tests bench graph compile equality anchors}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
stage() { [[ " $STAGES " == *" $1 "* ]]; }
# bench NAME WIDTH BATCH ROWS: the depth bench at 12 blocks in fp16 -> $OUT/NAME.{json,md}
bench() {
    SECONDS=0
    "$PY" scripts/bench/depth.py --device cuda --fp16 --depths 12 --embed-dim "$2" \
        --batch "$3" --rows "$4" --out "$OUT/$1.json" > /dev/null
    "$PY" -c "import json, sys; from layerlab import paths
print(paths.load_script('bench', 'depth.py').markdown_table(json.load(open(sys.argv[1]))))" \
        "$OUT/$1.json" | tee "$OUT/$1.md"
    echo "[gpu_check] $1: ${SECONDS}s" >&2
}
if ! "$PY" -c "import fairseq" 2>/dev/null; then
    "$PY" -m pip install -q --no-index --no-deps --no-build-isolation .gpu-wheels/*-none-any.whl \
        .gpu-wheels/*-cp3*-manylinux*.whl .gpu-wheels/antlr4*.tar.gz
    # fairseq from its source, not installed: of its compiled parts this check uses only the
    # two Cython modules (batching, token blocks), built in place in seconds (its whole build,
    # C++ extensions included, took 158 s on an H200 machine); fairseq-train then runs as
    # python -m fairseq_cli.train (layerlab.paths.fairseq_command)
    SECONDS=0
    src=${FAIRSEQ_SRC:-/tmp/fairseq-src}
    mkdir -p "$src"
    tar xzf .gpu-wheels/fairseq_fixed-*.tar.gz -C "$src" --strip-components 1
    (cd "$src" && "$PY" -c "
from Cython.Build import cythonize
from setuptools import Extension, setup
import numpy
setup(script_args=['build_ext', '--inplace', '-q'], ext_modules=cythonize([Extension(
    'fairseq.data.' + name, ['fairseq/data/' + name + '.pyx'], include_dirs=[numpy.get_include()],
    language='c++', extra_compile_args=['-std=c++11', '-O3'])
    for name in ('data_utils_fast', 'token_block_utils_fast')], quiet=True))")
    export PYTHONPATH=$src${PYTHONPATH:+:$PYTHONPATH}
    echo "[gpu_check] fairseq's Cython modules built in ${SECONDS}s" >&2
fi
# this package and its experiment library from the tree (scripts run as files do not see the
# current directory)
(cd / && "$PY" -c "import fairseq_plugins, layerlab" 2>/dev/null) || export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
"$PY" -c "import torch, triton; print('[gpu_check]', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())"
# every row with a kernel, beside its eager twin (--no-fused-kernels); the methods without one
FUSED=hc_static_n4,hc_dynamic_n4,mhc_n4,mhc_lite_n4,frac_dynamic_m4,attn_res_full,attn_res_block,mudd
ROWS=$FUSED,${FUSED//,/_eager,}_eager,dwa,value_residual
GRAPH_ROWS=plain_graph,${FUSED//,/_graph,}_graph,dwa_graph,value_residual_graph
COMPILE_ROWS=plain_compile,hc_dynamic_n4_compile,mhc_n4_compile,attn_res_full_compile,mudd_compile
if stage tests; then
    SECONDS=0
    "$PY" -m pytest -q -p no:cacheprovider tests/kernels 2>&1 | tee "$OUT/kernel_tests.txt"
    echo "[gpu_check] kernel tests: ${SECONDS}s" >&2
fi
if stage bench; then
    # d = 1024 at batch 64: at the comparison's 16 the plain fp16 step is launch-bound even
    # there (25 ms at d = 128 and d = 1024 on an H200), so the d = 1024 targets need a batch
    # whose plain step is arithmetic; the eager twins are measured at d = 128 only
    bench bench_depth_d128 128 16 "$ROWS"
    bench bench_depth_d1024 1024 64 "$FUSED,dwa,value_residual"
fi
if stage graph; then
    # the training passes of the blocks as a CUDA graph (--cuda-graph), against the plain
    # model without it in the same process: what the launches cost
    bench bench_graph_d128 128 16 "$GRAPH_ROWS"
fi
if stage compile; then
    # the same blocks through torch.compile (--torch-compile, reduce-overhead): inductor's
    # kernels from the eager code, replayed by torch's CUDA graphs
    bench bench_compile_d128 128 16 "$COMPILE_ROWS"
fi
if stage equality; then
    SECONDS=0
    "$PY" scripts/experiments/lm_fp16_check.py --data data-bin/wikitext-2 --depth 12 --updates 200 \
        --rows baseline,hc_static,hc_dynamic,mhc,mhc_lite,frac_connections,attn_res_full,attn_res_block,mudd --eager --graph --jobs 9 \
        --out-dir "$OUT/fp16_check"
    echo "[gpu_check] 200-update equality: ${SECONDS}s" >&2
fi
if stage anchors; then
    SECONDS=0
    anchors=/tmp/gpu-anchors
    mkdir -p "$anchors"
    "$PY" -m pip install -q --no-index --no-deps --target "$anchors" .gpu-wheels/fla_core-*.whl \
        .gpu-wheels/einops-*.whl || true
    "$PY" -m zipfile -e .gpu-wheels/transformer_engine-*-none-any.whl "$anchors/te" || true
    PYTHONPATH="$anchors${PYTHONPATH:+:$PYTHONPATH}" "$PY" scripts/bench/anchors.py \
        --te-mhc "$anchors/te/transformer_engine/common/triton/mhc.py" --out "$OUT/anchors.json" \
        > /dev/null || echo "[gpu_check] anchors failed" >&2
    echo "[gpu_check] anchors: ${SECONDS}s" >&2
fi
# the issue's targets against whatever the stages above (this call's or an earlier one's) left
# in $OUT: targets.{json,md}
"$PY" scripts/bench/gpu_targets.py "$OUT"
