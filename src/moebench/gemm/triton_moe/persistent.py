"""Decode path in one launch: a persistent fused MoE kernel (up, SiLU-and-mul, down, top-k sum).

Why: at M = 1 the two-launch GEMV path (gemv.py) spends ~4 us of a ~25 us call outside the HBM
stream: the up kernel's tail, the down kernel's ramp, and a kernel boundary. Here P programs, all
resident at once, first compute every up tile (one (pair, BLOCK_N gate + up rows) item each turn,
exactly as the GEMV up kernel does) and write the [pairs, I] activation, then publish with one
release increment of a counter. Each program then issues its first down tile's w2 loads (they do
not depend on the activation), waits until all P programs have published, and streams its down
tiles with the next tile's weights and activation already in flight while it reduces the current
one. So the w2 stream starts while the last up tiles finish, and a call is one kernel.

The barrier needs every program resident at the same time: `launch` sizes P from the compiled
binary's occupancy (CUDA's occupancy calculator, registers / warps / shared memory as fallback).
The wait is bounded (SPIN_LIMIT polls): a program that gives up sets the error word sync[2] and
goes on, so the worst outcome is a wrong result the correctness check reports, never a hang.
The last program to finish resets the two counters, so the next launch (stream-ordered) starts
from zero even after such a failure: every program increments each counter exactly once.
"""

from __future__ import annotations

import ctypes
import threading

import torch
import triton
import triton.language as tl

from .gemv import expert_scale, gemv_tile, load_a_raw, rowdot
from .tiles import load_w_raw

# ~1 s of polling at ~1 us per L2 round trip; a legitimate wait is a few us.
SPIN_LIMIT = 1 << 20


