"""int4 W4A16 group-32 experts in the rows-4 layout, and the fused MoE that runs them (w4_kernel.py).

    pack_rows4(data, scale) -> W4Weight          from the generic int4 layout (quant.py): [E, N, K/2]
                                                 bytes (low nibble = even k, stored q + 8), bf16 scales
                                                 [E, N, K/32]
    from_compressed_tensors(packed, scale)       from vLLM's compressed-tensors tensors as loaded for
                                                 Marlin: int32 [E, K/8, N] (8 nibbles along K), scales
                                                 [E, K/32, N]
    fused_moe_w4(x, w1, w2, topk_weights, topk_ids, config=None) -> [M, K]

The layout (see w4_kernel.py for why): words [E, N/4, K/8, 4] int32, where [e, n // 4, kw, n % 4] holds
row n's k values 8 kw .. 8 kw + 7 (nibble j = k 8 kw + j, stored q + 8); scales [E, N/4, K/32, 4] bf16.
Packing is a one-time cost at load (a permute), not part of a call.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import triton

from .config import KernelConfig, m_bucket, table_entry
from .w4_kernel import moebench_w4_down, moebench_w4_gemv

GROUP = 32


@dataclass(frozen=True)
class W4Weight:
    """One expert weight stack [E, N, K] in the rows-4 layout."""

    words: torch.Tensor   # int32 [E, N/4, K/8, 4]
    scales: torch.Tensor  # bf16 [E, N/4, K/32, 4]

    @property
    def E(self) -> int:
        return self.words.shape[0]

    @property
    def N(self) -> int:
        return 4 * self.words.shape[1]

    @property
    def K(self) -> int:
        return 8 * self.words.shape[2]


def _rows4(t: torch.Tensor) -> torch.Tensor:
    """[E, N, X] -> [E, N/4, X, 4] contiguous."""
    E, N, X = t.shape
    # a fresh tensor, not .contiguous(): that keeps a size-1 dim's odd stride, and the int32 view
    # of the bf16 scales needs every stride even
    out = torch.empty((E, N // 4, X, 4), dtype=t.dtype, device=t.device)
    return out.copy_(t.reshape(E, N // 4, 4, X).permute(0, 1, 3, 2))


def _check_shapes(E: int, N: int, K: int, scale: torch.Tensor, where: str) -> None:
    if N % 4 or K % GROUP:
        raise ValueError(f"{where}: rows-4 int4 needs N % 4 == 0 and K % {GROUP} == 0, got N={N}, K={K}")
    if tuple(scale.shape) != (E, N, K // GROUP):
        raise ValueError(f"{where}: scales must be [E, N, K/{GROUP}] = {(E, N, K // GROUP)}, got {tuple(scale.shape)}")


def pack_rows4(data: torch.Tensor, scale: torch.Tensor) -> W4Weight:
    """From the generic int4 layout: data uint8 [E, N, K/2], scale [E, N, K/32] (any float dtype)."""
    if data.dtype != torch.uint8 or data.dim() != 3:
        raise ValueError(f"int4 data must be uint8 [E, N, K/2], got {data.dtype} {tuple(data.shape)}")
    E, N, K2 = data.shape
    _check_shapes(E, N, 2 * K2, scale, "pack_rows4")
    # little-endian: byte i of a word is bits 8i..8i+7, so nibble j of the word is k = j
    words = data.contiguous().view(torch.int32)
    return W4Weight(_rows4(words), _rows4(scale.to(torch.bfloat16)))


def from_compressed_tensors(packed: torch.Tensor, scale: torch.Tensor) -> W4Weight:
    """From compressed-tensors W4A16 tensors as vLLM loads them for Marlin: packed int32 [E, K/8, N]
    (value j of a word in bits 4j, stored q + 8: vLLM's uint4b8), scale [E, K/32, N]."""
    if packed.dtype != torch.int32 or packed.dim() != 3:
        raise ValueError(f"packed weights must be int32 [E, K/8, N], got {packed.dtype} {tuple(packed.shape)}")
    E, KW, N = packed.shape
    sc = scale.transpose(1, 2)
    _check_shapes(E, N, 8 * KW, sc, "from_compressed_tensors")
    return W4Weight(_rows4(packed.transpose(1, 2)), _rows4(sc.to(torch.bfloat16)))


def w4_config(M: int, K: int, I: int, E: int, topk: int) -> tuple[KernelConfig, KernelConfig]:
    """(up, down) tiles for one call: the measured table (configs.json, key `w4|K|I|E|topk|M-bucket`,
    written by w4_tune.py on an H200), else a heuristic. up streams BLOCK_N gate + BLOCK_N up rows over
    K per program (pairs x I/BLOCK_N programs: 512 at Kimi-K2.5 M = 1 with 4 rows); down takes all
    top-k experts' rows of a BLOCK_N-row output tile over I."""
    hit = table_entry(f"w4|{K}|{I}|{E}|{topk}|{m_bucket(M)}")
    if hit is not None:
        return KernelConfig(**hit["up"]), KernelConfig(**hit["down"])
    up = KernelConfig(block_n=4, block_k=min(1024, max(GROUP, triton.next_power_of_2(K))))
    down = KernelConfig(block_n=4 if M <= 4 else 8, block_k=max(GROUP, triton.next_power_of_2(I)))
    return up, down


def use_asm(device: torch.device) -> bool:
    """The inline-PTX dequantization runs on CUDA devices; MOEBENCH_W4_ASM=0 forces the plain-Triton
    formula there too (to tell an asm fault from a layout fault when a check fails)."""
    return device.type == "cuda" and os.environ.get("MOEBENCH_W4_ASM", "1") != "0"


def _launch(a, w: W4Weight, ids, tw, out, *, rows, N, K, up_rows, slots, a_div, weighted, kc: KernelConfig,
            pdl_wait=False, pdl_trigger=False):
    if kc.block_n % 4 or kc.block_k % GROUP:
        raise ValueError(f"rows-4 int4 tiles need block_n % 4 == 0 and block_k % {GROUP} == 0, got {kc}")
    av = a.contiguous().view(torch.int32)
    grid = (rows, triton.cdiv(N, kc.block_n))
    moebench_w4_gemv[grid](
        av, w.words, w.scales.view(torch.int32), ids, tw, out,
        N, av.stride(0), w.words.stride(0), w.words.stride(1), w.scales.stride(0) // 2, w.scales.stride(1) // 2,
        out.stride(0),
        K=K, UP_ROWS=up_rows, SLOTS=slots, SLOTS_P=triton.next_power_of_2(slots), A_DIV=a_div,
        WEIGHTED=weighted, BLOCK_N=kc.block_n, BLOCK_K=kc.block_k,
        PDL_WAIT=pdl_wait, PDL_TRIGGER=pdl_trigger, USE_ASM=use_asm(a.device),
        num_warps=kc.num_warps, num_stages=1, launch_pdl=pdl_wait)


def fused_moe_w4(x: torch.Tensor, w1: W4Weight, w2: W4Weight, topk_weights: torch.Tensor, topk_ids: torch.Tensor,
                 *, config: tuple[KernelConfig, KernelConfig] | None = None, pdl: bool | None = None) -> torch.Tensor:
    """fused_moe (api.py) semantics for rows-4 int4 experts: x [M, K] bf16, w1 [E, 2I, K], w2 [E, K, I].

    Two launches at any M (the kernel is a GEMV per (token, slot) pair: right for decode, correct but
    slow for prefill-sized M). config: (up, down) KernelConfigs, default w4_config. pdl: programmatic
    dependent launch of the down kernel (default: on Hopper or newer). CUDA-graph capturable.
    """
    if x.dtype != torch.bfloat16:
        raise ValueError(f"fused_moe_w4 takes bf16 activations, got {x.dtype}")
    M, K = x.shape
    topk = topk_ids.shape[1]
    I = w1.N // 2
    if w1.K != K or w2.N != K or w2.K != I or w1.E != w2.E or I % 4:
        raise ValueError(f"shape mismatch: x {tuple(x.shape)}, w1 [{w1.E}, {w1.N}, {w1.K}], w2 [{w2.E}, {w2.N}, {w2.K}]")
    up, down = config or w4_config(M, K, I, w1.E, topk)
    if pdl is None:
        pdl = x.device.type == "cuda" and torch.cuda.get_device_capability(x.device) >= (9, 0)
    ids = topk_ids.reshape(-1).to(torch.int32).contiguous()
    tw = topk_weights.reshape(-1).to(torch.float32).contiguous()
    P = M * topk
    h = torch.empty((P, I), dtype=x.dtype, device=x.device)
    out = torch.empty((M, K), dtype=x.dtype, device=x.device)
    _launch(x, w1, ids, tw, h, rows=P, N=I, K=K, up_rows=I, slots=1, a_div=topk, weighted=False, kc=up,
            pdl_trigger=pdl)
    _launch_down(h, w2, ids, tw, out, M=M, topk=topk, kc=down, pdl_wait=pdl)
    return out


def _launch_down(h, w: W4Weight, ids, tw, out, *, M, topk, kc: KernelConfig, pdl_wait: bool):
    """The down projection + top-k sum: moebench_w4_down (activation read once per program, n_tiles
    row tiles each) where I fits one chunk, else the general kernel."""
    if w.K > kc.block_k or kc.block_k > 512:
        return _launch(h, w, ids, tw, out, rows=M, N=w.N, K=w.K, up_rows=0, slots=topk, a_div=1, weighted=True,
                       kc=kc, pdl_wait=pdl_wait)
    if kc.block_n % 4 or kc.n_tiles < 1:
        raise ValueError(f"rows-4 down tiles need block_n % 4 == 0 and n_tiles >= 1, got {kc}")
    hv = h.view(torch.int32)
    grid = (M, triton.cdiv(w.N, kc.block_n * kc.n_tiles))
    moebench_w4_down[grid](
        hv, w.words, w.scales.view(torch.int32), ids, tw, out,
        w.N, hv.stride(0), w.words.stride(0), w.words.stride(1), w.scales.stride(0) // 2, w.scales.stride(1) // 2,
        out.stride(0),
        K=w.K, SLOTS=topk, SLOTS_P=triton.next_power_of_2(topk), BLOCK_N=kc.block_n, BLOCK_K=kc.block_k,
        N_TILES=kc.n_tiles,
        PDL_WAIT=pdl_wait, USE_ASM=use_asm(h.device), num_warps=kc.num_warps, num_stages=1, launch_pdl=pdl_wait)
