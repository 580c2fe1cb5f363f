"""Larger-M path: tensor-core grouped GEMM over (token, slot) pairs sorted by expert.

routing.align_by_expert lays the pairs out in BLOCK_M-row blocks that each belong to one expert, so
a program loads a weight tile once for up to BLOCK_M rows and uses tl.dot. Quantized weights are
decoded in registers (int4 / nvfp4 to bf16); fp8 uses the fp8 tensor-core dot with the scales applied
to the float32 accumulator. Blocks past the routing's last one exit at once (the grid is sized for
the worst case so it never depends on the routing).
"""

import triton
import triton.language as tl

from .tiles import (A_FP8_GROUP, A_FP8_ROW, E2M1_UNSCALE, W_FP8, W_FP8_BLOCK, W_NVFP4, load_w_raw, silu_mul,
                    w_dequant)


@triton.jit
def _tile_dot(a, q, s, acc, a_s, W_MODE: tl.constexpr, W_GROUP: tl.constexpr, A_MODE: tl.constexpr,
              BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """acc + a [BM, BK] @ w.T for the raw weight tile q (a [1, BN, *] tile) with group scales s."""
    if W_MODE == W_FP8 or W_MODE == W_FP8_BLOCK:
        w = tl.reshape(q, [BLOCK_N, BLOCK_K])
        part = tl.dot(a, tl.trans(w))
        if W_MODE == W_FP8_BLOCK:
            # BLOCK_K == 128: one weight scale per output column and one activation scale per row
            part = part * tl.reshape(s, [1, BLOCK_N])
            if A_MODE == A_FP8_GROUP:
                part = part * a_s[:, None]
        return acc + part
    else:
        w = tl.reshape(w_dequant(q, s, W_MODE, W_GROUP), [BLOCK_N, BLOCK_K]).to(a.dtype)
        return tl.dot(a, tl.trans(w), acc)


@triton.jit
def moe_grouped_kernel(
    a_ptr, a_scale_ptr, w_ptr, w_scale_ptr, w_gscale_ptr, sorted_ptr, block_expert_ptr, tw_ptr, out_ptr,
    N, num_pairs, stride_am, stride_asm, stride_ask, stride_we, stride_wn, stride_se, stride_sn, stride_sk,
    stride_om,
    K: tl.constexpr, UP_ROWS: tl.constexpr, A_DIV: tl.constexpr, WEIGHTED: tl.constexpr,
    W_MODE: tl.constexpr, W_GROUP: tl.constexpr, W_SN_DIV: tl.constexpr, A_MODE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """For each pair p in block pid_m (expert e = block_expert[pid_m]):
    out[p, n] = tw[p] * f(a[p // A_DIV] . w[e, n]), f as in moe_gemv_kernel.
    Grid: (max_blocks, cdiv(N, BLOCK_N)); block_expert < 0 marks unused blocks."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    e = tl.load(block_expert_ptr + pid_m).to(tl.int64)
    if e < 0:
        return

    pairs = tl.load(sorted_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))
    mask_m = pairs < num_pairs
    arow = (pairs // A_DIV).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < N
    mask_r = mask_n[None, :, None]
    rows = e * stride_we + offs_n[None, :, None].to(tl.int64) * stride_wn
    srows = e * stride_se + (offs_n // W_SN_DIV)[None, :, None] * stride_sn
    if UP_ROWS > 0:
        rows_u = rows + UP_ROWS * stride_wn
        srows_u = e * stride_se + ((offs_n + UP_ROWS) // W_SN_DIV)[None, :, None] * stride_sn

    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc_u = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        a = tl.load(a_ptr + arow[:, None] * stride_am + offs_k[None, :],
                    mask=mask_m[:, None] & (offs_k < K)[None, :], other=0.0)
        a_s = tl.zeros([BLOCK_M], dtype=tl.float32)
        if A_MODE == A_FP8_GROUP:
            a_s = tl.load(a_scale_ptr + arow * stride_asm + (k0 // 128) * stride_ask, mask=mask_m, other=0.0)
        q, s = load_w_raw(w_ptr, w_scale_ptr, rows, srows, k0, mask_r, stride_sk, K, W_MODE, W_GROUP, BLOCK_K, 0)
        acc = _tile_dot(a, q, s, acc, a_s, W_MODE, W_GROUP, A_MODE, BLOCK_N, BLOCK_K)
        if UP_ROWS > 0:
            qu, su = load_w_raw(w_ptr, w_scale_ptr, rows_u, srows_u, k0, mask_r, stride_sk,
                                K, W_MODE, W_GROUP, BLOCK_K, 0)
            acc_u = _tile_dot(a, qu, su, acc_u, a_s, W_MODE, W_GROUP, A_MODE, BLOCK_N, BLOCK_K)

    # Scales constant over a whole row.
    factor = tl.full([BLOCK_M, 1], 1.0, tl.float32)
    if W_MODE == W_FP8:
        factor = factor * tl.load(w_scale_ptr + e * stride_se).to(tl.float32)
    if W_MODE == W_NVFP4:
        factor = factor * (tl.load(w_gscale_ptr + e).to(tl.float32) * E2M1_UNSCALE)
    if A_MODE == A_FP8_ROW:
        factor = factor * tl.load(a_scale_ptr + arow * stride_asm, mask=mask_m, other=0).to(tl.float32)[:, None]
    y = acc * factor
    if UP_ROWS > 0:
        y = silu_mul(y, acc_u * factor)
    if WEIGHTED:
        y = y * tl.load(tw_ptr + pairs, mask=mask_m, other=0).to(tl.float32)[:, None]
    tl.store(out_ptr + pairs.to(tl.int64)[:, None] * stride_om + offs_n[None, :], y.to(out_ptr.dtype.element_ty),
             mask=mask_m[:, None] & mask_n[None, :])


@triton.jit
def moe_sum_kernel(y_ptr, out_ptr, N, stride_ym, stride_om,
                   TOPK: tl.constexpr, TOPK_P: tl.constexpr, BLOCK_N: tl.constexpr):
    """out[m, n] = sum_j y[m * TOPK + j, n] in float32, stored in out's dtype. Grid: (M, cdiv(N, BLOCK_N))."""
    m = tl.program_id(0)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    j = tl.arange(0, TOPK_P)
    mask = (j < TOPK)[:, None] & (offs_n < N)[None, :]
    y = tl.load(y_ptr + (m * TOPK + j).to(tl.int64)[:, None] * stride_ym + offs_n[None, :], mask=mask, other=0)
    tl.store(out_ptr + m * stride_om + offs_n, tl.sum(y.to(tl.float32), axis=0).to(out_ptr.dtype.element_ty),
             mask=offs_n < N)
