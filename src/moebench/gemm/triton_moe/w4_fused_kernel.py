"""One launch for the int4 tensor-core decode (issue 32, docs/triton-moe-notes.md, "Version 7"): up, SiLU and
down of a (token, slot) pair's expert in the same programs, with no second kernel and no grid-wide barrier.

Why: at M = 1 the two-launch kernel (w4_mma_kernel.py) spends about 5.7 of its 14.3 us in its down launch, a
second round of 224 small programs whose weights (a third of the bytes) arrive after up's last program ends.
Here program (p, t) of the grid (pairs, I / 16) is the up launch's program for pair p and row tile t, and then
the down launch's work for pair p on one slice of the hidden rows (K / 16 / (I / 16) tiles of 16: 28 at K =
7168, I = 256). Its down weights do not depend on anything, so it issues their loads as soon as its own up loop
has issued its last; it then needs the whole activation row of its pair, which its pair's I / 16 programs write
between them: each publishes its 16 values and counts itself on the pair's counter (release), and each waits
for the count (acquire) before reading the row. Only the programs of one pair wait for each other, and those
run at the same time anyway. The top-k sum over pairs is a float32 atomic add into a workspace row per token;
the last of the top-k programs of a slice (a second counter) converts the slice to bf16, writes it, and zeroes
it (atomic exchange), so the next call starts from zeros without a memset.

The wait needs every program of a pair resident at once. The launcher allows it only when the whole grid fits
the GPU in one wave (w4_fused.py: programs <= SMs, one program an SM at 16 warps), and the wait is bounded: a
program that gives up sets the error word and goes on, so a broken assumption shows as a failed check against
the reference, never as a hang.

PHASE: 3 on the GPU (the whole call in one launch). The CPU interpreter runs programs one after another, so a
program that waits for a later one would never see it: there the call is two launches of this kernel, PHASE 1
(up: publish the activations) then PHASE 2 (down, the top-k sum and the finish, no wait), the same code apart
from the counters of the wait.

sync_ptr: int32 [pairs + M * (I / 16) + 1], zero before the first call and left zero by every call: the pair
counters (each program adds 1 when its activations are written and 1 when it is done with them; the one that
brings the count to 2 x I/16 resets it), the slice counters, and the error word (1: a wait gave up).
"""

import triton
import triton.language as tl

from .tiles import silu_mul
from .w4_mma_kernel import _group, _load_ws, _load_x, _rows_out


@triton.jit
def _load_h(h_ptr, hrow, grp, lane):
    """The pair's activation words [L, 1, GD, 4] as _load_x lays them out, read from L2 (.cg): another
    program of the pair wrote them during this launch, and this SM's L1 may still hold the previous call's."""
    return tl.load(h_ptr + (hrow + grp.to(tl.int64) * 16 + (lane % 4) * 4)[:, :, :, None]
                   + tl.arange(0, 4)[None, None, None, :], cache_modifier=".cg")


@triton.jit
def _down_groups(CHUNK: tl.constexpr, DKS: tl.constexpr, GD: tl.constexpr):
    """(lane [L, 1, 1], groups [L, 1, GD / DKS]) of a down batch's CHUNK x 32 lanes: DKS lane sets split I's
    GD groups, each set holding CHUNK / DKS tiles in each of its DKS slots."""
    RTD: tl.constexpr = CHUNK // DKS
    GPD: tl.constexpr = GD // DKS
    i = tl.arange(0, CHUNK * 32)
    ks = i // (32 * RTD)
    return (i % 32)[:, None, None], tl.arange(0, GPD)[None, None, :] + (ks * GPD)[:, None, None]


