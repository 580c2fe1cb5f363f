"""Decode in one launch, without a grid-wide barrier: the "onepass" path of the fused MoE (bf16).

The two-launch GEMV path loses ~4 us per call at M = 1 outside the HBM stream, at the boundary between
its up and down kernels (every output element needs all top-k experts' activations, so the down kernel
waits for the whole up kernel). Version 2 (a persistent kernel with an in-kernel barrier) kept that
dependency and was slower. This version removes it by splitting the down projection over I instead:

  program (m, t) owns rows t*BLOCK_N .. of the intermediate size, for all top-k slots of token m:
  1. gate and up rows of its slots' experts over all of K (the GEMV loop) -> h[slot, n] (rounded to
     bf16, as the two-launch path stores it), times the slot's routing weight;
  2. the matching rows of the *transposed* down weights w2t[e, n, :] (all of K, contiguous: w2 is
     stored [E, I, K] for this path, a one-time repack at load, like Marlin's) -> its partial output
     sum_{slot, n} h[slot, n] * w2t[e, n, k] for every k, added into a float32 row with atomics;
  3. after its adds, it bumps one counter per CHUNK of the output row; the program that completes a
     chunk (the I / BLOCK_N-th to arrive) writes that chunk of the bf16 output and zeroes the chunk and
     its counter for the next call.

No program ever waits for another, so there is no residency assumption and no deadlock; the only
ordering is release (each program's adds before its counter bumps) and acquire (the completing
program's reads after its bump). The float32 workspace is per device and shape and zeroes itself, so
one call at a time may use it (as with vLLM's workspaces). Summation order across programs is not
fixed: results agree with the reference to float32 rounding of 256 partial sums, not bit for bit.
"""

import triton
import triton.language as tl

from .tiles import W_BF16, A_BF16, load_w_raw, runs, silu_mul
from .gemv import _load_a_raw, _rowdot

# How the partial outputs are added (the ATOMICS constexpr).
ADD_SCALAR = tl.constexpr(0)  # tl.atomic_add: one 4-byte atomic per element (also runs in the interpreter)
ADD_V4 = tl.constexpr(1)      # red.global.add.v4.f32: one 16-byte reduction per 4 elements (sm_90+)


@triton.jit
def _red_add_v4(ptrs, vals):
    """Fire-and-forget float32 adds of each thread's runs of 4 consecutive values (16-byte aligned
    addresses) with red.global.add.v4.f32. The caller guarantees that no element is held by two threads
    (Triton's own atomics mask replicas; inline assembly does not)."""
    return tl.inline_asm_elementwise(
        "red.relaxed.gpu.global.add.v4.f32 [$4], {$8, $9, $10, $11};\n\t"
        "mov.b32 $0, 0;\n\tmov.b32 $1, 0;\n\tmov.b32 $2, 0;\n\tmov.b32 $3, 0;",
        "=r,=r,=r,=r,l,l,l,l,r,r,r,r", [ptrs.to(tl.int64, bitcast=True), vals], dtype=tl.int32,
        is_pure=False, pack=4)


