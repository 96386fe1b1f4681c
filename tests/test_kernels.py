"""The Triton kernels, checked without a GPU: tests/kernels/ in a child pytest under Triton's
interpreter (TRITON_INTERPRET=1 must be set before the kernels are defined, and in this process
it would send every multi-stream model of the other tests through the interpreter). On a GPU,
scripts/bench/gpu_check.sh runs tests/kernels/ with the real compiler."""
import importlib.util
import os
import subprocess
import sys

import pytest
import torch

from conftest import TESTS, cli_env
from fairseq_plugins.depth import fused


@pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                    reason="Triton is not installed (the test extra installs it)")
def test_kernels_under_the_triton_interpreter():
    env = dict(cli_env(), TRITON_INTERPRET="1", OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           os.path.join(TESTS, "kernels")], capture_output=True, text=True,
                          env=env, cwd=os.path.dirname(TESTS))
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    assert " passed" in proc.stdout and "skipped" not in proc.stdout, proc.stdout[-2000:]


def test_a_plain_cpu_runs_the_eager_code():
    """Without the interpreter a CPU tensor never takes a fused path, whatever the option."""
    if fused.interpreting():
        pytest.skip("this process runs Triton's interpreter")
    assert not fused.runs_on(torch.zeros(1))
