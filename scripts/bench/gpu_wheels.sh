#!/usr/bin/env bash
# The Python packages scripts/bench/gpu_check.sh needs that a GPU machine without network lacks,
# downloaded here into .gpu-wheels/ (git-ignored; carry it there with data-bin/wikitext-2).
# The lent H200 image (Python 3.12, torch 2.11, triton 3.6, numpy, cython, sacrebleu,
# sentencepiece, regex, pytest) has no fairseq: fairseq-fixed comes as its source (gpu_check.sh
# runs it from there, its Cython modules built in place), its pure-Python and compiled
# dependencies as wheels for the target's Python.
#   [PYTHON_VERSION=3.12] bash scripts/bench/gpu_wheels.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
DEST=.gpu-wheels
PYV=${PYTHON_VERSION:-3.12}
PIP=${PIP:-.venv/bin/pip}
mkdir -p "$DEST"
"$PIP" download -q --no-deps -d "$DEST" --no-binary fairseq-fixed fairseq-fixed==0.12.3.1
# the versions this repository's venv runs (dev.sh), for the target's Python and platform
"$PIP" download -q --no-deps -d "$DEST" --only-binary=:all: --python-version "$PYV" \
    --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64 \
    hydra-core==1.3.2 omegaconf==2.3.0 bitarray==3.12.3 subword-nmt==0.3.8 \
    mock portalocker tabulate colorama lxml
# the anchors of scripts/bench/anchors.py (gpu_check.sh's anchors stage): fla-core (pure
# Python and Triton) and TransformerEngine's meta wheel, whose Triton mHC file the stage reads
"$PIP" download -q --no-deps -d "$DEST" fla-core==0.6.0 einops transformer-engine==2.20.2
# antlr4's runtime (hydra's parser) is published as a source distribution only
"$PIP" download -q --no-deps -d "$DEST" antlr4-python3-runtime==4.9.3
ls "$DEST"
