"""Expert GEMM cases: frozen records built from named axes, with deterministic ids and the default
selection (the rest is marked `full`)."""

from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass

from moebench.gemm.presets import PRESETS
from moebench.gemm.routing import ROUTINGS

OPS = ("expert", "gemm1", "gemm2", "fused")
M_VALUES = (1, 2, 4, 8, 16, 32, 64, 128, 512)
# Weight formats. fp8 is w8a8 (activations quantized on the fly); int4 and nvfp4 are weight-only (a16).
DTYPES = ("bf16", "fp8-tensor", "fp8-block128", "int4-g32", "int4-g128", "nvfp4")
BACKENDS = ("torch_loop", "torch_bmm", "torch_grouped_mm", "triton", "triton_rows4", "triton_experts", "triton_fused",
            "vllm_triton", "vllm_marlin", "flashinfer_cutlass")
ROTATIONS = 16  # distinct routings and inputs per CUDA graph (see workload.py on the L2 trap)


@dataclass(frozen=True)
class GemmCase:
    """One (shape, op, M, dtype, routing, backend) point."""

    model: str
    tp: int
    op: str
    m: int
    dtype: str
    routing: str
    backend: str

    @property
    def preset(self):
        return PRESETS[self.model]

    @property
    def intermediate(self) -> int:
        return self.preset.intermediate_per_rank(self.tp)

    @property
    def shape_id(self) -> str:
        """Everything but the backend: all backends of one shape share it (pytest-benchmark group)."""
        return f"{self.model}-tp{self.tp}-{self.op}-m{self.m}-{self.dtype}-{self.routing}"

    @property
    def id(self) -> str:
        return f"{self.shape_id}-{self.backend}"

    @property
    def key(self) -> str:
        """The baseline key: the id rendered from the axes, never a file path."""
        return f"gemm[{self.id}]"

    def definition(self) -> dict:
        """What shapes the measurement: axes, derived sizes, rotations, seed."""
        p = self.preset
        return {**asdict(self), "hidden": p.hidden, "intermediate": self.intermediate, "experts": p.experts,
                "topk": p.topk, "rotations": ROTATIONS, "seed": self.seed}

    @property
    def seed(self) -> int:
        # Derived from the shape (not the backend) so every backend of a shape sees the same data.
        return sum(ord(c) * (i + 1) for i, c in enumerate(self.shape_id)) % (2**31)


def _all_cases():
    for model, op, m, dtype, routing, backend in itertools.product(PRESETS, OPS, M_VALUES, DTYPES, ROUTINGS, BACKENDS):
        yield GemmCase(model, 8, op, m, dtype, routing, backend)


# The default selection: what a nightly run on one H200 finishes in a few minutes, and what answers
# the users' questions: the headline Kimi shape for every backend, the three models' fused MoE for the
# fast backends at decode M, each quantized format on the backends that take it. The rest is `full`.
_FAST = ("triton", "triton_rows4", "triton_experts", "vllm_triton", "vllm_marlin", "flashinfer_cutlass")
_TORCH = ("torch_loop", "torch_bmm", "torch_grouped_mm")
# int4-g32 fused decode M in the default selection, per model. Issue 32 asks for committed H200 entries at
# M = 1, 2, 4, 8, 16 and 64 ("faster than Marlin at every M up to 64", so 32 too: where the grouped path is
# predicted to cross Marlin); a GPU session measures only what is in the default, so they must be here
# (tests/test_gemm_cases.py fails if one drops out). Kimi keeps 128, where
# the grouped path was measured at half Marlin's speed (docs/triton-moe-notes.md, "Issue 32").
INT4_DEFAULT_M = {"kimi-k2.5": (1, 2, 4, 8, 16, 32, 64, 128), "deepseek-v3": (1, 2, 4, 8, 16, 32, 64)}


# Backends outside the default selection at every case: experiments kept for comparison, not for the nightly
# run. The one-launch int4 kernel (issue 32's version 7) measured 1.6 us slower than `triton`'s two launches at
# M = 1 on an H200 (session 24: 15.8-15.9 against 14.0-14.3 us); it joins if a later version wins.
_COMPARISON_ONLY = ("triton_fused",)


def is_default(c: GemmCase) -> bool:
    """Whether a case is in the default selection (the rest carries the `full` marker)."""
    if c.backend in _COMPARISON_ONLY:
        return False
    if c.model == "tiny":
        return c.routing == "decode" and c.m in (1, 4, 16) and (
            c.dtype == "bf16" or c.op == "fused" and c.dtype in ("int4-g32", "fp8-block128"))
    if c.routing != "decode":
        return c.model == "kimi-k2.5" and c.op == "fused" and c.m == 128 and c.dtype == "bf16" and c.backend in (
            "triton", "vllm_triton")
    if c.model == "kimi-k2.5" and c.dtype == "bf16":
        if c.op == "fused":
            return c.m in ((1, 2, 4, 8, 16, 32, 128, 512) if c.backend in _FAST else (1, 16, 128))
        if c.op == "expert":
            return c.m in (1, 4, 16, 128)
        return c.backend in ("torch_bmm", "torch_grouped_mm", "triton") and c.m in (1, 128)
    if c.op != "fused" or c.backend in _TORCH:
        return False
    if c.dtype == "bf16":
        return c.model == "deepseek-v3" and c.m in (1, 2, 4, 8, 16, 128) or c.model == "glm-5" and c.m in (1, 16, 128)
    if c.dtype == "int4-g32":
        # Issue 32's M (1-64; Kimi also 128) on the two 7168-wide shapes: where our int4 kernels meet
        # Marlin. The backends are every non-torch one that takes int4-g32 (Backend.supports filters the
        # rest): triton, vllm_triton and vllm_marlin at every M, triton_rows4 only to its max_m 16;
        # flashinfer_cutlass takes no int4. So M = 32 and 64 have M = 128's set: ours, and both of vLLM's.
        return c.m in INT4_DEFAULT_M.get(c.model, ())
    if c.dtype == "fp8-block128":
        return c.model == "deepseek-v3" and c.m in (1, 4, 16, 128)
    if c.dtype == "nvfp4":
        return c.model == "glm-5" and c.m in (1, 16)
    return False


ALL_CASES: tuple[GemmCase, ...] = tuple(_all_cases())
