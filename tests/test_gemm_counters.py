"""The gemm family's --counters: the option (off by default), the definition's counting entry, the counter
part of a case on a machine that cannot count (no GPU, no ncu, no permission: a skip reason, the timing
stands) or can (a fake ncu that writes the child's report and prints a fixture with its boundary marker), and
the test's session batch (benchmarks/test_gemm.py: one child for every case the session counts)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from moebench.core import hardware
from moebench.core.ncu import parse_raw_csv
from moebench.core.ncu_launch import NcuTool
from moebench.gemm import counter_batch, counters
from moebench.gemm.cases import GemmCase
from moebench.gemm.counter_batch import CounterBatch
from moebench.gemm.counter_protocol import CaseReport, write_report
from moebench.suite import xdist_glue
from moebench.suite.family_options import add_family_options
from ncu_batch_fixtures import batch_csv, fixture_parts
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


def alone(tool: NcuTool, calls: int = 16) -> CounterBatch:
    """A batch of CASE alone, launched the real way (ncu_launch.run_under_ncu)."""
    return CounterBatch([CASE.id], tool, calls=calls)


def test_no_gpu_or_no_ncu_is_a_reason_not_a_failure(monkeypatch):
    monkeypatch.delenv("MOEBENCH_NCU", raising=False)
    assert counters.count(CASE, "cpu", 1e12, alone(NcuTool(None, None))) == (
        {}, {"skipped": "counters need a GPU: ncu profiles CUDA kernels"})
    metrics, info = counters.count(CASE, "cuda", 1e12, alone(NcuTool(None, None)))
    assert metrics == {} and info["skipped"].startswith("no ncu: not on PATH and MOEBENCH_NCU is not set")


def test_no_permission_is_a_skip_and_a_broken_ncu_a_recorded_failure(tmp_path):
    perm = fake_ncu(tmp_path, prints=(DATA / "err_nvgpuctrperm.txt").read_text(), exit=1)
    metrics, info = counters.count(CASE, "cuda", 1e12, alone(NcuTool(perm, "2024.3.2.0")))
    assert metrics == {} and "ERR_NVGPUCTRPERM" in info["skipped"]
    (tmp_path / "b").mkdir()
    broken = fake_ncu(tmp_path / "b", prints="oops\n", exit=0)
    metrics, info = counters.count(CASE, "cuda", 1e12, alone(NcuTool(broken, None)))
    assert metrics == {} and "no ncu raw CSV header" in info["failed"]


def test_moebench_ncu_keep_keeps_the_output_a_count_was_made_from(tmp_path, monkeypatch):
    monkeypatch.setenv("MOEBENCH_NCU_KEEP", str(tmp_path / "kept"))
    broken = fake_ncu(tmp_path, prints="oops\n", exit=0)
    counters.count(CASE, "cuda", 1e12, alone(NcuTool(broken, None)))
    assert (tmp_path / "kept" / "counters-chunk01.csv").read_text() == "oops\n"  # named by its chunk


def reporting_ncu(tmp_path: Path, prints: str) -> str:
    """An `ncu` that plays a child which counted every case it was given (its --report) and prints `prints`."""
    path = tmp_path / "ncu"
    path.write_text(f"""#!{sys.executable}
