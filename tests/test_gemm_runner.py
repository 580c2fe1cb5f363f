"""The GEMM runner's gate settings (CPU, no kernels timed that matter: the calls do nothing)."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from moebench.gemm import runner  # noqa: E402
from moebench.gemm.backends.base import Built  # noqa: E402
from moebench.gemm.cases import GemmCase  # noqa: E402
from moebench.gemm.workload import Workload  # noqa: E402


@pytest.fixture(scope="module")
def tiny_wl():
    return Workload(GemmCase("tiny", 8, "fused", 1, "bf16", "decode", "-"), "cpu", rotations=2)


def test_primary_time_takes_the_builds_tolerance(tiny_wl):
    """A build that declares a wider gate (vllm_triton's int4 workaround cases) gets it on its primary
    time; every other build keeps the family default."""
    calls = [lambda: None] * tiny_wl.R
    default, _ = runner.measure(Built(calls), tiny_wl, ceiling=1e11, l2_bytes=None)
    wide, _ = runner.measure(Built(calls, rel_tol=0.25), tiny_wl, ceiling=1e11, l2_bytes=None)
    assert default["wall_us"].rel_tol == 0.15
    assert wide["wall_us"].rel_tol == 0.25
