"""Allreduce family, pure parts: case ids and keys, definitions, the default selection, bandwidth math,
skip reasons, the group spec and message files, and how a launch becomes per-case outcomes.

No processes are started here and nothing depends on a clock."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from moebench.allreduce import bandwidth, cases as C
from moebench.allreduce.cases import AllreduceCase, all_cases, in_default_selection
from moebench.allreduce.launcher import GroupRun
from moebench.allreduce.protocol import Fault, GroupSpec, Reader, tail
from moebench.allreduce.requirements import ranks_topology, skip_reason
from moebench.allreduce.runner import AllreduceRunner, outcomes


def case(**kw) -> AllreduceCase:
    axes = dict(backend="nccl", world=2, variant="", dtype="bf16", hidden=7168, tokens=1, mode="graph")
    axes.update(kw)
    return AllreduceCase(**axes)


# --- ids, keys, definitions ----------------------------------------------------------------------
def test_key_renders_the_axes():
    assert case().key == "allreduce[nccl-w2-h7168-t1-bf16-graph]"
    assert case(backend="gloo", mode="eager", dtype="fp32", tokens=64).id == "gloo-w2-h7168-t64-fp32-eager"
    assert case(variant="protoLL", world=8, hidden=6144).id == "nccl-w8-h6144-t1-bf16-graph-protoLL"


def test_ids_unique_and_deterministic():
    ids = [c.id for c in all_cases()]
    assert len(ids) == len(set(ids))
    assert ids == [c.id for c in all_cases()]
    assert all(c.key == f"allreduce[{c.id}]" for c in all_cases())


def test_every_axis_value_is_in_the_product():
    cs = all_cases()
    assert {c.tokens for c in cs} == {1, 2, 4, 8, 16, 32, 64, 512, 4096, 8192}
    assert {c.hidden for c in cs} == {7168, 6144}
    assert {c.dtype for c in cs} == {"bf16", "fp32"}
    assert {(c.backend, c.mode) for c in cs} == {("nccl", "graph"), ("nccl", "eager"), ("vllm_custom_ar", "graph"),
                                                 ("vllm_custom_ar", "eager"), ("gloo", "eager")}
    assert {c.world for c in cs if c.backend == "nccl"} == {2, 4, 8}
    assert {c.variant for c in cs} == set(C.VARIANTS)


def test_group_cases_are_consecutive():
    seen, last = set(), None
    for c in all_cases():
        if c.group != last:
            assert c.group not in seen, f"group {c.group} is split"
            seen.add(c.group)
            last = c.group


def test_bytes_and_ops_per_sample():
    assert case(tokens=1).nbytes == 14336  # the 14 KB of reference-numbers.md
    assert case(tokens=64).nbytes == 917504
    assert case(tokens=8192, dtype="fp32").nbytes == 8192 * 7168 * 4
    assert case(tokens=64).ops_per_sample == C.OPS_PER_SAMPLE
    assert case(tokens=4096).ops_per_sample == C.OPS_PER_SAMPLE_LARGE


def test_definition_holds_what_shapes_the_measurement():
    d = case(transport="pcie").definition()
    assert d["bytes"] == 14336 and d["world"] == 2 and d["mode"] == "graph" and d["dtype"] == "bf16"
    assert d["env"]["NCCL_P2P_DISABLE"] == "1" and d["transport"] == "pcie"
    assert "transport" not in case().definition()  # NCCL's own choice: the definitions recorded before the axis
    assert d["ops_per_sample"] == C.OPS_PER_SAMPLE
    json.dumps(d)  # stored as JSON, hashed for STALE
    assert case().definition() != case(mode="eager").definition()
    assert case().definition() != case(variant="protoLL").definition()


def test_nvlink_multicast_stays_off_in_every_case():
    for c in all_cases():
        assert c.env["NCCL_NVLS_ENABLE"] == "0"
        assert c.env["TORCH_SYMM_MEM_DISABLE_MULTICAST"] == "1"
        assert c.env["NVSHMEM_DISABLE_NVLS"] == "1"


@pytest.mark.parametrize("kw", [dict(backend="gloo", mode="graph"), dict(backend="gloo", variant="protoLL"),
                                dict(dtype="fp16"), dict(world=1), dict(variant="nope")])
def test_impossible_cases_are_refused(kw):
    with pytest.raises(ValueError):
        case(**kw)


def test_default_selection_is_small_and_covers_the_headline():
    default = [c for c in all_cases() if in_default_selection(c)]
    w2 = [c for c in default if c.world == 2 and c.backend == "nccl" and c.transport == "auto"]
    assert {(c.tokens, c.mode) for c in w2 if c.hidden == 7168 and c.dtype == "bf16"} == \
        {(t, m) for t in C.TOKENS for m in C.MODES}
    assert any(c.dtype == "fp32" for c in w2) and any(c.hidden == 6144 for c in w2)
    assert len(w2) <= 30
    # each steered transport adds the headline sizes only: hidden 7168 bf16, every size, both modes
    for transport in ("pcie", "pcie-p2p"):
        steered = [c for c in default if c.world == 2 and c.transport == transport]
        assert {(c.tokens, c.mode, c.hidden, c.dtype) for c in steered} == \
            {(t, m, 7168, "bf16") for t in C.TOKENS for m in C.MODES}
    assert not any(c.variant for c in default)
    gloo = [c for c in default if c.backend == "gloo"]
    assert 3 <= len(gloo) <= 6 and all(c.nbytes <= 2 << 20 for c in gloo)
    assert all(c.nbytes < C.VLLM_CUSTOM_AR_MAX_BYTES for c in default if c.backend == "vllm_custom_ar")


# --- bandwidth -------------------------------------------------------------------------------------
def test_bus_factor():
    assert bandwidth.bus_factor(2) == 1.0
    assert bandwidth.bus_factor(4) == 1.5
    assert bandwidth.bus_factor(8) == 1.75
    with pytest.raises(ValueError):
        bandwidth.bus_factor(0)


def test_busbw_matches_the_reference_table():
    # Two H200s, 64 tokens x 7168 bf16 in 15.4 us -> 59.6 GB/s (reference-numbers.md); n=2: busbw == algbw.
    assert bandwidth.algbw_gbps(917504, 15.4e-6) == pytest.approx(59.58, abs=0.01)
    assert bandwidth.busbw_gbps(917504, 15.4e-6, 2) == bandwidth.algbw_gbps(917504, 15.4e-6)
    assert bandwidth.busbw_gbps(1_000_000, 1e-3, 8) == pytest.approx(1.75)
    with pytest.raises(ValueError):
        bandwidth.algbw_gbps(1, 0)


# --- skip reasons ---------------------------------------------------------------------------------
def _fp(n: int, link: str = "nvlink") -> dict:
    gpus = [{"index": i, "name": "NVIDIA H200"} for i in range(n)]
    pairs = {f"{a}-{b}": {"link": link, "p2p_read": True} for a in range(n) for b in range(a + 1, n)}
    return {"gpus": gpus, "topology": {"pairs": pairs}}


def test_skip_reasons(monkeypatch):
    from moebench.allreduce import requirements

    assert skip_reason(case(backend="gloo", mode="eager"), _fp(0)) is None
    assert "needs 2 CUDA GPUs, NVML sees 0" in skip_reason(case(), _fp(0))
    assert skip_reason(case(), _fp(2)) is None
    monkeypatch.setattr(requirements, "vllm_importable", lambda: False)
    assert "vllm is not importable" in skip_reason(case(backend="vllm_custom_ar"), _fp(2))
    monkeypatch.setattr(requirements, "vllm_importable", lambda: True)
    assert skip_reason(case(backend="vllm_custom_ar"), _fp(2, "pcie")) is None  # two PCIe GPUs: allowed
    assert "at most two PCIe GPUs" in skip_reason(case(backend="vllm_custom_ar", world=4), _fp(4, "pcie"))
    assert skip_reason(case(backend="vllm_custom_ar", world=4), _fp(4)) is None
    assert "under 8 MiB" in skip_reason(case(backend="vllm_custom_ar", tokens=4096), _fp(2))


def test_ranks_topology_takes_the_first_world_gpus():
    t = ranks_topology(2, _fp(4, "pcie"))
    assert t["gpus"] == [0, 1] and list(t["pairs"]) == ["0-1"] and t["interconnect"] == "pcie"


# --- spec and messages ----------------------------------------------------------------------------
def test_spec_round_trips(tmp_path):
    spec = GroupSpec("nccl", 2, "protoLL", (case(variant="protoLL"), case(variant="protoLL", tokens=8)),
                     port=1234, fault=Fault(1, "job", 1))
    spec.write(tmp_path / "s.json")
    assert GroupSpec.read(tmp_path / "s.json") == spec
    with pytest.raises(ValueError):
        GroupSpec("nccl", 4, "", (case(),))
    with pytest.raises(ValueError):
        Fault(0, "somewhere")


def test_reader_returns_complete_lines_only(tmp_path):
    p = tmp_path / "m.jsonl"
    r = Reader(p)
    assert r.poll() == []
    p.write_bytes(b'{"t": "hello"}\n{"t": "rea')
    assert r.poll() == [{"t": "hello"}]
    with open(p, "ab") as f:
        f.write(b'dy"}\n')
    assert r.poll() == [{"t": "ready"}]
    assert r.poll() == []


def test_tail(tmp_path):
    p = tmp_path / "err"
    p.write_text("\n".join(f"line {i}" for i in range(20)) + "\n\n")
    assert tail(p, 3) == ["line 17", "line 18", "line 19"]
    assert tail(tmp_path / "missing") == []


# --- outcomes and the runner (fake launches) -------------------------------------------------------
def _result(job: int, rank: int, samples, wrong: int = 0) -> dict:
    return {"t": "result", "job": job, "rank": rank, "wrong": wrong, "checked": 100, "samples_us": samples,
            "ops_per_sample": 10}


def _fake_launch(log: list, medians_by_rank=(10.0, 12.0), fail_from: int | None = None, wrong: int = 0):
    def launch(spec: GroupSpec, deadlines) -> GroupRun:
        log.append(spec)
        run = GroupRun(spec, ready=[{"info": {"rank": r}} for r in range(spec.world)], pids=[])
        for j, _ in enumerate(spec.cases):
            if fail_from is not None and j >= fail_from:
                run.error, run.failed_job = "rank 1 failed: RuntimeError: boom", j
                break
            run.results[j] = [_result(j, r, [m, m + 1, m - 1], wrong) for r, m in enumerate(medians_by_rank)]
        return run
    return launch


def test_outcome_uses_the_slowest_rank_and_reports_bandwidth():
    c = case(tokens=64)
    run = _fake_launch([], medians_by_rank=(15.4, 20.0))(GroupSpec("nccl", 2, "", (c,)), None)
    o = outcomes(run, _fp(2))[c]
    assert o.slowest_rank == 1 and o.rank_medians_us == [15.4, 20.0]
    m = o.metrics()
    assert m["latency_us"].value == 20.0 and m["latency_us"].gated and m["latency_us"].direction == "lower"
    assert m["latency_us"].samples == (20.0, 21.0, 19.0)
    assert m["algbw_GBps"].value == pytest.approx(917504 / 20e-6 / 1e9)
    assert m["busbw_GBps"].value == m["algbw_GBps"].value  # n = 2
    assert not m["busbw_GBps"].gated and m["busbw_GBps"].direction == "higher"
    assert o.wrong == 0 and o.checked == 200
    assert o.info["topology"]["interconnect"] == "nvlink" and o.info["slowest_rank"] == 1


def test_busbw_at_world_4_is_algbw_times_the_bus_factor():
    # 64 tokens x 7168 bf16 = 917504 bytes in 20 us: algbw 45.8752 GB/s; at n = 4, busbw x 2(n-1)/n = 1.5.
    c = case(tokens=64, world=4)
    run = _fake_launch([], medians_by_rank=(15.0, 20.0, 18.0, 16.0))(GroupSpec("nccl", 4, "", (c,)), None)
    m = outcomes(run, _fp(4))[c].metrics()
    assert m["algbw_GBps"].value == pytest.approx(45.8752)
    assert m["busbw_GBps"].value == pytest.approx(68.8128)


@pytest.mark.parametrize("kw", [dict(tokens=1, mode="graph"), dict(tokens=1, mode="eager"), dict(tokens=4096),
                                dict(backend="gloo", mode="eager")], ids=["decode", "eager", "prefill", "gloo"])
def test_latency_metric_carries_the_cases_own_tolerance(kw):
    """What a new baseline entry stores: latency_rel_tol(case), not Metric's 5 % default."""
    c = case(**kw)
    run = _fake_launch([])(GroupSpec(c.backend, 2, "", (c,)), None)
    tol = outcomes(run, _fp(2))[c].metrics()["latency_us"].rel_tol
    assert tol == C.latency_rel_tol(c) and tol != 0.05


