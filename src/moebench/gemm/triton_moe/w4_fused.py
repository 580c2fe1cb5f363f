"""The int4 tensor-core decode in one launch (w4_fused_kernel.py; issue 32's "one fused launch for w1, the
activation and w2"), beside the two-launch kernel it is measured against (w4_mma.py).

    plan_fused(call: w4_mma.MmaCall) -> FusedCall   the call's scratch, workspace and counters (once, before
                                                    any graph capture: a capture must not allocate them)
    grid_too_large(M, I, topk, sms) -> str | None   why a call's grid cannot be resident on a GPU of that size
    fused_launch(fc) -> out [M, K] bf16             one launch on the GPU; two (up, then down) in the
                                                    interpreter, which runs programs one after another
    wait_failed(fc) -> bool                         a program's bounded wait gave up (the result is wrong)

A FusedCall is for one call at a time: its workspace and counters are left zero by each call for the next, so
two calls on one FusedCall must not overlap (different streams); separate calls each plan their own.

Where it runs: the grid is (M x topk pairs, I / 16) programs of the up tiles' KS warps, and the programs of a
pair wait for each other, so the whole grid must be resident at once: at most one program an SM (16 warps of
up to 128 registers fill one) and no more programs than SMs (Kimi-K2.5 and DeepSeek-V3 TP8 at M = 1: 128 of
the H200's and H100 SXM's 132). plan_fused refuses a call that does not fit, and tiles it cannot lay out.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton

from .w4 import use_asm
from .w4_fused_kernel import moebench_w4_fused
from .w4_mma import TILE, MmaCall, lane_sets

SPIN_MAX = 1 << 20  # polls of the pair counter before a program gives up (about a second)
MAX_WARPS = 32      # warps of one program (1024 threads)


@dataclass(frozen=True)
class FusedCall:
    """One call's operands (call) and the buffers the launch keeps between calls."""

    call: MmaCall
    h: torch.Tensor       # bf16 [pairs, I]: the activations, written and read inside the launch
    ws: torch.Tensor      # float32 [M, K]: the top-k sum, zero between calls
    sync: torch.Tensor    # int32 [pairs + M * I/16 + 1]: pair counters, slice counters, the error word
    ks: int               # warps (lane sets) of up's K split; also the down chunk's tiles
    gpi: int              # groups a lane set takes a step
    early_b: bool = True  # both down chunks' loads issued before the wait (False: the second after it)
    dks: int = 1          # lane sets splitting I's groups in down (each holds 1 / dks of the activations)


def grid_too_large(M: int, I: int, topk: int, sms: int) -> str | None:
    """Why a call of M tokens (intermediate I per rank, top-k) cannot run in one launch on a GPU of `sms` SMs, or
    None: its M x topk x I / 16 programs must all be resident at once, one an SM (their pairs wait for each other)."""
    P, T = M * topk, I // TILE
    if P * T <= sms:
        return None
    return (f"the one-launch int4 kernel needs its {P} x {T} = {P * T} programs resident at once, one an SM: this "
            f"GPU has {sms} SMs (M = {M} is too large for it)")


