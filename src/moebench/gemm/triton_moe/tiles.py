"""Triton device helpers shared by the GEMV and grouped kernels: loading and decoding weight tiles.

Weight tiles are 3-D, [S, BLOCK_N, BLOCK_K] (S rows-of-experts: the top-k slots a GEMV program
reduces over, or 1), so one helper serves every kernel. A tile is loaded "raw" (the stored bytes
plus its per-group scales) and decoded separately, so a loop can issue the next tile's loads before
decoding the current one.
"""

import triton
import triton.language as tl

# Weight formats (the W_MODE constexpr).
W_BF16 = tl.constexpr(0)
W_INT4 = tl.constexpr(1)
W_FP8 = tl.constexpr(2)       # per-tensor (per expert) scale
W_FP8_BLOCK = tl.constexpr(3)  # 128x128 block scales
W_NVFP4 = tl.constexpr(4)

# Activation formats (the A_MODE constexpr).
A_BF16 = tl.constexpr(0)
A_FP8_ROW = tl.constexpr(1)    # one scale per row
A_FP8_GROUP = tl.constexpr(2)  # one scale per 128 elements of a row

# e2m1 is decoded through fp16 bit patterns, which leaves every value 2**-14 too small
# (see e2m1_to_f32); the kernels fold this factor into the global scale.
E2M1_UNSCALE = tl.constexpr(16384.0)


@triton.jit
def runs(N: tl.constexpr, V: tl.constexpr):
    """arange(0, N), written so the compiler can prove only V-element contiguity (V = 0: all N).

    A load's register layout follows the contiguity the compiler proves for its addresses: a
    16-byte-vector load of packed int4 gives each thread 32 k values, while a bf16 activation
    load gives it 8, and multiplying the two then costs a shared-memory layout conversion of one of
    them on every iteration. Capping the weight's run at 8 k values keeps both in one layout."""
    j = tl.arange(0, N)
    if V > 0:
        j = (j // V) * V + j % V
    return j


@triton.jit
def load_w_raw(w_ptr, s_ptr, rows, srows, k0, mask_r, stride_sk,
               K: tl.constexpr, W_MODE: tl.constexpr, W_GROUP: tl.constexpr, BLOCK_K: tl.constexpr,
               VEC: tl.constexpr):
    """Stored elements and scales of the tile at row offsets `rows` [S, BN, 1] (int64 element
    offsets of each weight row) and columns k0 .. k0 + BLOCK_K. Columns >= K and rows outside
    mask_r load as zeros, so they cost no memory traffic and add nothing to sums.

    Returns (q, s): q [S, BN, BLOCK_K] (4-bit formats: [S, BN, BLOCK_K // 2] bytes), loaded in
    runs of VEC k values (0: unconstrained); s float32 [S, BN, BLOCK_K // W_GROUP] for
    group-scaled formats (scale row offsets `srows`), else a dummy.
    """
    if W_MODE == W_INT4 or W_MODE == W_NVFP4:
        offs = k0 // 2 + runs(BLOCK_K // 2, VEC // 2)
        q = tl.load(w_ptr + rows + offs[None, None, :], mask=mask_r & (offs < K // 2)[None, None, :], other=0)
    else:
        offs = k0 + runs(BLOCK_K, VEC)
        q = tl.load(w_ptr + rows + offs[None, None, :], mask=mask_r & (offs < K)[None, None, :], other=0.0)
    if W_GROUP > 0:
        g = k0 // W_GROUP + tl.arange(0, BLOCK_K // W_GROUP)
        s = tl.load(s_ptr + srows + g[None, None, :] * stride_sk,
                    mask=mask_r & (g < K // W_GROUP)[None, None, :], other=0.0).to(tl.float32)
    else:
        s = tl.zeros([1, 1, 1], dtype=tl.float32)
    return q, s


@triton.jit
def e2m1_to_f32(c):
    """e2m1 codes (int32, low 4 bits) to float32 times 2**-14: the sign goes to fp16's sign bit and
    the 3 exponent/mantissa bits to the bottom of fp16's exponent and top of its mantissa, which
    makes the code an fp16 with the same mantissa and an exponent 14 lower (code 1, e2m1's
    subnormal 0.5, lands on fp16's subnormal 0.5 * 2**-14, so no branch is needed)."""
    bits = ((c & 7) << 9) | ((c & 8) << 12)
    return bits.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def w_values(q, W_MODE: tl.constexpr):
    """Unscaled float32 values [S, BN, BLOCK_K] of a raw tile (int4: q - 8; nvfp4: e2m1 * 2**-14)."""
    if W_MODE == W_INT4 or W_MODE == W_NVFP4:
        b = q.to(tl.int32)
        if W_MODE == W_INT4:
            # (2**23 + n) has n in the low mantissa bits: or-ing the nibble into 2**23's bit pattern
            # converts it without the slow int->float instruction; the zero point 8 goes in the same add.
            lo = ((b & 15) | 0x4B000000).to(tl.float32, bitcast=True) - 8388616.0
            hi = ((b >> 4) | 0x4B000000).to(tl.float32, bitcast=True) - 8388616.0
        else:
            lo = e2m1_to_f32(b)
            hi = e2m1_to_f32(b >> 4)
        # byte i holds k = 2i (low) and 2i + 1 (high): join puts them side by side, in order
        return tl.reshape(tl.join(lo, hi), [q.shape[0], q.shape[1], 2 * q.shape[2]])
    else:
        return q.to(tl.float32)


@triton.jit
def w_dequant(q, s, W_MODE: tl.constexpr, W_GROUP: tl.constexpr):
    """float32 [S, BN, BLOCK_K] weights with group scales applied (per-tensor scales are not)."""
    w = w_values(q, W_MODE)
    if W_GROUP > 0:
        S: tl.constexpr = w.shape[0]
        BN: tl.constexpr = w.shape[1]
        BK: tl.constexpr = w.shape[2]
        w = tl.reshape(tl.reshape(w, [S, BN, BK // W_GROUP, W_GROUP]) * s[:, :, :, None], [S, BN, BK])
    return w


@triton.jit
def silu_mul(gate, up):
    """silu(gate) * up in float32."""
    return gate / (1.0 + tl.exp(-gate)) * up


@triton.jit
def bf16_lo(v):
    """The bf16 in the low half of an int32 as f32 (the int4 decode kernels read bf16 pairs as words)."""
    return (v << 16).to(tl.float32, bitcast=True)


@triton.jit
def bf16_hi(v):
    """The bf16 in the high half of an int32 as f32 (-65536 is 0xFFFF0000)."""
    return (v & -65536).to(tl.float32, bitcast=True)
