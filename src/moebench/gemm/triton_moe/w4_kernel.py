"""Decode kernel for int4 W4A16 (group 32, symmetric) experts: a GEMV whose dequantization costs a few
instructions per weight.

Why a second int4 kernel: the generic GEMV (gemv.py) decodes each int4 weight with ~5 integer
instructions (byte extract, shift, mask, or, plus the activation's bf16 -> f32 conversion, once per
weight because Triton loads the activation in the weight tile's layout). Hopper issues 64 integer
instructions per SM per clock against 128 float ones, so at M = 16 (128 (token, slot) pairs, 704 M
weight decodes per call) that alone is ~210 us, which is what the generic kernel measures (243 us;
the int4 floor is 79 us). This kernel decodes in inline PTX (Marlin's trick, on CUDA cores):

  * one `lop3` turns two nibbles of a 32-bit word into two fp16 values 1024 + q (magic 0x6400 in the
    exponent, the nibble in the low mantissa bits): 3 shifts + 4 lop3 per 8 weights;
  * each fp16 is widened to f32 (a float-pipe instruction) and multiplied into an f32 sum, so the
    products are exact: sum_k x_k (1024 + q_k);
  * the offset is removed once per 8 k for 4 rows: sum_k x_k (q_k - 8) = that sum - 1032 * sum_k x_k
    (the activation sum X is computed once per word for all 4 rows);
  * the group scale multiplies the word's partial sum (one FMA per row per word).

The weight layout is ours (`w4.pack_rows4`): rows in quads, the quad's four 32-bit words of the same
8 k values side by side ([E, N/4, K/8, 4] int32), so one 16-byte load gives a thread four rows of one
k run and the activation conversion and X are shared by the four rows. Scales likewise
([E, N/4, K/32, 4] bf16, read as two 32-bit words).

Precision: x (bf16) * (1024 + q) is exact in f32; the sum of 8 such products and the 1032 X
correction lose ~8 of f32's 24 bits to the cancellation, leaving ~1e-4 relative error per word,
far inside the 1e-2 the checks allow.

The interpreter cannot run inline PTX, so USE_ASM = False computes the same per-word formula with
Triton integer and float ops (what the CPU tests exercise); on a GPU the asm path is checked against
the float32 reference before anything is timed.
"""

import triton
import triton.language as tl

from .tiles import bf16_hi, bf16_lo, silu_mul


def _row_asm(r: int) -> str:
    """PTX for one row of the quad: word $(4+r), accumulator in $(14+r), result $r."""
    w, acc = f"${4 + r}", f"${14 + r}"
    lines = [f"lop3.b32 h0, {w}, 0x000F000F, 0x64006400, 0xEA;"]  # fp16 pair (1024+q0, 1024+q4)
    for m in (1, 2, 3):  # (q1, q5), (q2, q6), (q3, q7)
        lines += [f"shr.u32 t, {w}, {4 * m};", f"lop3.b32 h{m}, t, 0x000F000F, 0x64006400, 0xEA;"]
    first = True
    for m in range(4):
        lines.append(f"mov.b32 {{lo, hi}}, h{m};")
        lines.append("cvt.f32.f16 f, lo;")
        lines.append(f"mul.f32 p, x{m}, f;" if first else f"fma.rn.f32 p, x{m}, f, p;")
        first = False
        lines.append("cvt.f32.f16 f, hi;")
        lines.append(f"fma.rn.f32 p, x{m + 4}, f, p;")
    lines.append("fma.rn.f32 p, X, 0fC4810000, p;")  # - 1032 * X  (0fC4810000 = -1032.0)
    lines.append(f"fma.rn.f32 ${r}, p, sc{r}, {acc};")
    return "\n".join(lines)


def _quad_asm() -> str:
    """PTX of one word-quad step: $0..$3 = $14..$17 + scale_r * sum_k x_k (q_rk - 8), from the 4 weight
    words $4..$7, the 4 activation words $8..$11 (bf16 pairs, k = 2i low half, 2i + 1 high half) and
    the 2 scale words $12, $13 (bf16 pairs: rows 0, 1 and 2, 3)."""
    head = [".reg .b32 t, h0, h1, h2, h3;", ".reg .b16 lo, hi;",
            ".reg .f32 x0, x1, x2, x3, x4, x5, x6, x7, X, p, f, sc0, sc1, sc2, sc3;"]
    # bf16 -> f32 is the bf16 bits in the high half. Activation word i holds k = 2i, 2i + 1; the row
    # code below names activations by k: x0..x7.
    for i in range(4):
        head += [f"shl.b32 t, ${8 + i}, 16;", f"mov.b32 x{2 * i}, t;",
                 f"and.b32 t, ${8 + i}, 0xFFFF0000;", f"mov.b32 x{2 * i + 1}, t;"]
    head += ["add.f32 X, x0, x1;"] + [f"add.f32 X, X, x{k};" for k in range(2, 8)]
    for j, word in enumerate(("$12", "$13")):
        head += [f"shl.b32 t, {word}, 16;", f"mov.b32 sc{2 * j}, t;",
                 f"and.b32 t, {word}, 0xFFFF0000;", f"mov.b32 sc{2 * j + 1}, t;"]
    # The row code reads activations in nibble order: word nibble m is k = m, m + 4 pairs with it.
    body = "\n".join(_row_asm(r) for r in range(4))
    return "{\n" + "\n".join(head) + "\n" + body + "\n}"


