"""The boundary marker the counter child launches, inside ncu's profiled range, right before each case's window.

One tiny Triton kernel named BOUNDARY_KERNEL (counter_protocol): ncu prints it as its own row, which the
parent splits the launch list at (core.ncu_windows) and then drops. It runs on a grid of position + 1
blocks, so ncu's Grid Size column says which of the child's cases follows it. Every block stores the
position into one int32 (the same value, so the race is harmless): the child reads it back after the window,
a check that the marker ran where it was launched.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


# The function's name is the name ncu prints: it must read counter_protocol.BOUNDARY_KERNEL
# (tests/test_counter_child.py holds it to that).
# do_not_specialize: Triton would otherwise compile position 1 (and multiples of 16) as its own kernel,
# possibly inside the profiled range; one compiled kernel serves every position.
@triton.jit(do_not_specialize=["position"])
def moebench_case_boundary(out_ptr, position):
    tl.store(out_ptr, position)


def mark(position: int, out: torch.Tensor) -> None:
    """Launch the marker of the case at `position` (0-based) on `out`'s device: grid (position + 1, 1, 1)."""
    moebench_case_boundary[(position + 1,)](out, position)