def test_one_launch_per_group_for_all_its_selected_cases():
    log: list = []
    sel = [case(tokens=t) for t in (1, 2)] + [case(mode="eager")] + [case(variant="protoLL")]
    r = AllreduceRunner(sel, launch=_fake_launch(log), fp=_fp(2))
    for c in sel:
        assert r.outcome(c).error is None
    assert [len(s.cases) for s in log] == [3, 1]
    assert [s.variant for s in log] == ["", "protoLL"]


def test_cases_that_cannot_run_here_stay_out_of_launches():
    log: list = []
    sel = [case(), case(world=8)]
    r = AllreduceRunner(sel, launch=_fake_launch(log), fp=_fp(2))
    r.outcome(case())
    assert [c.world for c in log[0].cases] == [2]


def test_a_failed_launch_fails_the_unfinished_cases_and_keeps_the_finished():
    sel = [case(tokens=t) for t in (1, 2, 4)]
    r = AllreduceRunner(sel, launch=_fake_launch([], fail_from=1), fp=_fp(2))
    assert r.outcome(sel[0]).error is None
    assert "boom" in r.outcome(sel[1]).error and "boom" in r.outcome(sel[2]).error


def test_remeasure_launches_just_that_case():
    log: list = []
    sel = [case(tokens=t) for t in (1, 2)]
    r = AllreduceRunner(sel, launch=_fake_launch(log), fp=_fp(2))
    r.outcome(sel[0])
    o = r.remeasure(sel[1])
    assert [len(s.cases) for s in log] == [2, 1] and log[1].cases == (sel[1],)
    assert o.info["remeasured"] is True


