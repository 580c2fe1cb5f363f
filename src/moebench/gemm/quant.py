"""Canonical quantized weights: the integer/fp8 values and scales every backend repacks from.

The correctness reference for a quantized case uses the dequantized weights, so a check measures the
kernel, not the format's rounding (fp8 w8a8 also rounds activations: its bound is looser).
"""

from __future__ import annotations

from dataclasses import dataclass

FP8_MAX = 448.0  # float8_e4m3fn
# e2m1 (nvfp4) magnitudes by 3-bit code; the 4th bit is the sign.
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


@dataclass
class QuantWeight:
    """One expert-stacked weight [E, N, K] in a quantized format.

    fmt: the case dtype ("int4-g32", "fp8-block128", ...).
    q: int4: int8 values in [-8, 7]; fp8: float8_e4m3fn; nvfp4: uint8 codes 0..15 (sign bit 3).
    scale: int4: [E, N, K // group] float32; fp8-tensor: [E] float32; fp8-block128: [E, N/128, K/128]
      float32; nvfp4: block scales [E, N, K // 16] as float8_e4m3fn.
    global_scale: nvfp4 only, [E] float32 (dequant = e2m1 * block_scale * global_scale).
    """

    fmt: str
    q: object
    scale: object
    global_scale: object = None

    @property
    def group(self) -> int | None:
        if self.fmt.startswith("int4-g"):
            return int(self.fmt.removeprefix("int4-g"))
        return {"fp8-block128": 128, "nvfp4": 16}.get(self.fmt)

    def dequantize(self):
        """float32 [E, N, K]."""
        import torch

        E, N, K = self.q.shape
        if self.fmt.startswith("int4"):
            g = self.group
            return (self.q.float().view(E, N, K // g, g) * self.scale.float().unsqueeze(-1)).view(E, N, K)
        if self.fmt == "fp8-tensor":
            return self.q.float() * self.scale.float().view(E, 1, 1)
        if self.fmt == "fp8-block128":
            return self.q.float() * _block_expand(self.scale.float(), N, K)
        if self.fmt == "nvfp4":
            table = torch.tensor(E2M1_VALUES, device=self.q.device)
            mag = table[(self.q & 7).long()]
            val = torch.where((self.q & 8) != 0, -mag, mag)
            s = self.scale.float().repeat_interleave(16, 2) * self.global_scale.float().view(E, 1, 1)
            return val * s
        raise ValueError(f"unknown format {self.fmt!r}")


def quantize(w, fmt: str) -> QuantWeight:
    """Quantize float weights [E, N, K] (any float dtype, any device) into a canonical QuantWeight."""
    import torch

    w = w.float()
    E, N, K = w.shape
    if fmt.startswith("int4-g"):
        g = int(fmt.removeprefix("int4-g"))
        if K % g:
            raise ValueError(f"K={K} is not a multiple of group_size={g}")
        wg = w.reshape(E, N, K // g, g)
        scale = (wg.abs().amax(-1) / 7.0).clamp_min(1e-8)  # symmetric, Kimi-K2.5's style
        q = torch.round(wg / scale.unsqueeze(-1)).clamp(-8, 7).to(torch.int8).reshape(E, N, K)
        return QuantWeight(fmt, q, scale)
    if fmt == "fp8-tensor":
        scale = (w.abs().amax(dim=(1, 2)) / FP8_MAX).clamp_min(1e-12)
        q = (w / scale.view(E, 1, 1)).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
        return QuantWeight(fmt, q, scale)
    if fmt == "fp8-block128":
        nb, kb = -(-N // 128), -(-K // 128)
        pad = w.new_zeros(E, nb * 128, kb * 128)
        pad[:, :N, :K] = w
        scale = (pad.view(E, nb, 128, kb, 128).abs().amax(dim=(2, 4)) / FP8_MAX).clamp_min(1e-12)
        q = (w / _block_expand(scale, N, K)).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
        return QuantWeight(fmt, q, scale)
    if fmt == "nvfp4":
        if K % 16:
            raise ValueError(f"K={K} is not a multiple of 16")
        global_scale = (w.abs().amax(dim=(1, 2)) / (6.0 * FP8_MAX)).clamp_min(1e-12)
        wb = w.reshape(E, N, K // 16, 16) / global_scale.view(E, 1, 1, 1)
        # 2^-9 is e4m3's smallest subnormal: a smaller scale would round to 0 and divide by it.
        block = (wb.abs().amax(-1) / 6.0).clamp_min(2.0**-9).to(torch.float8_e4m3fn)
        x = wb / block.float().unsqueeze(-1)
        # Nearest e2m1 magnitude: the midpoints between consecutive codes are the bucket edges.
        values = torch.tensor(E2M1_VALUES, device=w.device)
        code = torch.bucketize(x.abs().clamp(max=6.0), (values[1:] + values[:-1]) / 2)
        q = (code | ((x < 0).long() << 3)).to(torch.uint8).reshape(E, N, K)
        return QuantWeight(fmt, q, block, global_scale)
    raise ValueError(f"unknown format {fmt!r}")


def _block_expand(scale, n: int, k: int):
    """[E, N/128, K/128] block scales -> [E, N, K]."""
    return scale.repeat_interleave(128, 1).repeat_interleave(128, 2)[:, :n, :k]


# --- 4-bit packing: the one implementation every 4-bit layout (the Triton kernels', vLLM's fused_experts
# and Marlin inputs, FlashInfer's) is built from. -------------------------------------------------------
def pack_nibbles(codes):
    """uint8 codes 0..15 [..., K] -> uint8 [..., K/2]: element 2j in the low nibble, 2j+1 in the high
    one (the order of vLLM's int4 fused_experts kernels, of moebench's Triton kernels and of NVFP4
    checkpoints)."""
    import torch

    if codes.shape[-1] % 2:
        raise ValueError(f"pack_nibbles: last dim {codes.shape[-1]} is odd")
    c = codes.to(torch.uint8)
    if c.numel() and int(c.max()) > 15:
        raise ValueError("pack_nibbles: codes must lie in 0..15")
    return (c[..., 0::2] | (c[..., 1::2] << 4)).contiguous()


def unpack_nibbles(packed):
    """Inverse of pack_nibbles: uint8 [..., K/2] -> uint8 codes [..., K]."""
    import torch

    return torch.stack((packed & 0xF, packed >> 4), dim=-1).flatten(-2)


def int4_to_uint4b8(q):
    """Canonical int4 values (int8 in [-8, 7]) -> uint4b8 codes (q + 8, uint8 in 0..15)."""
    import torch

    if q.dtype != torch.int8:
        raise TypeError(f"int4 values must be int8, got {q.dtype}")
    if q.numel() and (int(q.min()) < -8 or int(q.max()) > 7):
        raise ValueError("int4 values must lie in [-8, 7]")
    return (q.to(torch.int16) + 8).to(torch.uint8)


def pack_int4_uint4b8(q):
    """int8 [E, N, K] in [-8, 7] -> uint8 [E, N, K/2]: nibble (k % 2) of byte k/2 holds q + 8 (zero point
    8, no zero-point tensor). vLLM's fused_experts int4_w4a16 and moebench's Triton kernels read this."""
    return pack_nibbles(int4_to_uint4b8(q))


def unpack_int4_uint4b8(packed):
    """Inverse of pack_int4_uint4b8: uint8 [..., K/2] -> int8 values [..., K] in [-8, 7]."""
    import torch

    return (unpack_nibbles(packed).to(torch.int16) - 8).to(torch.int8)
