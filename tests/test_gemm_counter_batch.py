"""The parent's side of counting many gemm cases in one ncu child (gemm.counter_batch, gemm.counters), with a
FAKE runner in place of ncu_launch.run_under_ncu (no subprocess): it plays a child that writes its report and
an ncu that prints the chunk's table. The tables are built from the real H200 fixture's rows; their marker rows
were written from the real format until a device run replaces them (tests/ncu_batch_fixtures.py)."""

from __future__ import annotations

import json
import os

import pytest

from moebench.core.ncu import parse_raw_csv
from moebench.core.ncu_kernels import per_kernel
from moebench.core.ncu_launch import NcuFailed, NcuTool, NcuUnavailable
from moebench.gemm import counters
from moebench.gemm.cases import ROTATIONS, GemmCase
from moebench.gemm.counter_batch import CounterBatch, chunk_timeout_s
from moebench.gemm.counter_protocol import CaseReport, write_report
from ncu_batch_fixtures import batch_csv, real_windows

TOOL = NcuTool("/opt/ncu/ncu", "2025.3.1.0")
W = real_windows()
# three cases of one shape; what each launches is cut from the real window (their own ids, not the fixture's)
CASES = [GemmCase("kimi-k2.5", 8, "fused", 1, "int4-g32", "decode", b)
         for b in ("triton", "vllm_marlin", "triton_rows4")]
KIMI, MARLIN, ROWS4 = (c.id for c in CASES)


class FakeChild:
    """run_under_ncu's stand-in: reads the child's arguments, writes its report (every case counted but those
    in `fails`, with their line) and returns the table of the windows it profiled (`launches[id]`: the rows
    its window holds), each after its marker. `raises`: an exception to raise instead, per call."""

    def __init__(self, launches=None, fails=None, raises=()):
        self.launches = launches or {}
        self.fails = fails or {}
        self.raises = list(raises)
        self.calls = []

    def __call__(self, ncu, metrics, module, args, *, timeout_s, keep=None):
        ids = [args[i + 1] for i, a in enumerate(args) if a == "--case"]
        report = args[args.index("--report") + 1]
        self.calls.append({"ncu": ncu, "module": module, "ids": ids, "timeout_s": timeout_s, "keep": keep,
                           "calls": int(args[args.index("--calls") + 1]), "report": report})
        if self.raises:
            error = self.raises.pop(0)
            if error is not None:
                raise error
        outcomes = [CaseReport(cid, i, self.fails.get(cid)) for i, cid in enumerate(ids)]
        write_report(report, outcomes, done=True)
        windows = [(i, self.launches.get(cid, W["both"])) for i, cid in enumerate(ids) if cid not in self.fails]
        return parse_raw_csv(batch_csv(windows), metrics, source="fake ncu")


def test_one_child_counts_the_chunk_and_each_case_gets_its_own_window():
    fake = FakeChild({KIMI: W["both"], MARLIN: W["up"], ROWS4: W["down"]})
    batch = CounterBatch([KIMI, MARLIN, ROWS4], TOOL, run=fake)
    got = {c.id: counters.count(c, "cuda", 4.2e12, batch) for c in CASES}
    assert [c["ids"] for c in fake.calls] == [[KIMI, MARLIN, ROWS4]]  # one child for the three
    assert fake.calls[0]["module"] == "moebench.gemm.counter_child" and fake.calls[0]["calls"] == 16
    kimi, info = got[KIMI]
    assert kimi["ncu_inst_executed@moebench_w4_mma#1"].value == 3_197_184
    assert kimi["ncu_inst_executed@moebench_w4_mma#2"].value == 1_556_128
    assert kimi["ncu_inst_executed"].value == 3_197_184 + 1_556_128  # no marker counted in the case
    assert info["chunk"] == "counters-chunk01" and "excluded" in info["counting"]["boundary"]
    assert set(got[MARLIN][1]["kernels"]) == {"moebench_w4_mma"}
    assert got[MARLIN][0]["ncu_inst_executed"].value == 3_197_184
    assert got[ROWS4][0]["ncu_inst_executed"].value == 1_556_128


