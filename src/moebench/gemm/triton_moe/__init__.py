"""moebench's Triton MoE kernels: a decode-first fused MoE and per-expert grouped GEMMs.

    fused_moe(x, w1, w2, topk_weights, topk_ids, *, quant=None, config=None) -> [M, K]
    grouped_gemm(x, w, topk_ids, *, op, quant=None, config=None) -> [M, topk, N]
    config_for(M, K, N, E, topk, quant, *, op="fused", pdl=False) -> MoEConfig (.as_dict() to record)
    Quant, quantize_weight / quantize_moe / dequantize_weight: the quantized weight formats.

To run on CPU tensors, set TRITON_INTERPRET=1 before this package is first imported (the kernels are
built for the interpreter or the GPU at import). See docs/triton-moe-notes.md for the design.
"""

import triton

from .api import fused_moe, grouped_gemm, pdl_capable
from .config import KernelConfig, MoEConfig, config_for
from .quant import (Quant, dequantize_weight, fake_quant_fp8_act, pack_nibbles, quantize_moe, quantize_weight,
                    unpack_nibbles)
from .reference import fused_moe_ref, grouped_gemm_ref

if triton.knobs.runtime.interpret:
    from ._interpreter import patch

    patch()

__all__ = [
    "KernelConfig", "MoEConfig", "Quant", "config_for", "dequantize_weight", "fake_quant_fp8_act", "fused_moe",
    "fused_moe_ref", "grouped_gemm", "grouped_gemm_ref", "pack_nibbles", "pdl_capable", "quantize_moe",
    "quantize_weight", "unpack_nibbles",
]
