"""int4 and fp4 weight repacking into the layouts vLLM's MoE kernels read: pure torch, any device, tested on
CPU (the layouts are described in moebench.gemm.backends.vllm_backends). The two-codes-per-byte packing
itself is moebench.gemm.quant.pack_nibbles, shared with the Triton and FlashInfer backends."""

from __future__ import annotations


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
