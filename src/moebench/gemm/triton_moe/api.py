"""Public entry points: fused_moe and grouped_gemm, and the argument plumbing for the kernels.

Everything on the launch path is shape arithmetic on Python ints and fixed-shape torch ops: no host
syncs and no data-dependent control flow, so a call can be captured in a CUDA graph.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton

from . import tiles
from .act_quant import fp8_act_quant
from .config import KernelConfig, MoEConfig, config_for
from .gemv import moe_gemv_kernel
from .grouped import moe_grouped_kernel, moe_sum_kernel
from .quant import Quant
from .routing import align_by_expert


@dataclass
class _Weight:
    """A weight tensor [E, N, K] (4-bit formats: [E, N, K // 2] bytes) as the kernels see it."""

    data: torch.Tensor
    scale: torch.Tensor
    gscale: torch.Tensor
    mode: int
    group: int         # K elements per scale (0: none / per tensor)
    sn_div: int        # weight rows per scale row
    E: int
    N: int
    K: int
    s_strides: tuple   # scale strides (e, n, k) in elements

    @property
    def w_args(self) -> dict:
        return dict(W_MODE=self.mode, W_GROUP=self.group, W_SN_DIV=self.sn_div)


@dataclass
class _Act:
    """A GEMM input [rows, K] and its fp8 scales, as the kernels see it."""

    data: torch.Tensor
    scale: torch.Tensor
    mode: int
    stride_sm: int
    stride_sk: int


def _weight(w: torch.Tensor, quant: Quant | None, index: int) -> _Weight:
    if w.dim() != 3 or w.stride(2) != 1:
        raise ValueError(f"expert weights must be [E, N, K] with unit stride along K, got {tuple(w.shape)}")
    E, N, Kw = w.shape
    if quant is None:
        if w.dtype not in (torch.bfloat16, torch.float16, torch.float32):
            raise ValueError(f"unquantized weights must be a float dtype, got {w.dtype}; pass quant= for {w.dtype}")
        return _Weight(w, w, w, tiles.W_BF16.value, 0, 1, E, N, Kw, (0, 0, 0))
    scale = quant.scales[index]
    if quant.kind == "fp8_w8a8":
        if w.dtype != torch.float8_e4m3fn:
            raise ValueError(f"fp8_w8a8 weights must be float8_e4m3fn, got {w.dtype}")
        if quant.group_size == 0:
            return _Weight(w, scale, w, tiles.W_FP8.value, 0, 1, E, N, Kw, (scale.stride(0), 0, 0))
        return _Weight(w, scale, w, tiles.W_FP8_BLOCK.value, 128, 128, E, N, Kw, scale.stride())
    if w.dtype != torch.uint8:
        raise ValueError(f"{quant.kind} weights must be packed uint8 [E, N, K // 2], got {w.dtype}")
    if quant.kind == "int4_w4a16":
        return _Weight(w, scale, w, tiles.W_INT4.value, quant.group_size, 1, E, N, 2 * Kw, scale.stride())
    gscale = quant.global_scales[index]
    return _Weight(w, scale, gscale, tiles.W_NVFP4.value, 16, 1, E, N, 2 * Kw, scale.stride())


def _act(a: torch.Tensor, quant: Quant | None) -> _Act:
    """The kernels' view of a GEMM input; fp8_w8a8 quantizes it first (one launch)."""
    if a.stride(-1) != 1:
        a = a.contiguous()
    if quant is None or quant.kind != "fp8_w8a8":
        return _Act(a, a, tiles.A_BF16.value, 0, 0)
    q, scale = fp8_act_quant(a, quant.group_size)
    mode = tiles.A_FP8_ROW.value if quant.group_size == 0 else tiles.A_FP8_GROUP.value
    return _Act(q, scale, mode, scale.stride(0), scale.stride(1))


def _check(kc: KernelConfig, w: _Weight, a: _Act, path: str):
    for name in ("block_n", "block_k", "block_m"):
        v = getattr(kc, name)
        if v < 1 or v & (v - 1):
            raise ValueError(f"{name}={v} must be a power of two")
    # GEMV reduces runs of 8 k values per thread; 4-bit formats pack 2 per byte; scales cover groups
    need = max(w.group, 128 if a.mode == tiles.A_FP8_GROUP.value else 1, 8)
    if kc.block_k % need:
        raise ValueError(f"block_k={kc.block_k} must be a multiple of {need} for this format")
    if path == "grouped":
        if min(kc.block_m, kc.block_n, kc.block_k) < 16:
            raise ValueError("the grouped (tl.dot) path needs block_m, block_n, block_k >= 16")
        if w.mode == tiles.W_FP8_BLOCK.value and kc.block_k != 128:
            raise ValueError("fp8 block-128 on the grouped path needs block_k == 128")


def pdl_capable(device: torch.device) -> bool:
    """Whether the fused path may launch its down kernel with programmatic dependent launch on this
    device (a Hopper or newer GPU); config_for's `pdl` argument, shared by fused_moe and whoever records
    the config fused_moe will pick (the `triton` gemm backend)."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device) >= (9, 0)


def _gemv(a: _Act, w: _Weight, ids, tw, out, *, rows, N, K, up_rows, slots, a_div, weighted,
          kc: KernelConfig, pdl_wait=False, pdl_trigger=False):
    _check(kc, w, a, "gemv")
    grid = (rows, triton.cdiv(N, kc.block_n))
    moe_gemv_kernel[grid](
        a.data, a.scale, w.data, w.scale, w.gscale, ids, tw, out,
        N, a.data.stride(0), a.stride_sm, a.stride_sk, w.data.stride(0), w.data.stride(1), *w.s_strides,
        out.stride(0),
        K=K, UP_ROWS=up_rows, SLOTS=slots, SLOTS_P=triton.next_power_of_2(slots), A_DIV=a_div,
        WEIGHTED=weighted, **w.w_args, A_MODE=a.mode, BLOCK_N=kc.block_n, BLOCK_K=kc.block_k,
        PDL_WAIT=pdl_wait, PDL_TRIGGER=pdl_trigger,
        num_warps=kc.num_warps, num_stages=kc.num_stages, launch_pdl=pdl_wait)


def _grouped(a: _Act, w: _Weight, sorted_pairs, block_expert, tw, out, *, num_pairs, N, K, up_rows, a_div,
             weighted, kc: KernelConfig):
    _check(kc, w, a, "grouped")
    grid = (block_expert.numel(), triton.cdiv(N, kc.block_n))
    moe_grouped_kernel[grid](
        a.data, a.scale, w.data, w.scale, w.gscale, sorted_pairs, block_expert, tw, out,
        N, num_pairs, a.data.stride(0), a.stride_sm, a.stride_sk, w.data.stride(0), w.data.stride(1),
        *w.s_strides, out.stride(0),
        K=K, UP_ROWS=up_rows, A_DIV=a_div, WEIGHTED=weighted, **w.w_args, A_MODE=a.mode,
        BLOCK_M=kc.block_m, BLOCK_N=kc.block_n, BLOCK_K=kc.block_k,
        num_warps=kc.num_warps, num_stages=kc.num_stages)


def _routing(topk_ids, topk_weights):
    ids = topk_ids.reshape(-1)
    if ids.dtype != torch.int32:
        ids = ids.to(torch.int32)
    tw = None if topk_weights is None else topk_weights.reshape(-1).to(torch.float32)
    return ids.contiguous(), tw


def fused_moe(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
              topk_ids: torch.Tensor, *, quant: Quant | None = None, config: MoEConfig | None = None) -> torch.Tensor:
    """Fused MoE forward, vLLM fused_experts semantics with SiLU-and-mul:

        out[m] = sum_j topk_weights[m, j] * (silu(x[m] @ g_e.T) * (x[m] @ u_e.T)) @ w2[e].T,
        e = topk_ids[m, j], g_e = w1[e, :I], u_e = w1[e, I:].

    x: [M, K] bf16. w1: [E, 2I, K], w2: [E, K, I] (bf16, or the packed format of `quant`).
    topk_weights: float32 [M, topk]. topk_ids: int32 [M, topk]. quant: a Quant with
    scales (w1_scale, w2_scale), or None for bf16. config: a MoEConfig, default config_for(...).
    Returns [M, K] in x's dtype. CUDA-graph capturable; two launches on the decode path (plus two
    activation-quantization launches for fp8_w8a8).
    """
    M, K = x.shape
    topk = topk_ids.shape[1]
    wu, wd = _weight(w1, quant, 0), _weight(w2, quant, 1)
    I = wu.N // 2
    if wu.K != K or wd.N != K or wd.K != I or wd.E != wu.E:
        raise ValueError(f"shape mismatch: x {tuple(x.shape)}, w1 {tuple(w1.shape)}, w2 {tuple(w2.shape)}")
    cfg = config or config_for(M, K, I, wu.E, topk, quant, op="fused", pdl=pdl_capable(x.device))
    ids, tw = _routing(topk_ids, topk_weights)
    P = M * topk
    h = torch.empty((P, I), dtype=x.dtype, device=x.device)
    out = torch.empty((M, K), dtype=x.dtype, device=x.device)
    if cfg.path == "gemv":
        _gemv(_act(x, quant), wu, ids, tw, h, rows=P, N=I, K=K, up_rows=I, slots=1, a_div=topk,
              weighted=False, kc=cfg.up, pdl_trigger=cfg.pdl)
        _gemv(_act(h, quant), wd, ids, tw, out, rows=M, N=K, K=I, up_rows=0, slots=topk, a_div=1,
              weighted=True, kc=cfg.down, pdl_wait=cfg.pdl)
        return out
    if cfg.path != "grouped":
        raise ValueError(f"unknown path {cfg.path!r}")
    if cfg.up.block_m != cfg.down.block_m:
        raise ValueError("the grouped path shares one expert-sorted layout: up.block_m must equal down.block_m")
    sorted_pairs, block_expert = align_by_expert(ids, wu.E, cfg.up.block_m)
    _grouped(_act(x, quant), wu, sorted_pairs, block_expert, tw, h, num_pairs=P, N=I, K=K, up_rows=I,
             a_div=topk, weighted=False, kc=cfg.up)
    y = torch.empty((P, K), dtype=x.dtype, device=x.device)
    _grouped(_act(h, quant), wd, sorted_pairs, block_expert, tw, y, num_pairs=P, N=K, K=I, up_rows=0,
             a_div=1, weighted=True, kc=cfg.down)
    bn = min(1024, triton.next_power_of_2(K))
    moe_sum_kernel[(M, triton.cdiv(K, bn))](y, out, K, y.stride(0), out.stride(0), TOPK=topk,
                                             TOPK_P=triton.next_power_of_2(topk), BLOCK_N=bn, num_warps=4)
    return out


def grouped_gemm(x: torch.Tensor, w: torch.Tensor, topk_ids: torch.Tensor, *, op: str,
                 quant: Quant | None = None, config: MoEConfig | None = None) -> torch.Tensor:
    """Per-expert GEMM on the rows routed to each expert, without activation or top-k sum.

    op="gemm1": x [M, K], out[m, j] = x[m] @ w[topk_ids[m, j]].T.
    op="gemm2": x [M, topk, K] (one input row per pair), out[m, j] = x[m, j] @ w[topk_ids[m, j]].T.
    w: [E, N, K] (bf16, or the packed format of `quant`, whose scales are (w_scale,)).
    Returns [M, topk, N] in x's dtype. config: a MoEConfig whose `up` kernel config is used.
    """
    M, topk = topk_ids.shape
    wt = _weight(w, quant, 0)
    if op == "gemm1":
        a, a_div = x, topk
    elif op == "gemm2":
        a, a_div = x.reshape(M * topk, x.shape[-1]), 1
    else:
        raise ValueError(f"op must be 'gemm1' or 'gemm2', got {op!r}")
    if a.shape[-1] != wt.K:
        raise ValueError(f"x has K={a.shape[-1]}, w has K={wt.K}")
    cfg = config or config_for(M, wt.K, wt.N, wt.E, topk, quant, op=op)
    ids, _ = _routing(topk_ids, None)
    P = M * topk
    out = torch.empty((P, wt.N), dtype=x.dtype, device=x.device)
    act = _act(a, quant)
    if cfg.path == "gemv":
        _gemv(act, wt, ids, ids, out, rows=P, N=wt.N, K=wt.K, up_rows=0, slots=1, a_div=a_div,
              weighted=False, kc=cfg.up)
    elif cfg.path == "grouped":
        sorted_pairs, block_expert = align_by_expert(ids, wt.E, cfg.up.block_m)
        _grouped(act, wt, sorted_pairs, block_expert, ids, out, num_pairs=P, N=wt.N, K=wt.K, up_rows=0,
                 a_div=a_div, weighted=False, kc=cfg.up)
    else:
        raise ValueError(f"unknown path {cfg.path!r}")
    return out.view(M, topk, wt.N)

