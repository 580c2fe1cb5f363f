"""Every MoE backend, by name (= its pytest marker). Importing this imports no GPU library."""

from __future__ import annotations

from moebench.gemm.backends.base import Backend, Built
from moebench.gemm.backends.torch_backends import TORCH_BACKENDS
from moebench.gemm.backends.triton_backend import TRITON_BACKENDS
from moebench.gemm.backends.vllm_backends import VLLM_BACKENDS
from moebench.gemm.backends.flashinfer_backend import FLASHINFER_BACKENDS

BACKENDS: dict[str, Backend] = {b.name: b for b in (*TORCH_BACKENDS, *TRITON_BACKENDS, *VLLM_BACKENDS,
                                                     *FLASHINFER_BACKENDS)}

__all__ = ["BACKENDS", "Backend", "Built"]