def plan_fused(c: MmaCall, early_b: bool = True, down_lane_sets: int = 1) -> FusedCall:
    """The buffers of a one-launch call on the call's up tiles (its up config: 16 rows a program; its warps
    raised where the down slice needs more, K then split over more lane sets); ValueError naming what does not
    fit (tiles, shapes, or a grid larger than the GPU's SMs). early_b: issue both chunks of down's loads before
    the pair's wait (True) or the second after it (False: fewer registers live across the wait; compile_check
    reads 60 and 32 B of spill at the M = 1 tiles). down_lane_sets: how many lane sets split I's groups in down
    (a power of two dividing the warps and I / 32): each lane then holds that fraction of the pair's activations,
    and a reduction across the sets follows."""
    rt, ks, gpi = lane_sets(c.up)
    K, I, P = c.x.shape[1], c.I, c.M * c.topk
    T = I // TILE
    if rt != 1:
        raise ValueError(f"the one-launch int4 kernel takes up tiles of {TILE} rows (block_n {TILE}), got {c.up}")
    if (K // TILE) % T:
        raise ValueError(f"the one-launch int4 kernel splits K / {TILE} = {K // TILE} down tiles over I / {TILE} = "
                         f"{T} programs: K / {TILE} must be a multiple of it")
    td = (K // TILE) // T
    # a program takes its down tiles in two chunks of one tile a warp: raise up's warps (its K split) to cover them
    ks = max(ks, triton.next_power_of_2(-(-td // 2)))
    if ks > MAX_WARPS:
        raise ValueError(f"the one-launch int4 kernel takes a program's {td} down tiles in two chunks of one tile a "
                         f"warp: that needs {ks} warps, more than a program has ({MAX_WARPS})")
    if c.x.device.type == "cuda":
        too_large = grid_too_large(c.M, I, c.topk, torch.cuda.get_device_properties(c.x.device).multi_processor_count)
        if too_large:
            raise ValueError(too_large)
    gd = I // 32
    if down_lane_sets < 1 or down_lane_sets & (down_lane_sets - 1) or ks % down_lane_sets or gd % down_lane_sets:
        raise ValueError(f"down_lane_sets must be a power of two dividing the {ks} warps and I / 32 = {gd}, "
                         f"got {down_lane_sets}")
    dev = c.x.device
    # the activations start as NaN: a program that read them before its pair wrote them (a wait given up) turns
    # the first call's output NaN, which the reference check catches, instead of stale values that may match
    return FusedCall(c, torch.full((P, I), float("nan"), dtype=torch.bfloat16, device=dev),
                     torch.zeros(c.M, K, dtype=torch.float32, device=dev),
                     torch.zeros(P + c.M * T + 1, dtype=torch.int32, device=dev), ks, gpi, early_b,
                     down_lane_sets)


def _launch(fc: FusedCall, out: torch.Tensor, phase: int) -> None:
    c = fc.call
    av = c.x.contiguous().view(torch.int32)
    w1, w2 = c.w1, c.w2
    moebench_w4_fused[(c.M * c.topk, c.I // TILE)](
        av, w1.words, w1.scales, w2.words, w2.scales, c.ids, c.tw, fc.h, fc.h.view(torch.int32), fc.ws, out,
        fc.sync,
        av.stride(0), w1.words.stride(0), w1.words.stride(1), w1.scales.stride(0), w1.scales.stride(1),
        w2.words.stride(0), w2.words.stride(1), w2.scales.stride(0), w2.scales.stride(1),
        K=w1.K, I=c.I, TOPK=c.topk, KS=fc.ks, GPI=fc.gpi, CHUNK=fc.ks,
        SL_P=triton.next_power_of_2(w1.K // (c.I // TILE)), PHASE=phase, USE_ASM=use_asm(c.x.device),
        SPIN_MAX=SPIN_MAX, EARLY_B=int(fc.early_b), DKS=fc.dks, num_warps=fc.ks, num_stages=1)


def fused_launch(fc: FusedCall) -> torch.Tensor:
    """out [M, K] bf16 = the call's fused MoE (fused_moe_w4_mma's result, summed over the top-k slots in float32
    before one rounding). CUDA-graph capturable; on the CPU (the interpreter) two launches, PHASE 1 then 2."""
    c = fc.call
    out = torch.empty((c.M, c.w2.N), dtype=c.x.dtype, device=c.x.device)
    if c.x.device.type == "cuda":
        _launch(fc, out, 3)
    else:
        _launch(fc, out, 1)
        _launch(fc, out, 2)
    return out


def wait_failed(fc: FusedCall) -> bool:
    """Whether a program of an earlier launch on fc gave up waiting for its pair (synchronizes)."""
    return bool(fc.sync[-1].item())
