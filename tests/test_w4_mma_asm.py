"""The tensor-core int4 kernel's inline PTX (w4_mma_kernel.GROUP_ASM), run for a whole warp on CPU.

The Triton interpreter cannot run inline assembly or warp-collective `mma.sync`, so the kernel tests
on CPU exercise the plain-Triton per-lane formula (USE_ASM = False). This runs the exact asm text the
GPU runs, line by line for all 32 lanes in lockstep (a register file per lane): the scalar opcodes
with PTX's bit-level semantics, and `mma.m16n8k16` by gathering its A/B/C fragments from the 32 lanes
and scattering D back per the PTX ISA's fragment layout. Its operands come from the real packing
(w4_mma.pack_tiles16), and the result is held to acc + scale * sum_k q_k x_k computed in float64, so a
wrong nibble order, magic number, lop3 table or lane mapping fails here; so does a deliberately broken
packing (test_a_wrong_packing_fails), which shows the layout model is not trivially symmetric.
"""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

pytest.importorskip("triton")
torch = pytest.importorskip("torch")

from moebench.gemm.triton_moe.w4_mma import pack_tiles16  # noqa: E402
from moebench.gemm.triton_moe.w4_mma_kernel import GROUP_ASM  # noqa: E402

MMA = "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"


def _f32(bits: int) -> float:
    return float(np.array([bits & 0xFFFFFFFF], dtype=np.uint32).view(np.float32)[0])


def _bits(f) -> int:
    return int(np.array([f], dtype=np.float32).view(np.uint32)[0])


def _bf16_bits(x: np.ndarray) -> np.ndarray:
    """bf16 bit patterns (round to nearest even) of float32 values."""
    u = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint32)


def _pair(word: int) -> tuple[float, float]:
    """The bf16 pair (low half, high half) of a 32-bit word as floats."""
    return _f32((word & 0xFFFF) << 16), _f32(word & 0xFFFF0000)


def _round_bf16(v: float) -> int:
    """bf16 bits of v rounded once to nearest even (8 significant bits; normal range is all we need)."""
    if v == 0.0:
        return 0x8000 if math.copysign(1.0, v) < 0 else 0
    e = math.frexp(v)[1]
    return _bits(round(v * 2.0 ** (8 - e)) * 2.0 ** (e - 8)) >> 16  # round(): half to even, exact here


def _lop3(a: int, b: int, c: int, imm: int) -> int:
    # PTX's immLut indexes the truth table by (a, b, c) bits with a as the high bit: a=0xF0, b=0xCC, c=0xAA
    return sum(((imm >> ((((a >> i) & 1) << 2) | (((b >> i) & 1) << 1) | ((c >> i) & 1))) & 1) << i
               for i in range(32))


def _mma(lanes: list[dict], d: list[str], a: list[str], b: list[str], c: list[str]) -> None:
    """D = A @ B + C over the warp; lane (g, t): A rows g / g + 8, k 2t, 2t + 1 (+ 8); B k 2t, 2t + 1
    (+ 8), column g; C/D row g / g + 8, columns 2t, 2t + 1. Low half of a pair = the lower k / column."""
    A, B, C = np.zeros((16, 16)), np.zeros((16, 8)), np.zeros((16, 8))
    cd = lambda g, t: ((g, 2 * t), (g, 2 * t + 1), (g + 8, 2 * t), (g + 8, 2 * t + 1))
    for lane, r in enumerate(lanes):
        g, t = lane >> 2, lane & 3
        for reg, (row, col) in zip(a, ((g, 2 * t), (g + 8, 2 * t), (g, 2 * t + 8), (g + 8, 2 * t + 8))):
            A[row, col], A[row, col + 1] = _pair(r[reg])
        for reg, k in zip(b, (2 * t, 2 * t + 8)):
            B[k, g], B[k + 1, g] = _pair(r[reg])
        for reg, (row, col) in zip(c, cd(g, t)):
            C[row, col] = _f32(r[reg])
    D = (A @ B + C).astype(np.float32)  # gather everything before writing: D may alias C
    for lane, r in enumerate(lanes):
        for reg, (row, col) in zip(d, cd(lane >> 2, lane & 3)):
            r[reg] = _bits(D[row, col])


