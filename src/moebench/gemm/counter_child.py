"""The process ncu profiles for one gemm case (`python -m moebench.gemm.counter_child --case <id>`).

It builds the case as benchmarks/test_gemm.py does (same workload: seeded weights, R rotated routings and
inputs), checks its output against the float32 reference as the test does (a wrong kernel is not counted:
the child exits non-zero and the case fails), runs every rotation once outside the profiled range (JIT
compilation, autotuning and the first-call allocations stay out of the counters), then profiles one window:
cudaProfilerStart, each of the R calls once (the timer's rotations), cudaProfilerStop. ncu runs with
--profile-from-start off, so only that window is counted. It prints nothing on stdout, where ncu writes its table.

First run on an H200 in session 16 (docs/counters.md, "The first H200 run"): the window of the Kimi int4 M = 1
case held its 16 calls' up and down launches, 32 in all, reading the experts' weight bytes once.
"""

from __future__ import annotations

import argparse
import sys

import torch

from moebench.gemm import runner
from moebench.gemm.backends import BACKENDS
from moebench.gemm.cases import ALL_CASES, GemmCase
from moebench.gemm.workload import Workload


def main(argv: list[str] | None = None) -> int:
    """Profile one window of the case named by --case (a GemmCase id) on cuda:0; 0 on success."""
    ap = argparse.ArgumentParser(prog="python -m moebench.gemm.counter_child")
    ap.add_argument("--case", required=True, help="a gemm case id (GemmCase.id)")
    ap.add_argument("--calls", type=int, default=None, help="calls in the window (default: the case's R)")
    args = ap.parse_args(argv)
    case = next((c for c in ALL_CASES if c.id == args.case), None)
    if case is None:
        print(f"counter_child: no gemm case {args.case!r}", file=sys.stderr)
        return 2
    backend = BACKENDS[case.backend]
    if not backend.supports(case):  # a case the suite never generates: its check would fail for no kernel's fault
        print(f"counter_child: backend {case.backend} does not run case {args.case!r}", file=sys.stderr)
        return 2
    wl = Workload(GemmCase(case.model, case.tp, case.op, case.m, case.dtype, case.routing, "-"), "cuda")
    calls = args.calls or wl.R
    if calls != wl.R:
        print(f"counter_child: the window is the case's {wl.R} rotations, got --calls {calls}", file=sys.stderr)
        return 2
    built = backend.build(case, wl)
    try:  # correct before counted, with the test's own check and bounds (outside the profiled range)
        runner.check(built, wl, backend.error_bounds.get(case.dtype), key=case.key)
    except AssertionError as e:
        print(f"counter_child: {e}", file=sys.stderr)
        return 1
    for call in built.calls:  # warm: compile, autotune, allocate, outside the counted window
        call()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for call in built.calls:
        call()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