def test_fault_hook_reaches_the_named_group_only():
    log: list = []
    r = AllreduceRunner([case(), case(variant="protoLL")], launch=_fake_launch(log), fp=_fp(2),
                        faults={"nccl-w2-protoLL": Fault(1, "rendezvous")})
    r.outcome(case())
    r.outcome(case(variant="protoLL"))
    assert log[0].fault is None and log[1].fault == Fault(1, "rendezvous")


# --- what a benchmark case does with an outcome ----------------------------------------------------
class _Recorder:
    """Stands in for the moebench fixture: calls measure() the given number of times (2 = the gate's
    re-measure of a suspected regression)."""

    def __init__(self, times: int = 1) -> None:
        self.times, self.metrics, self.kw = times, [], {}

    def record(self, key, family, definition, measure, **kw):
        self.key, self.family, self.kw = key, family, kw
        for _ in range(self.times):
            self.metrics.append(measure())


def test_run_case_records_and_remeasures(monkeypatch):
    from moebench.allreduce import bench

    monkeypatch.setattr(bench, "skip_reason", lambda c: None)
    log: list = []
    r = AllreduceRunner([case()], launch=_fake_launch(log), fp=_fp(2))
    rec = _Recorder(times=2)
    bench.run_case(case(), r, rec)
    assert rec.key == "allreduce[nccl-w2-h7168-t1-bf16-graph]" and rec.family == "allreduce"
    assert rec.kw["primary"] == "latency_us" and "topology" in rec.kw["info"]
    assert len(log) == 2 and len(rec.metrics) == 2


