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
  nvfp4_w4a16  e2m1 codes (bit 3 sign, bits 0-2 index into E2M1_VALUES) packed 2 per uint8 like int4
               (low nibble = even k, no zero point); dequant = value * scale[e, n, k // 16] * gscale[e],
               scale float8_e4m3fn [E, N, K // 16], gscale float32 [E].
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

FP8_MAX = 448.0
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
KINDS = ("int4_w4a16", "fp8_w8a8", "nvfp4_w4a16")


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

    @property
    def key(self) -> str:
        """Short name used in config tables and results, e.g. "int4_w4a16-g32"."""
        return f"{self.kind}-g{self.group_size}"


def pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """Pack 4-bit codes (uint8 0..15) [..., K] into bytes [..., K // 2]; even k in the low nibble."""
    if codes.shape[-1] % 2:
        raise ValueError("K must be even to pack two 4-bit values per byte")
    c = codes.to(torch.uint8)
    return c[..., 0::2] | (c[..., 1::2] << 4)


def unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    """Inverse of pack_nibbles: bytes [..., K // 2] -> codes uint8 [..., K]."""
    lo, hi = packed & 15, packed >> 4
    return torch.stack((lo, hi), dim=-1).flatten(-2)


def quantize_int4(w: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int4 with one float32 scale per `group_size` elements along K.

    w: [E, N, K] float. Returns (packed uint8 [E, N, K // 2], scale float32 [E, N, K // group_size]).
    """
    E, N, K = w.shape
    if K % group_size:
        raise ValueError(f"K={K} is not a multiple of group_size={group_size}")
    wg = w.float().reshape(E, N, K // group_size, group_size)
    scale = (wg.abs().amax(-1) / 7.0).clamp_min(1e-8)
    q = torch.round(wg / scale.unsqueeze(-1)).clamp(-8, 7).reshape(E, N, K)
    return pack_nibbles((q + 8).to(torch.uint8)), scale


def dequantize_int4(packed: torch.Tensor, scale: torch.Tensor, group_size: int) -> torch.Tensor:
    """float32 [E, N, K] from quantize_int4's outputs."""
    q = unpack_nibbles(packed).float() - 8.0
    E, N, K = q.shape
    return (q.reshape(E, N, K // group_size, group_size) * scale.float().unsqueeze(-1)).reshape(E, N, K)


def quantize_fp8(w: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """float8_e4m3fn weights. group_size 0: scale [E] (per expert); 128: scale [E, ceil(N/128), ceil(K/128)]."""
    E, N, K = w.shape
    w = w.float()
    if group_size == 0:
        scale = (w.abs().amax(dim=(1, 2)) / FP8_MAX).clamp_min(1e-12)
        return (w / scale.view(E, 1, 1)).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn), scale
    nb, kb = -(-N // 128), -(-K // 128)
    padded = w.new_zeros(E, nb * 128, kb * 128)
    padded[:, :N, :K] = w
    scale = (padded.view(E, nb, 128, kb, 128).abs().amax(dim=(2, 4)) / FP8_MAX).clamp_min(1e-12)
    q = (w / _block_scale_expand(scale, N, K)).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q, scale


def dequantize_fp8(q: torch.Tensor, scale: torch.Tensor, group_size: int) -> torch.Tensor:
    """float32 [E, N, K] from quantize_fp8's outputs."""
    E, N, K = q.shape
    if group_size == 0:
        return q.float() * scale.float().view(E, 1, 1)
    return q.float() * _block_scale_expand(scale.float(), N, K)


def _block_scale_expand(scale: torch.Tensor, N: int, K: int) -> torch.Tensor:
    return scale.repeat_interleave(128, 1).repeat_interleave(128, 2)[:, :N, :K]


def quantize_nvfp4(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """nvfp4: returns (packed uint8 [E, N, K // 2], block scale float8_e4m3fn [E, N, K // 16], global float32 [E])."""
    E, N, K = w.shape
    if K % 16:
        raise ValueError(f"K={K} is not a multiple of 16")
    w = w.float()
    gscale = (w.abs().amax(dim=(1, 2)) / (6.0 * FP8_MAX)).clamp_min(1e-12)
    wb = w.reshape(E, N, K // 16, 16) / gscale.view(E, 1, 1, 1)
    bscale = (wb.abs().amax(-1) / 6.0).clamp_min(2.0 ** -9).to(torch.float8_e4m3fn)
    x = wb / bscale.float().unsqueeze(-1)
    # nearest e2m1 magnitude: the midpoints between consecutive codes are the bucket edges
    values = torch.tensor(E2M1_VALUES, device=w.device)
    code = torch.bucketize(x.abs().clamp(max=6.0), (values[1:] + values[:-1]) / 2)
    codes = (code | ((x < 0).long() << 3)).to(torch.uint8).reshape(E, N, K)
    return pack_nibbles(codes), bscale, gscale


def dequantize_nvfp4(packed: torch.Tensor, bscale: torch.Tensor, gscale: torch.Tensor) -> torch.Tensor:
    """float32 [E, N, K] from quantize_nvfp4's outputs."""
    codes = unpack_nibbles(packed).long()
    values = torch.tensor(E2M1_VALUES, device=packed.device)
    mag = values[codes & 7]
    val = torch.where(codes >= 8, -mag, mag)
    E, N, K = val.shape
    s = bscale.float().repeat_interleave(16, 2) * gscale.float().view(E, 1, 1)
    return val * s


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
