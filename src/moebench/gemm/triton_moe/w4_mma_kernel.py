"""Decode kernel for int4 W4A16 (group 32, symmetric) experts on tensor cores: each warp dequantizes a
16-row weight tile straight into `mma.sync` fragments and multiplies it by the token's activations.

Why (docs/triton-moe-notes.md, version 5): the rows-4 CUDA-core kernel (w4_kernel.py) spends ~4 SASS
instructions per weight and per (token, slot) pair; at M = 16 (128 pairs) that issue time, not memory,
is its limit, and Marlin, which decodes once per weight into tensor-core fragments, wins there. Here one
`mma.m16n8k16` does the 256 multiply-adds of a 16 x 16 tile, so a weight costs its decode
(lop3 + bf16x2 fma per 2 weights, 11 instructions per 8) and no per-weight multiply:

  * lop3(w >> 4m, 0x000F000F, 0x43004300) makes a bf16 pair 128 + n (bf16 128 is 0x4300, the nibble in
    its low mantissa bits); fma.rn.bf16x2 by (1, -136) makes q = n - 8 exactly (stored n = q + 8);
  * those pairs are the A fragment (weights as the 16-row operand), the activations' bf16 pairs the B
    fragment as they lie in memory, 8 columns; the f32 accumulator is exact for the products;
  * two mma per group of 32 k, then the group's scale multiplies the group's sum (one FMA per row).

Lanes and layout (w4_mma.pack_tiles16): mma's A fragment gives lane (g, c) = (lane // 4, lane % 4)
rows g and g + 8 and k positions 2c, 2c+1, 2c+8, 2c+9; we map k positions to real k so a lane's 16
weights of a group (rows g, g + 8; real k 8c .. 8c + 7) are two 32-bit words, [E, N/16, K/32, 32, 2],
and its B fragment is the activation's 16 contiguous bytes at k 8c .. 8c + 7. Every lane of the 8
columns loads the same token, so all 8 columns hold the same result: lanes with c == 0 store rows
g and g + 8. (The other 7 columns are spare tensor-core throughput, not spare memory traffic.)

The lane mapping relies on Triton giving the [.., L, ..] lane axis to the 32 threads of a warp (L a
multiple of 32 and the fastest axis with more than one thread); compile_check prints the layout and
the GPU check against the float32 reference runs before anything is timed. The interpreter cannot run
the asm or warps, so USE_ASM = False computes each lane's own 8-k partial with Triton ops and sums the
4 lanes of a row at the end, the formula the CPU tests exercise.
"""

import triton
import triton.language as tl

from .tiles import bf16_hi, bf16_lo, silu_mul
from .w4_prefetch import prefetch_down


def _dequant(word: str, tile: int) -> list[str]:
    """PTX: the A fragment a0..a3 (bf16 pairs of q = n - 8) of one tile from its weight word."""
    out = [f"lop3.b32 a0, {word}, 0x000F000F, 0x43004300, 0xEA;"]
    for m in (1, 2, 3):
        out += [f"shr.u32 t, {word}, {4 * m};", f"lop3.b32 a{m}, t, 0x000F000F, 0x43004300, 0xEA;"]
    out += [f"fma.rn.bf16x2 a{m}, a{m}, one, m136;" for m in range(4)]
    return out