import json, sys
args = sys.argv[sys.argv.index("-m") + 2:]
ids = [args[i + 1] for i, a in enumerate(args) if a == "--case"]
cases = [{{"case": c, "position": i, "counted": True}} for i, c in enumerate(ids)]
json.dump({{"done": True, "cases": cases}}, open(args[args.index("--report") + 1], "w"))
sys.stdout.write({prints!r})
""")
    path.chmod(0o755)
    return str(path)


def test_a_counted_case_records_each_kernels_counters_and_what_ran(tmp_path):
    # the made-up window's 6 launches (2 calls), after the marker of the chunk's only case
    ncu = reporting_ncu(tmp_path, batch_csv([(0, fixture_parts("raw_base_units.csv")[3])], "raw_base_units.csv"))
    metrics, info = counters.count(CASE, "cuda", 4e12, alone(NcuTool(ncu, "2024.3.2.0"), calls=2))
    assert metrics["ncu_dram_read_bytes@fused_moe_w4_mma#1"].value == (16_515_072 + 16_777_216) / 2  # up
    assert metrics["ncu_dram_read_bytes@fused_moe_w4_mma#2"].value == (8_257_536 + 8_388_608) / 2  # down
    assert info["version"] == "2024.3.2.0" and info["kernels"]["fused_moe_w4_mma#1"]["launches_per_call"] == 1
    assert "16 rotated calls the timer times" in info["counting"]["window"]  # how it counted, with the run
    assert "moebench_case_boundary" in info["counting"]["boundary"] and info["chunk"] == "counters-chunk01"
    assert "moebench_case_boundary" not in str(info["kernels"])


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
    config = SimpleNamespace(getoption=lambda name, default=None: counters_on and name == "counters",
                             stash=pytest.Stash())
    bench.test_gemm(CASE, moebench, SimpleNamespace(config=config, session=SimpleNamespace(items=[])))
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


def _item(case, name="test_gemm"):
    return SimpleNamespace(originalname=name, callspec=SimpleNamespace(params={"case": case}))


def test_the_session_counts_every_selected_case_in_one_child_and_later_cases_read_the_cache(monkeypatch):
    """benchmarks/test_gemm.py's batch: made on the first counted case from the session's selected test_gemm
    items whose backend runs here, kept for the session; N cases, one child (a fake runner, no subprocess)."""
    spec = importlib.util.spec_from_file_location("benchmarks_test_gemm", REPO / "benchmarks" / "test_gemm.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    planned = [GemmCase("tiny", 8, "fused", m, "bf16", "decode", "torch_loop") for m in (1, 2, 4, 8)]
    no_sm80 = GemmCase("tiny", 8, "fused", 1, "bf16", "decode", "torch_grouped_mm")  # needs cc 8.0, GPU is 7.0
    other_test = _item(GemmCase("tiny", 8, "fused", 16, "bf16", "decode", "torch_loop"), name="test_other")
    items = [_item(planned[0]), _item(no_sm80), _item(planned[1]), other_test,
             SimpleNamespace(originalname="test_no_params"), _item(planned[2]), _item(planned[3])]
    request = SimpleNamespace(config=SimpleNamespace(stash=pytest.Stash()), session=SimpleNamespace(items=items))
    monkeypatch.setattr(hardware, "fingerprint", lambda: {"ncu": {"path": "/opt/ncu/ncu", "version": "2025.3.1.0"}})
    runs = []

    def fake_run(ncu, metrics, module, args, *, timeout_s, keep=None):
        ids = [args[i + 1] for i, a in enumerate(args) if a == "--case"]
        runs.append(ids)
        write_report(args[args.index("--report") + 1], [CaseReport(c, i) for i, c in enumerate(ids)], done=True)
        rows = fixture_parts()[3]
        return parse_raw_csv(batch_csv([(i, rows) for i in range(len(ids))]), metrics)

    monkeypatch.setattr(counter_batch, "run_under_ncu", fake_run)
    for case in planned:
        metrics, info = counters.count(case, "cuda", 4.2e12, bench._counter_batch(request, "cuda", (7, 0)))
        assert metrics["ncu_inst_executed"].value == 4_753_312 and info["chunk"] == "counters-chunk01"
    assert runs == [[c.id for c in planned]]  # one child for the four; the one that cannot run here is not asked
    assert bench._counter_batch(request, "cuda", (7, 0)) is bench._counter_batch(request, "cuda", (7, 0))


def test_an_n_worker_plans_only_the_cases_on_its_own_gpu(monkeypatch):
    """Under -n each worker sees every item of the session; its batch holds the cases the GPU plan gave it
    (suite.xdist_glue.placed_here), or each worker would count the others' share too."""
    spec = importlib.util.spec_from_file_location("benchmarks_test_gemm", REPO / "benchmarks" / "test_gemm.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    cases = [GemmCase("tiny", 8, "fused", m, "bf16", "decode", "torch_loop") for m in (1, 2, 4, 8)]
    items = [SimpleNamespace(nodeid=f"test_gemm[{c.id}]", **vars(_item(c))) for c in cases]
    config = SimpleNamespace(stash=pytest.Stash(), workerinput={"workerid": "gw1"})
    config.stash[xdist_glue._PLACED_HERE] = frozenset({items[1].nodeid, items[3].nodeid})
    monkeypatch.setattr(hardware, "fingerprint", lambda: {"ncu": {"path": "/opt/ncu/ncu", "version": "2025.3.1.0"}})
    batch = bench._counter_batch(SimpleNamespace(config=config, session=SimpleNamespace(items=items)), "cuda", (9, 0))
    assert batch.chunks == [[cases[1].id, cases[3].id]]