def test_run_case_fails_on_wrong_elements_and_on_rank_failure(monkeypatch):
    from moebench.allreduce import bench

    monkeypatch.setattr(bench, "skip_reason", lambda c: None)
    r = AllreduceRunner([case()], launch=_fake_launch([], wrong=3), fp=_fp(2))
    with pytest.raises(pytest.fail.Exception, match="6 of 200 result elements wrong"):
        bench.run_case(case(), r, _Recorder())
    r = AllreduceRunner([case()], launch=_fake_launch([], fail_from=0), fp=_fp(2))
    with pytest.raises(pytest.fail.Exception, match="boom"):
        bench.run_case(case(), r, _Recorder())


def test_run_case_skips_what_the_ranks_decline(monkeypatch):
    from moebench.allreduce import bench

    monkeypatch.setattr(bench, "skip_reason", lambda c: None)

    def launch(spec, deadlines):
        return GroupRun(spec, results={0: [{"unsupported": "vLLM disabled its custom allreduce here: no P2P"}] * 2})

    r = AllreduceRunner([case(backend="vllm_custom_ar")], launch=launch, fp=_fp(2))
    with pytest.raises(pytest.skip.Exception, match="no P2P"):
        bench.run_case(case(backend="vllm_custom_ar"), r, _Recorder())


