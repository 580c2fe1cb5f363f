"""Quantized expert-weight formats the Triton MoE kernels read, and torch helpers to build them.

Formats (all weights are expert-stacked [E, N, K], K the reduction dim):

  int4_w4a16   symmetric int4 q in [-8, 7], dequant = q * scale[e, n, k // group]; group 32 or 128.
               Packed 2 per uint8 along K with zero point 8: byte i of a row holds k = 2i in its low
               nibble and k = 2i + 1 in its high nibble, each stored as q + 8 (vLLM's fused_moe layout).
               data [E, N, K // 2] uint8, scale [E, N, K // group] float32 or bfloat16.
  fp8_w8a8     float8_e4m3fn weights; group_size 0: one float32 scale per expert, scale [E];
               group_size 128: one per 128x128 block, scale [E, ceil(N / 128), ceil(K / 128)]
               (DeepSeek-V3). Activations are quantized on the fly: per token (row) with group 0,
               per 1x128 group with group 128; scale = max|x| / 448 over the row or group.
  nvfp4_w4a16  e2m1 codes (bit 3 sign, bits 0-2 index into moebench.gemm.quant.E2M1_VALUES) packed 2 per uint8 like int4
               (low nibble = even k, no zero point); dequant = value * scale[e, n, k // 16] * gscale[e],
               scale float8_e4m3fn [E, N, K // 16], gscale float32 [E].
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from moebench.gemm.quant import (FP8_MAX, QuantWeight, pack_int4_uint4b8, pack_nibbles, quantize,
                                 unpack_int4_uint4b8, unpack_nibbles)

KINDS = ("int4_w4a16", "fp8_w8a8", "nvfp4_w4a16")
# The names users see are the gemm family's dtypes (moebench.gemm.cases.DTYPES): config-table keys,
# config_for's lookup, the sweep's --dtypes, results. A Quant's (kind, group_size) is the kernels' own
# description of the layout, named after vLLM's quant methods whose layouts they follow; this table is
# the one translation between the two.
DTYPE_FORMATS = {"int4-g32": ("int4_w4a16", 32), "int4-g128": ("int4_w4a16", 128), "fp8-tensor": ("fp8_w8a8", 0),
                 "fp8-block128": ("fp8_w8a8", 128), "nvfp4": ("nvfp4_w4a16", 16)}
_FORMAT_DTYPES = {fmt: dtype for dtype, fmt in DTYPE_FORMATS.items()}


@dataclass(frozen=True)
class Quant:
    """How the expert weights passed to fused_moe / grouped_gemm are quantized.

    kind: "int4_w4a16", "fp8_w8a8" or "nvfp4_w4a16" (see the module docstring for layouts).
    group_size: int4: 32 or 128; fp8: 0 (per-tensor weight, per-token activation) or 128 (block);
      nvfp4: 16.
    scales: one scale tensor per weight tensor, in argument order: (w1_scale, w2_scale) for
      fused_moe, (w_scale,) for grouped_gemm.
    global_scales: nvfp4 only, one float32 [E] tensor per weight tensor, same order.
    """

    kind: str
    group_size: int
    scales: tuple
    global_scales: tuple = ()

    def __post_init__(self):
        allowed = {"int4_w4a16": (32, 128), "fp8_w8a8": (0, 128), "nvfp4_w4a16": (16,)}
        if self.kind not in allowed:
            raise ValueError(f"unknown quant kind {self.kind!r} (known: {', '.join(KINDS)})")
        if self.group_size not in allowed[self.kind]:
            raise ValueError(f"{self.kind} supports group_size {allowed[self.kind]}, got {self.group_size}")
        if self.kind == "nvfp4_w4a16" and len(self.global_scales) != len(self.scales):
            raise ValueError("nvfp4_w4a16 needs one global scale per weight tensor")

    @classmethod
    def for_dtype(cls, dtype: str, scales: tuple, global_scales: tuple = ()) -> "Quant":
        """The Quant of a gemm-family dtype ("int4-g32", "fp8-block128", "nvfp4", ...)."""
        if dtype not in DTYPE_FORMATS:
            raise ValueError(f"no quantized format for dtype {dtype!r} (known: {', '.join(DTYPE_FORMATS)})")
        kind, group = DTYPE_FORMATS[dtype]
        return cls(kind, group, scales, global_scales)

    @property
    def dtype(self) -> str:
        """The gemm family's name of this format, e.g. "int4-g32"."""
        return _FORMAT_DTYPES[(self.kind, self.group_size)]