def run_warp(asm: str, operands: list[dict[str, int]]) -> list[dict[str, int]]:
    """Execute `asm` for 32 lanes in lockstep; operands[lane]: '$N' -> 32-bit raw bits."""
    assert len(operands) == 32
    lanes = [dict(o) for o in operands]
    declared: set[str] = set()
    for line in asm.split("\n"):
        line = line.strip().rstrip(";")
        if line in ("", "{", "}"):
            continue
        op, args = re.match(r"(\S+)\s+(.*)", line).groups()
        if op == ".reg":  # .reg .TYPE name, name, ...
            declared |= {x.strip() for x in args.split(None, 1)[1].split(",")}
            continue
        if op == MMA:
            d, a, b, c = [[x.strip() for x in grp.split(",")] for grp in re.findall(r"\{([^}]*)\}", args)]
            assert set(d) <= declared and (len(d), len(a), len(b), len(c)) == (4, 4, 2, 4), line
            _mma(lanes, d, a, b, c)
            continue
        dst, *srcs = [x.strip() for x in args.split(",")]
        assert dst in declared or dst.startswith("$"), f"write to undeclared register {dst!r}"
        for r in lanes:
            s = [int(x[2:], 16) if x.startswith(("0x", "0f")) else int(x) & 0xFFFFFFFF
                 if x.lstrip("-").isdigit() else r[x] for x in srcs]
            if op in ("mov.b32", "mov.f32"):
                v = s[0]
            elif op == "lop3.b32":
                v = _lop3(*s)
            elif op == "shr.u32":
                v = s[0] >> s[1]
            elif op == "shl.b32":
                v = (s[0] << s[1]) & 0xFFFFFFFF
            elif op == "and.b32":
                v = s[0] & s[1]
            elif op == "fma.rn.bf16x2":  # per half: a * b + c exactly, then one rounding to bf16
                h = [_pair(x) for x in s]
                v = _round_bf16(h[0][0] * h[1][0] + h[2][0]) | _round_bf16(h[0][1] * h[1][1] + h[2][1]) << 16
            elif op == "fma.rn.f32":
                v = _bits(np.float32(_f32(s[0]) * _f32(s[1]) + _f32(s[2])))
            else:
                raise AssertionError(f"the PTX interpreter does not know {op!r}: teach it before shipping the asm")
            r[dst] = v
    return lanes


def _problem(seed: int):
    """One 16-row tile x one group of 32 k: signed q [16, 32], bf16 x [32], bf16 scales [16], acc [32, 2]."""
    rng = np.random.default_rng(seed)
    q = rng.integers(-8, 8, size=(16, 32))
    xb = _bf16_bits((rng.standard_normal(32) * 10.0 ** rng.uniform(-2, 2, size=32)).astype(np.float32))
    sb = _bf16_bits(rng.uniform(1e-3, 2e-2, size=16).astype(np.float32))
    acc = rng.standard_normal((32, 2)).astype(np.float32)
    return q, xb, sb, acc


def _operands(q, xb, sb, acc, corrupt=lambda w: w):
    n = (q + 8).astype(np.uint8)
    data = torch.from_numpy(n[:, 0::2] | (n[:, 1::2] << 4))[None]             # [1, 16, 16]: low nibble even k
    scale = torch.from_numpy((sb << 16).view(np.float32).copy())[None, :, None]  # [1, 16, 1], bf16-exact
    t = pack_tiles16(data, scale)
    assert tuple(t.words.shape) == (1, 1, 1, 32, 2) and tuple(t.scales.shape) == (1, 1, 1, 8)
    words = corrupt(t.words[0, 0, 0].numpy().view(np.uint32).astype(np.int64))  # [32, 2]
    sw = t.scales[0, 0, 0].numpy().view(np.uint32)
    xw = [int(xb[2 * i]) | int(xb[2 * i + 1]) << 16 for i in range(16)]       # word i: k 2i low, 2i + 1 high
    ops = []
    for lane in range(32):
        g, c = lane >> 2, lane & 3
        o = {"$2": int(words[lane, 0]), "$3": int(words[lane, 1]), "$8": int(sw[g])}
        o.update({f"${4 + i}": xw[4 * c + i] for i in range(4)})
        o.update({"$9": _bits(acc[lane, 0]), "$10": _bits(acc[lane, 1])})
        ops.append(o)
    return ops


