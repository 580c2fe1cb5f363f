"""Compile every kernel specialization for sm_90 (H200) on any machine, no GPU needed.

    python -m moebench.gemm.triton_moe.compile_check [--filter up_bf16] [--dump DIR]

Triton compiles down to a cubin with its bundled ptxas; this reports, per kernel, the registers
per thread, spill bytes, the width of its global loads and the shared-memory round trips (layout
conversions) inside its main loop. The interpreter cannot catch GPU-only compile errors or codegen
regressions; this does. Exit status 1 if any kernel fails to compile or spills more than its spec's
max_spill (0 but for the opt-in one-launch int4 kernel's variants with one down lane set,
w4_fused_kernel.py, measured with their 32-60 B).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from . import act_quant, gemv, grouped, w4_experts_kernel, w4_fused_kernel, w4_kernel, w4_mma_kernel

TARGET = GPUTarget("cuda", 90, 32)
# Triton specializes int arguments that are multiples of 16 (as N, K and strides are for the real
# shapes); num_pairs = M * topk need not be.
UNALIGNED_INTS = {"num_pairs"}


@dataclass
class Spec:
    name: str
    fn: object
    ptrs: dict
    const: dict
    num_warps: int = 4
    num_stages: int = 1
    opts: dict = field(default_factory=dict)
    max_spill: int = 0  # spill bytes a kernel is known to have (an opt-in experiment measured with them)


def _w_ptrs(mode: int, a_dtype: str) -> dict:
    w, s = {0: ("*bf16", "*bf16"), 1: ("*u8", "*bf16"), 2: ("*fp8e4nv", "*fp32"), 3: ("*fp8e4nv", "*fp32"),
            4: ("*u8", "*fp8e4nv")}[mode]
    return dict(a_ptr=a_dtype, a_scale_ptr="*fp32", w_ptr=w, w_scale_ptr=s, w_gscale_ptr="*fp32",
                tw_ptr="*fp32", out_ptr="*bf16")


def specs() -> list[Spec]:
    """Kimi-K2.5 decode shapes (K 7168, I 256, top-8) for each weight format and both paths."""
    formats = {  # name: (W_MODE, W_GROUP, W_SN_DIV, A_MODE, activation dtype, gemv BLOCK_K)
        "bf16": (0, 0, 1, 0, "*bf16", 512),
        "int4g32": (1, 32, 1, 0, "*bf16", 1024),
        "int4g128": (1, 128, 1, 0, "*bf16", 1024),
        "fp8": (2, 0, 1, 1, "*fp8e4nv", 512),
        "fp8block": (3, 128, 128, 2, "*fp8e4nv", 512),
        "nvfp4": (4, 16, 1, 0, "*bf16", 1024),
    }
    out = []
    for name, (mode, group, sn_div, a_mode, a_dt, bk) in formats.items():
        w = dict(W_MODE=mode, W_GROUP=group, W_SN_DIV=sn_div, A_MODE=a_mode)
        ptrs = dict(_w_ptrs(mode, a_dt), ids_ptr="*i32")
        out.append(Spec(f"gemv_up_{name}", gemv.moe_gemv_kernel, ptrs, dict(
            K=7168, UP_ROWS=256, SLOTS=1, SLOTS_P=1, A_DIV=8, WEIGHTED=False, **w, BLOCK_N=4, BLOCK_K=bk,
            PDL_WAIT=False, PDL_TRIGGER=True)))
        out.append(Spec(f"gemv_down_{name}", gemv.moe_gemv_kernel, ptrs, dict(
            K=256, UP_ROWS=0, SLOTS=8, SLOTS_P=8, A_DIV=1, WEIGHTED=True, **w, BLOCK_N=8, BLOCK_K=256,
            PDL_WAIT=True, PDL_TRIGGER=False), opts=dict(launch_pdl=True)))
        gptrs = dict(_w_ptrs(mode, a_dt), sorted_ptr="*i32", block_expert_ptr="*i32")
        gbk = 128 if mode in (2, 3) or group == 128 else 64
        out.append(Spec(f"grouped_up_{name}", grouped.moe_grouped_kernel, gptrs, dict(
            K=7168, UP_ROWS=256, A_DIV=8, WEIGHTED=False, **w, BLOCK_M=16, BLOCK_N=64, BLOCK_K=gbk),
            num_stages=3))
        out.append(Spec(f"grouped_down_{name}", grouped.moe_grouped_kernel, gptrs, dict(
            K=256, UP_ROWS=0, A_DIV=1, WEIGHTED=True, **w, BLOCK_M=16, BLOCK_N=64, BLOCK_K=gbk),
            num_stages=3))
    # the rows-4 int4 decode kernel (w4_kernel.py), its inline-PTX path as the GPU runs it
    w4 = dict(a_ptr="*i32", w_ptr="*i32", s_ptr="*i32", ids_ptr="*i32", tw_ptr="*fp32", out_ptr="*bf16")
    out.append(Spec("w4_up", w4_kernel.moebench_w4_gemv, w4, dict(
        K=7168, UP_ROWS=256, SLOTS=1, SLOTS_P=1, A_DIV=8, WEIGHTED=False, BLOCK_N=4, BLOCK_K=1024,
        PDL_WAIT=False, PDL_TRIGGER=True, USE_ASM=True)))
    out.append(Spec("w4_down", w4_kernel.moebench_w4_down, w4, dict(
        K=256, SLOTS=8, SLOTS_P=8, BLOCK_N=8, BLOCK_K=256, N_TILES=4, PDL_WAIT=True, USE_ASM=True),
        opts=dict(launch_pdl=True)))
    # the 16-row int4 tensor-core decode kernel (w4_mma_kernel.py) at its tuned Kimi-K2.5 tiles (configs.json
    # w4mma|...|4 up: 16 rows x 4 lane sets of 4 groups; |1 down: 32 rows x 2 lane sets of 4 groups). Down
    # at 64 rows in one lane set of 2 groups (RT=4, KS=1, GPI=2) needs 255 registers and spills 400 B.
    out.append(Spec("w4mma_up", w4_mma_kernel.moebench_w4_mma, w4, dict(
        K=7168, UP_ROWS=256, SLOTS=1, SLOTS_P=1, A_DIV=8, WEIGHTED=False, RT=1, KS=4, GPI=4,
        PDL_WAIT=False, PDL_TRIGGER=True, USE_ASM=True)))
    out.append(Spec("w4mma_down", w4_mma_kernel.moebench_w4_mma, w4, dict(
        K=256, UP_ROWS=0, SLOTS=8, SLOTS_P=8, A_DIV=1, WEIGHTED=True, RT=2, KS=2, GPI=4,
        PDL_WAIT=True, PDL_TRIGGER=False, USE_ASM=True), opts=dict(launch_pdl=True)))
    # version 9 (LEAN, opt-in: w4_mma.plan_call(lean="both")) at lean_config's tiles of the same table: up at M = 4-16
    # (14 unmasked steps, the loop unrolled twice), up at M = 1 (block_k halved to 64: 7 steps over 16 lane sets)
    # and down (one unmasked step, a 64-bit base a lane and slot, its groups as load immediates)
    out.append(Spec("w4mma9_up", w4_mma_kernel.moebench_w4_mma, w4, dict(
        K=7168, UP_ROWS=256, SLOTS=1, SLOTS_P=1, A_DIV=8, WEIGHTED=False, RT=1, KS=4, GPI=4,
        PDL_WAIT=False, PDL_TRIGGER=True, USE_ASM=True, LEAN=1, UNROLL=2)))
    out.append(Spec("w4mma9_up_m1", w4_mma_kernel.moebench_w4_mma, w4, dict(
        K=7168, UP_ROWS=256, SLOTS=1, SLOTS_P=1, A_DIV=8, WEIGHTED=False, RT=1, KS=16, GPI=2,
        PDL_WAIT=False, PDL_TRIGGER=True, USE_ASM=True, LEAN=1, UNROLL=2), num_warps=16))
    out.append(Spec("w4mma9_down", w4_mma_kernel.moebench_w4_mma, w4, dict(
        K=256, UP_ROWS=0, SLOTS=8, SLOTS_P=8, A_DIV=1, WEIGHTED=True, RT=2, KS=2, GPI=4,
        PDL_WAIT=True, PDL_TRIGGER=False, USE_ASM=True, LEAN=1, UNROLL=1), opts=dict(launch_pdl=True)))
    # the expert-major int4 kernel (w4_experts_kernel.py) at its heuristic tiles (w4_experts.experts_config) and
    # Kimi-K2.5 M = 64 (512 pairs)
    out.append(Spec("w4experts_up", w4_experts_kernel.moebench_w4_experts, w4, dict(
        K=7168, UP_ROWS=256, A_DIV=8, WEIGHTED=False, PAIRS_P=512, RT=1, KS=4, GPI=4,
        PDL_WAIT=False, PDL_TRIGGER=True, USE_ASM=True)))
    out.append(Spec("w4experts_down", w4_experts_kernel.moebench_w4_experts, w4, dict(
        K=256, UP_ROWS=0, A_DIV=1, WEIGHTED=True, PAIRS_P=512, RT=4, KS=1, GPI=8,
        PDL_WAIT=True, PDL_TRIGGER=False, USE_ASM=True), num_warps=4, opts=dict(launch_pdl=True)))
    # the one-launch int4 kernel (w4_fused_kernel.py) at the M = 1 up tiles (16 rows, 16 lane sets of 4 groups):
    # up's registers and down's 28 tiles in flight must fit 128 a thread (16 warps, one program an SM)
    out.append(Spec("w4fused", w4_fused_kernel.moebench_w4_fused, dict(
        a_ptr="*i32", w1_ptr="*i32", s1_ptr="*i32", w2_ptr="*i32", s2_ptr="*i32", ids_ptr="*i32", tw_ptr="*fp32",
        h_ptr="*bf16", hw_ptr="*i32", ws_ptr="*fp32", out_ptr="*bf16", sync_ptr="*i32"), dict(
        K=7168, I=256, TOPK=8, KS=16, GPI=4, CHUNK=16, SL_P=512, PHASE=3, USE_ASM=True, SPIN_MAX=1 << 20),
        num_warps=16, max_spill=60))
    fused = out[-1]
    out.append(Spec("w4fused_late_b", w4_fused_kernel.moebench_w4_fused, fused.ptrs,
                    dict(fused.const, EARLY_B=0), num_warps=16, max_spill=32))
    for dks in (2, 4):  # down's groups over 2 or 4 lane sets: a lane holds 1/2 or 1/4 of the activations (no spill)
        out.append(Spec(f"w4fused_dks{dks}", w4_fused_kernel.moebench_w4_fused, fused.ptrs,
                        dict(fused.const, DKS=dks), num_warps=16))
    out.append(Spec("moe_sum", grouped.moe_sum_kernel, dict(y_ptr="*bf16", out_ptr="*bf16"),
                    dict(TOPK=8, TOPK_P=8, BLOCK_N=1024)))
    for g in (0, 128):
        out.append(Spec(f"fp8_act_quant_g{g}", act_quant._fp8_act_quant_kernel,
                        dict(x_ptr="*bf16", q_ptr="*fp8e4nv", s_ptr="*fp32"),
                        dict(GROUP=g, BLOCK=1024 if g == 0 else 128, QMAX=448.0)))
    return out


def compile_kernel(spec: Spec):
    """triton.compile of the spec for TARGET: the compiled kernel, its `asm` holding ttgir, ptx and cubin."""
    fn = spec.fn
    names = list(fn.arg_names)
    sig, attrs, const = {}, {}, dict(spec.const)
    for i, (n, p) in enumerate(zip(names, fn.params)):
        if n in spec.const:
            sig[n] = "constexpr"
        elif p.has_default and n not in spec.ptrs:
            # an opt-in argument the spec leaves out compiles at its default, as a launch that omits it
            # does (w4_mma_kernel's PREFETCH_DOWN, w2_ptr=None: off)
            sig[n], const[n] = "constexpr", p.default
        elif n in spec.ptrs:
            sig[n] = spec.ptrs[n]
            attrs[(i,)] = [["tt.divisibility", 16]]
        else:
            sig[n] = "i32"
            if n not in UNALIGNED_INTS:
                attrs[(i,)] = [["tt.divisibility", 16]]
    src = ASTSource(fn=fn, signature=sig, constexprs=const, attrs=attrs)
    return triton.compile(src, target=TARGET, options=dict(num_warps=spec.num_warps, num_stages=spec.num_stages,
                                                           **spec.opts))


def ptxas_usage(ptx: str) -> tuple[int, int]:
    """(registers per thread, spill store bytes) of a kernel's PTX, from Triton's ptxas for sm_90a."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "k.ptx"
        path.write_text(ptx)
        res = subprocess.run([triton.knobs.nvidia.ptxas.path, "-arch=sm_90a", "-v", str(path), "-o",
                              str(Path(tmp) / "k.cubin")], capture_output=True, text=True, check=True).stderr
    return int(re.search(r"Used (\d+) registers", res).group(1)), int(re.search(r"(\d+) bytes spill stores", res).group(1))