@triton.jit
def _down_slice(w2_ptr, s2_ptr, e, tile0, NT, CHUNK: tl.constexpr, DKS: tl.constexpr, GD: tl.constexpr,
                stride_w2e, stride_w2t, stride_s2e, stride_s2t):
    """Weight and scale words [L, DKS, GD / DKS (, 2)] of CHUNK down tiles from tile0 (those below NT): slot sl
    of lane set ks, row tile rt holds tile tile0 + sl x CHUNK / DKS + rt, groups ks x GD / DKS onwards."""
    RTD: tl.constexpr = CHUNK // DKS
    i = tl.arange(0, CHUNK * 32)
    toff = tl.arange(0, DKS)[None, :] * RTD + ((i // 32) % RTD)[:, None]    # [L, DKS]
    lane, grp = _down_groups(CHUNK, DKS, GD)
    mask = (toff < NT)[:, :, None]
    wrow = e[None, :, None] * stride_w2e + (tile0 + toff)[:, :, None].to(tl.int64) * stride_w2t
    srow = e[None, :, None] * stride_s2e + (tile0 + toff)[:, :, None].to(tl.int64) * stride_s2t
    return _load_ws(w2_ptr, s2_ptr, wrow, srow, grp, mask, GD, lane)


@triton.jit
def _down_rows(w, s, hx, CHUNK: tl.constexpr, DKS: tl.constexpr, GD: tl.constexpr, USE_ASM: tl.constexpr):
    """The CHUNK tiles' rows g and g + 8 of w2 . h over all of I, flat [CHUNK x 8] in tile order (slot-major,
    as _down_slice lays tiles out; flat, because the interpreter's atomics mishandle a leading axis of 1)."""
    z = tl.zeros([CHUNK * 32, DKS, GD // DKS], dtype=tl.float32)
    c0, c2 = _group(w, hx, s, z, z, USE_ASM)
    y0, y2 = _rows_out(c0, c2, DKS, DKS, CHUNK // DKS, USE_ASM)     # [RTD, 8, DKS]
    return tl.reshape(tl.permute(y0, (2, 0, 1)), [CHUNK * 8]), tl.reshape(tl.permute(y2, (2, 0, 1)), [CHUNK * 8])


@triton.jit
def moebench_w4_fused(
    a_ptr, w1_ptr, s1_ptr, w2_ptr, s2_ptr, ids_ptr, tw_ptr, h_ptr, hw_ptr, ws_ptr, out_ptr, sync_ptr,
    stride_am, stride_w1e, stride_w1t, stride_s1e, stride_s1t, stride_w2e, stride_w2t, stride_s2e, stride_s2t,
    K: tl.constexpr, I: tl.constexpr, TOPK: tl.constexpr, KS: tl.constexpr, GPI: tl.constexpr,
    CHUNK: tl.constexpr, SL_P: tl.constexpr, PHASE: tl.constexpr, USE_ASM: tl.constexpr,
    SPIN_MAX: tl.constexpr, EARLY_B: tl.constexpr = 1, DKS: tl.constexpr = 1,
):
    """out[m] = sum_s tw[p] * w2[ids[p]] . (silu(w1_gate[ids[p]] . a[m]) * (w1_up[ids[p]] . a[m])), p = m TOPK + s,
    for int4 g32 weights in the 16-row tile layout (w4_mma.W4Tiles): w1 [E, 2I, K], w2 [E, K, I]. Grid (pairs,
    I / 16), KS x 32 lanes a program (KS warps split up's K; GPI groups a lane set a step; CHUNK x 32 = KS x 32).

    a_ptr: int32 words of bf16 activations [M, K / 2]; h_ptr / hw_ptr: the same bf16 [pairs, I] scratch as bf16
    and as int32 words; ws_ptr: float32 [M, K], zero between calls; out_ptr: bf16 [M, K]; sync_ptr: see the
    module docstring. Strides in elements of their tensors (words for the weights)."""
    p = tl.program_id(0)
    t = tl.program_id(1)
    P = tl.num_programs(0)
    T: tl.constexpr = I // 16
    TD: tl.constexpr = (K // 16) // T   # down tiles of this program's hidden slice
    m = p // TOPK
    one = tl.arange(0, 1)
    e = tl.load(ids_ptr + p + one).to(tl.int64)   # [1]: the pair's expert

    if PHASE != 2:
        # ---- up: gate and up rows 16 t .. 16 t + 15 of expert e over all of K, as w4_mma_kernel's up launch
        G: tl.constexpr = K // 32
        L: tl.constexpr = KS * 32
        i = tl.arange(0, L)
        lane = (i % 32)[:, None, None]
        ks = i // 32
        mask = (lane >= 0) & (one < 1)[None, :, None]  # all true: the [L, 1, 1] shape _load_ws broadcasts
        wrow = e[None, :, None] * stride_w1e + t.to(tl.int64) * stride_w1t
        srow = e[None, :, None] * stride_s1e + t.to(tl.int64) * stride_s1t
        wrow_u = wrow + T * stride_w1t
        srow_u = srow + T * stride_s1t
        arow = m.to(tl.int64) * stride_am
        grp = tl.arange(0, GPI)[None, None, :] + (ks * GPI)[:, None, None]
        STEP: tl.constexpr = KS * GPI
        w, s = _load_ws(w1_ptr, s1_ptr, wrow, srow, grp, mask, G, lane)
        wu, su = _load_ws(w1_ptr, s1_ptr, wrow_u, srow_u, grp, mask, G, lane)
        x = _load_x(a_ptr, arow, grp, mask, G, lane)
        z = tl.zeros([L, 1, GPI], dtype=tl.float32)
        c0, c2, u0, u2 = z, z, z, z
        for g0 in range(STEP, G, STEP):
            w_n, s_n = _load_ws(w1_ptr, s1_ptr, wrow, srow, grp + g0, mask, G, lane)
            wu_n, su_n = _load_ws(w1_ptr, s1_ptr, wrow_u, srow_u, grp + g0, mask, G, lane)
            x_n = _load_x(a_ptr, arow, grp + g0, mask, G, lane)
            c0, c2 = _group(w, x, s, c0, c2, USE_ASM)
            u0, u2 = _group(wu, x, su, u0, u2, USE_ASM)
            w, s, wu, su, x = w_n, s_n, wu_n, su_n, x_n
        c0, c2 = _group(w, x, s, c0, c2, USE_ASM)
        u0, u2 = _group(wu, x, su, u0, u2, USE_ASM)
        y0, y2 = _rows_out(c0, c2, 1, KS, 1, USE_ASM)
        v0, v2 = _rows_out(u0, u2, 1, KS, 1, USE_ASM)
        o0 = tl.sum(silu_mul(y0, v0), axis=2)   # [1, 8]: rows g
        o2 = tl.sum(silu_mul(y2, v2), axis=2)   # rows g + 8
        rows = t * 16 + tl.arange(0, 8)[None, :]
        dst = h_ptr + p.to(tl.int64) * I + rows
        tl.store(dst, o0.to(h_ptr.dtype.element_ty))
        tl.store(dst + 8, o2.to(h_ptr.dtype.element_ty))
    if PHASE != 1:
        # down's weights depend on nothing: in flight while the pair publishes and waits (the second chunk too
        # with EARLY_B; without, it is issued after the wait: 32 registers fewer live across it)
        wa, sa = _down_slice(w2_ptr, s2_ptr, e, t * TD, TD, CHUNK, DKS, I // 32, stride_w2e, stride_w2t,
                             stride_s2e, stride_s2t)
    if PHASE == 2 or (PHASE == 3 and EARLY_B):
        wb, sb = _down_slice(w2_ptr, s2_ptr, e, t * TD + CHUNK, TD - CHUNK, CHUNK, DKS, I // 32, stride_w2e,
                             stride_w2t, stride_s2e, stride_s2t)
    if PHASE == 3:
        # publish: every thread's stores before the count (CTA barrier, then a release at GPU scope)
        tl.debug_barrier()
        tl.atomic_add(sync_ptr + p, 1, sem="release", scope="gpu")
        n = 0
        seen = tl.atomic_add(sync_ptr + p, 0, sem="acquire", scope="gpu")
        while (seen < T) & (n < SPIN_MAX):
            seen = tl.atomic_add(sync_ptr + p, 0, sem="acquire", scope="gpu")
            n += 1
        if seen < T:
            tl.atomic_xchg(sync_ptr + P + (P // TOPK) * T, 1, sem="relaxed", scope="gpu")
    if PHASE == 3 and not EARLY_B:
        wb, sb = _down_slice(w2_ptr, s2_ptr, e, t * TD + CHUNK, TD - CHUNK, CHUNK, DKS, I // 32, stride_w2e,
                             stride_w2t, stride_s2e, stride_s2t)
    if PHASE != 1:
        # ---- down: hidden tiles t TD .. t TD + TD - 1 of expert e, weighted, added into the token's row
        GD: tl.constexpr = I // 32
        lane2, grp2 = _down_groups(CHUNK, DKS, GD)
        hx = _load_h(hw_ptr, p.to(tl.int64) * (I // 2), grp2, lane2)
        if PHASE == 3:
            # this program is done with the pair's activations; the last of them leaves the counter at zero
            tl.debug_barrier()
            if tl.atomic_add(sync_ptr + p, 1, sem="relaxed", scope="gpu") == 2 * T - 1:
                tl.atomic_xchg(sync_ptr + p, 0, sem="relaxed", scope="gpu")
        tw = tl.load(tw_ptr + p).to(tl.float32)
        ya0, ya2 = _down_rows(wa, sa, hx, CHUNK, DKS, GD, USE_ASM)
        yb0, yb2 = _down_rows(wb, sb, hx, CHUNK, DKS, GD, USE_ASM)
        c = tl.arange(0, CHUNK * 8)
        rows_a = (t * TD + c // 8) * 16 + c % 8
        ma = c // 8 < TD
        mb = c // 8 + CHUNK < TD
        wsrow = ws_ptr + m.to(tl.int64) * K
        tl.atomic_add(wsrow + rows_a, ya0 * tw, mask=ma, sem="relaxed", scope="gpu")
        tl.atomic_add(wsrow + rows_a + 8, ya2 * tw, mask=ma, sem="relaxed", scope="gpu")
        rows_b = rows_a + CHUNK * 16
        tl.atomic_add(wsrow + rows_b, yb0 * tw, mask=mb, sem="relaxed", scope="gpu")
        tl.atomic_add(wsrow + rows_b + 8, yb2 * tw, mask=mb, sem="relaxed", scope="gpu")
        # ---- finish: the last of the token's TOPK programs of this slice writes it as bf16 and zeroes it
        tl.debug_barrier()
        slot = sync_ptr + P + m * T + t
        if tl.atomic_add(slot, 1, sem="acq_rel", scope="gpu") == TOPK - 1:
            SL: tl.constexpr = TD * 16
            r = tl.arange(0, SL_P)
            keep = r < SL
            # exchanged as int32 words (the interpreter exchanges no floats; the GPU's atom.exch is 32-bit anyway)
            wsw = (wsrow + t * SL + r).to(tl.pointer_type(tl.int32))
            v = tl.atomic_xchg(wsw, 0, mask=keep, sem="relaxed", scope="gpu").to(tl.float32, bitcast=True)
            tl.store(out_ptr + m.to(tl.int64) * K + t * SL + r, v.to(out_ptr.dtype.element_ty), mask=keep)
            tl.atomic_xchg(slot, 0, sem="relaxed", scope="gpu")
