"""A deliberate change to moebench's int4 Triton MoE kernel (triton_moe/w4_mma_kernel.py) that time should
miss and the ncu counters should catch (issue 34): each lane's two weight words are read with two 32-bit
loads instead of one 64-bit load. The same bytes are read and the same result is computed; the kernel issues
one more load instruction per (lane set, group, weight stack) step, so `sm__inst_executed` grows while
`dram__bytes_read` does not.

Applied from outside moebench's code, by ci/planted/sitecustomize.py when MOEBENCH_PLANT_NARROW_LOADS is set
(a pytest plugin would not reach the ncu child process, `python -m moebench.gemm.counter_child`):

    PYTHONPATH=$PWD/ci/planted:$PWD/src MOEBENCH_PLANT_NARROW_LOADS=1 \\
        python3 -m pytest benchmarks/test_gemm.py -m "gemm and triton" -k "int4 and m1-" --counters

`plant(module)` replaces the module's global `_load_ws` with `_load_ws_narrow` below. Triton resolves a
kernel's callees from its module's globals when it first compiles the kernel (and puts their source into the
kernel's cache key, so the planted kernel is never taken from the cache of an unplanted one), which is why the
swap must happen before the kernel's first compilation: sitecustomize does it right after the module's own
code has run. This module imports triton, so it is imported only then.
"""

from __future__ import annotations

import sys

import triton
import triton.language as tl

MODULE = "moebench.gemm.triton_moe.w4_mma_kernel"


@triton.jit
def _load_ws_narrow(w_ptr, s_ptr, wrow, srow, grp, mask, G: tl.constexpr, lane):
    """w4_mma_kernel._load_ws with the lane's two weight words as two 32-bit loads (the original: one
    [.., 2] load, a 64-bit ld.global.v2.b32): weight words [L, S, GPI, 2] and scale words [L, S, GPI]."""
    m = mask & (grp < G)
    g3 = grp.to(tl.int64)
    word = w_ptr + wrow + g3 * 64 + lane * 2  # the lane's first word; the second is the next one
    w = tl.join(tl.load(word, mask=m, other=0), tl.load(word + 1, mask=m, other=0))
    s = tl.load(s_ptr + srow + g3 * 8 + lane // 4, mask=m, other=0)
    return w, s


def plant(module) -> bool:
    """Swap module._load_ws for the narrow variant, once; True if it did now. Says so on stderr (the ncu
    child's stdout is where ncu writes its table)."""
    if getattr(module._load_ws, "_moebench_planted", False):
        return False
    module._load_ws = _load_ws_narrow
    print(f"moebench planted regression: {module.__name__}._load_ws reads each lane's two weight words with "
          f"two 32-bit loads (MOEBENCH_PLANT_NARROW_LOADS)", file=sys.stderr, flush=True)
    return True


_load_ws_narrow._moebench_planted = True
