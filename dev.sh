#!/usr/bin/env bash
# Set up and run from nothing but Python 3.11 + pip:
#   bash dev.sh quickstart   # venv + install, then SCAN -> transformer, LRF, FC bridge -> table + analysis
#   bash dev.sh test         # venv + install, then the test suite
#   bash dev.sh setup        # venv + install only
# The virtual environment is $VENV (default .venv) and is reused once installed.
set -euo pipefail
cd "$(dirname "$0")"
VENV=${VENV:-.venv}
TORCH_VERSION=${TORCH_VERSION:-2.13.0}
PYTHON=${PYTHON:-$(command -v python3.11 || command -v python3)}

setup() {
    local stamp="$VENV/.installed"
    if [ -f "$stamp" ] && [ "$stamp" -nt setup.py ] && [ "$stamp" -nt dev.sh ]; then
        return
    fi
    echo "== setting up $VENV (torch $TORCH_VERSION, fairseq, this package) =="
    "$PYTHON" -m venv "$VENV"
    # --no-compile, then compileall on every core: pip byte-compiles each package's files on one
    # core (most of the install's CPU time), and imports need the .pyc files where
    # PYTHONDONTWRITEBYTECODE is set (as on these machines), or every fresh interpreter
    # compiles torch again
    local pip=("$VENV/bin/python" -m pip install -q --no-compile)
    "${pip[@]}" --upgrade pip setuptools wheel
    "${pip[@]}" "torch==$TORCH_VERSION"
    # fairseq-fixed compiles extensions against the torch installed above: no build isolation
    "${pip[@]}" cython numpy
    "${pip[@]}" --no-build-isolation -e ".[test,plot,hf,data,tensorboard]"
    # fairseq-fixed pulls in torchaudio, whose newest wheels (2.11) do not load under torch 2.13;
    # fairseq needs it only for speech tasks, but transformers imports it whenever it is installed
    if ! "$VENV/bin/python" -c "import torchaudio" >/dev/null 2>&1; then
        "$VENV/bin/python" -m pip uninstall -y -q torchaudio
    fi
    local site
    site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    # status 1 for files no 3.11 can compile (torch's py312_intrinsics.py), as pip skips them
    "$VENV/bin/python" -m compileall -q -j 0 "$site" >/dev/null || true
    touch "$stamp"
}

case "${1:-}" in
    setup) setup ;;
    quickstart) setup; PATH="$PWD/$VENV/bin:$PATH" bash scripts/quickstart.sh "${@:2}" ;;
    test)
        setup
        set +e
        # --maxschedchunk 1: xdist hands out tests one at a time, not a first chunk of an
        # eighth of the suite per worker, which gave the first worker every long test that
        # tests/conftest.py's LONG_FIRST puts at the front
        "$VENV/bin/python" -m pytest -q -n "${PYTEST_WORKERS:-auto}" --maxschedchunk 1 \
            --durations=15 tests "${@:2}"
        rc=$?
        # pytest exits 5 when it collected no test: that is a failure, not a pass
        [ $rc -eq 5 ] && echo "dev.sh: pytest ran no test" >&2
        exit $rc ;;
    *) echo "usage: bash dev.sh {quickstart|test|setup} [args...]" >&2; exit 2 ;;
esac