QUAD_ASM = tl.constexpr(_quad_asm())


@triton.jit
def _row_ref(w, xs, s, c):
    """c + s * sum_k x_k (q_k - 8) for one row's word w (nibble k = bits 4k..4k+3), in plain Triton ops."""
    p = tl.zeros(w.shape, tl.float32)
    for k in tl.static_range(8):
        q = ((w >> (4 * k)) & 15).to(tl.float32) - 8.0
        p += q * xs[k]
    return c + s * p


@triton.jit
def _quad(w0, w1, w2, w3, a0, a1, a2, a3, s01, s23, c0, c1, c2, c3, USE_ASM: tl.constexpr):
    """Accumulate one k word (8 k values) of a row quad: returns the 4 new partial sums."""
    if USE_ASM:
        return tl.inline_asm_elementwise(
            QUAD_ASM, "=f,=f,=f,=f,r,r,r,r,r,r,r,r,r,r,f,f,f,f",
            [w0, w1, w2, w3, a0, a1, a2, a3, s01, s23, c0, c1, c2, c3],
            dtype=(tl.float32, tl.float32, tl.float32, tl.float32), is_pure=True, pack=1)
    else:
        xs = (bf16_lo(a0), bf16_hi(a0), bf16_lo(a1), bf16_hi(a1),
              bf16_lo(a2), bf16_hi(a2), bf16_lo(a3), bf16_hi(a3))
        return (_row_ref(w0, xs, bf16_lo(s01), c0), _row_ref(w1, xs, bf16_hi(s01), c1),
                _row_ref(w2, xs, bf16_lo(s23), c2), _row_ref(w3, xs, bf16_hi(s23), c3))


@triton.jit
def _split4(t):
    """[..., 4] -> four [...] tensors (index 0, 1, 2, 3); free when the 4 sit in one thread."""
    lo, hi = tl.split(tl.reshape(t, t.shape[:-1] + [2, 2]))
    t0, t2 = tl.split(lo)
    t1, t3 = tl.split(hi)
    return t0, t1, t2, t3


