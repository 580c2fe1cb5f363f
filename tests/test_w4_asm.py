"""The rows-4 int4 kernel's inline PTX (w4_kernel.QUAD_ASM), executed by a small PTX interpreter on CPU.

The Triton interpreter cannot run inline assembly, so the kernel tests exercise the plain-Triton
formula; this runs the exact asm text the GPU runs, instruction by instruction (the dozen opcodes it
uses, with PTX's bit-level semantics), and holds its result to sum_k x_k (q_k - 8) * scale + acc
computed exactly. A wrong magic number, nibble order, lop3 table or offset fails here.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

pytest.importorskip("triton")

from moebench.gemm.triton_moe import w4_kernel  # noqa: E402


def _f32(bits: int) -> np.float32:
    return np.array([bits & 0xFFFFFFFF], dtype=np.uint32).view(np.float32)[0]


def _bits(f) -> int:
    return int(np.array([f], dtype=np.float32).view(np.uint32)[0])


def _imm(tok: str, regs: dict):
    if tok.startswith("0f"):
        return _bits(_f32(int(tok[2:], 16)))
    if tok.startswith("0x"):
        return int(tok, 16)
    if tok.lstrip("-").isdigit():
        return int(tok) & 0xFFFFFFFF
    return regs[tok]


def run_ptx(asm: str, operands: dict[str, int]) -> dict[str, int]:
    """Execute `asm` (32-bit registers hold raw bits; .b16 halves too). operands: '$N' -> bits."""
    regs = dict(operands)
    lut = lambda a, b, c, imm: sum(((imm >> ((((a >> i) & 1) << 2) | (((b >> i) & 1) << 1) | ((c >> i) & 1))) & 1) << i
                                   for i in range(32))
    for line in asm.split("\n"):
        line = line.strip().rstrip(";")
        if line in ("", "{", "}") or line.startswith(".reg"):
            continue
        m = re.match(r"(\S+)\s+(.*)", line)
        op, args = m.group(1), m.group(2)
        if op == "mov.b32" and args.startswith("{"):
            lo, hi, src = re.findall(r"[\w$]+", args)
            v = regs[src]
            regs[lo], regs[hi] = v & 0xFFFF, v >> 16
            continue
        a = [x.strip() for x in args.split(",")]
        d, src = a[0], [_imm(x, regs) for x in a[1:]]
        f = lambda i: _f32(src[i])
        if op == "lop3.b32":
            # PTX's immLut indexes the truth table by (a, b, c) bits with a as the high bit: a=0xF0, b=0xCC, c=0xAA
            r = lut(src[0], src[1], src[2], src[3])
        elif op == "shr.u32":
            r = src[0] >> src[1]
        elif op == "shl.b32":
            r = (src[0] << src[1]) & 0xFFFFFFFF
        elif op == "and.b32":
            r = src[0] & src[1]
        elif op == "mov.b32":
            r = src[0]
        elif op == "cvt.f32.f16":
            r = _bits(np.array([src[0]], dtype=np.uint16).view(np.float16)[0].astype(np.float32))
        elif op == "mul.f32":
            r = _bits(f(0) * f(1))
        elif op == "add.f32":
            r = _bits(f(0) + f(1))
        elif op == "fma.rn.f32":
            r = _bits(np.float32(np.float64(f(0)) * np.float64(f(1)) + np.float64(f(2))))
        else:
            raise AssertionError(f"the PTX interpreter does not know {op!r}: teach it before shipping the asm")
        regs[d] = r
    return regs


def _bf16_bits(x: np.ndarray) -> np.ndarray:
    """bf16 bit patterns (round to nearest even) of float32 values."""
    u = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint32)


@pytest.mark.parametrize("seed", range(4))
def test_the_quad_asm_computes_the_scaled_int4_dot_products(seed):
    rng = np.random.default_rng(seed)
    q = rng.integers(0, 16, size=(4, 8))                      # stored nibbles (q + 8 of the signed value)
    xb = _bf16_bits(rng.standard_normal(8).astype(np.float32) * (10.0 ** rng.integers(-2, 3)))
    sb = _bf16_bits(rng.uniform(1e-3, 2e-2, size=4).astype(np.float32))
    acc = rng.standard_normal(4).astype(np.float32)
    x = (xb << 16).view(np.float32).astype(np.float64)
    s = (sb << 16).view(np.float32).astype(np.float64)
    ops = {f"${4 + r}": sum(int(q[r, k]) << (4 * k) for k in range(8)) for r in range(4)}   # nibble k = k
    ops.update({f"${8 + i}": int(xb[2 * i]) | int(xb[2 * i + 1]) << 16 for i in range(4)})  # k = 2i low half
    ops.update({"$12": int(sb[0]) | int(sb[1]) << 16, "$13": int(sb[2]) | int(sb[3]) << 16})
    ops.update({f"${14 + r}": _bits(acc[r]) for r in range(4)})
    regs = run_ptx(w4_kernel.QUAD_ASM.value, ops)
    for r in range(4):
        want = acc[r] + s[r] * float(np.dot(x, q[r] - 8))
        got = float(_f32(regs[f"${r}"]))
        scale = abs(acc[r]) + s[r] * float(np.abs(x).sum()) * 8
        assert abs(got - want) <= 1e-5 * scale, (r, got, want)


def test_the_ptx_interpreter_knows_lop3():
    """(a & b) | c is table 0xEA: the interpreter's lop3 must agree, or the asm test proves nothing."""
    assert run_ptx("lop3.b32 d, 0x12345678, 0x000F000F, 0x64006400, 0xEA;", {})["d"] == 0x64046408
