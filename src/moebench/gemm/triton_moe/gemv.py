"""Decode path: a GEMV kernel over (token, top-k slot) pairs that streams each expert's weight once.

One program computes BLOCK_N outputs of one output row. It reads rows of the routed expert's weight
over all of K with wide, vectorised loads, double-buffered by hand (the next K chunk's loads are
issued before the current chunk is multiplied), and reduces in float32 on CUDA cores: at M <= 16 the
work is a few rows per expert, far below what tensor cores need, and the cost is all weight bytes.

The same kernel is used four ways (all constexpr, so each is its own specialised binary):
  * fused up-projection: row = pair, UP_ROWS = I: gate rows n and up rows I + n of w1 in one program,
    silu(gate) * up in the epilogue, so only the [pairs, I] activation is written;
  * fused down-projection: row = token, SLOTS = topk, WEIGHTED: the program loads its N tile of all
    top-k experts' w2 at once and writes sum_j topk_weight[j] * (h_j @ w2[e_j].T) in bf16 directly
    (no atomics, no second reduction launch);
  * grouped_gemm "gemm1" / "gemm2": row = pair, plain per-pair GEMM.
Tokens sharing an expert read the same weight tile at nearly the same time (pairs are the grid's
fastest axis), so the repeat reads hit L2 instead of HBM.
"""

import triton
import triton.language as tl

from .tiles import (A_FP8_GROUP, A_FP8_ROW, E2M1_UNSCALE, W_FP8, W_NVFP4, load_w_raw, runs, silu_mul, w_values)