def group_mma_lines(w0: str, w1: str, b0: str, b1: str, scale: str) -> list[str]:
    """The PTX both int4 tensor-core kernels share for one group (32 k) of a 16-row tile, opening a scope the
    caller closes: decode the weight words w0 (k positions of tile 0) and w1 (tile 1), mma them by the B
    fragments b0 and b1 (two registers each, "$4, $5") into d0..d3, and split the scale word (bf16: row g low,
    row g + 8 high) into f32 s0 and s1. The caller adds its scaled accumulation (fma of d by s) and "}"."""
    lines = ["{", ".reg .b32 a0, a1, a2, a3, t, one, m136;", ".reg .f32 d0, d1, d2, d3, z, s0, s1;",
             "mov.b32 one, 0x3F803F80;",   # bf16 pair (1, 1)
             "mov.b32 m136, 0xC308C308;",  # bf16 pair (-136, -136)
             "mov.f32 z, 0f00000000;"]
    lines += _dequant(w0, 0)
    lines.append("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {d0, d1, d2, d3}, {a0, a1, a2, a3}, "
                 f"{{{b0}}}, {{z, z, z, z}};")
    lines += _dequant(w1, 1)
    lines.append("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {d0, d1, d2, d3}, {a0, a1, a2, a3}, "
                 f"{{{b1}}}, {{d0, d1, d2, d3}};")
    lines += [f"shl.b32 t, {scale}, 16;", "mov.b32 s0, t;", f"and.b32 t, {scale}, 0xFFFF0000;", "mov.b32 s1, t;"]
    return lines


def _group_asm() -> str:
    """PTX of one group (32 k) of a 16-row tile: $0, $1 = $9, $10 + scale * (rows g, g + 8 of W x),
    from the weight words $2 (k positions of tile 0), $3 (tile 1), the activation words $4..$7 (bf16
    pairs; $4, $5 are tile 0's B fragment, $6, $7 tile 1's) and the scale word $8 (bf16: row g low,
    row g + 8 high). One token: of mma's 8 columns, only column 2c's sums (d0, d2) are kept."""
    lines = group_mma_lines("$2", "$3", "$4, $5", "$6, $7", "$8")
    lines += ["fma.rn.f32 $0, d0, s0, $9;", "fma.rn.f32 $1, d2, s1, $10;", "}"]
    return "\n".join(lines)


GROUP_ASM = tl.constexpr(_group_asm())


@triton.jit
def _nib(w, j: tl.constexpr):
    """Nibble j of w as the signed weight q = n - 8."""
    return ((w >> (4 * j)) & 15).to(tl.float32) - 8.0


@triton.jit
def _lane_ref(w0, w1, x0, x1, x2, x3, s, c0, c2):
    """The lane's own part of the group without the mma: rows g (c0) and g + 8 (c2) over its 8 k.
    Word nibble j holds row g + 8 (j & 1), k 4 t + 2 ((j >> 1) & 1) + (j >> 2) of the lane's 8; x
    word 2 t + p holds k 4 t + 2 p (low half) and + 1 (high half)."""
    xs = (bf16_lo(x0), bf16_hi(x0), bf16_lo(x1), bf16_hi(x1),
          bf16_lo(x2), bf16_hi(x2), bf16_lo(x3), bf16_hi(x3))
    p0 = (_nib(w0, 0) * xs[0] + _nib(w0, 4) * xs[1] + _nib(w0, 2) * xs[2] + _nib(w0, 6) * xs[3]
          + _nib(w1, 0) * xs[4] + _nib(w1, 4) * xs[5] + _nib(w1, 2) * xs[6] + _nib(w1, 6) * xs[7])
    p2 = (_nib(w0, 1) * xs[0] + _nib(w0, 5) * xs[1] + _nib(w0, 3) * xs[2] + _nib(w0, 7) * xs[3]
          + _nib(w1, 1) * xs[4] + _nib(w1, 5) * xs[5] + _nib(w1, 3) * xs[6] + _nib(w1, 7) * xs[7])
    return c0 + bf16_lo(s) * p0, c2 + bf16_hi(s) * p2


@triton.jit
def _group(w, x, s, c0, c2, USE_ASM: tl.constexpr):
    """One group of 32 k for every (group slot, pair, lane) element: w [.., 2] words, x [.., 4] words."""
    w0, w1 = tl.split(w)
    xa, xb = tl.split(tl.reshape(x, x.shape[:-1] + [2, 2]))
    x0, x2 = tl.split(xa)
    x1, x3 = tl.split(xb)
    if USE_ASM:
        return tl.inline_asm_elementwise(
            GROUP_ASM, "=f,=f,r,r,r,r,r,r,r,f,f", [w0, w1, x0, x1, x2, x3, s, c0, c2],
            dtype=(tl.float32, tl.float32), is_pure=True, pack=1)
    else:
        return _lane_ref(w0, w1, x0, x1, x2, x3, s, c0, c2)