@triton.jit
def _fence_gpu():
    """fence.acq_rel.gpu in every thread (CUDA's __threadfence())."""
    tl.inline_asm_elementwise("fence.acq_rel.gpu; // $0", "=r", [], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _add_chunk(row_ptr, k0, d, hb, K: tl.constexpr, BLOCK_K: tl.constexpr, ATOMICS: tl.constexpr):
    """row[k0 + j] += sum_{slot, n} hb[slot, n] * d[slot, n, j] for the chunk's BLOCK_K columns."""
    part = tl.sum(tl.sum(d.to(tl.float32) * hb, axis=0), axis=0)
    offs = k0 + runs(BLOCK_K, 8)
    if ATOMICS == ADD_V4:
        _red_add_v4(row_ptr + offs, part)
    else:
        tl.atomic_add(row_ptr + offs, part, mask=offs < K, sem="relaxed")


@triton.jit
def moe_onepass_kernel(
    x_ptr, w1_ptr, w2t_ptr, ids_ptr, tw_ptr, acc_ptr, cnt_ptr, out_ptr,
    stride_xm, stride_w1e, stride_w1n, stride_w2e, stride_w2n, stride_om,
    K: tl.constexpr, I: tl.constexpr, TOPK: tl.constexpr, TOPK_P: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, CHUNK: tl.constexpr, NCHUNK_P: tl.constexpr,
    ATOMICS: tl.constexpr, FENCE: tl.constexpr,
):
    """out[m] = sum_j tw[m, j] * (silu(x[m] @ g_e.T) * (x[m] @ u_e.T)) @ w2t[e], e = ids[m, j].
    Grid: (M, cdiv(I, BLOCK_N)). acc_ptr: float32 [M, K], zero on entry and on exit; cnt_ptr: int32
    [M, NCHUNK_P], zero on entry and on exit. FENCE: per-thread fence before the counters (off only in
    the interpreter, which cannot run inline assembly)."""
    m = tl.program_id(0).to(tl.int64)
    t = tl.program_id(1)
    TILES: tl.constexpr = (I + BLOCK_N - 1) // BLOCK_N
    NCHUNK: tl.constexpr = (K + CHUNK - 1) // CHUNK
    LAST_K: tl.constexpr = ((K - 1) // BLOCK_K) * BLOCK_K

    slot = tl.arange(0, TOPK_P)
    mask_s = slot < TOPK
    e = tl.load(ids_ptr + m * TOPK + slot, mask=mask_s, other=0).to(tl.int64)
    tw = tl.load(tw_ptr + m * TOPK + slot, mask=mask_s, other=0.0).to(tl.float32)
    offs_n = t * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_r = mask_s[:, None, None] & (offs_n < I)[None, :, None]
    rows_g = e[:, None, None] * stride_w1e + offs_n[None, :, None].to(tl.int64) * stride_w1n
    rows_u = rows_g + I * stride_w1n
    rows_d = e[:, None, None] * stride_w2e + offs_n[None, :, None].to(tl.int64) * stride_w2n
    # one activation row for all slots: [1, BLOCK_N, BLOCK_K], broadcast against the weight tiles
    arow = tl.zeros([1, 1, 1], tl.int64) + m * stride_xm
    amask = tl.full([1, 1, 1], 1, tl.int1)

    # 1. gate and up over K (the GEMV loop: the next chunk's loads go out before this one is reduced)
    q, s = load_w_raw(w1_ptr, w1_ptr, rows_g, rows_g, 0, mask_r, 0, K, W_BF16, 0, BLOCK_K, 8)
    qu, su = load_w_raw(w1_ptr, w1_ptr, rows_u, rows_u, 0, mask_r, 0, K, W_BF16, 0, BLOCK_K, 8)
    a, a_s = _load_a_raw(x_ptr, x_ptr, arow, arow, 0, amask, 0, K, A_BF16, BLOCK_N, BLOCK_K)
    acc = tl.zeros([TOPK_P, BLOCK_N, BLOCK_K // 8], dtype=tl.float32)
    acc_u = tl.zeros([TOPK_P, BLOCK_N, BLOCK_K // 8], dtype=tl.float32)
    for k0 in range(BLOCK_K, K, BLOCK_K):
        q_next, s = load_w_raw(w1_ptr, w1_ptr, rows_g, rows_g, k0, mask_r, 0, K, W_BF16, 0, BLOCK_K, 8)
        qu_next, su = load_w_raw(w1_ptr, w1_ptr, rows_u, rows_u, k0, mask_r, 0, K, W_BF16, 0, BLOCK_K, 8)
        a_next, a_s = _load_a_raw(x_ptr, x_ptr, arow, arow, k0, amask, 0, K, A_BF16, BLOCK_N, BLOCK_K)
        acc += _rowdot(q, s, a, a_s, W_BF16, 0, A_BF16)
        acc_u += _rowdot(qu, su, a, a_s, W_BF16, 0, A_BF16)
        q, qu, a = q_next, qu_next, a_next
    # the down weights do not depend on h: their first chunk goes out before the last up chunk is reduced
    d, s = load_w_raw(w2t_ptr, w2t_ptr, rows_d, rows_d, 0, mask_r, 0, K, W_BF16, 0, BLOCK_K, 8)
    acc += _rowdot(q, s, a, a_s, W_BF16, 0, A_BF16)
    acc_u += _rowdot(qu, su, a, a_s, W_BF16, 0, A_BF16)
    h = silu_mul(tl.sum(acc, axis=2), tl.sum(acc_u, axis=2))
    hb = (h.to(x_ptr.dtype.element_ty).to(tl.float32) * tw[:, None])[:, :, None]

    # 2. this program's share of the down projection, for every output column
    row = acc_ptr + m * K
    for k0 in range(BLOCK_K, K, BLOCK_K):
        d_next, s = load_w_raw(w2t_ptr, w2t_ptr, rows_d, rows_d, k0, mask_r, 0, K, W_BF16, 0, BLOCK_K, 8)
        _add_chunk(row, k0 - BLOCK_K, d, hb, K, BLOCK_K, ATOMICS)
        d = d_next
    _add_chunk(row, LAST_K, d, hb, K, BLOCK_K, ATOMICS)

    # 3. publish: every thread's adds are ordered before the counter bumps (fence + CTA barrier, then
    # release), and the completing program's reads after them (acquire; .cg reads L2, never a stale L1)
    if FENCE:
        _fence_gpu()
    tl.debug_barrier()
    c = tl.arange(0, NCHUNK_P)
    mask_c = c < NCHUNK
    old = tl.atomic_add(cnt_ptr + m * NCHUNK_P + c, tl.full([NCHUNK_P], 1, tl.int32), mask=mask_c,
                        sem="acq_rel", scope="gpu")
    last = mask_c & (old == TILES - 1)
    tl.debug_barrier()
    offs = c[:, None] * CHUNK + tl.arange(0, CHUNK)[None, :]
    mk = last[:, None] & (offs < K)
    v = tl.load(row + offs, mask=mk, other=0.0, cache_modifier=".cg")
    tl.store(out_ptr + m * stride_om + offs, v.to(out_ptr.dtype.element_ty), mask=mk)
    tl.store(row + offs, tl.zeros([NCHUNK_P, CHUNK], dtype=tl.float32), mask=mk)
    tl.store(cnt_ptr + m * NCHUNK_P + c, tl.zeros([NCHUNK_P], dtype=tl.int32), mask=last)