def compile_spec(spec: Spec, dump: Path | None = None) -> dict:
    k = compile_kernel(spec)
    regs, spill = ptxas_usage(k.asm["ptx"])
    if dump:
        dump.mkdir(parents=True, exist_ok=True)
        for ext in ("ttgir", "ptx"):
            (dump / f"{spec.name}.{ext}").write_text(k.asm[ext])
    loads = {}
    for m in re.finditer(r"ld\.global[\w.]*", k.asm["ptx"]):
        loads[m.group(0)] = loads.get(m.group(0), 0) + 1
    return dict(regs=regs, spill=spill, loop_smem=_loop_conversions(k.asm["ttgir"]), loads=loads)


def _loop_conversions(ttgir: str) -> int:
    """convert_layout ops inside scf.for bodies (equivalent layouts lower to nothing; the rest go
    through shared memory)."""
    count, depth = 0, 0
    for line in ttgir.splitlines():
        if "scf.for" in line:
            depth += 1
        elif depth and "scf.yield" in line:
            depth -= 1
        elif depth and "ttg.convert_layout" in line:
            count += 1
    return count


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--filter", default="", help="only kernels whose name contains this")
    ap.add_argument("--dump", type=Path, default=None, help="write each kernel's ttgir and ptx here")
    args = ap.parse_args(argv)
    failed = False
    for spec in specs():
        if args.filter not in spec.name:
            continue
        try:
            r = compile_spec(spec, args.dump)
        except Exception as exc:  # report every kernel, then fail
            failed = True
            print(f"{spec.name:24s} FAILED: {type(exc).__name__}: {str(exc).strip().splitlines()[-1][:300]}")
            continue
        failed |= r["spill"] > spec.max_spill
        loads = " ".join(f"{k.removeprefix('ld.global.')}x{v}" for k, v in sorted(r["loads"].items()))
        print(f"{spec.name:24s} regs {r['regs']:3d}  spill {r['spill']:4d} B  loop layout conversions "
              f"{r['loop_smem']:2d}  loads {loads}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