@pytest.mark.parametrize("tokens,mode,tol", [(1, "graph", C.LATENCY_REL_TOL_DECODE), (1, "eager", C.LATENCY_REL_TOL_DECODE_EAGER),
                                             (64, "eager", C.LATENCY_REL_TOL_DECODE_EAGER),
                                             (4096, "eager", C.LATENCY_REL_TOL_PREFILL),
                                             (4096, "graph", C.LATENCY_REL_TOL_PREFILL)])
def test_latency_tolerance_by_size_and_mode(tokens, mode, tol):
    """Decode sizes (<= 1 MiB) gate loosely, eager ones loosest (host-bound); prefill sizes tightly."""
    assert C.latency_rel_tol(case(tokens=tokens, mode=mode)) == tol


@pytest.mark.parametrize("tokens,dtype", [(1, "bf16"), (64, "fp32")])
def test_gloo_tolerance_is_its_own(tokens, dtype):
    """gloo (CPU over loopback, host-noise bound) gates at its measured spread at every size."""
    assert C.latency_rel_tol(case(backend="gloo", mode="eager", tokens=tokens, dtype=dtype)) == C.LATENCY_REL_TOL_GLOO


def test_a_pcie_case_whose_nccl_used_nvlink_fails_and_every_case_records_what_nccl_chose(monkeypatch):
    import moebench.allreduce.runner as runner_mod

    monkeypatch.setattr(runner_mod, "topo_matrix", lambda: "GPU0 GPU1\nGPU0 X NV18")
    nvlink_log = (Path(__file__).parent / "data" / "nccl-info-nvlink.log").read_text()
    steered, plain = case(transport="pcie"), case()
    for c in (steered, plain):
        run = _fake_launch([])(GroupSpec("nccl", 2, "", (c,)), None)
        run.rank0_log = nvlink_log
        o = outcomes(run, _fp(2))[c]
        assert o.info["nccl_chosen"]["summary"] == "nvlink-p2p" and o.info["topo_matrix"].endswith("NV18")
        assert o.info["transport"] == c.transport
        if c is steered:
            assert o.error == ("allreduce[nccl-w2-h7168-t1-bf16-graph-pcie]: transport pcie asked NCCL to stay off "
                               "peer-to-peer, but its log says it used nvlink-p2p (NCCL: P2P/CUMEM/read)")
        else:
            assert o.error is None and o.rank_samples_us


def test_a_group_holds_one_transport():
    with pytest.raises(ValueError, match="does not belong to group nccl-w2"):
        GroupSpec("nccl", 2, "", (case(), case(transport="pcie")))
