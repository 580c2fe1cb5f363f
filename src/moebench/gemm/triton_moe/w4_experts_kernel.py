"""Expert-major int4 W4A16 (group 32) kernel on tensor cores: one program decodes a 16-row weight tile of ONE
expert once and multiplies it by up to 8 tokens routed to that expert, one token per column of mma's B operand.

Why (docs/triton-moe-notes.md, issue 32, "expert-major"): the pair-major kernel (w4_mma_kernel.py) gives each
(token, slot) pair its own programs, so all 8 columns of `mma.m16n8k16` hold the same token and an expert
chosen by two tokens is decoded (and read from L2 or DRAM) twice. From M = 32 on, tokens share experts (Kimi
M = 64: 512 pairs on about 284 experts), and the pair-major time grows by a token's whole weight stream per
token. Here the weight words, their decode and the scale multiply are shared by the expert's tokens, and the
tokens' activations (a few KB) are what each column adds.

Lanes, as mma's fragments give them (PTX ISA, m16n8k16 with .bf16): lane (g, c) = (lane // 4, lane % 4)
  * A (the weights): rows g, g + 8 at the k positions of lane c; the same words and the same lop3 decode as the
    pair-major kernel (w4_mma_kernel._dequant, the W4Tiles layout of w4_mma.py);
  * B (the activations): column g, at the k positions of lane c: lane (g, c) loads token column g's 16 bytes at
    real k 8c .. 8c + 7, the bytes the pair-major kernel's lanes load for their one token;
  * D: rows g, g + 8 at columns 2c, 2c + 1: each lane holds four whole sums (no lane reduction at the end).

Routing: the grid's first axis is the expert. A program reads the M * topk routing ids (2 KB at M = 64, from
L2), exits at once if its expert has no pair, and otherwise takes its pairs in the order they appear, 8 at a
time (more than 8 pairs on one expert loop: each chunk streams the tile again, from L2). No sort and no
launch before it; the cost is one early-exiting program per unused expert and tile, which is why the pair-major
kernel stays the choice at small M.

The interpreter cannot run the asm or warps: USE_ASM = False computes lane (g, c)'s four sums from the words
lanes (g, 0..3) would hold (w4_mma_kernel._lane_ref, the formula the pair-major CPU tests exercise), so the
CPU tests check the layout, the routing, the columns and the epilogue, and tests/test_w4_experts_asm.py runs
the asm text itself for a warp.
"""

import triton
import triton.language as tl

from .tiles import silu_mul
from .w4_kernel import _split4
from .w4_mma_kernel import _lane_ref, _load_ws, _load_x, group_mma_lines

COLS = tl.constexpr(8)  # tokens a program multiplies at once: mma.m16n8k16's B columns


def _group8_asm() -> str:
    """PTX of one group (32 k) of a 16-row tile by 8 token columns: $0..$3 = $11..$14 + scale x (rows g, g + 8)
    x (columns 2c, 2c + 1) of W X, from the weight words $4 (tile 0), $5 (tile 1), the lane's activation
    words $6..$9 (column g; $6, $7 tile 0's B fragment, $8, $9 tile 1's) and the scale word $10 (bf16: row g
    low, row g + 8 high). Outputs: $0 (g, 2c), $1 (g, 2c + 1), $2 (g + 8, 2c), $3 (g + 8, 2c + 1)."""
    lines = group_mma_lines("$4", "$5", "$6, $7", "$8, $9", "$10")
    lines += ["fma.rn.f32 $0, d0, s0, $11;", "fma.rn.f32 $1, d1, s0, $12;",
              "fma.rn.f32 $2, d2, s1, $13;", "fma.rn.f32 $3, d3, s1, $14;", "}"]
    return "\n".join(lines)


GROUP8_ASM = tl.constexpr(_group8_asm())


