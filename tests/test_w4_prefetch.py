"""The up launch's opt-in L2 prefetch of down's weights (triton_moe/w4_prefetch.py, the PREFETCH_DOWN constexpr
of w4_mma_kernel; issue 32) on CPU: compiled for sm_90a it issues the predicted number of prefetch
instructions a warp, off it leaves today's SASS byte for byte, the interpreter's output does not depend on
it, and the host refuses what the kernel cannot address. Its effect on time is the next H200 lease's
(docs/triton-moe-notes.md, "Prefetch down's weights into L2")."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess

import pytest

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")
tl = triton.language

import moebench.gemm.triton_moe as tm  # noqa: E402
from moebench.gemm.triton_moe import compile_check as cc  # noqa: E402
from moebench.gemm.triton_moe import w4_mma, w4_prefetch  # noqa: E402
from moebench.gemm.triton_moe import w4_mma_kernel as wk  # noqa: E402
from moebench.gemm.triton_moe.config import KernelConfig  # noqa: E402
from sass_counts import counts, sass  # noqa: E402

K, I, E, TOPK = 7168, 256, 384, 8  # Kimi-K2.5 TP8 decode: the tuned tiles of configs.json
PTRS = dict(a_ptr="*i32", w_ptr="*i32", s_ptr="*i32", ids_ptr="*i32", tw_ptr="*fp32", out_ptr="*bf16")
UP = dict(UP_ROWS=I, SLOTS=1, SLOTS_P=1, A_DIV=TOPK, WEIGHTED=False, PDL_WAIT=False, PDL_TRIGGER=True)
DOWN = dict(UP_ROWS=0, SLOTS=TOPK, SLOTS_P=TOPK, A_DIV=1, WEIGHTED=True, PDL_WAIT=True, PDL_TRIGGER=False)
OPCODE = {1: "CCTL.E.PF2", 2: "CCTL.E.PML2"}  # prefetch.global.L2 and its ::evict_last, as ptxas writes them
# sha256 of the Kimi M = 1 kernels' SASS (sass_counts.sass: "address text" lines up to the last EXIT), compiled
# by Triton 3.6.0 from the tree before the prefetch existed (commit 276113f)
TODAY = {"up": "82159e8d2d67f28de5ebdcefb47526c1dc17993f7035c22ebef764ce705e365f",
         "down": "c96bd99f674f3f6d511c6cf9c1f686a85dfedd54a63219643b52c24e30f77acb"}


def _digest(ins) -> str:
    return hashlib.sha256("\n".join(f"{a:05x} {t}" for a, t in ins).encode()).hexdigest()


def _compile(M: int, launch: str, mode: int | None, tmp) -> dict:
    """One launch of the Kimi M call compiled for sm_90a as w4_mma launches it on an H200 (PDL, the inline
    PTX): {ins, trips, warps, regs, spill}. mode None: the spec says nothing of the prefetch (today's)."""
    up, down = w4_mma.mma_config(M, K, I, E, TOPK)
    kc, const, n_k, opts = (up, UP, K, {}) if launch == "up" else (down, DOWN, I, dict(launch_pdl=True))
    rt, gpi = kc.block_n // 16, kc.block_k // 32
    c = dict(K=n_k, RT=rt, KS=kc.num_warps // rt, GPI=gpi, USE_ASM=True, **const)
    ptrs = dict(PTRS)
    if mode is not None:
        c["PREFETCH_DOWN"] = mode
        if mode:
            ptrs.update(w2_ptr="*i32", s2_ptr="*i32")
        else:  # off as w4_mma launches it: the down operands left at None
            c.update(w2_ptr=None, s2_ptr=None)
    k = cc.compile_kernel(cc.Spec(launch, wk.moebench_w4_mma, ptrs, c, num_warps=kc.num_warps, num_stages=1,
                                  opts=opts))
    cubin = tmp / f"{launch}-{M}-{mode}.cubin"
    cubin.write_bytes(k.asm["cubin"])
    try:
        text = subprocess.run([triton.knobs.nvidia.cuobjdump.path, "-sass", str(cubin)], capture_output=True,
                              text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        pytest.skip(f"no cuobjdump to read sm_90a SASS with: {e}")
    step = c["KS"] * gpi
    regs, spill = cc.ptxas_usage(k.asm["ptx"])
    return dict(ins=sass(text), trips=len(range(step, n_k // 32, step)), warps=kc.num_warps, rt=rt,
                regs=regs, spill=spill)


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    """{(M, launch, mode): compiled}, in a Triton cache of its own; skipped where Triton cannot target sm_90."""
    tmp = tmp_path_factory.mktemp("prefetch")
    saved = os.environ.get("TRITON_CACHE_DIR")
    os.environ["TRITON_CACHE_DIR"] = str(tmp / "cache")
    out = {}
    try:
        for key in [(1, "up", None), (1, "down", None), (1, "up", 0), (1, "down", 0), (1, "up", 1), (1, "up", 2),
                    (2, "up", 1), (4, "up", 1)]:
            try:
                out[key] = _compile(*key, tmp)
            except Exception as e:
                if key == (1, "up", None):
                    pytest.skip(f"Triton cannot compile for sm_90 here: {type(e).__name__}: {e}"[:300])
                raise
    finally:
        if saved is None:
            del os.environ["TRITON_CACHE_DIR"]
        else:
            os.environ["TRITON_CACHE_DIR"] = saved
    return out


def _ops(ins) -> list[str]:
    return [re.sub(r"^@!?U?P\w+\s+", "", t).split()[0] for _, t in ins]


def test_the_line_arithmetic_of_the_kimi_shape():
    """An expert's down slice: 7168 x 256 nibbles = 896 KiB of words (7168 lines) and 112 KiB of scales (896
    lines); 16 up programs a pair split it: 448 + 56 = 504 lines a program, 1.03 MB an expert."""
    assert w4_prefetch.down_lines(K, I) == (7168, 896)
    assert w4_prefetch.lines_per_program(K, I, 1) == (448, 56)
    assert w4_prefetch.lines_per_program(K, I, 2) == (896, 112)  # 8 programs of 2 row tiles
    assert sum(w4_prefetch.down_lines(K, I)) * w4_prefetch.LINE == 1_032_192


@pytest.mark.parametrize("M, warps, per_warp", [(1, 16, 1), (2, 8, 2), (4, 4, 4)])
def test_each_warp_issues_one_prefetch_per_pass_over_its_programs_lines(compiled, M, warps, per_warp):
    """504 lines a program over 32 x warps threads: one pass of 512 at M = 1 (16 warps), two of 256 at M = 2
    (8 warps), four of 128 at M = 4 (4 warps); outside the K loop, after the program's own weight loads."""
    c = compiled[(M, "up", 1)]
    assert c["warps"] == warps and w4_prefetch.prefetches_per_thread(K, I, c["rt"], warps) == per_warp
    ops = _ops(c["ins"])
    at = [i for i, o in enumerate(ops) if o == OPCODE[1]]
    assert len(at) == per_warp and OPCODE[2] not in ops
    # executed once a warp: not inside the K loop (from its back edge's target to the back edge)
    addr = [a for a, _ in c["ins"]]
    back = [(addr.index(int(m.group(1), 16)), i) for i, (a, t) in enumerate(c["ins"])
            if (m := re.search(r"\bBRA\s+0x([0-9a-f]+)", t)) and int(m.group(1), 16) < a]
    assert len(back) == (1 if c["trips"] else 0)
    assert not any(start <= j <= end for start, end in back for j in at), "a prefetch inside the K loop"
    first_weight_load = ops.index("LDG.E.64")
    assert all(i > first_weight_load for i in at)
    assert c["spill"] == 0


def test_evict_last_is_the_same_code_with_the_other_prefetch(compiled):
    on, last = compiled[(1, "up", 1)], compiled[(1, "up", 2)]
    assert _ops(last["ins"]).count(OPCODE[2]) == 1 and OPCODE[1] not in _ops(last["ins"])
    assert [t.replace(OPCODE[2], OPCODE[1]) for _, t in last["ins"]] == [t for _, t in on["ins"]]


def test_what_the_prefetch_adds_to_each_up_warp(compiled):
    """Per warp at M = 1, as ncu's sm__inst_executed would count it: 30 more instructions (one prefetch, the
    rest its line offset and predicate), no more loads and registers, the same 128 registers. The notes'
    prediction quotes this number."""
    if triton.__version__ != "3.6.0":
        pytest.skip(f"the count is Triton 3.6.0's code; this is Triton {triton.__version__}")
    off, on = compiled[(1, "up", 0)], compiled[(1, "up", 1)]
    a, b = (counts(c["ins"], c["trips"], c["warps"]) for c in (off, on))
    assert b["inst"] - a["inst"] == 30
    assert b["loads"] == a["loads"] and b["load_bytes"] == a["load_bytes"]
    assert on["regs"] == off["regs"] == 128


def test_off_compiles_todays_kernels_byte_for_byte(compiled):
    """The spec that names no prefetch (compile_check's, test_planted_counters') and the launch with it off
    (PREFETCH_DOWN = 0, the down operands None) both give the SASS of the tree before the prefetch."""
    if triton.__version__ != "3.6.0":
        pytest.skip(f"the digests are Triton 3.6.0's code; this is Triton {triton.__version__}")
    for launch in ("up", "down"):
        assert _digest(compiled[(1, launch, None)]["ins"]) == TODAY[launch], launch
        assert _digest(compiled[(1, launch, 0)]["ins"]) == TODAY[launch], launch
    assert _digest(compiled[(1, "up", 1)]["ins"]) != TODAY["up"]  # control: the digest sees the prefetch


# ---- the interpreter and the host -------------------------------------------------------------------------

def _outputs(M, K_, I_, topk, up, down, seed=0):
    """fused_moe_w4_mma's output with the prefetch off, l2 and evict_last, on one problem (two tokens share an
    expert when M > 1: a duplicate prefetch)."""
    g = torch.Generator().manual_seed(seed)
    n_e = 8
    x = (torch.randn(M, K_, generator=g) * 3).bfloat16()
    w1, w2 = torch.randn(n_e, 2 * I_, K_, generator=g) / K_ ** 0.5, torch.randn(n_e, K_, I_, generator=g) / I_ ** 0.5
    ids = torch.stack([torch.randperm(n_e, generator=g)[:topk] for _ in range(M)]).int()
    if M > 1:
        ids[1, -1] = ids[0, 0]
    tw = torch.softmax(torch.randn(M, topk, generator=g), -1)
    d1, d2, q = tm.quantize_moe(w1, w2, "int4_w4a16", 32)
    t1, t2 = w4_mma.pack_tiles16(d1, q.scales[0]), w4_mma.pack_tiles16(d2, q.scales[1])
    cfg = (KernelConfig(*up), KernelConfig(*down))
    return [w4_mma.down_launch(c, w4_mma.up_launch(c)) for c in
            (w4_mma.plan_call(x, t1, t2, tw, ids, config=cfg, pdl=False, prefetch_down=m) for m in (0, 1, 2))]


@pytest.mark.parametrize("M, K_, I_, topk, up, down", [
    (1, 64, 32, 2, (16, 32, 1), (16, 32, 1)),
    (3, 256, 32, 4, (16, 64, 2), (32, 32, 2)),
    (2, 96, 64, 2, (32, 64, 4), (64, 64, 4)),
])
def test_the_interpreter_gives_the_same_output_with_the_prefetch_on_and_off(interp, M, K_, I_, topk, up, down):
    off, l2, last = interp(_outputs, M, K_, I_, topk, up, down)
    assert not torch.isnan(off).any()
    assert torch.equal(l2, off) and torch.equal(last, off)


def test_a_mode_that_does_not_exist_is_refused():
    t = w4_mma.W4Tiles(torch.zeros(2, 4, 2, 32, 2, dtype=torch.int32), torch.zeros(2, 4, 2, 8, dtype=torch.int32))
    w2 = w4_mma.W4Tiles(torch.zeros(2, 4, 1, 32, 2, dtype=torch.int32), torch.zeros(2, 4, 1, 8, dtype=torch.int32))
    x = torch.zeros(1, 64, dtype=torch.bfloat16)
    args = (x, t, w2, torch.ones(1, 1), torch.zeros(1, 1, dtype=torch.int32))
    with pytest.raises(ValueError, match=r"prefetch_down must be one of \[0, 1, 2\] \(off, l2, evict_last\), got 3"):
        w4_mma.plan_call(*args, pdl=False, prefetch_down=3)
    assert w4_mma.plan_call(*args, pdl=False).prefetch_down == 0  # off unless asked


def test_down_stacks_the_kernel_cannot_address_by_expert_are_refused_before_launch():
    t = w4_mma.W4Tiles(torch.zeros(2, 4, 2, 32, 2, dtype=torch.int32), torch.zeros(2, 4, 2, 8, dtype=torch.int32))
    words = torch.zeros(2, 4, 2, 32, 2, dtype=torch.int32)[:, :, :1]  # [2, 4, 1, 32, 2], experts 512 words apart
    w2 = w4_mma.W4Tiles(words, torch.zeros(2, 4, 1, 8, dtype=torch.int32))
    c = w4_mma.plan_call(torch.zeros(1, 64, dtype=torch.bfloat16), t, w2, torch.ones(1, 1),
                         torch.zeros(1, 1, dtype=torch.int32), pdl=False, prefetch_down=1)
    with pytest.raises(ValueError, match="prefetch_down needs the down weights' words and scales contiguous"):
        w4_mma.up_launch(c)


# ---- which lines: the programs of a pair cover their expert's down slice, each line once -------------------

@triton.jit
def _record_lines(is_w_out, off_out, on_out, K: tl.constexpr, I: tl.constexpr, RT: tl.constexpr,
                  L: tl.constexpr, PASSES: tl.constexpr):
    pid_n = tl.program_id(0)
    for r in tl.static_range(PASSES):
        is_w, off, on = w4_prefetch.prefetch_lines(pid_n, r, K, I, RT, L)
        at = (pid_n * PASSES + r) * L + tl.arange(0, L)
        tl.store(is_w_out + at, is_w.to(tl.int32))
        tl.store(off_out + at, off)
        tl.store(on_out + at, on.to(tl.int32))


def _covered(K, I, RT, warps):
    """{"words": [line, ...], "scales": [...]}: the lines every up program of a pair prefetches (with repeats)."""
    L = 32 * warps
    np_ = -(-(I // 16) // RT)
    passes = w4_prefetch.prefetches_per_thread(K, I, RT, warps)
    outs = [torch.zeros(np_ * passes * L, dtype=torch.int32) for _ in range(3)]
    _record_lines[(np_,)](*outs, K, I, RT, L, passes)
    is_w, off, on = (o.tolist() for o in outs)
    lines = {"words": [], "scales": []}
    for w, o, p in zip(is_w, off, on):
        if p:
            assert o % 32 == 0, "a prefetch address is a line's first word"
            lines["words" if w else "scales"].append(o // 32)
    return lines


@pytest.mark.parametrize("K, I, RT, warps", [(7168, 256, 1, 16), (7168, 256, 2, 8), (512, 64, 1, 4)])
def test_the_programs_of_a_pair_prefetch_every_line_of_the_slice_once(interp, K, I, RT, warps):
    lines = interp(_covered, K, I, RT, warps)
    words, scales = w4_prefetch.down_lines(K, I)
    assert sorted(lines["words"]) == list(range(words))  # every line of the expert's words, once
    assert sorted(lines["scales"]) == list(range(scales))  # and of its scales
