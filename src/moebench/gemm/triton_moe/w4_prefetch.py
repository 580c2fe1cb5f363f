"""L2 prefetch of the down launch's weights from the up launch of the tensor-core int4 kernel (issue 32,
opt-in: the up kernel's PREFETCH_DOWN constexpr; docs/triton-moe-notes.md, "Prefetch down's weights into L2").

Why: at M = 1 down adds 5.7 us to the graph beyond up for 8.3 MB that take 2.0 us at the read ceiling; it is
latency-bound (224 programs, each issuing all its loads at once, two rounds an SM). The 8 experts' down
weights and scales (8.26 MB) fit the H200's L2, so the up launch, whose programs know their pair's expert,
can pull them into L2 while it streams its own weights; down's loads then hit L2. The call still reads
every byte from DRAM once.

Who prefetches what: the NP = cdiv(I / 16, RT) up programs of a pair split its expert's down slice: program
pid_n takes lines [pid_n CW, (pid_n + 1) CW) of the expert's words and [pid_n CS, (pid_n + 1) CS) of its
scales (128-byte lines; w4_mma's layout keeps an expert's words, and its scales, contiguous). Each of the
program's L threads issues one `prefetch` per pass over L lines: cdiv(CW + CS, L) per thread, so per warp.
Several tokens (M > 1) mean several pairs: each pair's programs prefetch its own expert, and a repeated
expert is prefetched again (an L2 hit, harmless). It only pays while M x topk experts' down weights
(1.03 MB each at Kimi-K2.5 TP8) fit L2 beside up's stream: M = 1 or 2.

Modes (MODES): 0 off (the default: the kernel is what it was, its SASS unchanged), 1 `prefetch.global.L2`,
2 `prefetch.global.L2::evict_last` (the line should outlive up's streaming of its own weights through L2).
"""

from __future__ import annotations

import triton
import triton.language as tl

MODES = {"off": 0, "l2": 1, "evict_last": 2}
LINE = 128  # bytes of an L2 line, the unit one prefetch brings in
WORD = 4    # bytes of an int32 word, the unit of the kernel's pointers


def _asm(op: str) -> str:
    """PTX: `op` of address $2 when $1 != 0; $0 is a dummy result (inline asm must return something)."""
    return "{\n.reg .pred p;\nsetp.ne.b32 p, $1, 0;\n@p " + op + " [$2];\nmov.b32 $0, 0;\n}"


PREFETCH_L2 = tl.constexpr(_asm("prefetch.global.L2"))
PREFETCH_L2_EVICT_LAST = tl.constexpr(_asm("prefetch.global.L2::evict_last"))


def down_lines(K: int, I: int) -> tuple[int, int]:
    """128-byte lines of one expert's down weights [K, I] in the 16-row tile layout: (words, scales).
    Words: K/16 tiles x I/32 groups x 64 words; scales: K/16 x I/32 x 8 words."""
    return triton.cdiv(K * I // 8 * WORD, LINE), triton.cdiv(K * I // 64 * WORD, LINE)


def lines_per_program(K: int, I: int, RT: int) -> tuple[int, int]:
    """(CW, CS): the lines of words and of scales one up program prefetches, 1/NP of its expert's each,
    NP = cdiv(I / 16, RT) up programs a pair."""
    np_ = triton.cdiv(I // 16, RT)
    wl, sl = down_lines(K, I)
    return triton.cdiv(wl, np_), triton.cdiv(sl, np_)


def prefetches_per_thread(K: int, I: int, RT: int, warps: int) -> int:
    """`prefetch` instructions each thread (so each warp) of an up program issues: one per pass over its
    32 x warps threads."""
    cw, cs = lines_per_program(K, I, RT)
    return triton.cdiv(cw + cs, 32 * warps)


@triton.jit
def _prefetch(addr, on, ASM: tl.constexpr):
    # is_pure=False: the result is unused, and a pure op would be dropped with it
    tl.inline_asm_elementwise(ASM, "=r,r,l", [on.to(tl.int32), addr], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def prefetch_lines(pid_n, r, K: tl.constexpr, I: tl.constexpr, RT: tl.constexpr, L: tl.constexpr):
    """Pass r of program pid_n over its L threads: (is_w, off, on) a thread, off the int32-word offset of its
    line in its expert's down words (is_w) or scales, on whether the thread prefetches in this pass. The
    same arithmetic as lines_per_program, in constexprs; its own function so that a CPU test can run it
    in the interpreter (the prefetch itself is inline PTX) and see which lines the programs cover."""
    NP: tl.constexpr = (I // 16 + RT - 1) // RT
    LINE_WORDS: tl.constexpr = 32  # 128 bytes
    WL: tl.constexpr = (K * I // 8 + LINE_WORDS - 1) // LINE_WORDS
    SL: tl.constexpr = (K * I // 64 + LINE_WORDS - 1) // LINE_WORDS
    CW: tl.constexpr = (WL + NP - 1) // NP
    CS: tl.constexpr = (SL + NP - 1) // NP
    j = r * L + tl.arange(0, L)  # the program's line j: words first, then scales
    is_w = j < CW
    js = tl.where(is_w, 0, j - CW)
    on = tl.where(is_w, pid_n * CW + j < WL, (js < CS) & (pid_n * CS + js < SL))
    off = tl.where(is_w, (pid_n * CW + j) * LINE_WORDS, (pid_n * CS + js) * LINE_WORDS)
    return is_w, off, on


@triton.jit
def prefetch_down(w2_ptr, s2_ptr, e, pid_n, K: tl.constexpr, I: tl.constexpr, RT: tl.constexpr,
                  L: tl.constexpr, MODE: tl.constexpr):
    """Issue the L2 prefetch of program pid_n's share of expert e's down words (w2_ptr: int32 [E, K/16,
    I/32, 32, 2], contiguous) and scales (s2_ptr: int32 [E, K/16, I/32, 8]), over L threads
    (prefetch_lines says which line each thread takes)."""
    NP: tl.constexpr = (I // 16 + RT - 1) // RT
    WL: tl.constexpr = (K * I // 8 + 31) // 32
    SL: tl.constexpr = (K * I // 64 + 31) // 32
    PASSES: tl.constexpr = ((WL + NP - 1) // NP + (SL + NP - 1) // NP + L - 1) // L
    for r in tl.static_range(PASSES):
        is_w, off, on = prefetch_lines(pid_n, r, K, I, RT, L)
        addr = tl.where(is_w, w2_ptr + e * (K * I // 8) + off, s2_ptr + e * (K * I // 64) + off)
        if MODE == 1:
            _prefetch(addr, on, PREFETCH_L2)
        else:
            _prefetch(addr, on, PREFETCH_L2_EVICT_LAST)