def test_a_case_failing_its_check_fails_alone_and_the_others_are_counted():
    line = "its output failed the check before counting: gemm[x] rotation 0: max rel error 0.4 > 0.02"
    fake = FakeChild(fails={MARLIN: line})
    batch = CounterBatch([KIMI, MARLIN, ROWS4], TOOL, run=fake)
    got = {c.id: counters.count(c, "cuda", 4.2e12, batch) for c in CASES}
    assert len(fake.calls) == 1
    assert got[KIMI][0]["ncu_inst_executed"].value == got[ROWS4][0]["ncu_inst_executed"].value == 4_753_312
    assert got[MARLIN][0] == {}
    assert got[MARLIN][1] == {"failed": f"the counter child did not count it (counters-chunk01): {line}"}
    assert counters.failure({"counters": got[MARLIN][1]}).endswith(line)


def test_cases_are_counted_in_chunks_each_on_first_demand_with_a_timeout_for_its_size():
    ids = [f"case{i}" for i in range(5)]
    fake = FakeChild()
    batch = CounterBatch(ids, TOOL, chunk_cases=2, run=fake)
    assert batch.chunks == [ids[0:2], ids[2:4], ids[4:]]
    assert fake.calls == []  # nothing runs before a case is asked for
    batch.count("case0")
    batch.count("case1")
    assert [c["ids"] for c in fake.calls] == [ids[0:2]]
    batch.count("case4")
    batch.count("case3")
    batch.count("case2")
    assert [c["ids"] for c in fake.calls] == [ids[0:2], ids[4:], ids[2:4]]
    assert [c["timeout_s"] for c in fake.calls] == [chunk_timeout_s(2), chunk_timeout_s(1), chunk_timeout_s(2)]
    assert chunk_timeout_s(32) - chunk_timeout_s(31) == chunk_timeout_s(2) - chunk_timeout_s(1) > 0
    assert all(len(batch.count(i).launches) == 32 for i in ids)
    assert len(fake.calls) == 3  # asked again: read from the cache


def test_a_case_nobody_planned_is_counted_in_a_chunk_of_its_own():
    fake = FakeChild()
    batch = CounterBatch(["a", "b"], TOOL, run=fake)
    assert batch.count("stray").launches and [c["ids"] for c in fake.calls] == [["stray"]]
    assert batch.chunks == [["a", "b"], ["stray"]]


def test_a_failed_or_timed_out_chunk_fails_its_own_cases_only_and_names_where_it_stopped():
    fake = FakeChild(raises=[NcuFailed("ncu did not finish within 180 s running moebench.gemm.counter_child"), None])
    batch = CounterBatch(["a", "b", "c"], TOOL, chunk_cases=2, run=fake)
    first = batch.count("a")
    assert first.reason == {"failed": "counters-chunk01 (2 cases in one ncu child): ncu did not finish within 180 s "
                                      "running moebench.gemm.counter_child; the child had finished 0 of them and "
                                      "stopped in a"}
    assert batch.count("b").reason == first.reason and len(fake.calls) == 1
    assert batch.count("c").launches and len(fake.calls) == 2


def test_the_child_dying_mid_chunk_names_the_case_it_died_in(tmp_path):
    def dies_in_b(ncu, metrics, module, args, *, timeout_s, keep=None):
        report = args[args.index("--report") + 1]
        write_report(report, [CaseReport("a", 0)], done=False)
        raise NcuFailed("ncu exited with status 139 running moebench.gemm.counter_child: Segmentation fault")

    got = CounterBatch(["a", "b", "c"], TOOL, run=dies_in_b).count("c")
    assert got.reason["failed"].endswith("Segmentation fault; the child had finished 1 of them and stopped in b")


def test_a_marker_that_does_not_match_the_report_fails_the_chunk_with_a_line_naming_the_case():
    class NoMarkerForB(FakeChild):
        def __call__(self, ncu, metrics, module, args, **kw):
            super().__call__(ncu, metrics, module, args, **kw)
            return parse_raw_csv(batch_csv([(0, W["both"]), (None, W["up"]), (2, W["down"])]), metrics)

    batch = CounterBatch(["a", "b", "c"], TOOL, run=NoMarkerForB())
    for cid in "abc":
        assert batch.count(cid).reason == {"failed": "counters-chunk01 (3 cases in one ncu child): ncu output of "
                                                     "counters-chunk01: case b: the moebench_case_boundary launch "
                                                     "before its window (ID 49) names position 2, the case is at "
                                                     "position 1"}


