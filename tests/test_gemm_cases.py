"""The gemm family's default selection (moebench.gemm.cases.is_default): the cases a GPU session measures
without `-m full`. Pure: no GPU, no weights, nothing timed."""

from __future__ import annotations

import pytest

from moebench.gemm.backends import BACKENDS
from moebench.gemm.cases import ALL_CASES, INT4_DEFAULT_M, GemmCase, is_default

# Issue 32 asks for committed H200 entries of our int4 backend against Marlin at these M on both shapes.
ISSUE_32_M = (1, 2, 4, 8, 16, 32, 64)
SHAPES = ("kimi-k2.5", "deepseek-v3")


def default_cases() -> list[GemmCase]:
    """What benchmarks/test_gemm.py generates without `full`: supported and in the default selection."""
    return [c for c in ALL_CASES if BACKENDS[c.backend].supports(c) and is_default(c)]


def int4(model: str, m: int, backend: str) -> GemmCase:
    """The int4-g32 fused decode-routing case at tp 8 (issue 32's cases)."""
    return GemmCase(model, 8, "fused", m, "int4-g32", "decode", backend)


@pytest.mark.parametrize("model", SHAPES)
@pytest.mark.parametrize("backend", ["triton", "vllm_marlin"])
def test_issue_32s_int4_m_are_in_the_default_selection(model, backend):
    """A GPU session measures only the default selection: without M = 64 here, issue 32's "faster than
    Marlin at every M up to 64" has no case to measure or gate."""
    generated = {c.id for c in default_cases()}
    missing = [int4(model, m, backend).id for m in ISSUE_32_M if int4(model, m, backend).id not in generated]
    assert not missing, f"issue 32's int4 cases outside the default selection: {missing}"


@pytest.mark.parametrize("model", SHAPES)
def test_int4_m64_runs_the_backends_of_m128(model):
    """M = 64 compares the same int4 backends as M = 128 (Kimi's, the one larger M measured before): ours (the
    grouped path and the expert-major kernel) and both of vLLM's paths; triton_rows4 stops at its max_m 16 and
    flashinfer_cutlass takes no int4."""
    at = {m: {c.backend for c in default_cases() if c.model == model and c.dtype == "int4-g32" and c.m == m}
          for m in (16, 64)}
    assert at[64] == {"triton", "triton_experts", "vllm_triton", "vllm_marlin"}
    assert at[16] == at[64] | {"triton_rows4"}
    assert at[64] == {c.backend for c in default_cases() if c.model == "kimi-k2.5" and c.dtype == "int4-g32"
                      and c.m == 128}


def test_int4_default_m_per_model():
    """The int4-g32 M of the default selection are INT4_DEFAULT_M's, nothing else (no glm-5 int4)."""
    got = {}
    for c in default_cases():
        if c.dtype == "int4-g32" and c.model != "tiny":
            got.setdefault(c.model, set()).add(c.m)
    assert got == {k: set(v) for k, v in INT4_DEFAULT_M.items()}
    assert set(ISSUE_32_M) <= got["kimi-k2.5"] and set(ISSUE_32_M) <= got["deepseek-v3"]


def test_default_selection_size():
    """README.md ("Nightly on every GPU") counts this selection: 251 gemm cases collected (22 of them
    flashinfer_cutlass, which skip where FlashInfer is not staged), 4,897 outside it (`full`). Change the
    README with this number."""
    cases = default_cases()
    assert len(cases) == 251
    assert sum(c.backend == "flashinfer_cutlass" for c in cases) == 22
    assert sum(BACKENDS[c.backend].supports(c) for c in ALL_CASES) - len(cases) == 4897
