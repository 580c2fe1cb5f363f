"""The process ncu profiles for a chunk of gemm cases:
`python -m moebench.gemm.counter_child --case <id> [--case <id> ...] --calls 16 --report <file>`.

Per case, one after another, as the case ran alone before: it builds the case as benchmarks/test_gemm.py
does (same workload: seeded weights, R rotated routings and inputs; consecutive cases of one shape share
it, as the test's do), checks its output against the float32 reference as the test does (a wrong kernel is
not counted), runs every rotation once outside the profiled range (JIT compilation, autotuning and the
first-call allocations stay out of the counters), then profiles one window: cudaProfilerStart, the boundary
marker (case_boundary: one tiny launch whose grid names the case's position), each of the R calls once (the
timer's rotations), cudaProfilerStop. ncu runs with --profile-from-start off, so only the windows are
counted. The case's tensors are freed before the next case (torch.cuda.empty_cache), so memory does not
grow with the chunk; the model's seeded weights stay cached for the next case of the same model, one model
at a time, as in the test.

A case that cannot be counted (no such case, a backend that does not build it, an output that fails its
check) launches nothing inside the profiled range and is recorded as failed with its line; the next case
goes on. An error inside a profiled window is not caught: the chunk's output could not be split honestly,
so the child dies and the parent fails the chunk. The per-case outcomes go to the --report file
(counter_protocol), never to stdout, where ncu writes its table; nothing is printed on stdout.

First run on an H200 in session 16 (docs/counters.md, "The first H200 run"), one case a child: the window
of the Kimi int4 M = 1 case held its 16 calls' up and down launches, 32 in all, reading the experts' weight
bytes once.
"""

from __future__ import annotations

import argparse
import sys
from typing import Callable, Sequence

import torch

from moebench.gemm import case_boundary, runner
from moebench.gemm.backends import BACKENDS
from moebench.gemm.cases import ALL_CASES, GemmCase
from moebench.gemm.counter_protocol import CHILD, CaseReport, write_report
from moebench.gemm.workload import Workload


class NotCounted(Exception):
    """A case this child could not count, with the line its report records (raised before its window)."""


class SharedWorkload:
    """The workload of the shape being counted: the next case of the same shape (another backend) reuses
    it, as the test's lru_cache does; another shape frees it first."""

    def __init__(self) -> None:
        self._shape: GemmCase | None = None
        self._wl: Workload | None = None

    def of(self, case: GemmCase) -> Workload:
        shape = GemmCase(case.model, case.tp, case.op, case.m, case.dtype, case.routing, "-")
        if shape != self._shape:
            self.free()
            self._wl, self._shape = Workload(shape, "cuda"), shape
        return self._wl

    def free(self) -> None:
        self._wl = self._shape = None
        torch.cuda.empty_cache()


def count_case(case_id: str, position: int, calls: int | None, marker_out: torch.Tensor,
               shared: SharedWorkload) -> None:
    """Build, check and warm the case (NotCounted with its line when any of that fails), then profile its
    window with its boundary marker first."""
    case = next((c for c in ALL_CASES if c.id == case_id), None)
    if case is None:
        raise NotCounted(f"no gemm case {case_id!r}")
    backend = BACKENDS[case.backend]
    if not backend.supports(case):  # a case the suite never generates: its check would fail for no kernel's fault
        raise NotCounted(f"backend {case.backend} does not run case {case_id!r}")
    try:
        wl = shared.of(case)
        if calls is not None and calls != wl.R:
            raise NotCounted(f"the window is the case's {wl.R} rotations, got --calls {calls}")
        built = backend.build(case, wl)
        # correct before counted, with the test's own check and bounds (outside the profiled range)
        runner.check(built, wl, backend.error_bounds.get(case.dtype), key=case.key)
        for call in built.calls:  # warm: compile, autotune, allocate, outside the counted window
            call()
        torch.cuda.synchronize()
    except NotCounted:
        raise
    except AssertionError as e:
        raise NotCounted(f"its output failed the check before counting: {_line(e)}") from None
    except Exception as e:  # a backend that cannot build or run this case here: recorded, the chunk goes on
        raise NotCounted(f"it could not be built and run: {type(e).__name__}: {_line(e)}") from None
    torch.cuda.profiler.start()
    try:
        case_boundary.mark(position, marker_out)
        for call in built.calls:
            call()
        torch.cuda.synchronize()
    finally:
        torch.cuda.profiler.stop()


def _line(e: BaseException) -> str:
    return next((ln.strip() for ln in str(e).splitlines() if ln.strip()), type(e).__name__)


def count_cases(case_ids: Sequence[str], count_one: Callable[[str, int], None],
                report: str | None = None) -> list[CaseReport]:
    """count_one(case id, position) for each case in turn; a NotCounted is recorded (and said on stderr) and
    the next case goes on, anything else propagates. With `report`, the outcomes so far are written there
    after every case, and marked done at the end."""
    outcomes: list[CaseReport] = []
    for position, case_id in enumerate(case_ids):
        try:
            count_one(case_id, position)
            outcomes.append(CaseReport(case_id, position))
        except NotCounted as e:
            outcomes.append(CaseReport(case_id, position, str(e)))
            print(f"counter_child: {case_id}: not counted: {e}", file=sys.stderr)
        if report:
            write_report(report, outcomes, done=False)
    if report:
        write_report(report, outcomes, done=True)
    return outcomes


def main(argv: list[str] | None = None) -> int:
    """Profile one window per --case (GemmCase ids, in order) on cuda:0. Exit status 0 when the report was
    written (it says which cases were counted); without --report, 1 when a case was not counted."""
    ap = argparse.ArgumentParser(prog=f"python -m {CHILD}")
    ap.add_argument("--case", action="append", required=True, help="a gemm case id (GemmCase.id); repeatable")
    ap.add_argument("--calls", type=int, default=None, help="calls in each window (default: the case's R)")
    ap.add_argument("--report", default=None, help="a JSON file to write the per-case outcomes to")
    args = ap.parse_args(argv)
    marker_out = torch.zeros(1, dtype=torch.int32, device="cuda")
    case_boundary.mark(0, marker_out)  # compiled and loaded here, outside the profiled range
    torch.cuda.synchronize()
    shared = SharedWorkload()

    def count_one(case_id: str, position: int) -> None:
        # The previous case's built weights and buffers are unreferenced by now (also after its failure, whose
        # traceback held them until count_cases recorded it): hand their memory back before this case builds.
        torch.cuda.empty_cache()
        count_case(case_id, position, args.calls, marker_out, shared)

    outcomes = count_cases(args.case, count_one, args.report)
    return 0 if args.report or all(o.counted for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