def test_a_child_without_a_report_fails_its_chunk():
    def no_report(ncu, metrics, module, args, **kw):
        return parse_raw_csv(batch_csv([(0, W["both"])]), metrics)

    got = CounterBatch(["a"], TOOL, run=no_report).count("a")
    assert "the counter child wrote no report" in got.reason["failed"]


def test_no_permission_skips_every_case_and_launches_no_later_chunk():
    why = "ncu may not read the GPU performance counters here (ERR_NVGPUCTRPERM)"
    fake = FakeChild(raises=[NcuUnavailable(why)])
    batch = CounterBatch(["a", "b", "c"], TOOL, chunk_cases=1, run=fake)
    assert batch.count("a").reason == {"skipped": why}
    assert batch.count("c").reason == batch.count("a").reason and len(fake.calls) == 1


def test_no_ncu_runs_nothing():
    fake = FakeChild()
    got = CounterBatch(["a"], NcuTool(None, None), run=fake).count("a")
    assert got.reason["skipped"].startswith("no ncu") and fake.calls == []


def test_moebench_ncu_keep_names_the_files_per_chunk_and_keeps_the_report(tmp_path, monkeypatch):
    monkeypatch.setenv("MOEBENCH_NCU_KEEP", str(tmp_path / "kept"))
    fake = FakeChild()
    batch = CounterBatch(["a", "b", "c"], TOOL, chunk_cases=2, run=fake)
    batch.count("a")
    batch.count("c")
    assert [c["keep"] for c in fake.calls] == [str(tmp_path / "kept" / "counters-chunk01.csv"),
                                               str(tmp_path / "kept" / "counters-chunk02.csv")]
    assert [c["report"] for c in fake.calls] == [str(tmp_path / "kept" / "counters-chunk01.json"),
                                                 str(tmp_path / "kept" / "counters-chunk02.json")]
    kept = json.loads((tmp_path / "kept" / "counters-chunk01.json").read_text())
    assert [c["case"] for c in kept["cases"]] == ["a", "b"]


def test_without_keep_the_report_is_a_temporary_file_that_does_not_outlive_the_chunk():
    fake = FakeChild()
    CounterBatch(["a"], TOOL, run=fake).count("a")
    assert fake.calls[0]["keep"] is None and not os.path.exists(fake.calls[0]["report"])


def test_a_window_is_per_call_over_the_chunks_calls():
    fake = FakeChild()
    batch = CounterBatch(["a"], TOOL, run=fake)
    view = per_kernel(batch.count("a").launches, batch.calls)
    assert view["moebench_w4_mma#1"].launches_per_call == 1 and batch.calls == ROTATIONS == 16


def test_a_chunk_holds_a_case_at_least():
    with pytest.raises(ValueError, match="at least one case"):
        CounterBatch(["a"], TOOL, chunk_cases=0)


def test_a_chunk_whose_every_case_failed_its_check_keeps_each_reason_though_ncu_printed_no_table():
    # ncu prints no table when nothing was profiled: the report's reasons are what the cases fail with
    class NothingProfiled(FakeChild):
        def __call__(self, ncu, metrics, module, args, **kw):
            super().__call__(ncu, metrics, module, args, **kw)
            return parse_raw_csv("==PROF== Disconnected from process 1\n==WARNING== No kernels were profiled.\n",
                                 metrics, source="ncu output of moebench.gemm.counter_child")

    fails = {"a": "its output failed the check before counting: gemm[a] ...", "b": "no gemm case 'b'"}
    batch = CounterBatch(["a", "b"], TOOL, run=NothingProfiled(fails=fails))
    assert batch.count("a").reason == {
        "failed": f"the counter child did not count it (counters-chunk01): {fails['a']}"}
    assert batch.count("b").reason["failed"].endswith("no gemm case 'b'")
    # with a case counted, a missing table is the chunk's failure
    batch = CounterBatch(["a", "b"], TOOL, run=NothingProfiled(fails={"a": fails["a"]}))
    assert batch.count("b").reason == {"failed": "counters-chunk01 (2 cases in one ncu child): ncu output of "
                                                 "moebench.gemm.counter_child: no ncu raw CSV header (a row starting "
                                                 "\"ID\" with \"Kernel Name\")"}