@triton.jit
def _fence(FENCE: tl.constexpr):
    """fence.acq_rel.gpu in every thread (CUDA's __threadfence()); off in the interpreter, which
    cannot run inline assembly and runs one program at a time anyway."""
    if FENCE:
        tl.inline_asm_elementwise("fence.acq_rel.gpu; // $0", "=r", [], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _wait_for(sync_ptr, target, SPIN_LIMIT: tl.constexpr, FENCE: tl.constexpr):
    """Spin until sync[0] >= target (acquire), at most SPIN_LIMIT polls; on giving up set sync[2]."""
    c = tl.atomic_add(sync_ptr, 0, sem="acquire")
    polls = 0
    while (c < target) & (polls < SPIN_LIMIT):
        c = tl.atomic_add(sync_ptr, 0, sem="acquire")
        polls += 1
    if c < target:
        tl.atomic_xchg(sync_ptr + 2, 1)
    _fence(FENCE)


@triton.jit
def _down_slots(ids_ptr, item, n_items, M, TOPK: tl.constexpr, TOPK_P: tl.constexpr):
    """Pair indices [TOPK_P], their mask and experts of down item `item` (token item % M); an
    item >= n_items has every slot masked, so whatever it loads costs no memory traffic."""
    slot = tl.arange(0, TOPK_P)
    mask_s = (slot < TOPK) & (item < n_items)
    pair = (item % M) * TOPK + slot
    e = tl.load(ids_ptr + pair, mask=mask_s, other=0).to(tl.int64)
    return pair, mask_s, e


@triton.jit
def _down_weights(w_ptr, s_ptr, ids_ptr, item, n_items, M, stride_we, stride_wn, stride_se, stride_sn, stride_sk,
                  K: tl.constexpr, I: tl.constexpr, TOPK: tl.constexpr, TOPK_P: tl.constexpr,
                  W_MODE: tl.constexpr, W_GROUP: tl.constexpr, W_SN_DIV: tl.constexpr,
                  BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """Raw w2 tile [TOPK_P, BLOCK_N, BLOCK_K] and scales of down item `item`: hidden columns
    (item // M) * BLOCK_N onwards of all its top-k experts."""
    pair, mask_s, e = _down_slots(ids_ptr, item, n_items, M, TOPK, TOPK_P)
    offs_n = (item // M) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_r = mask_s[:, None, None] & (offs_n < K)[None, :, None]
    rows = e[:, None, None] * stride_we + offs_n[None, :, None].to(tl.int64) * stride_wn
    srows = e[:, None, None] * stride_se + (offs_n // W_SN_DIV)[None, :, None] * stride_sn
    return load_w_raw(w_ptr, s_ptr, rows, srows, 0, mask_r, stride_sk, I, W_MODE, W_GROUP, BLOCK_K, 8)


@triton.jit
def _down_act(h_ptr, ids_ptr, item, n_items, M, stride_hm, I: tl.constexpr, TOPK: tl.constexpr,
              TOPK_P: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """The activation rows of down item `item`'s top-k pairs, in its weight tile's layout."""
    pair, mask_s, _ = _down_slots(ids_ptr, item, n_items, M, TOPK, TOPK_P)
    a, _ = load_a_raw(h_ptr, h_ptr, pair.to(tl.int64)[:, None, None] * stride_hm, 0, 0,
                      mask_s[:, None, None], 0, I, 0, BLOCK_N, BLOCK_K)
    return a


@triton.jit
def moe_persistent_kernel(
    x_ptr, w1_ptr, w1s_ptr, w1g_ptr, w2_ptr, w2s_ptr, w2g_ptr, ids_ptr, tw_ptr, h_ptr, out_ptr, sync_ptr,
    M, stride_xm, stride_w1e, stride_w1n, stride_s1e, stride_s1n, stride_s1k,
    stride_w2e, stride_w2n, stride_s2e, stride_s2n, stride_s2k, stride_hm, stride_om,
    K: tl.constexpr, I: tl.constexpr, TOPK: tl.constexpr, TOPK_P: tl.constexpr,
    W_MODE: tl.constexpr, W_GROUP: tl.constexpr, W_SN_DIV: tl.constexpr,
    UP_BLOCK_N: tl.constexpr, UP_BLOCK_K: tl.constexpr, DOWN_BLOCK_N: tl.constexpr, DOWN_BLOCK_K: tl.constexpr,
    FENCE: tl.constexpr, SPIN_LIMIT: tl.constexpr,
):
    """out[m] = sum_j tw[m, j] * silu_mul(x[m] @ w1[e].T) @ w2[e].T, e = ids[m, j], in one launch of
    P = num_programs programs that must all be resident (see the module docstring).
    h: [M * TOPK, I] scratch for the activation. sync: int32[3], zero before the launch (the kernel
    leaves it zero, except sync[2] = 1 if a program gave up waiting)."""
    pid = tl.program_id(0)
    P = tl.num_programs(0)
    pairs = M * TOPK

    # Phase 1: up tiles. Pairs are the fastest item axis, so pairs sharing an expert read the same
    # rows at about the same time (L2 hits), as in the GEMV kernel's grid.
    n_up = pairs * tl.cdiv(I, UP_BLOCK_N)
    for item in range(pid, n_up, P):
        pair = item % pairs
        y, offs_n, mask_n = gemv_tile(
            x_ptr, x_ptr, w1_ptr, w1s_ptr, w1g_ptr, ids_ptr, tw_ptr, pair, item // pairs,
            I, stride_xm, 0, 0, stride_w1e, stride_w1n, stride_s1e, stride_s1n, stride_s1k,
            K, I, 1, 1, TOPK, False, W_MODE, W_GROUP, W_SN_DIV, 0, UP_BLOCK_N, UP_BLOCK_K, False)
        tl.store(h_ptr + pair * stride_hm + offs_n, y.to(h_ptr.dtype.element_ty), mask=mask_n)
    # Publish: every thread's stores are ordered before the one release increment.
    _fence(FENCE)
    tl.debug_barrier()
    tl.atomic_add(sync_ptr, 1, sem="release")

    # Phase 2: down tiles (token, DOWN_BLOCK_N hidden columns), all top-k slots per tile.
    n_down = M * tl.cdiv(K, DOWN_BLOCK_N)
    q, s = _down_weights(w2_ptr, w2s_ptr, ids_ptr, pid, n_down, M, stride_w2e, stride_w2n, stride_s2e, stride_s2n,
                         stride_s2k, K, I, TOPK, TOPK_P, W_MODE, W_GROUP, W_SN_DIV, DOWN_BLOCK_N, DOWN_BLOCK_K)
    _wait_for(sync_ptr, P, SPIN_LIMIT, FENCE)
    a = _down_act(h_ptr, ids_ptr, pid, n_down, M, stride_hm, I, TOPK, TOPK_P, DOWN_BLOCK_N, DOWN_BLOCK_K)
    for item in range(pid, n_down, P):
        # the next tile's weights and activation are in flight while this one is reduced
        q_n, s_n = _down_weights(w2_ptr, w2s_ptr, ids_ptr, item + P, n_down, M, stride_w2e, stride_w2n, stride_s2e,
                                 stride_s2n, stride_s2k, K, I, TOPK, TOPK_P, W_MODE, W_GROUP, W_SN_DIV,
                                 DOWN_BLOCK_N, DOWN_BLOCK_K)
        a_n = _down_act(h_ptr, ids_ptr, item + P, n_down, M, stride_hm, I, TOPK, TOPK_P, DOWN_BLOCK_N, DOWN_BLOCK_K)
        pair, mask_s, e = _down_slots(ids_ptr, item, n_down, M, TOPK, TOPK_P)
        part = tl.sum(rowdot(q, s, a, s, W_MODE, W_GROUP, 0), axis=2)
        factor = expert_scale(w2s_ptr, w2g_ptr, e, stride_s2e, mask_s, W_MODE)
        factor = factor * tl.load(tw_ptr + pair, mask=mask_s, other=0).to(tl.float32)
        y = tl.sum(part * factor[:, None], axis=0)
        offs_n = (item // M) * DOWN_BLOCK_N + tl.arange(0, DOWN_BLOCK_N)
        tl.store(out_ptr + (item % M) * stride_om + offs_n, y.to(out_ptr.dtype.element_ty), mask=offs_n < K)
        q, s, a = q_n, s_n, a_n

    # The last program out resets the counters for the next launch: every program has passed its
    # wait before it increments sync[1], so nobody is still polling sync[0].
    done = tl.atomic_add(sync_ptr + 1, 1, sem="acq_rel")
    if done == P - 1:
        tl.atomic_xchg(sync_ptr, 0)
        tl.atomic_xchg(sync_ptr + 1, 0)


# ---------------------------------------------------------------- host side

_SYNC: dict = {}
_RESIDENT: dict = {}
_LOCK = threading.Lock()


def sync_buffer(device: torch.device) -> torch.Tensor:
    """The device's int32[3] counters (arrived, finished, error), allocated zeroed on first use.

    One buffer per device: two persistent launches must not run concurrently on one device (on
    different streams), which is how MoE layers run anyway. It cannot be created inside CUDA-graph
    capture (the memset would become part of the graph): call once eagerly first, as the suite's
    correctness check does."""
    key = str(device)
    with _LOCK:
        buf = _SYNC.get(key)
        if buf is None:
            if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
                raise RuntimeError("the persistent MoE kernel's sync counters are set up on the first call, which "
                                   "must not be inside CUDA-graph capture: call fused_moe once eagerly first")
            buf = _SYNC[key] = torch.zeros(3, dtype=torch.int32, device=device)
    return buf


def had_errors(device: torch.device) -> bool:
    """True if any persistent launch on `device` gave up waiting for its programs (reads the
    error word: a device sync)."""
    buf = _SYNC.get(str(device))
    return bool(buf is not None and int(buf[2].item()) != 0)


def _blocks_per_sm(compiled, num_warps: int) -> int:
    """Resident blocks per SM for a compiled kernel: CUDA's occupancy calculator, or registers /
    warps / shared memory if the driver call is not available."""
    compiled._init_handles()
    shared = int(compiled.metadata.shared)
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
        n = ctypes.c_int(0)
        rc = cuda.cuOccupancyMaxActiveBlocksPerMultiprocessor(
            ctypes.byref(n), ctypes.c_void_p(compiled.function), num_warps * 32, ctypes.c_size_t(shared))
        if rc == 0 and n.value > 0:
            return n.value
    except (OSError, AttributeError):
        pass
    regs_per_warp = -(-max(compiled.n_regs, 1) * 32 // 256) * 256
    by_regs = (65536 // regs_per_warp) // num_warps
    by_warps = 64 // num_warps
    by_smem = (227 * 1024) // (shared + 1024) if shared else 32
    return max(1, min(by_regs, by_warps, by_smem, 32))


def launch(x, wu, wd, ids, tw, h, out, *, M: int, topk: int, I: int, K: int, cfg) -> int:
    """Run the persistent kernel for fused_moe (wu, wd: api._Weight views of w1, w2; h: [M * topk, I]
    scratch). Returns the number of programs P it launched (1 in the interpreter, which runs
    programs one after another and would otherwise wait forever on the barrier)."""
    on_gpu = x.device.type == "cuda"
    sync = sync_buffer(x.device)
    meta = dict(K=K, I=I, TOPK=topk, TOPK_P=triton.next_power_of_2(topk), **wu.w_args,
                UP_BLOCK_N=cfg.up.block_n, UP_BLOCK_K=cfg.up.block_k,
                DOWN_BLOCK_N=cfg.down.block_n, DOWN_BLOCK_K=cfg.down.block_k,
                FENCE=on_gpu, SPIN_LIMIT=SPIN_LIMIT, num_warps=cfg.up.num_warps, num_stages=1)
    args = (x, wu.data, wu.scale, wu.gscale, wd.data, wd.scale, wd.gscale, ids, tw, h, out, sync,
            M, x.stride(0), wu.data.stride(0), wu.data.stride(1), *wu.s_strides,
            wd.data.stride(0), wd.data.stride(1), *wd.s_strides, h.stride(0), out.stride(0))
    n_up = M * topk * triton.cdiv(I, cfg.up.block_n)
    programs = 1
    if on_gpu:
        key = (str(x.device), tuple(sorted((k, str(v)) for k, v in meta.items())), x.dtype, wu.data.dtype)
        resident = _RESIDENT.get(key)
        if resident is None:
            compiled = moe_persistent_kernel.warmup(*args, grid=(1,), **meta)
            compiled = compiled.result() if hasattr(compiled, "result") else compiled
            sms = torch.cuda.get_device_properties(x.device).multi_processor_count
            resident = _RESIDENT[key] = sms * _blocks_per_sm(compiled, cfg.up.num_warps)
        programs = max(1, min(n_up, resident))
    moe_persistent_kernel[(programs,)](*args, **meta)
    return programs
