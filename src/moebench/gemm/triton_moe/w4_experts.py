"""Expert-major int4 W4A16 group-32 fused MoE on tensor cores (w4_experts_kernel.py), on the pair-major kernel's
weights (w4_mma.W4Tiles): one weight decode serves every token of an expert, for M where tokens share experts.

    fused_moe_w4_experts(x, w1, w2, topk_weights, topk_ids, config=None, pdl=None) -> [M, K]
    experts_config(M, K, I, E, topk) -> (up, down) KernelConfigs
    down_launch(call, h) -> [M, K]      the down launch and the top-k sum alone, on any up launch's activations

Three launches: up (gate and up GEMMs and silu(gate) * up, per expert, into h [M * topk, I]), down (per expert,
weighted by the top-k weights, into y [M * topk, K]), and the top-k sum of y into out [M, K] (grouped.py's
moe_sum_kernel). No sort: each program finds its expert's pairs in the routing ids itself
(w4_experts_kernel.py says why), so the call is fixed-shape and CUDA-graph capturable.
"""

from __future__ import annotations

import torch
import triton

from .config import KernelConfig, m_bucket, table_entry
from .grouped import moe_sum_kernel
from .w4 import use_asm
from .w4_experts_kernel import moebench_w4_experts
from .w4_mma import TILE, MmaCall, W4Tiles, lane_sets, plan_call

SUM_BLOCK_N = 1024  # top-k sum: columns a program adds (7168 / 1024 = 7 programs a token)


def experts_config(M: int, K: int, I: int, E: int, topk: int) -> tuple[KernelConfig, KernelConfig]:
    """(up, down) tiles, in w4_mma.mma_config's terms (block_n = 16 x row tiles, block_k = 32 x groups a lane
    set takes a step, num_warps = lane sets x row tiles). The measured table (configs.json,
    `w4mmax|K|I|E|topk|M-bucket`) first, else the tiles that won most of session 20's H200 sweep (Kimi-K2.5
    and DeepSeek-V3, M 8-128): up one row tile of 16 gate + 16 up rows over 4 lane sets of 4 groups; down 4
    row tiles, one lane set a tile taking I = 256 in one step (no split of K across warps: the heuristic
    written before any measurement split it over 2 lane sets and read 1.5-1.6x slower)."""
    hit = table_entry(f"w4mmax|{K}|{I}|{E}|{topk}|{m_bucket(M)}")
    if hit is not None:
        return KernelConfig(**hit["up"]), KernelConfig(**hit["down"])
    return (KernelConfig(block_n=16, block_k=128, num_warps=4),
            KernelConfig(block_n=64, block_k=256, num_warps=4))


def _launch(a, w: W4Tiles, ids, tw, out, *, N, up_rows, a_div, weighted, kc: KernelConfig,
            pdl_wait=False, pdl_trigger=False):
    rt, ks, gpi = lane_sets(kc)
    av = a.contiguous().view(torch.int32)
    pairs = ids.numel()
    moebench_w4_experts[(w.E, triton.cdiv(N // TILE, rt))](
        av, w.words, w.scales, ids, tw, out,
        N, pairs, av.stride(0), w.words.stride(0), w.words.stride(1), w.scales.stride(0), w.scales.stride(1),
        out.stride(0),
        K=w.K, UP_ROWS=up_rows, A_DIV=a_div, WEIGHTED=weighted, PAIRS_P=triton.next_power_of_2(pairs),
        RT=rt, KS=ks, GPI=gpi, PDL_WAIT=pdl_wait, PDL_TRIGGER=pdl_trigger, USE_ASM=use_asm(a.device),
        num_warps=kc.num_warps, num_stages=1, launch_pdl=pdl_wait)


def fused_moe_w4_experts(x: torch.Tensor, w1: W4Tiles, w2: W4Tiles, topk_weights: torch.Tensor,
                         topk_ids: torch.Tensor, *, config: tuple[KernelConfig, KernelConfig] | None = None,
                         pdl: bool | None = None) -> torch.Tensor:
    """fused_moe (api.py) semantics for int4 experts in the 16-row tile layout: x [M, K] bf16,
    w1 [E, 2I, K], w2 [E, K, I], topk_ids in [0, E). config: (up, down) KernelConfigs, default
    experts_config. pdl: the down launch streams its weights before up ends (default: on Hopper or newer).
    CUDA-graph capturable."""
    M, K = x.shape
    c = plan_call(x, w1, w2, topk_weights, topk_ids, pdl=pdl,
                  config=config or experts_config(M, K, w1.N // 2, w1.E, topk_ids.shape[1]))
    lane_sets(c.down)  # both tiles refused before anything runs
    h = torch.empty((M * c.topk, c.I), dtype=x.dtype, device=x.device)
    _launch(x, c.w1, c.ids, c.tw, h, N=c.I, up_rows=c.I, a_div=c.topk, weighted=False, kc=c.up,
            pdl_trigger=c.pdl)
    return down_launch(c, h)


def down_launch(c: MmaCall, h: torch.Tensor) -> torch.Tensor:
    """The expert-major down launch on activations h [M * topk, I], weighted by the top-k weights, then the top-k
    sum: out [M, K]. h may come from either up launch (this module's or w4_mma.up_launch: both write one row a
    (token, slot) pair), which is how w4_split times the pair-major up beside this down. With PDL it streams its
    weights before waiting for h's writer."""
    M, K = c.M, c.w2.N
    y = torch.empty((M * c.topk, K), dtype=c.x.dtype, device=c.x.device)
    _launch(h, c.w2, c.ids, c.tw, y, N=K, up_rows=0, a_div=1, weighted=True, kc=c.down, pdl_wait=c.pdl)
    out = torch.empty((M, K), dtype=c.x.dtype, device=c.x.device)
    moe_sum_kernel[(M, triton.cdiv(K, SUM_BLOCK_N))](y, out, K, y.stride(0), out.stride(0), TOPK=c.topk,
                                                     TOPK_P=triton.next_power_of_2(c.topk), BLOCK_N=SUM_BLOCK_N)
    return out