@triton.jit
def _lane_group_ref(w_ptr, s_ptr, a_ptr, wrow, srow, arow_e, arow_o, grp, mask, mask_e, mask_o, G: tl.constexpr,
                    lane, c0, c1, c2, c3):
    """What the asm leaves in lane (g, c) for one group, without mma: the four sums over the 32 k, read from the
    words of lanes (g, 0..3) and the activations of columns 2c (arow_e) and 2c + 1 (arow_o)."""
    for cc in tl.static_range(4):
        src = (lane // 4) * 4 + cc  # lane (g, cc): its words hold rows g, g + 8 at k 8 cc .. 8 cc + 7
        w, s = _load_ws(w_ptr, s_ptr, wrow, srow, grp, mask, G, src)
        w0, w1 = tl.split(w)
        xe0, xe1, xe2, xe3 = _split4(_load_x(a_ptr, arow_e, grp, mask_e, G, src))
        xo0, xo1, xo2, xo3 = _split4(_load_x(a_ptr, arow_o, grp, mask_o, G, src))
        c0, c2 = _lane_ref(w0, w1, xe0, xe1, xe2, xe3, s, c0, c2)
        c1, c3 = _lane_ref(w0, w1, xo0, xo1, xo2, xo3, s, c1, c3)
    return c0, c1, c2, c3


@triton.jit
def _group8(w, x, s, c0, c1, c2, c3):
    """One group on tensor cores for every (lane, group slot) element: w [.., 2] words, x [.., 4] words."""
    w0, w1 = tl.split(w)
    x0, x1, x2, x3 = _split4(x)
    return tl.inline_asm_elementwise(
        GROUP8_ASM, "=f,=f,=f,=f,r,r,r,r,r,r,r,f,f,f,f", [w0, w1, x0, x1, x2, x3, s, c0, c1, c2, c3],
        dtype=(tl.float32, tl.float32, tl.float32, tl.float32), is_pure=True, pack=1)


@triton.jit
def _cols_out(c, KS: tl.constexpr, RT: tl.constexpr):
    """An accumulator [L, 1, GPI] (L = KS x RT x 32 lanes) -> [RT, 8, 4]: row tile, g, c."""
    return tl.sum(tl.reshape(tl.sum(c, axis=2), [KS, RT, 8, 4]), axis=0)


@triton.jit
def _lane_pick(vals, idx, L: tl.constexpr):
    """vals[idx] for each of the L lanes: vals [8] (a chunk's pairs), idx [L] in 0..7."""
    hit = idx[:, None] == tl.arange(0, 8)[None, :]
    return tl.sum(tl.where(hit, vals[None, :], 0), axis=1)


@triton.jit
def _load_words(w_ptr, s_ptr, wrow, srow, wrow_u, srow_u, grp, mask, G: tl.constexpr, lane, UP_ROWS: tl.constexpr):
    """A step's weight words and scales (w4_mma_kernel._load_ws): the gate (or down) rows', and the up rows' when
    UP_ROWS > 0 (else the same again: the caller passes them on, unused)."""
    w, s = _load_ws(w_ptr, s_ptr, wrow, srow, grp, mask, G, lane)
    wu, su = w, s
    if UP_ROWS > 0:
        wu, su = _load_ws(w_ptr, s_ptr, wrow_u, srow_u, grp, mask, G, lane)
    return w, s, wu, su


@triton.jit
def _step(w, x, s, wu, su, a0, a1, a2, a3, u0, u1, u2, u3, w_ptr, s_ptr, a_ptr, wrow, srow, wrow_u, srow_u, arow_e,
          arow_o, grp, mask, mask_e, mask_o, G: tl.constexpr, lane, UP_ROWS: tl.constexpr, USE_ASM: tl.constexpr):
    """One step's groups (grp) into the gate (a) and up (u) accumulators: on tensor cores from the loaded words
    (w, s, wu, su, x), or, without the asm, by _lane_group_ref from memory."""
    if USE_ASM:
        a0, a1, a2, a3 = _group8(w, x, s, a0, a1, a2, a3)
        if UP_ROWS > 0:
            u0, u1, u2, u3 = _group8(wu, x, su, u0, u1, u2, u3)
    else:
        a0, a1, a2, a3 = _lane_group_ref(w_ptr, s_ptr, a_ptr, wrow, srow, arow_e, arow_o, grp, mask, mask_e, mask_o,
                                         G, lane, a0, a1, a2, a3)
        if UP_ROWS > 0:
            u0, u1, u2, u3 = _lane_group_ref(w_ptr, s_ptr, a_ptr, wrow_u, srow_u, arow_e, arow_o, grp, mask, mask_e,
                                             mask_o, G, lane, u0, u1, u2, u3)
    return a0, a1, a2, a3, u0, u1, u2, u3


@triton.jit
def _chunk(a_ptr, w_ptr, s_ptr, ids_ptr, tw_ptr, out_ptr, w, s, wu, su, wrow, srow, wrow_u, srow_u, grp, mask, lane,
           g, c, e, num_pairs, c0, n0, N, stride_am, stride_om, PAIRS_P: tl.constexpr, G: tl.constexpr,
           L: tl.constexpr, STEP: tl.constexpr, KS: tl.constexpr, RT: tl.constexpr, GPI: tl.constexpr,
           UP_ROWS: tl.constexpr, A_DIV: tl.constexpr, WEIGHTED: tl.constexpr, USE_ASM: tl.constexpr,
           PIPELINED: tl.constexpr):
    """Pairs c0 .. c0 + 7 of the program's expert (by rank) through the tile; out rows of those pairs written.
    PIPELINED: w, s (wu, su) are the first step's words and scales, already loaded, and each step issues the
    next one's loads before its mma (the first chunk); else each step loads and then multiplies (the chunks
    after it, rare: lighter on registers, which a loop around the pipelined walk would cost; see the kernel)."""
    # this chunk's pairs by column (-1: no pair), then each lane's: column g (B), columns 2c, 2c + 1 (D)
    p = tl.arange(0, PAIRS_P)
    hit = tl.load(ids_ptr + p, mask=p < num_pairs, other=-1) == e
    rank = tl.cumsum(hit.to(tl.int32), axis=0) - 1  # a pair's position among its expert's pairs
    col = tl.where(hit, rank - c0, -1)
    pairs = tl.sum(tl.where(col[None, :] == tl.arange(0, COLS)[:, None], p[None, :] + 1, 0), axis=1) - 1
    pair_g = _lane_pick(pairs, g, L)[:, None, None]
    arow = (tl.maximum(pair_g, 0) // A_DIV).to(tl.int64) * stride_am
    mask_x = mask & (pair_g >= 0)
    arow_e, arow_o, mask_e, mask_o = arow, arow, mask_x, mask_x  # the asm's lanes read column g only
    if not USE_ASM:
        pair_e = _lane_pick(pairs, 2 * c, L)[:, None, None]
        pair_o = _lane_pick(pairs, 2 * c + 1, L)[:, None, None]
        arow_e = (tl.maximum(pair_e, 0) // A_DIV).to(tl.int64) * stride_am
        arow_o = (tl.maximum(pair_o, 0) // A_DIV).to(tl.int64) * stride_am
        mask_e = mask & (pair_e >= 0)
        mask_o = mask & (pair_o >= 0)

    z = tl.zeros([L, 1, GPI], dtype=tl.float32)
    a0, a1, a2, a3 = z, z, z, z
    u0, u1, u2, u3 = z, z, z, z
    if PIPELINED:
        x = _load_x(a_ptr, arow, grp, mask_x, G, lane)
        # hand double-buffering: issue the next step's loads, then reduce this one
        for g0 in range(STEP, G, STEP):
            w_n, s_n, wu_n, su_n = _load_words(w_ptr, s_ptr, wrow, srow, wrow_u, srow_u, grp + g0, mask, G, lane,
                                               UP_ROWS)
            x_n = _load_x(a_ptr, arow, grp + g0, mask_x, G, lane)
            a0, a1, a2, a3, u0, u1, u2, u3 = _step(
                w, x, s, wu, su, a0, a1, a2, a3, u0, u1, u2, u3, w_ptr, s_ptr, a_ptr, wrow, srow, wrow_u, srow_u,
                arow_e, arow_o, grp + g0 - STEP, mask, mask_e, mask_o, G, lane, UP_ROWS, USE_ASM)
            w, s, x, wu, su = w_n, s_n, x_n, wu_n, su_n
        LAST: tl.constexpr = STEP * ((G - 1) // STEP)  # the last step's first group
        a0, a1, a2, a3, u0, u1, u2, u3 = _step(
            w, x, s, wu, su, a0, a1, a2, a3, u0, u1, u2, u3, w_ptr, s_ptr, a_ptr, wrow, srow, wrow_u, srow_u,
            arow_e, arow_o, grp + LAST, mask, mask_e, mask_o, G, lane, UP_ROWS, USE_ASM)
    else:
        for g0 in range(0, G, STEP):
            w, s, wu, su = _load_words(w_ptr, s_ptr, wrow, srow, wrow_u, srow_u, grp + g0, mask, G, lane, UP_ROWS)
            x = _load_x(a_ptr, arow, grp + g0, mask_x, G, lane)
            a0, a1, a2, a3, u0, u1, u2, u3 = _step(
                w, x, s, wu, su, a0, a1, a2, a3, u0, u1, u2, u3, w_ptr, s_ptr, a_ptr, wrow, srow, wrow_u, srow_u,
                arow_e, arow_o, grp + g0, mask, mask_e, mask_o, G, lane, UP_ROWS, USE_ASM)

    y0, y1 = _cols_out(a0, KS, RT), _cols_out(a1, KS, RT)  # [RT, 8, 4]: (row g, column 2c / 2c + 1)
    y2, y3 = _cols_out(a2, KS, RT), _cols_out(a3, KS, RT)  # rows g + 8
    if UP_ROWS > 0:
        y0 = silu_mul(y0, _cols_out(u0, KS, RT))
        y1 = silu_mul(y1, _cols_out(u1, KS, RT))
        y2 = silu_mul(y2, _cols_out(u2, KS, RT))
        y3 = silu_mul(y3, _cols_out(u3, KS, RT))
    pe, po = tl.split(tl.reshape(pairs, [4, 2]))  # the pairs of columns 2c and 2c + 1, c = 0..3
    pe = pe[None, None, :]
    po = po[None, None, :]
    if WEIGHTED:  # a column's top-k weight scales both its rows (g, g + 8)
        tw_e = tl.load(tw_ptr + pe, mask=pe >= 0, other=0).to(tl.float32)
        tw_o = tl.load(tw_ptr + po, mask=po >= 0, other=0).to(tl.float32)
        y0, y2 = y0 * tw_e, y2 * tw_e
        y1, y3 = y1 * tw_o, y3 * tw_o
    dst_e = out_ptr + pe.to(tl.int64) * stride_om + n0
    dst_o = out_ptr + po.to(tl.int64) * stride_om + n0
    ok_e = (pe >= 0) & (n0 < N)
    ok_o = (po >= 0) & (n0 < N)
    ty = out_ptr.dtype.element_ty
    tl.store(dst_e, y0.to(ty), mask=ok_e)
    tl.store(dst_o, y1.to(ty), mask=ok_o)
    tl.store(dst_e + 8, y2.to(ty), mask=ok_e & (n0 + 8 < N))
    tl.store(dst_o + 8, y3.to(ty), mask=ok_o & (n0 + 8 < N))


@triton.jit
def moebench_w4_experts(
    a_ptr, w_ptr, s_ptr, ids_ptr, tw_ptr, out_ptr,
    N, num_pairs, stride_am, stride_we, stride_wt, stride_se, stride_st, stride_om,
    K: tl.constexpr, UP_ROWS: tl.constexpr, A_DIV: tl.constexpr, WEIGHTED: tl.constexpr, PAIRS_P: tl.constexpr,
    RT: tl.constexpr, KS: tl.constexpr, GPI: tl.constexpr,
    PDL_WAIT: tl.constexpr, PDL_TRIGGER: tl.constexpr, USE_ASM: tl.constexpr,
):
    """For each pair p routed to expert e = program_id(0) (ids[p] == e, p < num_pairs):
    out[p, n] = tw[p] * f(a[p // A_DIV] . w[e, n]) (tw only if WEIGHTED); f as in moebench_w4_mma (UP_ROWS > 0:
    silu(gate row n) * (up row UP_ROWS + n), N the output rows). Rows of out whose pair is routed elsewhere are
    not touched: the caller's top-k sum (or down launch) reads only routed pairs.

    a_ptr: activations as int32 words (bf16 pairs), row stride stride_am in words. w_ptr, s_ptr: the W4Tiles
    layout (w4_mma.py), strides in words. PAIRS_P: num_pairs rounded up to a power of two. A program takes RT
    row tiles of 16 and splits K over KS lane sets, each walking its groups GPI at a time.
    Grid: (E, cdiv(N / 16, RT)).
    """
    e = tl.program_id(0)
    pid_n = tl.program_id(1)
    if PDL_TRIGGER:
        tl.extra.cuda.gdc_launch_dependents()
    p = tl.arange(0, PAIRS_P)
    ids = tl.load(ids_ptr + p, mask=p < num_pairs, other=-1)
    hit = ids == e
    count = tl.sum(hit.to(tl.int32), axis=0)
    if count == 0:
        return

    G: tl.constexpr = K // 32
    L: tl.constexpr = KS * RT * 32
    i = tl.arange(0, L)
    lane = (i % 32)[:, None, None]
    g = (i // 4) % 8
    c = i % 4
    tile = pid_n * RT + (i // 32) % RT
    ks = i // (32 * RT)
    mask = (tile < N // 16)[:, None, None]
    e64 = e.to(tl.int64)
    wrow = (e64 * stride_we + tile.to(tl.int64) * stride_wt)[:, None, None]
    srow = (e64 * stride_se + tile.to(tl.int64) * stride_st)[:, None, None]
    wrow_u, srow_u = wrow, srow  # down: no up rows (loaded as the same words, never used)
    if UP_ROWS > 0:
        wrow_u = wrow + (UP_ROWS // 16) * stride_wt
        srow_u = srow + (UP_ROWS // 16) * stride_st
    j = tl.arange(0, GPI)
    grp = j[None, None, :] + (ks * GPI)[:, None, None]
    STEP: tl.constexpr = KS * GPI

    # the expert's weights never depend on the previous kernel: start streaming them before the PDL wait
    w, s, wu, su = _load_words(w_ptr, s_ptr, wrow, srow, wrow_u, srow_u, grp, mask, G, lane, UP_ROWS)
    if PDL_WAIT:
        tl.extra.cuda.gdc_wait()
    n0 = ((pid_n * RT + tl.arange(0, RT)) * 16)[:, None, None] + tl.arange(0, 8)[None, :, None]  # [RT, 8, 1]
    # The first 8 pairs outside any loop, pipelined; the rest (an expert has at most M pairs, as a token's top-k
    # experts are distinct: up to M = 8 there is no second chunk, and past it few experts have one) in a loop of
    # unpipelined walks. A loop around the pipelined walk costs it ~55 registers (sm_90a, up at (16, 64, 4): 128
    # against 72 with no loop, 96 as written), which halves the programs an SM holds and so the bytes in flight.
    _chunk(a_ptr, w_ptr, s_ptr, ids_ptr, tw_ptr, out_ptr, w, s, wu, su, wrow, srow, wrow_u, srow_u, grp, mask, lane,
           g, c, e, num_pairs, 0, n0, N, stride_am, stride_om, PAIRS_P, G, L, STEP, KS, RT, GPI, UP_ROWS, A_DIV,
           WEIGHTED, USE_ASM, True)
    for c0 in range(COLS, count, COLS):
        _chunk(a_ptr, w_ptr, s_ptr, ids_ptr, tw_ptr, out_ptr, w, s, wu, su, wrow, srow, wrow_u, srow_u, grp, mask,
               lane, g, c, e, num_pairs, c0, n0, N, stride_am, stride_om, PAIRS_P, G, L, STEP, KS, RT, GPI, UP_ROWS,
               A_DIV, WEIGHTED, USE_ASM, False)