@triton.jit
def _load_a_raw(a_ptr, as_ptr, arows, asrows, k0, mask_s, stride_ask,
                K: tl.constexpr, A_MODE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """Activation chunk [S, BLOCK_N, BLOCK_K] (stored dtype; the row repeated BLOCK_N times) and,
    for A_FP8_GROUP, the scale of each run of 8 k values [S, BLOCK_N, BLOCK_K // 8] (else a dummy).

    Loading the chunk in the weight tile's shape, in runs of 8, gives it the weight tile's register
    layout; loaded as [S, 1, BLOCK_K] the compiler converts the (larger) weight tile to the
    activation's layout through shared memory on every iteration instead. The repeats hit L1."""
    rows = tl.broadcast_to(arows, [arows.shape[0], BLOCK_N, 1])
    offs = k0 + runs(BLOCK_K, 8)
    a = tl.load(a_ptr + rows + offs[None, None, :], mask=mask_s & (offs < K)[None, None, :], other=0.0)
    if A_MODE == A_FP8_GROUP:
        g = (k0 + 8 * tl.arange(0, BLOCK_K // 8)) // 128
        s = tl.load(as_ptr + tl.broadcast_to(asrows, [arows.shape[0], BLOCK_N, 1]) + g[None, None, :] * stride_ask,
                    mask=mask_s & (g < K // 128)[None, None, :], other=0.0).to(tl.float32)
    else:
        s = tl.zeros([1, 1, 1], dtype=tl.float32)
    return a, s


@triton.jit
def _rowdot(q, s, a, a_s, W_MODE: tl.constexpr, W_GROUP: tl.constexpr, A_MODE: tl.constexpr):
    """Partial dot products [S, BN, BLOCK_K // 8] of a raw weight tile with an activation chunk:
    sums over runs of 8 consecutive k (one thread's vector, so no cross-thread traffic), times the
    runs' scales. The caller accumulates these and reduces across threads once, after the K loop."""
    prod = w_values(q, W_MODE) * a.to(tl.float32)
    S: tl.constexpr = prod.shape[0]
    BN: tl.constexpr = prod.shape[1]
    BK: tl.constexpr = prod.shape[2]
    part = tl.sum(tl.reshape(prod, [S, BN, BK // 8, 8]), axis=3)
    if W_GROUP > 0:
        # one scale per group, repeated for the group's runs of 8
        NG: tl.constexpr = s.shape[2]
        part = part * tl.reshape(tl.broadcast_to(s[:, :, :, None], [S, BN, NG, W_GROUP // 8]), [S, BN, BK // 8])
    if A_MODE == A_FP8_GROUP:
        part = part * a_s
    return part


@triton.jit
def _expert_scale(s_ptr, g_ptr, e, stride_se, mask_s, W_MODE: tl.constexpr):
    """Per-slot factor [S] that is constant over the whole weight (fp8 per-tensor, nvfp4 global)."""
    if W_MODE == W_FP8:
        return tl.load(s_ptr + e * stride_se, mask=mask_s, other=0).to(tl.float32)
    elif W_MODE == W_NVFP4:
        return tl.load(g_ptr + e, mask=mask_s, other=0).to(tl.float32) * E2M1_UNSCALE
    else:
        return tl.full(e.shape, 1.0, tl.float32)


@triton.jit
def moe_gemv_kernel(
    a_ptr, a_scale_ptr, w_ptr, w_scale_ptr, w_gscale_ptr, ids_ptr, tw_ptr, out_ptr,
    N, stride_am, stride_asm, stride_ask, stride_we, stride_wn, stride_se, stride_sn, stride_sk, stride_om,
    K: tl.constexpr, UP_ROWS: tl.constexpr, SLOTS: tl.constexpr, SLOTS_P: tl.constexpr, A_DIV: tl.constexpr,
    WEIGHTED: tl.constexpr, W_MODE: tl.constexpr, W_GROUP: tl.constexpr, W_SN_DIV: tl.constexpr,
    A_MODE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    PDL_WAIT: tl.constexpr, PDL_TRIGGER: tl.constexpr,
):
    """out[r, n] = sum_{s < SLOTS} tw[p] * f(a[p // A_DIV] . w[ids[p], n]),  p = r * SLOTS + s,
    with f = identity, or silu(gate) * up when UP_ROWS > 0 (up row = UP_ROWS + n), tw = 1 unless
    WEIGHTED. Grid: (rows, cdiv(N, BLOCK_N)).

    W_SN_DIV: weight rows per scale row (128 for fp8 block scales, else 1). PDL_WAIT: load the
    weights, then wait for the previous kernel (whose output `a` is) before touching `a`.
    PDL_TRIGGER: let the next kernel launch now (it must PDL_WAIT before reading this one's output).
    """
    pid_r = tl.program_id(0)
    pid_n = tl.program_id(1)
    if PDL_TRIGGER:
        tl.extra.cuda.gdc_launch_dependents()

    slot = tl.arange(0, SLOTS_P)
    mask_s = slot < SLOTS
    pair = pid_r * SLOTS + slot
    e = tl.load(ids_ptr + pair, mask=mask_s, other=0).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < N
    mask_r = mask_s[:, None, None] & mask_n[None, :, None]
    mask_a = mask_s[:, None, None]
    # weights in runs of 8 k values, like the activations (see tiles.runs)
    W_VEC: tl.constexpr = 8

    rows = e[:, None, None] * stride_we + offs_n[None, :, None].to(tl.int64) * stride_wn
    srows = e[:, None, None] * stride_se + (offs_n // W_SN_DIV)[None, :, None] * stride_sn
    arow = (pair // A_DIV).to(tl.int64)
    arows = arow[:, None, None] * stride_am
    asrows = arow[:, None, None] * stride_asm
    if UP_ROWS > 0:
        rows_u = rows + UP_ROWS * stride_wn
        srows_u = e[:, None, None] * stride_se + ((offs_n + UP_ROWS) // W_SN_DIV)[None, :, None] * stride_sn

    # The weights never depend on the previous kernel: start streaming them before the PDL wait.
    q, s = load_w_raw(w_ptr, w_scale_ptr, rows, srows, 0, mask_r, stride_sk, K, W_MODE, W_GROUP, BLOCK_K, W_VEC)
    if UP_ROWS > 0:
        qu, su = load_w_raw(w_ptr, w_scale_ptr, rows_u, srows_u, 0, mask_r, stride_sk,
                            K, W_MODE, W_GROUP, BLOCK_K, W_VEC)
    if PDL_WAIT:
        tl.extra.cuda.gdc_wait()
    a, a_s = _load_a_raw(a_ptr, a_scale_ptr, arows, asrows, 0, mask_a, stride_ask, K, A_MODE, BLOCK_N, BLOCK_K)

    # Hand double-buffering: each iteration issues chunk k0's loads, then reduces the chunk loaded
    # one iteration earlier, so a program always has a chunk in flight while it computes.
    acc = tl.zeros([SLOTS_P, BLOCK_N, BLOCK_K // 8], dtype=tl.float32)
    acc_u = tl.zeros([SLOTS_P, BLOCK_N, BLOCK_K // 8], dtype=tl.float32)
    for k0 in range(BLOCK_K, K, BLOCK_K):
        q_next, s_next = load_w_raw(w_ptr, w_scale_ptr, rows, srows, k0, mask_r, stride_sk,
                                    K, W_MODE, W_GROUP, BLOCK_K, W_VEC)
        if UP_ROWS > 0:
            qu_next, su_next = load_w_raw(w_ptr, w_scale_ptr, rows_u, srows_u, k0, mask_r, stride_sk,
                                          K, W_MODE, W_GROUP, BLOCK_K, W_VEC)
        a_next, a_s_next = _load_a_raw(a_ptr, a_scale_ptr, arows, asrows, k0, mask_a, stride_ask,
                                       K, A_MODE, BLOCK_N, BLOCK_K)
        acc += _rowdot(q, s, a, a_s, W_MODE, W_GROUP, A_MODE)
        if UP_ROWS > 0:
            acc_u += _rowdot(qu, su, a, a_s, W_MODE, W_GROUP, A_MODE)
            qu, su = qu_next, su_next
        q, s, a, a_s = q_next, s_next, a_next, a_s_next
    acc += _rowdot(q, s, a, a_s, W_MODE, W_GROUP, A_MODE)
    if UP_ROWS > 0:
        acc_u += _rowdot(qu, su, a, a_s, W_MODE, W_GROUP, A_MODE)

    acc = tl.sum(acc, axis=2)
    acc_u = tl.sum(acc_u, axis=2)
    # Scales constant over a whole row: per-expert weight scale, per-row activation scale.
    factor = _expert_scale(w_scale_ptr, w_gscale_ptr, e, stride_se, mask_s, W_MODE)
    if A_MODE == A_FP8_ROW:
        factor = factor * tl.load(a_scale_ptr + arow * stride_asm, mask=mask_s, other=0).to(tl.float32)
    y = acc * factor[:, None]
    if UP_ROWS > 0:
        y = silu_mul(y, acc_u * factor[:, None])
    if WEIGHTED:
        y = y * tl.load(tw_ptr + pair, mask=mask_s, other=0).to(tl.float32)[:, None]
    out = tl.sum(y, axis=0)
    tl.store(out_ptr + pid_r * stride_om + offs_n, out.to(out_ptr.dtype.element_ty), mask=mask_n)