def _errors(q, xb, sb, acc, regs) -> np.ndarray:
    """|got - want| / (|acc| + s sum|x| 8) for every lane and output [32, 2]."""
    x = (xb << 16).view(np.float32).astype(np.float64)
    s = (sb << 16).view(np.float32).astype(np.float64)
    err = np.zeros((32, 2))
    for lane in range(32):
        for o, row in enumerate((lane >> 2, (lane >> 2) + 8)):
            want = float(acc[lane, o]) + s[row] * float(np.dot(q[row], x))
            got = _f32(regs[lane][f"${o}"])
            err[lane, o] = abs(got - want) / (abs(float(acc[lane, o])) + s[row] * np.abs(x).sum() * 8)
    return err


@pytest.mark.parametrize("seed", range(4))
def test_the_group_asm_computes_a_tile_of_scaled_int4_dot_products(seed):
    q, xb, sb, acc = _problem(seed)
    err = _errors(q, xb, sb, acc, run_warp(GROUP_ASM.value, _operands(q, xb, sb, acc)))
    bad = [(lane, lane >> 2 if o == 0 else (lane >> 2) + 8, float(err[lane, o]))
           for lane, o in zip(*np.nonzero(err > 1e-5))]
    assert not bad, f"(lane, row, relative error) off: {bad}"


def _swap_nibbles(w, m):  # nibble j <-> nibble j ^ m of every word
    sel = sum(0xF << (4 * j) for j in range(8) if not j & m)
    return ((w & sel) << (4 * m)) | ((w >> (4 * m)) & sel)


@pytest.mark.parametrize("corrupt", [
    lambda w: w[:, ::-1],                                        # the two tile words swapped
    lambda w: _swap_nibbles(w, 1),                               # rows g and g + 8 swapped
    lambda w: _swap_nibbles(w, 4),                               # even and odd k swapped
    lambda w: _swap_nibbles(w, 2),                               # k pairs 2c.. and 2c + 8.. swapped
    lambda w: w.reshape(8, 4, 2)[:, [1, 2, 3, 0]].reshape(32, 2),  # lanes c shifted by one
], ids=["tiles", "rows", "k-parity", "k-halves", "lanes"])
def test_a_wrong_packing_fails(corrupt):
    """The check must catch layout bugs: each of these wrong packings is far off on some lane."""
    q, xb, sb, acc = _problem(0)
    err = _errors(q, xb, sb, acc, run_warp(GROUP_ASM.value, _operands(q, xb, sb, acc, corrupt)))
    assert err.max() > 1e-3


def test_the_interpreter_knows_the_decode_fma():
    """bf16 pair (128 + n, 128 + m) * (1, 1) + (-136, -136) is (n - 8, m - 8) exactly, for every nibble."""
    asm = "{\n.reg .b32 d;\nfma.rn.bf16x2 d, $0, 0x3F803F80, 0xC308C308;\n}"
    for n in range(16):
        m = 15 - n
        d = run_warp(asm, [{"$0": 0x43000000 | m << 16 | 0x4300 | n}] * 32)[0]["d"]
        assert _pair(d) == (n - 8.0, m - 8.0)
    with pytest.raises(AssertionError, match="does not know"):
        run_warp("{\n.reg .b32 d;\nadd.u32 d, 1, 2;\n}", [{}] * 32)