@triton.jit
def _load_ws(w_ptr, s_ptr, wrow, srow, grp, mask, G: tl.constexpr, lane):
    """Weight words [L, S, GPI, 2] and scale words [L, S, GPI] of groups grp ([L, 1, GPI])."""
    m = mask & (grp < G)
    g3 = grp.to(tl.int64)
    w = tl.load(w_ptr + (wrow + g3 * 64 + lane * 2)[:, :, :, None] + tl.arange(0, 2)[None, None, None, :],
                mask=m[:, :, :, None], other=0)
    s = tl.load(s_ptr + srow + g3 * 8 + lane // 4, mask=m, other=0)
    return w, s


@triton.jit
def _load_x(a_ptr, arow, grp, mask, G: tl.constexpr, lane):
    """Activation words [L, S, GPI, 4] of groups grp: the lane's 16 bytes, k 8c .. 8c + 7 of the group."""
    m = mask & (grp < G)
    return tl.load(a_ptr + (arow + grp.to(tl.int64) * 16 + (lane % 4) * 4)[:, :, :, None]
                   + tl.arange(0, 4)[None, None, None, :], mask=m[:, :, :, None], other=0)


@triton.jit
def _mma_step(w, x, s, wu, su, c0, c2, u0, u2, UP_ROWS: tl.constexpr, USE_ASM: tl.constexpr):
    """One step's groups into the accumulators: the weight stack's (c0, c2) and, for an up launch, the up
    stack's (u0, u2) on the same activations."""
    c0, c2 = _group(w, x, s, c0, c2, USE_ASM)
    if UP_ROWS > 0:
        u0, u2 = _group(wu, x, su, u0, u2, USE_ASM)
    return c0, c2, u0, u2


@triton.jit
def _lean_ws(wp, sp, g0, grp, mask, EVEN: tl.constexpr, G: tl.constexpr):
    """Version 9's weight words [L, S, GPI, 2] and scale words [L, S, GPI] at the lane pointers wp, sp of step 0
    moved on by g0 groups; no masks when the shape needs none (EVEN)."""
    wq = (wp + g0 * 64)[:, :, :, None] + tl.arange(0, 2)[None, None, None, :]
    if EVEN:
        return tl.load(wq), tl.load(sp + g0 * 8)
    m = mask & (grp + g0 < G)
    return tl.load(wq, mask=m[:, :, :, None], other=0), tl.load(sp + g0 * 8, mask=m, other=0)


@triton.jit
def _lean_x(xp, g0, grp, mask, EVEN: tl.constexpr, G: tl.constexpr):
    """Version 9's activation words [L, S, GPI, 4] at the lane pointers xp of step 0 moved on by g0 groups."""
    xq = (xp + g0 * 16)[:, :, :, None] + tl.arange(0, 4)[None, None, None, :]
    if EVEN:
        return tl.load(xq)
    m = mask & (grp + g0 < G)
    return tl.load(xq, mask=m[:, :, :, None], other=0)


@triton.jit
def _lean_k_loop(a_ptr, w_ptr, s_ptr, wrow, srow, arow, up_off_w, up_off_s, grp, mask, lane,
                 G: tl.constexpr, STEP: tl.constexpr, UP_ROWS: tl.constexpr, EVEN: tl.constexpr,
                 UNROLL: tl.constexpr, PDL_WAIT: tl.constexpr, USE_ASM: tl.constexpr, L: tl.constexpr,
                 SLOTS_P: tl.constexpr, GPI: tl.constexpr):
    """Version 9 (`lean`, docs/triton-moe-notes.md) of the kernel's K loop, the same sums in fewer instructions:
    loads without masks where the shape needs none, lane pointers made once and moved by immediates, and the
    double-buffered loop unrolled UNROLL times so its buffers swap without register copies. Down (UP_ROWS = 0)
    takes a 64-bit base a (lane, slot) and each of its groups as a load immediate (its 8 slots x GPI groups of
    loads then need 8 addresses, not 32)."""
    if UP_ROWS > 0:
        wp = w_ptr + (wrow + grp * 64 + lane * 2)
        sp = s_ptr + (srow + grp * 8 + lane // 4)
        xp = a_ptr + (arow + grp * 16 + (lane % 4) * 4)
        wpu = wp + up_off_w
        spu = sp + up_off_s
    else:
        # a 64-bit base a (lane, slot) first, then each group as a constant: the loads take it as an immediate
        jj = tl.arange(0, GPI)[None, None, :]
        first = grp - jj
        wp = ((w_ptr + wrow) + (first * 64 + lane * 2)) + jj * 64
        sp = ((s_ptr + srow) + (first * 8 + lane // 4)) + jj * 8
        xp = ((a_ptr + arow) + (first * 16 + (lane % 4) * 4)) + jj * 16
        wpu, spu = wp, sp
    w, s = _lean_ws(wp, sp, 0, grp, mask, EVEN, G)
    if UP_ROWS > 0:
        wu, su = _lean_ws(wpu, spu, 0, grp, mask, EVEN, G)
    else:
        wu, su = w, s
    if PDL_WAIT:
        tl.extra.cuda.gdc_wait()
    x = _lean_x(xp, 0, grp, mask, EVEN, G)
    z = tl.zeros([L, SLOTS_P, GPI], dtype=tl.float32)
    c0, c2, u0, u2 = z, z, z, z
    for g0 in tl.range(STEP, G, STEP, loop_unroll_factor=UNROLL):
        w_n, s_n = _lean_ws(wp, sp, g0, grp, mask, EVEN, G)
        if UP_ROWS > 0:
            wu_n, su_n = _lean_ws(wpu, spu, g0, grp, mask, EVEN, G)
        x_n = _lean_x(xp, g0, grp, mask, EVEN, G)
        c0, c2, u0, u2 = _mma_step(w, x, s, wu, su, c0, c2, u0, u2, UP_ROWS, USE_ASM)
        if UP_ROWS > 0:
            wu, su = wu_n, su_n
        w, x, s = w_n, x_n, s_n
    return _mma_step(w, x, s, wu, su, c0, c2, u0, u2, UP_ROWS, USE_ASM)


@triton.jit
def _rows_out(c0, c2, S: tl.constexpr, KS: tl.constexpr, RT: tl.constexpr, USE_ASM: tl.constexpr):
    """Accumulators [L, S, GPI] (L = KS x RT x 32 lanes) -> rows g, g + 8 of each tile: two [RT, 8, S]."""
    y0 = tl.reshape(tl.sum(c0, axis=2), [KS, RT, 8, 4, S])
    y2 = tl.reshape(tl.sum(c2, axis=2), [KS, RT, 8, 4, S])
    if USE_ASM:  # every lane of a row holds the whole sum (mma added the 4 lanes' k): take c == 0
        first = (tl.arange(0, 4) == 0)[None, None, None, :, None]
        y0 = tl.where(first, y0, 0.0)
        y2 = tl.where(first, y2, 0.0)
    # lane partials (USE_ASM = False): the 4 lanes of a row hold its 4 runs of 8 k
    return tl.sum(tl.sum(y0, axis=3), axis=0), tl.sum(tl.sum(y2, axis=3), axis=0)


@triton.jit
def moebench_w4_mma(
    a_ptr, w_ptr, s_ptr, ids_ptr, tw_ptr, out_ptr,
    N, stride_am, stride_we, stride_wt, stride_se, stride_st, stride_om,
    K: tl.constexpr, UP_ROWS: tl.constexpr, SLOTS: tl.constexpr, SLOTS_P: tl.constexpr, A_DIV: tl.constexpr,
    WEIGHTED: tl.constexpr, RT: tl.constexpr, KS: tl.constexpr, GPI: tl.constexpr,
    PDL_WAIT: tl.constexpr, PDL_TRIGGER: tl.constexpr, USE_ASM: tl.constexpr,
    w2_ptr=None, s2_ptr=None, PREFETCH_DOWN: tl.constexpr = 0, LEAN: tl.constexpr = 0,
    UNROLL: tl.constexpr = 1,
):
    """out[r, n] = sum_{s < SLOTS} tw[p] * f(a[p // A_DIV] . w[ids[p], n]),  p = r * SLOTS + s: the
    contract of the other GEMV kernels (gemv.moe_gemv_kernel), for int4 g32 weights in the 16-row tile
    layout. UP_ROWS > 0: silu(gate row n) * (up row UP_ROWS + n), N the output rows (UP_ROWS = N).

    a_ptr: activations as int32 words (bf16 pairs), row stride stride_am in words. w_ptr: int32
    [E, N/16, K/32, 32, 2]; s_ptr: int32 [E, N/16, K/32, 8]; strides in words. A program takes RT row
    tiles of 16 and splits K over KS lane sets (warps), each walking its groups GPI at a time.
    Grid: (rows, cdiv(N / 16, RT)).

    PREFETCH_DOWN (up launch only, w4_prefetch.MODES; 0 = off, the default): once its first weight loads
    are issued, the program prefetches into L2 its share of its pair's expert's down words (w2_ptr) and
    scales (s2_ptr), the down launch's operands (w4_prefetch.py). Off, w2_ptr and s2_ptr are None and
    the kernel compiles to what it was. Skipped without USE_ASM (the interpreter: nothing to check).

    LEAN (0 = off, the default; w4_mma.plan_call(lean=...), per launch): version 9's K loop (_lean_k_loop), the
    same sums in fewer instructions. The launcher sets it only when every row tile is whole ((N / 16) % RT ==
    0); UNROLL (1 or 2) unrolls its loop. Off, the kernel compiles to what it was.
    """
    pid_r = tl.program_id(0)
    pid_n = tl.program_id(1)
    if PDL_TRIGGER:
        tl.extra.cuda.gdc_launch_dependents()
    G: tl.constexpr = K // 32
    L: tl.constexpr = KS * RT * 32
    slot = tl.arange(0, SLOTS_P)
    mask_s = slot < SLOTS
    pair = pid_r * SLOTS + slot
    e = tl.load(ids_ptr + pair, mask=mask_s, other=0).to(tl.int64)

    i = tl.arange(0, L)
    lane = i % 32
    tile = pid_n * RT + (i // 32) % RT
    ks = i // (32 * RT)
    # Lanes lead every tensor: Triton's coalescing pass hands threads to the leading axis among those
    # with equal contiguity, and the asm needs L's 32 consecutive elements on a warp's 32 threads.
    lane = lane[:, None, None]
    mask = mask_s[None, :, None] & (tile < N // 16)[:, None, None]
    # [L, S, 1] element offsets (words) of each lane's tile (the group offset is added per step)
    wrow = e[None, :, None] * stride_we + tile[:, None, None].to(tl.int64) * stride_wt
    srow = e[None, :, None] * stride_se + tile[:, None, None].to(tl.int64) * stride_st
    arow = ((pair // A_DIV).to(tl.int64) * stride_am)[None, :, None]
    if UP_ROWS > 0:
        wrow_u = wrow + (UP_ROWS // 16) * stride_wt
        srow_u = srow + (UP_ROWS // 16) * stride_st

    # lane set ks takes groups ks * GPI + j, then + KS * GPI, ...: [L, 1, GPI] group index of each slot
    j = tl.arange(0, GPI)
    grp = j[None, None, :] + (ks * GPI)[:, None, None]
    STEP: tl.constexpr = KS * GPI
    if LEAN:
        # version 9: whole row tiles (the launcher's promise) and, with EVEN, every group of every lane set real
        EVEN: tl.constexpr = (G % STEP == 0) and (SLOTS == SLOTS_P)
        tl.static_assert(PREFETCH_DOWN == 0, "LEAN has no L2 prefetch of down's weights (w4_prefetch.py)")
        c0, c2, u0, u2 = _lean_k_loop(a_ptr, w_ptr, s_ptr, wrow, srow, arow, (UP_ROWS // 16) * stride_wt,
                                      (UP_ROWS // 16) * stride_st, grp, mask, lane, G, STEP, UP_ROWS, EVEN, UNROLL,
                                      PDL_WAIT, USE_ASM, L, SLOTS_P, GPI)
    else:
        # weights never depend on the previous kernel: start streaming them before the PDL wait
        w, s = _load_ws(w_ptr, s_ptr, wrow, srow, grp, mask, G, lane)
        if UP_ROWS > 0:
            wu, su = _load_ws(w_ptr, s_ptr, wrow_u, srow_u, grp, mask, G, lane)
        else:
            wu, su = w, s  # unused: down has no up stack
        if PREFETCH_DOWN > 0:
            tl.static_assert(UP_ROWS > 0 and SLOTS == 1, "PREFETCH_DOWN is the up launch's (one pair a program row)")
            if USE_ASM:
                # behind the program's own first loads, so its stream starts first
                prefetch_down(w2_ptr, s2_ptr, tl.sum(e, axis=0), pid_n, K, UP_ROWS, RT, L, PREFETCH_DOWN)
        if PDL_WAIT:
            tl.extra.cuda.gdc_wait()
        x = _load_x(a_ptr, arow, grp, mask, G, lane)

        z = tl.zeros([L, SLOTS_P, GPI], dtype=tl.float32)
        c0, c2, u0, u2 = z, z, z, z
        # hand double-buffering: issue the next step's loads, then reduce this one
        for g0 in range(STEP, G, STEP):
            w_n, s_n = _load_ws(w_ptr, s_ptr, wrow, srow, grp + g0, mask, G, lane)
            if UP_ROWS > 0:
                wu_n, su_n = _load_ws(w_ptr, s_ptr, wrow_u, srow_u, grp + g0, mask, G, lane)
            x_n = _load_x(a_ptr, arow, grp + g0, mask, G, lane)
            c0, c2, u0, u2 = _mma_step(w, x, s, wu, su, c0, c2, u0, u2, UP_ROWS, USE_ASM)
            if UP_ROWS > 0:
                wu, su = wu_n, su_n
            w, x, s = w_n, x_n, s_n
        c0, c2, u0, u2 = _mma_step(w, x, s, wu, su, c0, c2, u0, u2, UP_ROWS, USE_ASM)

    y0, y2 = _rows_out(c0, c2, SLOTS_P, KS, RT, USE_ASM)  # [RT, 8, S]: rows g, g + 8
    if UP_ROWS > 0:
        v0, v2 = _rows_out(u0, u2, SLOTS_P, KS, RT, USE_ASM)
        y0 = silu_mul(y0, v0)
        y2 = silu_mul(y2, v2)
    if WEIGHTED:
        tw = tl.load(tw_ptr + pair, mask=mask_s, other=0).to(tl.float32)[None, None, :]
        y0 = y0 * tw
        y2 = y2 * tw
    # invalid slots hold zeros (masked loads), so the sum over slots is the top-k sum
    o0 = tl.sum(y0, axis=2)
    o2 = tl.sum(y2, axis=2)
    rows = (pid_n * RT + tl.arange(0, RT))[:, None] * 16 + tl.arange(0, 8)[None, :]
    dst = out_ptr + pid_r * stride_om + rows
    tl.store(dst, o0.to(out_ptr.dtype.element_ty), mask=rows < N)
    tl.store(dst + 8, o2.to(out_ptr.dtype.element_ty), mask=rows + 8 < N)
