"""The gemm family's --counters: the option (off by default), the definition's counting entry, and the
counter part of a case on a machine that cannot count (no GPU, no ncu, no permission: a skip reason, the
timing stands) or can (a fake ncu printing a fixture)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from moebench.core.ncu_launch import NcuTool
from moebench.gemm import counters
from moebench.gemm.cases import GemmCase
from moebench.suite.family_options import add_family_options
from test_ncu_launch import fake_ncu

REPO = Path(__file__).resolve().parents[1]
DATA = Path(__file__).parent / "data" / "ncu"
CASE = GemmCase("tiny", 8, "fused", 1, "bf16", "decode", "torch_loop")


class Group:
    def __init__(self):
        self.options = {}

    def addoption(self, name, **kw):
        self.options[name] = kw


def test_counters_is_a_gemm_option_registered_through_family_options_and_off_by_default():
    g = Group()
    add_family_options(g)
    assert g.options["--counters"]["default"] is False and g.options["--counters"]["action"] == "store_true"


def test_only_a_failed_count_fails_the_case_and_its_line_says_the_timing_stands():
    assert counters.failure({"counters": {"skipped": "no ncu"}}) is None and counters.failure({}) is None
    line = counters.failure({"counters": {"failed": "ncu exited 1: boom"}})
    assert line == "--counters: the case was timed and gated, but not counted: ncu exited 1: boom"


def test_no_gpu_or_no_ncu_is_a_reason_not_a_failure(monkeypatch):
    monkeypatch.delenv("MOEBENCH_NCU", raising=False)
    assert counters.count(CASE, "cpu", 1e12, NcuTool(None, None)) == (
        {}, {"skipped": "counters need a GPU: ncu profiles CUDA kernels"})
    metrics, info = counters.count(CASE, "cuda", 1e12, NcuTool(None, None))
    assert metrics == {} and info["skipped"].startswith("no ncu: not on PATH and MOEBENCH_NCU is not set")


def test_no_permission_is_a_skip_and_a_broken_ncu_a_recorded_failure(tmp_path):
    perm = fake_ncu(tmp_path, prints=(DATA / "err_nvgpuctrperm.txt").read_text(), exit=1)
    metrics, info = counters.count(CASE, "cuda", 1e12, NcuTool(perm, "2024.3.2.0"))
    assert metrics == {} and "ERR_NVGPUCTRPERM" in info["skipped"]
    (tmp_path / "b").mkdir()
    broken = fake_ncu(tmp_path / "b", prints="oops\n", exit=0)
    metrics, info = counters.count(CASE, "cuda", 1e12, NcuTool(broken, None))
    assert metrics == {} and "no ncu raw CSV header" in info["failed"]


def test_moebench_ncu_keep_keeps_the_output_a_count_was_made_from(tmp_path, monkeypatch):
    monkeypatch.setenv("MOEBENCH_NCU_KEEP", str(tmp_path / "kept"))
    broken = fake_ncu(tmp_path, prints="oops\n", exit=0)
    counters.count(CASE, "cuda", 1e12, NcuTool(broken, None))
    assert (tmp_path / "kept" / f"{CASE.id}.csv").read_text() == "oops\n"


def test_a_counted_case_records_each_kernels_counters_and_what_ran(tmp_path):
    ncu = fake_ncu(tmp_path, prints=(DATA / "raw_base_units.csv").read_text())
    metrics, info = counters.count(CASE, "cuda", 4e12, NcuTool(ncu, "2024.3.2.0"), calls=2)
    assert metrics["ncu_dram_read_bytes@fused_moe_w4_mma#1"].value == (16_515_072 + 16_777_216) / 2  # up
    assert metrics["ncu_dram_read_bytes@fused_moe_w4_mma#2"].value == (8_257_536 + 8_388_608) / 2  # down
    assert info["version"] == "2024.3.2.0" and info["kernels"]["fused_moe_w4_mma#1"]["launches_per_call"] == 1
    assert "16 rotated calls the timer times" in info["counting"]["window"]  # how it counted, with the run


def _bench_with_fake_record(counters_on: bool):
    """benchmarks/test_gemm.py's test_gemm on CASE with a fake `moebench` fixture: (definition, metrics, kwargs)
    of what it recorded, or the pytest failure it raised."""
    spec = importlib.util.spec_from_file_location("benchmarks_test_gemm", REPO / "benchmarks" / "test_gemm.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    from moebench.gemm.workload import Workload

    if bench._device()[0] != "cpu":
        pytest.skip("this test is for a CPU box")
    bench._workload = lambda shape, device: Workload(shape, device, rotations=2)
    recorded = []
    moebench = type("FakeBench", (), {
        "progress": lambda self, msg: None, "ceiling": lambda self, dev, kind: 1e9,
        "record": lambda self, key, family, definition, measure, **kw: recorded.append((definition, measure(), kw))})()
    config = type("Config", (), {"getoption": lambda self, name, default=None: counters_on and name == "counters"})()
    bench.test_gemm(CASE, moebench, type("Request", (), {"config": config})())
    [found] = recorded
    return found


def test_with_counters_on_a_cpu_case_still_times_and_records_why_it_did_not_count():
    definition, metrics, kw = _bench_with_fake_record(True)
    assert "wall_us" in metrics
    assert kw["info"]["counters"] == {"skipped": "counters need a GPU: ncu profiles CUDA kernels"}
    assert kw["explain"] is counters.explain


def test_counters_on_or_off_leave_the_case_definition_alone():
    # the definition is the timing entry's identity: --counters must not make it STALE when turned on or off
    assert _bench_with_fake_record(True)[0] == _bench_with_fake_record(False)[0]


def test_a_count_that_failed_fails_the_case_after_its_timing_was_recorded(monkeypatch):
    monkeypatch.setattr(counters, "count", lambda *a, **k: ({}, {"failed": "ncu exited 1: boom"}))
    with pytest.raises(pytest.fail.Exception, match="not counted: ncu exited 1: boom"):
        _bench_with_fake_record(True)