@triton.jit
def _load_quad(w_ptr, s_ptr, wrows, srows, kw0, mask_r, KW: tl.constexpr, BKW: tl.constexpr):
    """Weight words [S, BN4, BKW, 4] (int32) and scale words [S, BN4, BKW, 2] of k words kw0 .. kw0+BKW."""
    kw = kw0 + tl.arange(0, BKW)
    mk = mask_r & (kw < KW)[None, None, :, None]
    w = tl.load(w_ptr + wrows + (kw * 4)[None, None, :, None] + tl.arange(0, 4)[None, None, None, :],
                mask=mk, other=0)
    s = tl.load(s_ptr + srows + ((kw // 4) * 2)[None, None, :, None] + tl.arange(0, 2)[None, None, None, :],
                mask=mk, other=0)
    return w, s


@triton.jit
def _load_act(a_ptr, arows, kw0, mask_s, KW: tl.constexpr, BN4: tl.constexpr, BKW: tl.constexpr):
    """Activation words [S, BN4, BKW, 4] (int32 bf16 pairs of k words kw0 .. kw0+BKW), in the weight
    tile's shape so the two share one register layout (the repeats over BN4 hit L1)."""
    kw = kw0 + tl.arange(0, BKW)
    rows = tl.broadcast_to(arows, [arows.shape[0], BN4, 1, 1])
    return tl.load(a_ptr + rows + (kw * 4)[None, None, :, None] + tl.arange(0, 4)[None, None, None, :],
                   mask=mask_s & (kw < KW)[None, None, :, None], other=0)


@triton.jit
def _step(w, s, a, c0, c1, c2, c3, USE_ASM: tl.constexpr):
    w0, w1, w2, w3 = _split4(w)
    a0, a1, a2, a3 = _split4(a)
    s01, s23 = tl.split(s)
    return _quad(w0, w1, w2, w3, a0, a1, a2, a3, s01, s23, c0, c1, c2, c3, USE_ASM)


@triton.jit
def _slots(ids_ptr, pid_r, SLOTS: tl.constexpr, SLOTS_P: tl.constexpr):
    """Row pid_r's (token, slot) pairs: (mask of the real slots, pair index, expert id as int64)."""
    slot = tl.arange(0, SLOTS_P)
    mask_s = slot < SLOTS
    pair = pid_r * SLOTS + slot
    return mask_s, pair, tl.load(ids_ptr + pair, mask=mask_s, other=0).to(tl.int64)


@triton.jit
def _join4(t0, t1, t2, t3):
    """Four [S, BN4] row results (row 4 n4 + r in t_r) -> [S, 4 BN4] in row order."""
    j = tl.join(tl.join(t0, t2), tl.join(t1, t3))  # [S, BN4, 2, 2]: element (b, a) = t_(2b + a)
    return tl.reshape(j, [t0.shape[0], 4 * t0.shape[1]])


@triton.jit
def moebench_w4_gemv(
    a_ptr, w_ptr, s_ptr, ids_ptr, tw_ptr, out_ptr,
    N, stride_am, stride_we, stride_wn4, stride_se, stride_sn4, stride_om,
    K: tl.constexpr, UP_ROWS: tl.constexpr, SLOTS: tl.constexpr, SLOTS_P: tl.constexpr, A_DIV: tl.constexpr,
    WEIGHTED: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    PDL_WAIT: tl.constexpr, PDL_TRIGGER: tl.constexpr, USE_ASM: tl.constexpr,
):
    """out[r, n] = sum_{s < SLOTS} tw[p] * f(a[p // A_DIV] . w[ids[p], n]),  p = r * SLOTS + s: the
    generic GEMV's contract (gemv.moe_gemv_kernel) for int4 g32 weights in the rows-4 layout.

    a_ptr: the activations as int32 words (bf16 pairs), row stride stride_am in words. w_ptr: int32
    [E, N/4, K/8, 4]; s_ptr: int32 [E, N/4, K/32, 2] (bf16 scale pairs); strides in 32-bit words.
    UP_ROWS > 0: silu(gate row n) * (up row UP_ROWS + n). Grid: (rows, cdiv(N, BLOCK_N)).
    """
    pid_r = tl.program_id(0)
    pid_n = tl.program_id(1)
    if PDL_TRIGGER:
        tl.extra.cuda.gdc_launch_dependents()
    BN4: tl.constexpr = BLOCK_N // 4
    BKW: tl.constexpr = BLOCK_K // 8
    KW: tl.constexpr = K // 8

    mask_s, pair, e = _slots(ids_ptr, pid_r, SLOTS, SLOTS_P)
    n4 = pid_n * BN4 + tl.arange(0, BN4)
    mask_r = mask_s[:, None, None, None] & (n4 < N // 4)[None, :, None, None]
    mask_a = mask_s[:, None, None, None]
    wrows = e[:, None, None, None] * stride_we + n4[None, :, None, None].to(tl.int64) * stride_wn4
    srows = e[:, None, None, None] * stride_se + n4[None, :, None, None].to(tl.int64) * stride_sn4
    arows = (pair // A_DIV).to(tl.int64)[:, None, None, None] * stride_am
    if UP_ROWS > 0:
        wrows_u = wrows + (UP_ROWS // 4) * stride_wn4
        srows_u = srows + (UP_ROWS // 4) * stride_sn4

    # Weights never depend on the previous kernel: start streaming them before the PDL wait.
    w, s = _load_quad(w_ptr, s_ptr, wrows, srows, 0, mask_r, KW, BKW)
    if UP_ROWS > 0:
        wu, su = _load_quad(w_ptr, s_ptr, wrows_u, srows_u, 0, mask_r, KW, BKW)
    if PDL_WAIT:
        tl.extra.cuda.gdc_wait()
    a = _load_act(a_ptr, arows, 0, mask_a, KW, BN4, BKW)

    z = tl.zeros([SLOTS_P, BN4, BKW], dtype=tl.float32)
    c0, c1, c2, c3 = z, z, z, z
    u0, u1, u2, u3 = z, z, z, z
    # Hand double-buffering, as in gemv.py: issue chunk k0's loads, then reduce the previous chunk.
    for kw0 in range(BKW, KW, BKW):
        w_next, s_next = _load_quad(w_ptr, s_ptr, wrows, srows, kw0, mask_r, KW, BKW)
        if UP_ROWS > 0:
            wu_next, su_next = _load_quad(w_ptr, s_ptr, wrows_u, srows_u, kw0, mask_r, KW, BKW)
        a_next = _load_act(a_ptr, arows, kw0, mask_a, KW, BN4, BKW)
        c0, c1, c2, c3 = _step(w, s, a, c0, c1, c2, c3, USE_ASM)
        if UP_ROWS > 0:
            u0, u1, u2, u3 = _step(wu, su, a, u0, u1, u2, u3, USE_ASM)
            wu, su = wu_next, su_next
        w, s, a = w_next, s_next, a_next
    c0, c1, c2, c3 = _step(w, s, a, c0, c1, c2, c3, USE_ASM)
    if UP_ROWS > 0:
        u0, u1, u2, u3 = _step(wu, su, a, u0, u1, u2, u3, USE_ASM)

    y = _join4(tl.sum(c0, axis=2), tl.sum(c1, axis=2), tl.sum(c2, axis=2), tl.sum(c3, axis=2))
    if UP_ROWS > 0:
        y = silu_mul(y, _join4(tl.sum(u0, axis=2), tl.sum(u1, axis=2), tl.sum(u2, axis=2), tl.sum(u3, axis=2)))
    if WEIGHTED:
        y = y * tl.load(tw_ptr + pair, mask=mask_s, other=0).to(tl.float32)[:, None]
    out = tl.sum(y, axis=0)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    tl.store(out_ptr + pid_r * stride_om + offs_n, out.to(out_ptr.dtype.element_ty), mask=offs_n < N)


@triton.jit
def moebench_w4_down(
    a_ptr, w_ptr, s_ptr, ids_ptr, tw_ptr, out_ptr,
    N, stride_am, stride_we, stride_wn4, stride_se, stride_sn4, stride_om,
    K: tl.constexpr, SLOTS: tl.constexpr, SLOTS_P: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    N_TILES: tl.constexpr, PDL_WAIT: tl.constexpr, USE_ASM: tl.constexpr,
):
    """The down projection with the top-k weighted sum: out[m, n] = sum_s tw[p] (a[p] . w[ids[p], n]),
    p = m * SLOTS + s, K (the intermediate size) in one chunk of BLOCK_K >= K. Grid: (M, cdiv(N, BLOCK_N * N_TILES)).

    Why not moebench_w4_gemv: there every program re-reads its token's whole activation (all top-k
    slots, 4 KB at I = 256) from L1 to produce BLOCK_N outputs, so the activation traffic equals the
    weight traffic; Nsight Compute read the kernel as L1-bound (memory pipes 90% busy, DRAM 22%, warps
    waiting on L1TEX) at Kimi-K2.5 M = 16. Here a program loads the activation once and walks N_TILES
    row tiles with it, prefetching the next tile's weights while it reduces the current one.
    """
    pid_r = tl.program_id(0)
    pid_t = tl.program_id(1)
    BN4: tl.constexpr = BLOCK_N // 4
    KW: tl.constexpr = K // 8
    BKW: tl.constexpr = BLOCK_K // 8
    mask_s, pair, e = _slots(ids_ptr, pid_r, SLOTS, SLOTS_P)
    q4 = tl.arange(0, BN4)
    wbase = e[:, None, None, None] * stride_we
    sbase = e[:, None, None, None] * stride_se
    n4 = pid_t * (N_TILES * BN4) + q4
    mask_r = mask_s[:, None, None, None] & (n4 < N // 4)[None, :, None, None]
    w, s = _load_quad(w_ptr, s_ptr, wbase + n4[None, :, None, None].to(tl.int64) * stride_wn4,
                      sbase + n4[None, :, None, None].to(tl.int64) * stride_sn4, 0, mask_r, KW, BKW)
    if PDL_WAIT:
        tl.extra.cuda.gdc_wait()
    a = _load_act(a_ptr, pair.to(tl.int64)[:, None, None, None] * stride_am, 0, mask_s[:, None, None, None], KW, BN4, BKW)
    tw = tl.load(tw_ptr + pair, mask=mask_s, other=0).to(tl.float32)
    z = tl.zeros([SLOTS_P, BN4, BKW], dtype=tl.float32)
    for t in range(N_TILES):
        # the next tile's weights are in flight while this one is reduced (masked off past the last)
        n4n = n4 + BN4
        mask_n = mask_s[:, None, None, None] & (n4n < N // 4)[None, :, None, None] & (t + 1 < N_TILES)
        w_next, s_next = _load_quad(w_ptr, s_ptr, wbase + n4n[None, :, None, None].to(tl.int64) * stride_wn4,
                                    sbase + n4n[None, :, None, None].to(tl.int64) * stride_sn4, 0, mask_n, KW, BKW)
        c0, c1, c2, c3 = _step(w, s, a, z, z, z, z, USE_ASM)
        y = _join4(tl.sum(c0, axis=2), tl.sum(c1, axis=2), tl.sum(c2, axis=2), tl.sum(c3, axis=2))
        out = tl.sum(y * tw[:, None], axis=0)
        offs_n = (pid_t * N_TILES + t) * BLOCK_N + tl.arange(0, BLOCK_N)
        tl.store(out_ptr + pid_r * stride_om + offs_n, out.to(out_ptr.dtype.element_ty), mask=offs_n < N)
        n4, w, s = n4n, w_next, s_next
