"""int4 and fp4 weight repacking into the layouts vLLM's MoE kernels read: pure torch, any device, tested on
CPU (the layouts are described in moebench.gemm.backends.vllm_backends)."""

from __future__ import annotations


def pack_nibbles(codes):
    """uint8 codes 0..15 [..., K] -> uint8 [..., K/2]: element 2j in the low nibble, 2j+1 in the high
    one (the order of vLLM's int4 fused_experts kernels and of NVFP4 checkpoints)."""
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
    """int8 [E, N, K] in [-8, 7] -> uint8 [E, N, K/2] as vLLM's fused_experts int4_w4a16 reads it:
    nibble (k % 2) of byte k/2 holds q + 8 (the kernels subtract 8 when no zero points are given)."""
    return pack_nibbles(int4_to_uint4b8(q))


def nibbles_to_gptq_int32(packed):
    """uint8 [E, N, K/2] (low nibble first) -> GPTQ qweight int32 [E, K/8, N]: element k of output
    column n at bits 4*(k % 8) of word [k/8, n]. This is the `b_q_weight` gptq_marlin_(moe_)repack
    takes, and exactly what vLLM's fp4 Marlin prep does with `weight.view(torch.int32).T` (CUDA and x86
    are little-endian, so byte b of a word lands at bits 8b)."""
    import torch

    if packed.dtype != torch.uint8 or packed.dim() != 3 or packed.shape[-1] % 4:
        raise ValueError(f"expected uint8 [E, N, K/2] with K/2 % 4 == 0, got {packed.dtype} {tuple(packed.shape)}")
    return packed.contiguous().view(torch.int32).transpose(1, 2).contiguous()


def unpack_gptq_int32(qweight):
    """Inverse of nibbles_to_gptq_int32, by plain shifts: int32 [E, K/8, N] -> uint8 codes [E, N, K]."""
    import torch

    E, k8, N = qweight.shape
    nib = torch.stack([(qweight >> (4 * j)) & 0xF for j in range(8)], dim=2)  # [E, K/8, 8, N]
    return nib.reshape(E, k8 * 8, N).transpose(1, 2).to(torch.uint8).contiguous()