# The format math (scales, rounding) and the 4-bit packing live in moebench.gemm.quant, shared with
# every other backend; this module only puts them together in the kernels' argument layout.
def _canonical(fmt: str, w: torch.Tensor) -> QuantWeight:
    return quantize(w, fmt)


def quantize_int4(w: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int4 with one float32 scale per `group_size` elements along K.

    w: [E, N, K] float. Returns (packed uint8 [E, N, K // 2], scale float32 [E, N, K // group_size]).
    """
    qw = _canonical(f"int4-g{group_size}", w)
    return pack_int4_uint4b8(qw.q), qw.scale


def dequantize_int4(packed: torch.Tensor, scale: torch.Tensor, group_size: int) -> torch.Tensor:
    """float32 [E, N, K] from quantize_int4's outputs."""
    return QuantWeight(f"int4-g{group_size}", unpack_int4_uint4b8(packed), scale).dequantize()


def quantize_fp8(w: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """float8_e4m3fn weights. group_size 0: scale [E] (per expert); 128: scale [E, ceil(N/128), ceil(K/128)]."""
    qw = _canonical("fp8-tensor" if group_size == 0 else "fp8-block128", w)
    return qw.q, qw.scale


def dequantize_fp8(q: torch.Tensor, scale: torch.Tensor, group_size: int) -> torch.Tensor:
    """float32 [E, N, K] from quantize_fp8's outputs."""
    return QuantWeight("fp8-tensor" if group_size == 0 else "fp8-block128", q, scale).dequantize()


def quantize_nvfp4(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """nvfp4: returns (packed uint8 [E, N, K // 2], block scale float8_e4m3fn [E, N, K // 16], global float32 [E])."""
    qw = _canonical("nvfp4", w)
    return pack_nibbles(qw.q), qw.scale, qw.global_scale


def dequantize_nvfp4(packed: torch.Tensor, bscale: torch.Tensor, gscale: torch.Tensor) -> torch.Tensor:
    """float32 [E, N, K] from quantize_nvfp4's outputs."""
    return QuantWeight("nvfp4", unpack_nibbles(packed), bscale, gscale).dequantize()


def quantize_weight(w: torch.Tensor, kind: str, group_size: int):
    """Quantize one [E, N, K] weight. Returns (data, scale, global_scale or None)."""
    if kind == "int4_w4a16":
        return (*quantize_int4(w, group_size), None)
    if kind == "fp8_w8a8":
        return (*quantize_fp8(w, group_size), None)
    if kind == "nvfp4_w4a16":
        return quantize_nvfp4(w)
    raise ValueError(f"unknown quant kind {kind!r}")


def dequantize_weight(data: torch.Tensor, quant: Quant, index: int = 0) -> torch.Tensor:
    """float32 [E, N, K] of weight tensor number `index` (0: w1 / w, 1: w2) under `quant`."""
    scale = quant.scales[index]
    if quant.kind == "int4_w4a16":
        return dequantize_int4(data, scale, quant.group_size)
    if quant.kind == "fp8_w8a8":
        return dequantize_fp8(data, scale, quant.group_size)
    return dequantize_nvfp4(data, scale, quant.global_scales[index])


def quantize_moe(w1: torch.Tensor, w2: torch.Tensor, kind: str, group_size: int):
    """Quantize both MoE weights: returns (w1_data, w2_data, Quant) ready for fused_moe."""
    d1, s1, g1 = quantize_weight(w1, kind, group_size)
    d2, s2, g2 = quantize_weight(w2, kind, group_size)
    gs = (g1, g2) if g1 is not None else ()
    return d1, d2, Quant(kind, group_size, (s1, s2), gs)


def fake_quant_fp8_act(x: torch.Tensor, group_size: int) -> torch.Tensor:
    """float32 copy of x after the kernels' dynamic fp8 activation quantization (per row if
    group_size is 0, else per 1 x group_size group), for references."""
    x = x.float()
    rows, K = x.shape
    g = K if group_size == 0 else group_size
    xg = x.reshape(rows, K // g, g)
    scale = xg.abs().amax(-1, keepdim=True).clamp_min(1e-10) / FP8_MAX
    q = (xg / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return (q.float() * scale).reshape(rows, K)
