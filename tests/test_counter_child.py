"""The counter child's side of a chunk, on CPU (no CUDA, no ncu): its loop over the cases (a case that cannot
be counted is recorded and the others go on; an error inside a window stops the child), the report it leaves,
its command line, and the boundary marker's name and grid as the parser reads them."""

from __future__ import annotations

import json

import pytest

from moebench.gemm import counter_protocol
from moebench.gemm.counter_protocol import CaseReport, ReportError, child_args, finished_so_far, read_report

child = pytest.importorskip("moebench.gemm.counter_child")  # imports torch and Triton (the marker kernel)
case_boundary = pytest.importorskip("moebench.gemm.case_boundary")


def test_a_case_that_fails_its_check_is_recorded_and_the_cases_after_it_are_counted(tmp_path):
    report, profiled = str(tmp_path / "report.json"), []

    def count_one(case_id, position):
        if case_id == "b":
            raise child.NotCounted("its output failed the check before counting: gemm[b] rotation 0: error 0.5")
        profiled.append((case_id, position))

    outcomes = child.count_cases(["a", "b", "c"], count_one, report)
    assert profiled == [("a", 0), ("c", 2)]
    assert read_report(report, ["a", "b", "c"]) == outcomes == [
        CaseReport("a", 0), CaseReport("b", 1, "its output failed the check before counting: gemm[b] rotation 0: "
                                              "error 0.5"), CaseReport("c", 2)]


def test_an_error_inside_a_window_stops_the_child_and_its_report_says_where(tmp_path):
    report = str(tmp_path / "report.json")

    def count_one(case_id, position):
        if case_id == "b":
            raise RuntimeError("CUDA error: an illegal memory access was encountered")

    with pytest.raises(RuntimeError):
        child.count_cases(["a", "b", "c"], count_one, report)
    assert finished_so_far(report) == 1
    with pytest.raises(ReportError, match=r"report\.json: the counter child did not finish its report \(it stopped "
                                          r"after a\)$"):
        read_report(report, ["a", "b", "c"])


def test_a_report_that_does_not_answer_for_the_cases_asked_is_refused(tmp_path):
    path = str(tmp_path / "r.json")
    with pytest.raises(ReportError, match=r"r\.json: the counter child wrote no report$"):
        read_report(path, ["a"])
    counter_protocol.write_report(path, [CaseReport("a", 0)], done=True)
    with pytest.raises(ReportError, match=r"reported on \['a'\], asked for \['a', 'b'\]$"):
        read_report(path, ["a", "b"])
    (tmp_path / "r.json").write_text(json.dumps({"done": True, "cases": [{"case": "a", "position": 0}]}))
    with pytest.raises(ReportError, match=r"a case in the counter child's report lacks 'failed'"):
        read_report(path, ["a"])


def test_the_child_is_asked_for_every_case_of_its_chunk_in_order():
    assert child_args(["x", "y"], 16, "/tmp/r.json") == ["--case", "x", "--case", "y", "--calls", "16",
                                                          "--report", "/tmp/r.json"]


def test_the_marker_kernel_is_named_as_the_parser_finds_it_and_its_grid_names_the_position(monkeypatch):
    # ncu prints a Triton kernel under its function's name (the real fixture: "moebench_w4_mma")
    assert case_boundary.moebench_case_boundary.__name__ == counter_protocol.BOUNDARY_KERNEL
    launched = []

    class Kernel:
        def __getitem__(self, grid):
            return lambda out, position: launched.append((grid, position))

    monkeypatch.setattr(case_boundary, "moebench_case_boundary", Kernel())
    case_boundary.mark(0, None)
    case_boundary.mark(6, None)
    assert launched == [((1,), 0), ((7,), 6)]
