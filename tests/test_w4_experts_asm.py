"""The expert-major kernel's inline PTX (w4_experts_kernel.GROUP8_ASM), run for a whole warp on CPU by the PTX
interpreter of test_w4_mma_asm.py: one 16-row tile of real packed words (w4_mma.pack_tiles16) by 8 different
tokens, one in each of mma's B columns, held to acc + scale * sum_k q_k x_k in float64 for every lane's four
outputs (rows g, g + 8 by columns 2c, 2c + 1). A wrong column wiring fails here."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("triton")
torch = pytest.importorskip("torch")

from test_w4_mma_asm import _bf16_bits, _bits, _f32, run_warp  # noqa: E402

from moebench.gemm.triton_moe.w4_experts_kernel import GROUP8_ASM  # noqa: E402
from moebench.gemm.triton_moe.w4_mma import pack_tiles16  # noqa: E402


def _problem(seed: int):
    """Signed q [16, 32], bf16 bits of 8 tokens' x [8, 32], bf16 scales [16], accumulators [32 lanes, 4]."""
    rng = np.random.default_rng(seed)
    q = rng.integers(-8, 8, size=(16, 32))
    xb = _bf16_bits((rng.standard_normal((8, 32)) * 10.0 ** rng.uniform(-2, 2, size=(8, 32))).astype(np.float32))
    sb = _bf16_bits(rng.uniform(1e-3, 2e-2, size=16).astype(np.float32))
    acc = rng.standard_normal((32, 4)).astype(np.float32)
    return q, xb, sb, acc


def _operands(q, xb, sb, acc, column=lambda g: g):
    """Each lane's registers as the kernel loads them: lane (g, c) takes token column(g)'s words 4c .. 4c + 3."""
    n = (q + 8).astype(np.uint8)
    t = pack_tiles16(torch.from_numpy(n[:, 0::2] | (n[:, 1::2] << 4))[None],
                     torch.from_numpy((sb << 16).view(np.float32).copy())[None, :, None])
    words = t.words[0, 0, 0].numpy().view(np.uint32)   # [32 lanes, 2]
    sw = t.scales[0, 0, 0].numpy().view(np.uint32)     # [8]
    xw = [[int(xb[tok, 2 * i]) | int(xb[tok, 2 * i + 1]) << 16 for i in range(16)] for tok in range(8)]
    ops = []
    for lane in range(32):
        g, c = lane >> 2, lane & 3
        o = {"$4": int(words[lane, 0]), "$5": int(words[lane, 1]), "$10": int(sw[g])}
        o.update({f"${6 + i}": xw[column(g)][4 * c + i] for i in range(4)})
        o.update({f"${11 + j}": _bits(acc[lane, j]) for j in range(4)})
        ops.append(o)
    return ops


def _errors(q, xb, sb, acc, regs) -> np.ndarray:
    """|got - want| / (|acc| + s sum|x| 8) for every lane's four outputs [32, 4]."""
    x = (xb << 16).view(np.float32).astype(np.float64)
    s = (sb << 16).view(np.float32).astype(np.float64)
    err = np.zeros((32, 4))
    for lane in range(32):
        g, c = lane >> 2, lane & 3
        for o, (row, tok) in enumerate(((g, 2 * c), (g, 2 * c + 1), (g + 8, 2 * c), (g + 8, 2 * c + 1))):
            want = float(acc[lane, o]) + s[row] * float(np.dot(q[row], x[tok]))
            err[lane, o] = abs(_f32(regs[lane][f"${o}"]) - want) / (
                abs(float(acc[lane, o])) + s[row] * np.abs(x[tok]).sum() * 8)
    return err


@pytest.mark.parametrize("seed", range(3))
def test_the_group8_asm_multiplies_a_tile_by_eight_tokens(seed):
    q, xb, sb, acc = _problem(seed)
    err = _errors(q, xb, sb, acc, run_warp(GROUP8_ASM.value, _operands(q, xb, sb, acc)))
    assert err.max() < 1e-5, f"(lane, output) off: {list(zip(*np.nonzero(err > 1e-5)))}"


@pytest.mark.parametrize("column", [lambda g: 0, lambda g: 7 - g], ids=["one-token", "reversed"])
def test_lanes_loading_the_wrong_token_fail(column):
    """Lane g must load token column g: the pair-major kernel's wiring (every lane one token) is far off."""
    q, xb, sb, acc = _problem(0)
    err = _errors(q, xb, sb, acc, run_warp(GROUP8_ASM.value, _operands(q, xb, sb, acc, column)))
    assert err.max() > 1e-3
